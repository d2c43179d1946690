package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
)

// TestGetMany: one GetMany answers every key at one index; a key a Get
// would refuse (not valid, not readable with the token) or that would
// take the answer past max-range-response-bytes is unserved, not an
// error; more keys than max-txn-ops are refused, counted, as a whole.
func TestGetMany(t *testing.T) {
	c := newTestCluster(t, 1, withACLs, func(cfg *Config) {
		cfg.Limits.MaxTxnOps = 6
		cfg.MaxRangeResponseBytes = 64 << 10
	})
	n := c.names[0]
	boot, _, err := consulAs(t, c, n, "").ACL().Bootstrap()
	if err != nil {
		t.Fatal(err)
	}
	mgmt := consulAs(t, c, n, boot.SecretID)
	big := bytes.Repeat([]byte("v"), 30<<10)
	for _, kv := range []struct{ key, value string }{{"app/a", "a"}, {"app/b", "b"}, {"secret/s", "s"},
		{"app/big1", string(big)}, {"app/big2", string(big)}, {"app/big3", string(big)}} {
		if _, err := mgmt.KV().Put(&consul.KVPair{Key: kv.key, Value: []byte(kv.value)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	reader := tokenWith(t, mgmt, "reader", `key_prefix "app/" { policy = "read" }`)
	kv := lodestonepb.NewKVClient(grpcAs(t, c, n, reader))
	ctx := ctxT(t)

	getMany := func(keys ...string) []string {
		t.Helper()
		req := &lodestonepb.GetManyRequest{}
		for _, k := range keys {
			req.Keys = append(req.Keys, []byte(k))
		}
		resp, err := kv.GetMany(ctx, req)
		if err != nil {
			t.Fatalf("GetMany %q: %v", keys, err)
		}
		if len(resp.Results) != len(keys) || resp.Header.GetIndex() == 0 {
			t.Fatalf("GetMany %q: %d results at index %d", keys, len(resp.Results), resp.Header.GetIndex())
		}
		got := described(resp.Results, func(kv *lodestonepb.KeyValue) string { return fmt.Sprintf("%d bytes", len(kv.Value)) })
		return got
	}
	if got := fmt.Sprint(getMany("app/a", "app/missing", "secret/s", "", "app/b")); got != "[1 bytes missing unserved unserved 1 bytes]" {
		t.Errorf("served %s, want a, missing, secret/s and the empty key unserved, b", got)
	}
	if got := fmt.Sprint(getMany("app/big1", "app/a", "app/big2", "app/big3", "app/b")); got != "[30720 bytes 1 bytes 30720 bytes unserved unserved]" {
		t.Errorf("served %s, want everything up to 64 KiB", got)
	}

	refused := c.servers[n].metrics.refused.WithLabelValues("grpc", "max-txn-ops")
	before := testutil.ToFloat64(refused)
	_, err = kv.GetMany(ctx, &lodestonepb.GetManyRequest{Keys: bytes.Fields([]byte("a b c d e f g"))})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "at most 6") || !strings.Contains(err.Error(), "max-txn-ops") {
		t.Errorf("7 keys: %v, want InvalidArgument naming max-txn-ops and 6", err)
	}
	if got := testutil.ToFloat64(refused) - before; got != 1 {
		t.Errorf("refusals counted: %v, want 1", got)
	}
}

// described says what each result holds: "unserved", "missing", or what
// value says of its entry.
func described(results []*lodestonepb.GetManyResult, value func(*lodestonepb.KeyValue) string) []string {
	var got []string
	for _, r := range results {
		switch {
		case !r.Served:
			got = append(got, "unserved")
		case r.Kv == nil:
			got = append(got, "missing")
		default:
			got = append(got, value(r.Kv))
		}
	}
	return got
}

// TestClientCoalescesGets: many goroutines sharing one client get every
// answer a Get alone gives, values and denials alike, while their Gets
// travel as batches on a GetStream.
func TestClientCoalescesGets(t *testing.T) {
	c := newTestCluster(t, 1, withACLs)
	n := c.names[0]
	boot, _, err := consulAs(t, c, n, "").ACL().Bootstrap()
	if err != nil {
		t.Fatal(err)
	}
	mgmt := consulAs(t, c, n, boot.SecretID)
	for _, k := range []string{"app/0", "app/1", "app/2", "secret/s"} {
		if _, err := mgmt.KV().Put(&consul.KVPair{Key: k, Value: []byte(k)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	cl, err := client.New(client.Config{Endpoints: []string{c.servers[n].GRPCAddr()},
		Token: tokenWith(t, mgmt, "reader", `key_prefix "app/" { policy = "read" }`)})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := ctxT(t)
	many := c.servers[n].metrics.requests.WithLabelValues(lodestonepb.KV_GetStream_FullMethodName, "OK")
	// NB: rounds until a batch was seen, not a fixed count: whether Gets
	// queue depends on timing; each round checks every answer either way.
	for round := 0; testutil.ToFloat64(many) == 0; round++ {
		if round == 50 {
			t.Fatal("50 rounds of 32 concurrent Gets sent no batch on a GetStream")
		}
		var wg sync.WaitGroup
		errs := make([]error, 32)
		for i := range errs {
			wg.Go(func() {
				key := []string{"app/0", "app/1", "app/2", "app/none", "secret/s"}[i%5]
				resp, err := cl.Get(ctx, key)
				switch {
				case key == "secret/s":
					if !errors.Is(err, client.ErrPermissionDenied) {
						errs[i] = fmt.Errorf("get %s: %v, want permission denied", key, err)
					}
				case err != nil:
					errs[i] = err
				case key == "app/none" && resp.Kv != nil, key != "app/none" && string(resp.GetKv().GetValue()) != key:
					errs[i] = fmt.Errorf("get %s: %v", key, resp.Kv)
				}
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGetStream: a GetStream answers each request as GetMany would, in
// order, and authorizes each with its token as it is then: a policy
// narrowed mid-stream leaves the keys it no longer grants unserved, and
// a token deleted mid-stream ends the stream PermissionDenied. A request
// GetMany would refuse ends the stream with GetMany's error. Every answer,
// and the request the deleted token was refused, is counted as a
// GetStream request.
func TestGetStream(t *testing.T) {
	c := newTestCluster(t, 1, withACLs, func(cfg *Config) { cfg.Limits.MaxTxnOps = 6 })
	n := c.names[0]
	boot, _, err := consulAs(t, c, n, "").ACL().Bootstrap()
	if err != nil {
		t.Fatal(err)
	}
	mgmt := consulAs(t, c, n, boot.SecretID)
	for _, k := range []string{"app/a", "app/b", "secret/s"} {
		if _, err := mgmt.KV().Put(&consul.KVPair{Key: k, Value: []byte(k)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	pol, _, err := mgmt.ACL().PolicyCreate(&consul.ACLPolicy{Name: "reader", Rules: `key_prefix "app/" { policy = "read" }`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := mgmt.ACL().TokenCreate(&consul.ACLToken{Policies: []*consul.ACLTokenPolicyLink{{ID: pol.ID}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kv := lodestonepb.NewKVClient(grpcAs(t, c, n, tok.SecretID))
	answered := c.servers[n].metrics.requests.WithLabelValues(lodestonepb.KV_GetStream_FullMethodName, "OK")
	before := testutil.ToFloat64(answered)

	st, err := kv.GetStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	ask := func(keys ...string) (string, error) {
		t.Helper()
		req := &lodestonepb.GetManyRequest{}
		for _, k := range keys {
			req.Keys = append(req.Keys, []byte(k))
		}
		if err := st.Send(req); err != nil {
			t.Fatalf("send %q: %v", keys, err)
		}
		resp, err := st.Recv()
		if err != nil {
			return "", err
		}
		return fmt.Sprint(described(resp.Results, func(kv *lodestonepb.KeyValue) string { return string(kv.Value) })), nil
	}
	for range 2 {
		if got, err := ask("app/a", "app/missing", "secret/s", "", "app/b"); err != nil || got != "[app/a missing unserved unserved app/b]" {
			t.Fatalf("answered %s, %v; want app/a, missing, secret/s and the empty key unserved, app/b", got, err)
		}
	}
	if got := testutil.ToFloat64(answered) - before; got != 2 {
		t.Errorf("GetStream answers counted: %v, want 2", got)
	}

	pol.Rules = `key "app/a" { policy = "read" }`
	if _, _, err := mgmt.ACL().PolicyUpdate(pol, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := ask("app/a", "app/b"); err != nil || got != "[app/a unserved]" {
		t.Errorf("after the policy narrowed: %s, %v; want app/a and app/b unserved", got, err)
	}
	if _, err := mgmt.ACL().TokenDelete(tok.AccessorID, nil); err != nil {
		t.Fatal(err)
	}
	denied := c.servers[n].metrics.requests.WithLabelValues(lodestonepb.KV_GetStream_FullMethodName, "PermissionDenied")
	deniedBefore := testutil.ToFloat64(denied)
	if got, err := ask("app/a"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("after the token was deleted: %s, %v; want PermissionDenied", got, err)
	}
	if got := testutil.ToFloat64(denied) - deniedBefore; got != 1 {
		t.Errorf("GetStream requests counted PermissionDenied: %v, want 1", got)
	}

	st, err = lodestonepb.NewKVClient(grpcAs(t, c, n, boot.SecretID)).GetStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ask("a", "b", "c", "d", "e", "f", "g"); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "max-txn-ops") {
		t.Errorf("7 keys: %v, want InvalidArgument naming max-txn-ops", err)
	}
}

// TestGetStreamAdmitsEachRequest: under a read limit each request of a
// GetStream takes a token for each key, as a GetMany does, and one over
// the limit ends the stream RESOURCE_EXHAUSTED with a retry hint, counted
// as a refused GetStream request.
func TestGetStreamAdmitsEachRequest(t *testing.T) {
	c := newTestCluster(t, 1)
	n := c.names[0]
	if err := retryUnavailable(t, func(ctx context.Context) error {
		_, err := lodestonepb.NewAdminClient(c.conn(n)).SetAdmission(ctx, &lodestonepb.SetAdmissionRequest{Policy: &lodestonepb.AdmissionPolicy{Enabled: true, Reads: 5}})
		return err
	}); err != nil {
		t.Fatalf("set admission: %v", err)
	}
	st, err := c.kv(n).GetStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	six := &lodestonepb.GetManyRequest{Keys: bytes.Fields([]byte("a b c d e f"))}
	if err := st.Send(six); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatalf("6 keys with a full bucket of 5: %v, want admitted", err)
	}
	if err := st.Send(six); err != nil {
		t.Fatal(err)
	}
	refused := c.servers[n].metrics.requests.WithLabelValues(lodestonepb.KV_GetStream_FullMethodName, "ResourceExhausted")
	before := testutil.ToFloat64(refused)
	if _, err := st.Recv(); status.Code(err) != codes.ResourceExhausted || retryHintOf(err) <= 0 {
		t.Errorf("6 more keys at once: %v, want RESOURCE_EXHAUSTED with a retry hint", err)
	}
	if got := testutil.ToFloat64(refused) - before; got != 1 {
		t.Errorf("GetStream requests counted ResourceExhausted: %v, want 1", got)
	}
}

// TestGetStreamEndsWhenServerCloses: a GetStream waiting for its next
// request ends Unavailable, saying why, when the server closes, instead
// of holding the graceful stop until its grace period (5 s) runs out.
func TestGetStreamEndsWhenServerCloses(t *testing.T) {
	c := newTestCluster(t, 1)
	n := c.names[0]
	put(t, c.kv(n), "k", "v")
	st, err := c.kv(n).GetStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&lodestonepb.GetManyRequest{Keys: [][]byte{[]byte("k")}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := st.Recv(); err != nil || string(resp.Results[0].GetKv().GetValue()) != "v" {
		t.Fatalf("get k: %v, %v", resp, err)
	}
	began := time.Now()
	if err := c.servers[n].Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took >= 5*time.Second {
		t.Errorf("the server took %v to close with an idle GetStream open: its grace period ran out", took)
	}
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("the idle stream ended with %v, want Unavailable saying the server is shutting down", err)
	}
}
