// Package broadcast is the anti-pattern watchbench compares Lodestone's
// sharded watch hub against: a store whose every change is fanned out to
// every subscriber through ONE shared Go channel and ONE mutex, the shape
// of the streaming fan-out in the Consul outage of Roblox's public
// post-mortem of October 2021 ("contention on a single Go channel ...
// causes blocking during writes").
//
// It serves Lodestone's own gRPC API (KV.Put and Watch, nothing else), so
// the benchmark drives it with the very code it drives Lodestone with.
//
// How a change travels, and where it waits:
//
//  1. Put takes the write lock, stamps the next index, and sends the event
//     on the shared bus channel while still holding the lock (so indices
//     reach the bus in order). A full bus blocks the writer, and every
//     writer behind it.
//  2. One fan-out goroutine reads the bus and, holding the subscription
//     mutex, finds the subscribers by key (an exact-key map plus the list
//     of prefix subscribers — indexed, so this is no straw man) and sends
//     the event to each subscriber's stream channel, blocking while that
//     channel is full. A slow stream therefore stalls the fan-out, the bus
//     and the writers; creating or canceling a watch waits for the mutex
//     too.
//  3. Each stream has one sender goroutine draining its channel into
//     gRPC.
//
// There is no replication and no fsync: what is compared is how write
// latency and delivery lag grow with watchers, not their absolute values.
package broadcast

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Config sizes the shared channel and the per-stream channels.
type Config struct {
	// Bus is the capacity of the one shared event channel. Default 1024.
	Bus int
	// StreamBuffer is the capacity of each stream's channel. Default 256.
	StreamBuffer int
}

// Server is the broadcaster. Create it with New, serve it with
// lodestonepb.RegisterKVServer and RegisterWatchServer, and Close it after
// the gRPC server has stopped.
type Server struct {
	lodestonepb.UnimplementedKVServer
	lodestonepb.UnimplementedWatchServer

	cfg Config
	bus chan *lodestonepb.Event // THE shared channel
	wg  sync.WaitGroup

	writeMu sync.Mutex // serializes writers: index order on the bus
	index   uint64

	mu     sync.Mutex // THE subscription mutex, held for every fan-out
	exact  map[string]map[*sub]struct{}
	prefix map[*sub]struct{}
}

// sub is one watch: which stream it belongs to and what it selects.
type sub struct {
	st     *stream
	id     int64
	key    string
	prefix bool
}

// stream is one Watch RPC: its channel and when it ended.
type stream struct {
	out  chan *lodestonepb.WatchResponse
	done chan struct{}
}

// New starts the fan-out goroutine.
func New(cfg Config) *Server {
	if cfg.Bus <= 0 {
		cfg.Bus = 1024
	}
	if cfg.StreamBuffer <= 0 {
		cfg.StreamBuffer = 256
	}
	s := &Server{cfg: cfg, bus: make(chan *lodestonepb.Event, cfg.Bus),
		exact: map[string]map[*sub]struct{}{}, prefix: map[*sub]struct{}{}}
	s.wg.Add(1)
	go s.fanOut()
	return s
}

// Close stops the fan-out goroutine. No Put may run during or after it.
func (s *Server) Close() {
	close(s.bus)
	s.wg.Wait()
}

// Put stamps the next index and publishes the change on the shared bus.
func (s *Server) Put(ctx context.Context, r *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error) {
	if len(r.GetKey()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "empty key")
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.index++
	kv := &lodestonepb.KeyValue{Key: r.GetKey(), Value: r.GetValue(), Flags: r.GetFlags(), ModifyIndex: s.index, CreateIndex: s.index}
	select {
	case s.bus <- &lodestonepb.Event{Type: lodestonepb.Event_PUT, Kv: kv}:
	case <-ctx.Done():
		// The index is spent; like a server that failed after proposing.
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &lodestonepb.PutResponse{Header: &lodestonepb.ResponseHeader{Index: s.index}, Kv: &lodestonepb.KeyValue{
		Key: kv.Key, ModifyIndex: kv.ModifyIndex, CreateIndex: kv.CreateIndex}}, nil
}

// fanOut delivers every bus event to its subscribers, one at a time,
// under the subscription mutex.
func (s *Server) fanOut() {
	defer s.wg.Done()
	for ev := range s.bus {
		key := string(ev.GetKv().GetKey())
		s.mu.Lock()
		for sb := range s.exact[key] {
			s.send(sb, ev)
		}
		for sb := range s.prefix {
			if strings.HasPrefix(key, sb.key) {
				s.send(sb, ev)
			}
		}
		s.mu.Unlock()
	}
}

// send blocks until sb's stream takes the event or ends.
func (s *Server) send(sb *sub, ev *lodestonepb.Event) {
	resp := &lodestonepb.WatchResponse{WatchId: sb.id, Index: ev.GetKv().GetModifyIndex(), Events: []*lodestonepb.Event{ev}}
	select {
	case sb.st.out <- resp:
	case <-sb.st.done:
	}
}

// Watch serves one stream: creates and cancels; progress is ignored.
// start_index is ignored too (every watch is "from now").
func (s *Server) Watch(gs lodestonepb.Watch_WatchServer) error {
	st := &stream{out: make(chan *lodestonepb.WatchResponse, s.cfg.StreamBuffer), done: make(chan struct{})}
	subs := map[int64]*sub{}
	defer func() {
		s.mu.Lock()
		for _, sb := range subs {
			s.unlinkLocked(sb)
		}
		s.mu.Unlock()
	}()
	sendErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case r := <-st.out:
				if err := gs.Send(r); err != nil {
					sendErr <- err
					return
				}
			case <-st.done:
				return
			}
		}
	}()
	defer wg.Wait()
	defer close(st.done)

	reqs := make(chan *lodestonepb.WatchRequest)
	recvErr := make(chan error, 1)
	go func() { // ends when the handler has returned and gRPC fails Recv
		for {
			r, err := gs.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- r:
			case <-gs.Context().Done():
				return
			}
		}
	}()
	for {
		select {
		case err := <-sendErr:
			return err
		case err := <-recvErr:
			if err == io.EOF {
				return nil
			}
			return err
		case <-gs.Context().Done():
			return gs.Context().Err()
		case r := <-reqs:
			var resp *lodestonepb.WatchResponse
			switch {
			case r.GetCreate() != nil:
				c := r.GetCreate()
				sb := &sub{st: st, id: c.GetWatchId(), key: string(c.GetKey()), prefix: c.GetPrefix()}
				if _, dup := subs[sb.id]; dup {
					resp = &lodestonepb.WatchResponse{WatchId: sb.id, Canceled: true, CancelReason: "duplicate watch id"}
					break
				}
				subs[sb.id] = sb
				s.mu.Lock()
				s.linkLocked(sb)
				s.mu.Unlock()
				resp = &lodestonepb.WatchResponse{WatchId: sb.id, Created: true}
			case r.GetCancel() != nil:
				id := r.GetCancel().GetWatchId()
				if sb, ok := subs[id]; ok {
					delete(subs, id)
					s.mu.Lock()
					s.unlinkLocked(sb)
					s.mu.Unlock()
				}
				resp = &lodestonepb.WatchResponse{WatchId: id, Canceled: true, CancelReason: "canceled by the client"}
			default:
				continue
			}
			select {
			case st.out <- resp:
			case err := <-sendErr:
				return err
			}
		}
	}
}

func (s *Server) linkLocked(sb *sub) {
	if sb.prefix {
		s.prefix[sb] = struct{}{}
		return
	}
	m := s.exact[sb.key]
	if m == nil {
		m = map[*sub]struct{}{}
		s.exact[sb.key] = m
	}
	m[sb] = struct{}{}
}

func (s *Server) unlinkLocked(sb *sub) {
	if sb.prefix {
		delete(s.prefix, sb)
		return
	}
	delete(s.exact[sb.key], sb)
	if len(s.exact[sb.key]) == 0 {
		delete(s.exact, sb.key)
	}
}

// MetricsHandler serves the Go heap figure watchbench reads
// (go_memstats_heap_alloc_bytes), in the Prometheus text format Lodestone
// and etcd use for it.
func MetricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		fmt.Fprintf(w, "go_memstats_heap_alloc_bytes %d\n", ms.HeapAlloc)
	})
}
