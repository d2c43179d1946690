package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/grpcopt"
	"github.com/lodestone-kv/lodestone/watch"
)

// inProcessStream is a Watch stream served without a network, so a test
// can act while the server is inside a send: it hands the server the
// requests on reqs and puts each response it sends on sent, after calling
// onSend (if set) with it.
type inProcessStream struct {
	grpc.ServerStream // nil: Watch uses only the methods below
	ctx               context.Context
	reqs              chan *lodestonepb.WatchRequest
	sent              chan sentResponse
	onSend            func(*lodestonepb.WatchResponse)
}

type sentResponse struct {
	at   time.Time // when the server began sending it
	resp *lodestonepb.WatchResponse
}

func (s *inProcessStream) Context() context.Context { return s.ctx }

func (s *inProcessStream) Recv() (*lodestonepb.WatchRequest, error) {
	select {
	case req := <-s.reqs:
		return req, nil
	case <-s.ctx.Done():
		return nil, s.ctx.Err()
	}
}

func (s *inProcessStream) Send(resp *lodestonepb.WatchResponse) error {
	return s.record(time.Now(), resp)
}

func (s *inProcessStream) SendMsg(m any) error {
	at := time.Now()
	wire, ok := m.(grpcopt.Encoded)
	if !ok {
		return fmt.Errorf("in-process stream: cannot send a %T", m)
	}
	resp := new(lodestonepb.WatchResponse)
	if err := proto.Unmarshal(wire, resp); err != nil {
		return err
	}
	return s.record(at, resp)
}

func (s *inProcessStream) record(at time.Time, resp *lodestonepb.WatchResponse) error {
	if s.onSend != nil {
		s.onSend(resp)
	}
	select {
	case s.sent <- sentResponse{at, resp}:
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

func (s *inProcessStream) next(t *testing.T) sentResponse {
	t.Helper()
	select {
	case r := <-s.sent:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no watch response in 10s")
		return sentResponse{}
	}
}

// A delivery round sends what a watch had when the round reached it: an
// event that comes while the round's response is being written goes out
// in the next round, on the grid, not in a second message at once. (That
// second message let a busy stream send more than one message a busy
// interval.)
func TestWatchRoundSendsAWatchOnce(t *testing.T) {
	const grid = time.Second
	c := newTestCluster(t, 1, func(cfg *Config) {
		cfg.Watch.Shards = 1 // the probe below shares the stream's shard
		cfg.WatchDeliveryInterval = grid
		cfg.WatchBusyDeliveryInterval = 0
	})
	lead := c.waitLeader()
	srv := c.servers[lead]
	kv := c.kv(lead)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()

	st := &inProcessStream{ctx: ctx, reqs: make(chan *lodestonepb.WatchRequest, 1), sent: make(chan sentResponse, 8)}
	// While the round sends w/1, w/2 is written and reaches the watch:
	// once the probe, a watcher in the same shard, has it, so does the
	// watch.
	st.onSend = func(resp *lodestonepb.WatchResponse) {
		if len(resp.Events) != 1 || string(resp.Events[0].Kv.Key) != "w/1" {
			return
		}
		probe, err := srv.hub.Watch(ctx, watch.Request{Key: "w/2", FromNow: true})
		if err != nil {
			t.Errorf("probe watcher: %v", err)
			return
		}
		defer probe.Close()
		if _, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: []byte("w/2"), Value: []byte("v")}); err != nil {
			t.Errorf("put w/2: %v", err)
			return
		}
		if _, err := probe.Next(ctx); err != nil {
			t.Errorf("probe: %v", err)
		}
	}
	served := make(chan error, 1)
	go func() { served <- (&watchService{s: srv.core}).Watch(st) }()

	st.reqs <- &lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Create{Create: &lodestonepb.WatchCreate{WatchId: 1, Key: []byte("w/"), Prefix: true}}}
	if r := st.next(t); !r.resp.Created {
		t.Fatalf("got %v, want the watch created", r.resp)
	}
	put(t, kv, "w/1", "v")
	first, second := st.next(t), st.next(t)
	for i, r := range []sentResponse{first, second} {
		want := fmt.Sprintf("w/%d", i+1)
		if len(r.resp.Events) != 1 || string(r.resp.Events[0].Kv.Key) != want {
			t.Fatalf("response %d: %v, want the one event for %s", i+1, r.resp, want)
		}
	}
	// The next grid point after the first send, less a margin for the
	// wall clock against the timers' monotonic one.
	next := first.at.Truncate(grid).Add(grid)
	if second.at.Before(next.Add(-grid / 10)) {
		t.Errorf("w/2 went out %v after w/1, before the next grid point (%v later): want it in the next round",
			second.at.Sub(first.at).Round(time.Millisecond), next.Sub(first.at).Round(time.Millisecond))
	}
	cancel()
	if err := <-served; err != nil && ctx.Err() == nil {
		t.Fatal(err)
	}
}
