package client

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client/clienttest"
)

// TestOptionsOnTheWire checks that every option lands in its request field.
func TestOptionsOnTheWire(t *testing.T) {
	t.Parallel()
	got := make(chan proto.Message, 1)
	s := clienttest.Start(t, &clienttest.Funcs{
		Get: func(_ context.Context, r *lodestonepb.GetRequest) (*lodestonepb.GetResponse, error) {
			got <- r
			return &lodestonepb.GetResponse{}, nil
		},
		Range: func(_ context.Context, r *lodestonepb.RangeRequest) (*lodestonepb.RangeResponse, error) {
			got <- r
			return &lodestonepb.RangeResponse{}, nil
		},
		Put: func(_ context.Context, r *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error) {
			got <- r
			return &lodestonepb.PutResponse{}, nil
		},
		Delete: func(_ context.Context, r *lodestonepb.DeleteRequest) (*lodestonepb.DeleteResponse, error) {
			got <- r
			return &lodestonepb.DeleteResponse{}, nil
		},
	})
	c := newTestClient(t, fastRetry(s.Addr))
	ctx := testCtx(t, 5*time.Second)
	for _, tc := range []struct {
		name string
		call func() error
		want proto.Message
	}{
		{"get", func() error { _, err := c.Get(ctx, "k"); return err },
			&lodestonepb.GetRequest{Key: []byte("k")}},
		{"get stale wait", func() error { _, err := c.Get(ctx, "k", Stale(), WaitIndex(7, 1500*time.Millisecond)); return err },
			&lodestonepb.GetRequest{Key: []byte("k"), Consistency: lodestonepb.Consistency_STALE, WaitIndex: 7, WaitMs: 1500}},
		{"range all options", func() error {
			_, err := c.Range(ctx, "p/", Limit(10), KeysOnly(), StartAfter("p/b"), Stale(), WaitIndex(3, time.Second))
			return err
		}, &lodestonepb.RangeRequest{Prefix: []byte("p/"), Limit: 10, KeysOnly: true, StartAfter: []byte("p/b"),
			Consistency: lodestonepb.Consistency_STALE, WaitIndex: 3, WaitMs: 1000}},
		{"put flags cas", func() error { _, err := c.Put(ctx, "k", []byte("v"), WithFlags(42), WithCAS(0)); return err },
			&lodestonepb.PutRequest{Key: []byte("k"), Value: []byte("v"), Flags: 42, Cas: proto.Uint64(0)}},
		{"put plain has no cas", func() error { _, err := c.Put(ctx, "k", []byte("v")); return err },
			&lodestonepb.PutRequest{Key: []byte("k"), Value: []byte("v")}},
		{"delete prefix", func() error { _, err := c.Delete(ctx, "p/", Prefix()); return err },
			&lodestonepb.DeleteRequest{Key: []byte("p/"), Prefix: true}},
		{"delete cas", func() error { _, err := c.Delete(ctx, "k", DeleteCAS(9)); return err },
			&lodestonepb.DeleteRequest{Key: []byte("k"), Cas: proto.Uint64(9)}},
	} {
		if err := tc.call(); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if req := <-got; !proto.Equal(req, tc.want) {
			t.Errorf("%s: request = %v, want %v", tc.name, req, tc.want)
		}
	}
}

// TestKVAgainstMemory runs the KV calls end to end against the fake store.
func TestKVAgainstMemory(t *testing.T) {
	t.Parallel()
	s, _ := memoryServer(t, "a")
	c := newTestClient(t, fastRetry(s.Addr))
	ctx := testCtx(t, 5*time.Second)

	put, err := c.Put(ctx, "app/a", []byte("1"), WithFlags(5))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"app/b", "app/c", "other"} {
		if _, err := c.Put(ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	get, err := c.Get(ctx, "app/a")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(get.GetKv().GetValue()), "1"; got != want {
		t.Errorf("value = %q, want %q", got, want)
	}
	if got, want := get.GetKv().GetModifyIndex(), put.GetKv().GetModifyIndex(); got != want {
		t.Errorf("modify index = %d, want %d", got, want)
	}
	if got, want := get.GetKv().GetFlags(), uint64(5); got != want {
		t.Errorf("flags = %d, want %d", got, want)
	}
	missing, err := c.Get(ctx, "nope")
	if err != nil || missing.GetKv() != nil {
		t.Errorf("Get(missing) = %v, %v; want no entry, no error", missing, err)
	}

	page, err := c.Range(ctx, "app/", Limit(2))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(page.GetKvs()), 2; got != want || !page.GetMore() {
		t.Errorf("first page: %d keys more=%v, want %d more=true", got, page.GetMore(), want)
	}
	rest, err := c.Range(ctx, "app/", StartAfter(string(page.GetKvs()[1].GetKey())))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(rest.GetKvs()), 1; got != want || rest.GetMore() {
		t.Errorf("second page: %d keys more=%v, want %d more=false", got, rest.GetMore(), want)
	}

	txn, err := c.Txn(ctx, []*lodestonepb.TxnOp{
		{Verb: lodestonepb.TxnOp_CHECK_INDEX, Key: []byte("app/a"), Index: put.GetKv().GetModifyIndex()},
		{Verb: lodestonepb.TxnOp_SET, Key: []byte("app/d"), Value: []byte("4")},
	})
	if err != nil || !txn.GetSucceeded() {
		t.Fatalf("Txn = %v, %v; want success", txn, err)
	}

	del, err := c.Delete(ctx, "app/", Prefix())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := del.GetDeleted(), uint64(4); got != want {
		t.Errorf("deleted = %d, want %d", got, want)
	}
}

// TestClusterAgainstMemory runs the Cluster calls end to end.
func TestClusterAgainstMemory(t *testing.T) {
	t.Parallel()
	s, _ := memoryServer(t, "a")
	c := newTestClient(t, fastRetry(s.Addr))
	ctx := testCtx(t, 5*time.Second)

	// b is added but never started: its address refuses connections.
	bAddr := refusedEndpoint(t)
	add, err := c.AddMember(ctx, &lodestonepb.Member{Name: "b", PeerAddr: "10.0.0.2:7300", GrpcAddr: bAddr, Learner: true})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := add.GetMember().GetId(), clienttest.MemberID("b"); got != want {
		t.Errorf("new member id = %x, want %x", got, want)
	}
	if _, err := c.PromoteMember(ctx, ByName("b")); err != nil {
		t.Fatal(err)
	}
	tl, err := c.TransferLeader(ctx, ByID(clienttest.MemberID("b")))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := c.LeaderID(), tl.GetLeaderId(); got != want {
		t.Errorf("LeaderID = %x, want %x", got, want)
	}
	// The new leader's learned address now comes first.
	if got, want := c.Endpoints()[0], bAddr; got != want {
		t.Errorf("first endpoint = %s, want %s", got, want)
	}
	st, err := c.Status(ctx, s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := st.GetSelf().GetName(), "a"; got != want {
		t.Errorf("status self = %q, want %q", got, want)
	}
	// The leader b is unreachable: the write never leaves, so it moves on.
	// Removing one of two voters needs Force.
	if _, err := c.RemoveMember(ctx, ByName("b"), Force()); err != nil {
		t.Fatal(err)
	}
	ms, err := c.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(ms.GetMembers()), 1; got != want {
		t.Errorf("members = %d, want %d", got, want)
	}
}
