package client

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client/clienttest"
)

// streamServer answers each request of a GetStream with its keys as
// values. A request for "hold" is answered once release is closed; one
// for "fail" ends the stream Unavailable.
type streamServer struct {
	opened, many atomic.Int32
	release      chan struct{}
}

func (s *streamServer) serve(st lodestonepb.KV_GetStreamServer) error {
	s.opened.Add(1)
	for {
		req, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		resp := &lodestonepb.GetManyResponse{Header: &lodestonepb.ResponseHeader{Index: 9}}
		for _, k := range req.Keys {
			switch string(k) {
			case "hold":
				select {
				case <-s.release:
				case <-st.Context().Done():
					return st.Context().Err()
				}
			case "fail":
				return status.Error(codes.Unavailable, "scripted")
			}
			resp.Results = append(resp.Results, &lodestonepb.GetManyResult{Served: true, Kv: &lodestonepb.KeyValue{Key: k, Value: k}})
		}
		if err := st.Send(resp); err != nil {
			return err
		}
	}
}

func (s *streamServer) getMany(context.Context, *lodestonepb.GetManyRequest) (*lodestonepb.GetManyResponse, error) {
	s.many.Add(1)
	return &lodestonepb.GetManyResponse{}, nil
}

// batcherOf starts a server answering f and returns a Client of it, its
// linearizable batcher and its connection.
func batcherOf(t *testing.T, f *clienttest.Funcs) (*Client, *getBatcher, *grpc.ClientConn) {
	t.Helper()
	srv := clienttest.Start(t, f)
	c, err := New(fastRetry(srv.Addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cc, err := c.acquire(srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.release(srv.Addr, cc) })
	return c, c.gets[lodestonepb.Consistency_LINEARIZABLE], cc
}

// TestBatchesShareAStream: a batcher's batches go on one GetStream while
// they succeed; a batch out of time or a stream the server ended closes
// it, and the next batch opens another. No batch goes as a GetMany.
func TestBatchesShareAStream(t *testing.T) {
	s := &streamServer{release: make(chan struct{})}
	c, b, cc := batcherOf(t, &clienttest.Funcs{GetStream: s.serve, GetMany: s.getMany})
	ask := func(ctx context.Context, keys ...string) (string, error) {
		req := &lodestonepb.GetManyRequest{}
		for _, k := range keys {
			req.Keys = append(req.Keys, []byte(k))
		}
		resp, err := b.batchOn(ctx, cc, req)
		var got string
		for _, r := range resp.GetResults() {
			got += string(r.GetKv().GetValue())
		}
		return got, err
	}
	ctx := testCtx(t, 10*time.Second)
	for _, keys := range [][]string{{"a", "b"}, {"c"}, {"d", "e", "f"}} {
		if got, err := ask(ctx, keys...); err != nil || len(got) != len(keys) || got[0] != keys[0][0] {
			t.Fatalf("batch %q: %q, %v", keys, got, err)
		}
	}
	if got := s.opened.Load(); got != 1 {
		t.Errorf("three batches opened %d streams, want 1", got)
	}

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := ask(short, "hold"); status.Code(err) != codes.DeadlineExceeded || b.stream != nil {
		t.Fatalf("a batch out of time: %v, stream kept %v; want DeadlineExceeded and the stream closed", err, b.stream != nil)
	}
	close(s.release)
	if got, err := ask(ctx, "g"); err != nil || got != "g" || s.opened.Load() != 2 {
		t.Fatalf("the batch after it: %q, %v on stream %d; want g on a second stream", got, err, s.opened.Load())
	}
	if _, err := ask(ctx, "fail"); status.Code(err) != codes.Unavailable || b.stream != nil {
		t.Fatalf("a stream the server ended: %v, stream kept %v; want Unavailable and the stream closed", err, b.stream != nil)
	}
	if got, err := ask(ctx, "h"); err != nil || got != "h" || s.opened.Load() != 3 {
		t.Fatalf("the batch after it: %q, %v on stream %d; want h on a third stream", got, err, s.opened.Load())
	}
	if s.many.Load() != 0 || c.getStreamOff.Load() {
		t.Errorf("GetMany calls %d, streams off %v; want none and on", s.many.Load(), c.getStreamOff.Load())
	}
}

// TestBatchesWithoutGetStream: a server that predates GetStream answers
// Unimplemented; the batch goes as a GetMany, and so do the ones after it.
func TestBatchesWithoutGetStream(t *testing.T) {
	s := &streamServer{}
	c, b, cc := batcherOf(t, &clienttest.Funcs{GetMany: s.getMany})
	for range 2 {
		if _, err := b.batchOn(testCtx(t, 10*time.Second), cc, &lodestonepb.GetManyRequest{Keys: [][]byte{[]byte("a")}}); err != nil {
			t.Fatal(err)
		}
	}
	if s.many.Load() != 2 || !c.getStreamOff.Load() {
		t.Errorf("GetMany calls %d, streams off %v; want 2 and off", s.many.Load(), c.getStreamOff.Load())
	}
}
