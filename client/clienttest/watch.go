package clienttest

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// WatchFaults makes a WatchLog's streams misbehave in the ways a real
// cluster can, so tests can check that a client resumes correctly. The
// zero value is a well-behaved server.
type WatchFaults struct {
	// BreakAfterEvents ends each stream with Unavailable once it has sent
	// at least this many events (0: never), like a server dying mid-stream.
	BreakAfterEvents int
	// ResyncAfterEvents cancels a watch with resync_index once it has been
	// sent this many events since it was created (0: never), like a hub
	// cutting a slow watcher loose.
	ResyncAfterEvents int
	// ReplayOverlap makes a create with start_index S replay from S-overlap
	// instead of S: an at-least-once server whose duplicates the client
	// must drop.
	ReplayOverlap uint64
	// NoCreatedIndex leaves index unset on created responses.
	NoCreatedIndex bool
	// Silent accepts streams and Status calls and never answers (a
	// black-holed server).
	Silent bool
	// NoLeader makes Status answer with no leader (a member cut off from
	// the cluster).
	NoLeader bool
	// MaxEventsPerResponse caps the events of one response (whole indices
	// are never split; 0: no cap).
	MaxEventsPerResponse int
}

// WatchLog is an in-memory event history that serves the Watch service of
// watch.proto: creates with start_index replay from the history, then
// events follow live; WatchProgress answers every watch of the stream with
// the current index; Compact makes older start indices fail with
// compacted_index. Several Servers may serve one WatchLog, like the members
// of a cluster sharing one Raft log. It is safe for concurrent use.
type WatchLog struct {
	mu      sync.Mutex
	index   uint64
	events  []*lodestonepb.Event // every event, in index order
	oldest  uint64               // smallest start_index accepted (0: all)
	changed chan struct{}        // closed and replaced on every append
	faults  WatchFaults
	streams int
	creates []*lodestonepb.WatchCreate
	created chan struct{} // closed and replaced on every create
}

// NewWatchLog returns an empty history at index 0.
func NewWatchLog() *WatchLog {
	return &WatchLog{changed: make(chan struct{}), created: make(chan struct{})}
}

// SetFaults replaces the faults; streams opened later use them.
func (l *WatchLog) SetFaults(f WatchFaults) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.faults = f
}

// Put records a put of each key=value pair (kvs alternates keys and
// values) at one new index, and returns it.
func (l *WatchLog) Put(kvs ...string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.index++
	for i := 0; i+1 < len(kvs); i += 2 {
		l.events = append(l.events, &lodestonepb.Event{Type: lodestonepb.Event_PUT, Kv: &lodestonepb.KeyValue{
			Key: []byte(kvs[i]), Value: []byte(kvs[i+1]), CreateIndex: l.index, ModifyIndex: l.index}})
	}
	l.notifyLocked()
	return l.index
}

// Delete records a delete of key at a new index and returns it.
func (l *WatchLog) Delete(key string) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.index++
	l.events = append(l.events, &lodestonepb.Event{Type: lodestonepb.Event_DELETE, Kv: &lodestonepb.KeyValue{Key: []byte(key), ModifyIndex: l.index}})
	l.notifyLocked()
	return l.index
}

// Skip advances the index without events (an entry that touched nothing
// watched, e.g. a membership change).
func (l *WatchLog) Skip() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.index++
	l.notifyLocked()
	return l.index
}

// Compact refuses start indices below oldest from now on.
func (l *WatchLog) Compact(oldest uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.oldest = oldest
}

// Index returns the newest index.
func (l *WatchLog) Index() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.index
}

// Streams returns how many Watch streams were opened.
func (l *WatchLog) Streams() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.streams
}

// Creates returns every WatchCreate received, in order.
func (l *WatchLog) Creates() []*lodestonepb.WatchCreate {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*lodestonepb.WatchCreate(nil), l.creates...)
}

// WaitCreate waits until a stream has taken a create for key: a watch
// from now starts at the index the log had then, so a test that writes
// for it must write after that.
func (l *WatchLog) WaitCreate(ctx context.Context, key string) error {
	for {
		l.mu.Lock()
		created := l.created
		for _, c := range l.creates {
			if string(c.GetKey()) == key {
				l.mu.Unlock()
				return nil
			}
		}
		l.mu.Unlock()
		select {
		case <-created:
		case <-ctx.Done():
			return fmt.Errorf("no create for %q: %w", key, ctx.Err())
		}
	}
}

func (l *WatchLog) notifyLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Funcs returns Funcs serving Watch from l, and a Status that reports
// leader 1 at l's index (see WatchFaults.Silent and NoLeader).
func (l *WatchLog) Funcs() *Funcs { return &Funcs{Watch: l.Serve, Status: l.status} }

func (l *WatchLog) status(ctx context.Context, _ *lodestonepb.StatusRequest) (*lodestonepb.StatusResponse, error) {
	l.mu.Lock()
	f, idx := l.faults, l.index
	l.mu.Unlock()
	if f.Silent {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	var leader uint64 = 1
	if f.NoLeader {
		leader = 0
	}
	return &lodestonepb.StatusResponse{
		Header:   &lodestonepb.ResponseHeader{Index: idx, LeaderId: leader, NodeId: 1, KnownLeader: leader != 0},
		LeaderId: leader, CommitIndex: idx, AppliedIndex: idx,
	}, nil
}

// fakeWatcher is one watch on a stream.
type fakeWatcher struct {
	create *lodestonepb.WatchCreate
	pos    uint64 // every matching event ≤ pos was sent
	sent   int    // events sent since creation
}

func (w *fakeWatcher) matches(ev *lodestonepb.Event) bool {
	k := string(ev.GetKv().GetKey())
	key := string(w.create.GetKey())
	if w.create.GetPrefix() {
		if !strings.HasPrefix(k, key) {
			return false
		}
	} else if k != key {
		return false
	}
	switch ev.GetType() {
	case lodestonepb.Event_PUT:
		return !w.create.GetNoPut()
	case lodestonepb.Event_DELETE:
		return !w.create.GetNoDelete()
	}
	return true
}

// Serve serves one Watch stream from l; use it as Funcs.Watch.
func (l *WatchLog) Serve(stream lodestonepb.Watch_WatchServer) error {
	ctx := stream.Context()
	l.mu.Lock()
	l.streams++
	faults := l.faults
	l.mu.Unlock()
	if faults.Silent {
		<-ctx.Done()
		return ctx.Err()
	}

	reqs := make(chan *lodestonepb.WatchRequest)
	recvErr := make(chan error, 1)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The receiver ends when the handler has returned (gRPC then fails
	// Recv), so the handler must not wait for it.
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- r:
			case <-ctx.Done():
				return
			}
		}
	}()

	watchers := map[int64]*fakeWatcher{}
	sentOnStream := 0
	for {
		l.mu.Lock()
		changed, now, oldest := l.changed, l.index, l.oldest
		l.mu.Unlock()
		// Catch every watcher up to now.
		for id, w := range watchers {
			for w.pos < now {
				resp, n := l.next(w, now, faults.MaxEventsPerResponse)
				resp.WatchId = id
				if err := stream.Send(resp); err != nil {
					return err
				}
				w.sent += n
				sentOnStream += n
				if faults.BreakAfterEvents > 0 && sentOnStream >= faults.BreakAfterEvents {
					return status.Error(codes.Unavailable, "clienttest: watch stream broken")
				}
				if faults.ResyncAfterEvents > 0 && w.sent >= faults.ResyncAfterEvents {
					delete(watchers, id)
					if err := stream.Send(&lodestonepb.WatchResponse{WatchId: id, Canceled: true,
						CancelReason: "clienttest: resync", ResyncIndex: w.pos}); err != nil {
						return err
					}
					break
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			return err
		case <-changed:
		case r := <-reqs:
			switch {
			case r.GetCreate() != nil:
				c := r.GetCreate()
				l.mu.Lock()
				l.creates = append(l.creates, c)
				close(l.created)
				l.created = make(chan struct{})
				l.mu.Unlock()
				header := &lodestonepb.ResponseHeader{Index: now, LeaderId: 1, NodeId: 1, KnownLeader: true}
				if c.GetStartIndex() > 0 && c.GetStartIndex() < oldest {
					if err := stream.Send(&lodestonepb.WatchResponse{Header: header, WatchId: c.GetWatchId(), Canceled: true,
						CancelReason: "clienttest: compacted", CompactedIndex: oldest}); err != nil {
						return err
					}
					continue
				}
				if len(c.GetKey()) == 0 && !c.GetPrefix() {
					if err := stream.Send(&lodestonepb.WatchResponse{Header: header, WatchId: c.GetWatchId(), Canceled: true,
						CancelReason: "clienttest: empty key without prefix"}); err != nil {
						return err
					}
					continue
				}
				w := &fakeWatcher{create: c, pos: now}
				if c.GetStartIndex() > 0 {
					w.pos = c.GetStartIndex() - min(faults.ReplayOverlap, c.GetStartIndex())
				}
				watchers[c.GetWatchId()] = w
				created := &lodestonepb.WatchResponse{Header: header, WatchId: c.GetWatchId(), Created: true}
				if !faults.NoCreatedIndex && c.GetStartIndex() == 0 {
					created.Index = now
				}
				if err := stream.Send(created); err != nil {
					return err
				}
			case r.GetCancel() != nil:
				id := r.GetCancel().GetWatchId()
				if _, ok := watchers[id]; ok {
					delete(watchers, id)
					if err := stream.Send(&lodestonepb.WatchResponse{WatchId: id, Canceled: true, CancelReason: "canceled by the client"}); err != nil {
						return err
					}
				}
			case r.GetProgress() != nil:
				for id, w := range watchers {
					if w.pos < now {
						continue // the catch-up above answers it
					}
					if err := stream.Send(&lodestonepb.WatchResponse{WatchId: id, Index: w.pos}); err != nil {
						return err
					}
				}
			}
		}
	}
}

// next builds the next response for w: the matching events of whole
// indices after w.pos up to now (at most max events unless one index holds
// more), and advances w.pos. n is the number of events in it.
func (l *WatchLog) next(w *fakeWatcher, now uint64, max int) (*lodestonepb.WatchResponse, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	resp := &lodestonepb.WatchResponse{}
	// First event after w.pos (events are in index order).
	lo, hi := 0, len(l.events)
	for lo < hi {
		mid := (lo + hi) / 2
		if l.events[mid].GetKv().GetModifyIndex() <= w.pos {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	upTo := now
	for i := lo; i < len(l.events); i++ {
		ev := l.events[i]
		idx := ev.GetKv().GetModifyIndex()
		if idx > now {
			break
		}
		if max > 0 && len(resp.Events) >= max && idx != resp.Events[len(resp.Events)-1].GetKv().GetModifyIndex() {
			upTo = idx - 1
			break
		}
		if !w.matches(ev) {
			continue
		}
		e := &lodestonepb.Event{Type: ev.Type, Kv: ev.Kv}
		if w.create.GetPrevKv() {
			e.PrevKv = &lodestonepb.KeyValue{Key: ev.Kv.Key}
		}
		resp.Events = append(resp.Events, e)
	}
	resp.Index = upTo
	w.pos = upTo
	return resp, len(resp.Events)
}

// Events returns the events a watch on key (with prefix: every key under
// it) should see after index after: the reference a test compares a
// watch's output with.
func (l *WatchLog) Events(key string, prefix bool, after uint64) []*lodestonepb.Event {
	w := &fakeWatcher{create: &lodestonepb.WatchCreate{Key: []byte(key), Prefix: prefix}}
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*lodestonepb.Event
	for _, ev := range l.events {
		if ev.GetKv().GetModifyIndex() > after && w.matches(ev) {
			out = append(out, ev)
		}
	}
	return out
}
