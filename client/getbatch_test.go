package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client/clienttest"
)

// heldServer answers Get and GetMany with the key as the value; the first
// Get waits in the server until release is closed, so the Gets made
// meanwhile queue behind it. GetMany answers with manyErr when set, and
// leaves the key "unserved" unserved.
type heldServer struct {
	entered, release chan struct{}
	first            atomic.Bool
	manyErr          error

	mu      sync.Mutex
	gets    []string
	getMany [][]string
}

func newHeldServer(t *testing.T) (*heldServer, *Client) {
	h := &heldServer{entered: make(chan struct{}), release: make(chan struct{})}
	srv := clienttest.Start(t, &clienttest.Funcs{Get: h.get, GetMany: h.many})
	c, err := New(fastRetry(srv.Addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return h, c
}

func (h *heldServer) get(_ context.Context, r *lodestonepb.GetRequest) (*lodestonepb.GetResponse, error) {
	h.mu.Lock()
	h.gets = append(h.gets, string(r.Key))
	h.mu.Unlock()
	if h.first.CompareAndSwap(false, true) {
		close(h.entered)
		<-h.release
	}
	return &lodestonepb.GetResponse{Header: &lodestonepb.ResponseHeader{Index: 7}, Kv: &lodestonepb.KeyValue{Key: r.Key, Value: r.Key}}, nil
}

func (h *heldServer) many(_ context.Context, r *lodestonepb.GetManyRequest) (*lodestonepb.GetManyResponse, error) {
	var keys []string
	resp := &lodestonepb.GetManyResponse{Header: &lodestonepb.ResponseHeader{Index: 8}}
	for _, k := range r.Keys {
		keys = append(keys, string(k))
		res := &lodestonepb.GetManyResult{Served: string(k) != "unserved"}
		if res.Served {
			res.Kv = &lodestonepb.KeyValue{Key: k, Value: k}
		}
		resp.Results = append(resp.Results, res)
	}
	h.mu.Lock()
	h.getMany = append(h.getMany, keys)
	h.mu.Unlock()
	if h.manyErr != nil {
		return nil, h.manyErr
	}
	return resp, nil
}

func (h *heldServer) calls() (gets []string, getMany [][]string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.gets...), append([][]string(nil), h.getMany...)
}

// waitQueued waits until n Gets wait in c's linearizable queue.
func waitQueued(t *testing.T, c *Client, n int) {
	t.Helper()
	b := c.gets[lodestonepb.Consistency_LINEARIZABLE]
	for deadline := time.Now().Add(5 * time.Second); ; {
		b.mu.Lock()
		got := len(b.queue)
		b.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d Gets queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

type getResult struct {
	key  string
	resp *lodestonepb.GetResponse
	err  error
}

// startGets starts a Get of each key with ctx; their results arrive on
// the channel.
func startGets(ctx context.Context, c *Client, keys ...string) <-chan getResult {
	out := make(chan getResult, len(keys))
	for _, k := range keys {
		go func() {
			resp, err := c.Get(ctx, k)
			out <- getResult{k, resp, err}
		}()
	}
	return out
}

// TestGetsCoalesce: Gets made while one is in flight wait for it and go
// as one GetMany; a key it did not serve is asked for alone; then the
// turn is free and a Get goes alone at once.
func TestGetsCoalesce(t *testing.T) {
	h, c := newHeldServer(t)
	ctx := testCtx(t, 10*time.Second)
	first := startGets(ctx, c, "k0")
	<-h.entered
	queued := []string{"k1", "k2", "unserved", "k3"}
	rest := startGets(ctx, c, queued...)
	waitQueued(t, c, len(queued))
	close(h.release)

	for range len(queued) + 1 {
		var r getResult
		select {
		case r = <-first:
		case r = <-rest:
		}
		if r.err != nil || string(r.resp.GetKv().GetValue()) != r.key {
			t.Fatalf("Get %q: %v, %v", r.key, r.resp, r.err)
		}
	}
	gets, many := h.calls()
	if len(many) != 1 || len(many[0]) != len(queued) {
		t.Fatalf("GetMany calls %q, want one of the %d queued keys", many, len(queued))
	}
	if fmt.Sprint(gets) != "[k0 unserved]" {
		t.Fatalf("Gets %q, want k0 (the first) and unserved (asked alone)", gets)
	}
	if _, err := c.Get(ctx, "k4"); err != nil {
		t.Fatal(err)
	}
	if gets, many := h.calls(); len(gets) != 3 || len(many) != 1 {
		t.Fatalf("after the batch a Get went as %d Gets and %d GetManys, want alone", len(gets)-2, len(many)-1)
	}
}

// TestGetManyRefusedAsAWhole: an error the servers gave the GetMany is
// each Get's error, under its own name, except Unimplemented (a server
// that predates GetMany): then each Get goes alone and the client stops
// coalescing.
func TestGetManyRefusedAsAWhole(t *testing.T) {
	for _, tc := range []struct {
		code        codes.Code
		alone       bool
		sentinel    error
		coalescePre bool
	}{
		{codes.PermissionDenied, false, ErrPermissionDenied, true},
		{codes.Unimplemented, true, nil, false},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			h, c := newHeldServer(t)
			h.manyErr = status.Error(tc.code, "refused")
			ctx := testCtx(t, 10*time.Second)
			first := startGets(ctx, c, "k0")
			<-h.entered
			rest := startGets(ctx, c, "k1", "k2")
			waitQueued(t, c, 2)
			close(h.release)
			<-first
			for range 2 {
				r := <-rest
				switch {
				case tc.alone && r.err != nil:
					t.Errorf("Get %q: %v, want it answered alone", r.key, r.err)
				case !tc.alone && !errors.Is(r.err, tc.sentinel):
					t.Errorf("Get %q: %v, want %v", r.key, r.err, tc.sentinel)
				case !tc.alone && r.err.(*Error).Op != fmt.Sprintf("get %q", r.key):
					t.Errorf("Get %q: error names %q", r.key, r.err.(*Error).Op)
				}
			}
			if got := !c.getManyOff.Load(); got != tc.coalescePre {
				t.Errorf("still coalescing: %v, want %v", got, tc.coalescePre)
			}
		})
	}
}

// TestGetWithMetadataGoesAlone: a Get whose ctx carries metadata of its
// own does not queue behind one in flight: a GetMany would not carry it.
func TestGetWithMetadataGoesAlone(t *testing.T) {
	h, c := newHeldServer(t)
	ctx := testCtx(t, 10*time.Second)
	first := startGets(ctx, c, "k0")
	<-h.entered
	own := metadata.AppendToOutgoingContext(ctx, "x-consul-token", "its-own")
	if _, err := c.Get(own, "k1"); err != nil {
		t.Fatalf("Get with metadata while one is in flight: %v", err)
	}
	close(h.release)
	<-first
	if gets, many := h.calls(); fmt.Sprint(gets) != "[k0 k1]" || len(many) != 0 {
		t.Fatalf("Gets %q, GetManys %q: want k1 alone beside k0", gets, many)
	}
}

// TestQueuedGetLeaves: a queued Get whose ctx ends returns its ctx error
// at once; the others are answered, and the turn is not lost with it.
func TestQueuedGetLeaves(t *testing.T) {
	h, c := newHeldServer(t)
	ctx := testCtx(t, 10*time.Second)
	first := startGets(ctx, c, "k0")
	<-h.entered
	short, cancel := context.WithCancel(ctx)
	left := startGets(short, c, "gone")
	waitQueued(t, c, 1)
	stays := startGets(ctx, c, "k1")
	waitQueued(t, c, 2)
	cancel()
	if r := <-left; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the Get that left: %v, want context.Canceled", r.err)
	}
	close(h.release)
	<-first
	if r := <-stays; r.err != nil {
		t.Fatalf("Get k1: %v", r.err)
	}
	if _, err := c.Get(ctx, "k2"); err != nil {
		t.Fatal(err)
	}
	gets, many := h.calls()
	if fmt.Sprint(gets) != "[k0 k1 k2]" || len(many) != 0 {
		t.Fatalf("Gets %q, GetManys %q: want k0, k1 and k2 each alone", gets, many)
	}
}
