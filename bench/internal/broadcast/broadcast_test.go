package broadcast

import (
	"context"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The broadcaster delivers each put to the exact and prefix watchers that
// match, in index order, and to nobody else.
func TestBroadcastDelivers(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := New(Config{Bus: 1, StreamBuffer: 1})
	gs := grpc.NewServer()
	lodestonepb.RegisterKVServer(gs, b)
	lodestonepb.RegisterWatchServer(gs, b)
	go gs.Serve(lis)
	defer b.Close()
	defer gs.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := lodestonepb.NewWatchClient(conn).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*lodestonepb.WatchCreate{{WatchId: 1, Key: []byte("a/1")}, {WatchId: 2, Key: []byte("a/"), Prefix: true}, {WatchId: 3, Key: []byte("b")}} {
		if err := st.Send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Create{Create: c}}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if r, err := st.Recv(); err != nil || !r.GetCreated() {
			t.Fatalf("created: %v, %v", r, err)
		}
	}
	kv := lodestonepb.NewKVClient(conn)
	for _, k := range []string{"a/1", "a/2", "c", "a/1"} {
		if _, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: []byte(k), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	type got struct {
		id  int64
		key string
		idx uint64
	}
	want := []got{{1, "a/1", 1}, {2, "a/1", 1}, {2, "a/2", 2}, {1, "a/1", 4}, {2, "a/1", 4}}
	for i, w := range want {
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		ev := r.GetEvents()[0]
		if g := (got{r.GetWatchId(), string(ev.GetKv().GetKey()), ev.GetKv().GetModifyIndex()}); g != w {
			t.Errorf("delivery %d = %+v, want %+v", i, g, w)
		}
	}
	st.CloseSend()
	cancel()
}
