package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client/clienttest"
)

// These tests check the resume contract of client/doc.go ("Watches")
// against clienttest.WatchLog, a fake server with the semantics of
// watch.proto and injectable faults: whatever breaks, a watch returns
// every matching event after its start index exactly once, in index
// order, with each index whole (docs/architecture.md, "Watches have no
// gaps, no duplicates and no reordering", resume continuity included).

// evKey identifies an event for comparisons.
type evKey struct {
	index uint64
	typ   lodestonepb.Event_Type
	key   string
}

func keysOf(evs []*lodestonepb.Event) []evKey {
	out := make([]evKey, 0, len(evs))
	for _, ev := range evs {
		out = append(out, evKey{ev.GetKv().GetModifyIndex(), ev.GetType(), string(ev.GetKv().GetKey())})
	}
	return out
}

// collect reads w until it has n events, checking batch invariants on the
// way: Index never decreases, covers its events, and no index is split
// across batches.
func collect(t *testing.T, w *Watch, n int) []evKey {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got []evKey
	var lastIndex uint64
	for len(got) < n {
		b, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("Next after %d of %d events: %v", len(got), n, err)
		}
		if b.Index < lastIndex {
			t.Fatalf("batch Index went back from %d to %d", lastIndex, b.Index)
		}
		for _, k := range keysOf(b.Events) {
			if k.index > b.Index {
				t.Fatalf("event at %d in a batch with Index %d", k.index, b.Index)
			}
			if k.index <= lastIndex {
				t.Fatalf("event at %d after a batch with Index %d (split index or duplicate)", k.index, lastIndex)
			}
		}
		lastIndex = b.Index
		got = append(got, keysOf(b.Events)...)
	}
	return got
}

// same fails unless got equals want exactly, naming the first difference
// as a gap, a duplicate or a reordering.
func same(t *testing.T, got, want []evKey) {
	t.Helper()
	for i := 0; i < len(got) || i < len(want); i++ {
		switch {
		case i >= len(got):
			t.Fatalf("missing %d events from %v on (gap)", len(want)-i, want[i])
		case i >= len(want):
			t.Fatalf("%d extra events from %v on (duplicates?)", len(got)-i, got[i])
		case got[i] != want[i]:
			t.Fatalf("event %d: got %v, want %v (gap, duplicate or reordering)", i, got[i], want[i])
		}
	}
}

// writeMix writes n entries to l: puts under svc/ (every third one a
// two-key index), deletes, and writes outside the prefix.
func writeMix(l *clienttest.WatchLog, from, n int) {
	for i := from; i < from+n; i++ {
		switch i % 6 {
		case 0:
			l.Put(fmt.Sprintf("svc/a/%d", i), "v", fmt.Sprintf("svc/b/%d", i), "w")
		case 1:
			l.Put(fmt.Sprintf("other/%d", i), "x")
		case 2:
			l.Delete(fmt.Sprintf("svc/a/%d", i-2))
		case 3:
			l.Skip()
		default:
			l.Put(fmt.Sprintf("svc/c/%d", i), strings.Repeat("v", i%7))
		}
	}
}

func newWatchClient(t *testing.T, cfg Config) *Client {
	t.Helper()
	cfg.BackoffBase, cfg.BackoffMax = time.Millisecond, 20*time.Millisecond
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A stream that breaks mid-way (every few events) is resumed from the
// last index seen: no gap, no duplicate.
func TestWatchResumesAfterStreamBreaks(t *testing.T) {
	l := clienttest.NewWatchLog()
	l.SetFaults(clienttest.WatchFaults{BreakAfterEvents: 7, MaxEventsPerResponse: 3})
	srv := clienttest.Start(t, l.Funcs())
	c := newWatchClient(t, Config{Endpoints: []string{srv.Addr}})

	writeMix(l, 0, 30)
	start := l.Index()
	writeMix(l, 30, 60) // replayed from history
	w := c.Watch(context.Background(), "svc/", WatchPrefix(), FromIndex(start))
	defer w.Close()
	got := collect(t, w, 10)
	writeMix(l, 90, 120) // live
	want := keysOf(l.Events("svc/", true, start))
	got = append(got, collect(t, w, len(want)-len(got))...)
	same(t, got, want)
	if n := l.Streams(); n < 5 {
		t.Errorf("streams opened = %d, want several (the fault breaks each after 7 events)", n)
	}
	if got, want := w.Index(), l.Index(); got > want {
		t.Errorf("Index() = %d beyond the log's %d", got, want)
	}
}

// A server that replays from before the requested start index (at least
// once delivery) produces no duplicates: the client drops what it has.
func TestWatchDropsReplayedDuplicates(t *testing.T) {
	l := clienttest.NewWatchLog()
	l.SetFaults(clienttest.WatchFaults{BreakAfterEvents: 9, ReplayOverlap: 6, MaxEventsPerResponse: 2})
	srv := clienttest.Start(t, l.Funcs())
	c := newWatchClient(t, Config{Endpoints: []string{srv.Addr}})

	writeMix(l, 0, 100)
	w := c.Watch(context.Background(), "svc/", WatchPrefix(), FromIndex(3))
	defer w.Close()
	want := keysOf(l.Events("svc/", true, 3))
	same(t, collect(t, w, len(want)), want)
}

// resync_index (the server cut the watch loose) recreates the watch from
// that index on the same stream.
func TestWatchResyncContinues(t *testing.T) {
	l := clienttest.NewWatchLog()
	l.SetFaults(clienttest.WatchFaults{ResyncAfterEvents: 5, MaxEventsPerResponse: 2})
	srv := clienttest.Start(t, l.Funcs())
	c := newWatchClient(t, Config{Endpoints: []string{srv.Addr}})

	writeMix(l, 0, 60)
	w := c.Watch(context.Background(), "svc/", WatchPrefix(), FromIndex(1))
	defer w.Close()
	want := keysOf(l.Events("svc/", true, 1))
	same(t, collect(t, w, len(want)), want)
	creates := l.Creates()
	if len(creates) < 3 {
		t.Fatalf("creates = %d, want a recreate per resync", len(creates))
	}
	for i := 1; i < len(creates); i++ {
		if creates[i].GetStartIndex() <= creates[i-1].GetStartIndex() {
			t.Errorf("create %d starts at %d, not after the previous %d", i, creates[i].GetStartIndex(), creates[i-1].GetStartIndex())
		}
	}
	if got, want := l.Streams(), 1; got != want {
		t.Errorf("streams = %d, want %d (a resync needs no new stream)", got, want)
	}
}

// A resume index older than the server's history ends the watch with
// ErrCompacted, after the batches delivered before it.
func TestWatchCompacted(t *testing.T) {
	l := clienttest.NewWatchLog()
	srv := clienttest.Start(t, l.Funcs())
	c := newWatchClient(t, Config{Endpoints: []string{srv.Addr}})
	writeMix(l, 0, 30)
	l.Compact(10)

	w := c.Watch(context.Background(), "svc/", WatchPrefix(), FromIndex(4))
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := w.Next(ctx)
	if !errors.Is(err, ErrCompacted) {
		t.Fatalf("Next = %v, want ErrCompacted", err)
	}
	var ce *CompactedError
	if !errors.As(err, &ce) || ce.Requested != 4 || ce.CompactedIndex != 10 || ce.Key != "svc/" {
		t.Errorf("error = %#v, want Requested 4, CompactedIndex 10, Key svc/", ce)
	}
	if _, err2 := w.Next(ctx); !errors.Is(err2, ErrCompacted) {
		t.Errorf("second Next = %v, want the same terminal error", err2)
	}
}

// The server dies (its process is gone): the watch moves to another
// member, which shares the history, and resumes there.
func TestWatchFailsOverToAnotherEndpoint(t *testing.T) {
	l := clienttest.NewWatchLog()
	a := clienttest.Start(t, l.Funcs())
	b := clienttest.Start(t, l.Funcs())
	c := newWatchClient(t, Config{Endpoints: []string{a.Addr, b.Addr}})

	writeMix(l, 0, 12)
	start := l.Index()
	w := c.Watch(context.Background(), "svc/", WatchPrefix(), FromIndex(start))
	defer w.Close()
	writeMix(l, 12, 30)
	got := collect(t, w, len(l.Events("svc/", true, start)))
	a.Stop()
	writeMix(l, 42, 40)
	want := keysOf(l.Events("svc/", true, start))
	got = append(got, collect(t, w, len(want)-len(got))...)
	same(t, got, want)
	if got := c.Endpoints()[0]; got != b.Addr {
		t.Errorf("preferred endpoint after failover = %s, want %s", got, b.Addr)
	}
}

// A watch stream refused by admission control resumes on the server that
// refused it, once the hinted slot is due, without trying the others.
func TestWatchRefusedResumesWhereBooked(t *testing.T) {
	const hint = 100 * time.Millisecond
	l := clienttest.NewWatchLog()
	var streams [2]atomic.Int32
	var refusedAt, resumedAt [2]atomic.Int64
	var servers [2]*clienttest.Server
	for i := range servers {
		f := l.Funcs()
		serve := f.Watch
		f.Watch = func(s lodestonepb.Watch_WatchServer) error {
			if streams[i].Add(1) == 1 {
				refusedAt[i].Store(time.Now().UnixNano())
				return refusal(hint)
			}
			resumedAt[i].CompareAndSwap(0, time.Now().UnixNano())
			return serve(s)
		}
		servers[i] = clienttest.Start(t, f)
	}
	c := newWatchClient(t, Config{Endpoints: []string{servers[0].Addr, servers[1].Addr}})
	writeMix(l, 0, 12)
	start := l.Index()
	w := c.Watch(context.Background(), "svc/", WatchPrefix(), FromIndex(start))
	defer w.Close()
	writeMix(l, 12, 30)
	same(t, collect(t, w, len(l.Events("svc/", true, start))), keysOf(l.Events("svc/", true, start)))
	first := 0
	if streams[1].Load() > 0 && (streams[0].Load() == 0 || refusedAt[1].Load() < refusedAt[0].Load()) {
		first = 1
	}
	if got := streams[first].Load(); got != 2 {
		t.Errorf("streams opened on the refusing server = %d, want 2 (the refusal, then its booked slot)", got)
	}
	if got := streams[1-first].Load(); got != 0 {
		t.Errorf("streams opened on the other server = %d, want 0", got)
	}
	if got := time.Duration(resumedAt[first].Load() - refusedAt[first].Load()); got < hint {
		t.Errorf("resumed %v after the refusal, want at least the hinted %v", got, hint)
	}
}

// Many watches share one stream, and each sees only its own key.
func TestWatchManyWatchesShareOneStream(t *testing.T) {
	l := clienttest.NewWatchLog()
	srv := clienttest.Start(t, l.Funcs())
	c := newWatchClient(t, Config{Endpoints: []string{srv.Addr}})
	start := l.Skip() // FromIndex(0) would mean "from now"
	const n = 50
	ws := make([]*Watch, n)
	for i := range ws {
		ws[i] = c.Watch(context.Background(), fmt.Sprintf("k/%d", i), FromIndex(start))
		defer ws[i].Close()
	}
	for round := range 3 {
		for i := range n {
			l.Put(fmt.Sprintf("k/%d", i), fmt.Sprint(round))
		}
	}
	for i, w := range ws {
		want := keysOf(l.Events(fmt.Sprintf("k/%d", i), false, start))
		same(t, collect(t, w, len(want)), want)
	}
	if got, want := l.Streams(), 1; got != want {
		t.Errorf("streams = %d, want %d", got, want)
	}
}

// A consumer that does not read fills its queue; the client stops feeding
// it without holding up the other watch on the stream, then resumes it
// from its last queued index once it reads again.
func TestWatchSlowConsumerDoesNotBlockOthers(t *testing.T) {
	l := clienttest.NewWatchLog()
	l.SetFaults(clienttest.WatchFaults{MaxEventsPerResponse: 1})
	srv := clienttest.Start(t, l.Funcs())
	c := newWatchClient(t, Config{Endpoints: []string{srv.Addr}})
	start := l.Skip()
	slow := c.Watch(context.Background(), "svc/", WatchPrefix(), FromIndex(start), WatchBuffer(8))
	defer slow.Close()
	fast := c.Watch(context.Background(), "svc/", WatchPrefix(), FromIndex(start))
	defer fast.Close()

	writeMix(l, 0, 120)
	want := keysOf(l.Events("svc/", true, start))
	same(t, collect(t, fast, len(want)), want) // while slow reads nothing
	// The stream may carry the fast watch's events before the slow one's,
	// so having all of fast's says nothing of slow's queue: read slow only
	// once it has filled and paused, or the reader can keep pace with the
	// delivery and the pause this test is about never happens.
	waitPaused(t, slow)
	same(t, collect(t, slow, len(want)), want)
	paused := 0
	for _, cr := range l.Creates() {
		if cr.GetStartIndex() > start {
			paused++
		}
	}
	if paused == 0 {
		t.Errorf("the slow watch was never recreated from a later index: creates %v", l.Creates())
	}
}

// waitPaused returns once w's queue has filled and the watch paused. It
// waits on the wake-up every delivery sends (the one that fills the queue
// too), so its consumer must not be reading: Next takes the same wake-ups,
// and a read can resume the watch.
func waitPaused(t *testing.T, w *Watch) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		w.mu.Lock()
		paused := w.paused
		w.mu.Unlock()
		if paused {
			return
		}
		select {
		case <-w.wake:
		case <-timeout:
			t.Fatalf("the watch did not pause within 10 s (buffer %d)", w.set.buffer)
		}
	}
}

// sentRequests is a Watch stream that records what the client sends.
type sentRequests struct {
	grpc.ClientStream
	reqs []*lodestonepb.WatchRequest
}

func (s *sentRequests) Send(r *lodestonepb.WatchRequest) error {
	s.reqs = append(s.reqs, r)
	return nil
}

func (s *sentRequests) Recv() (*lodestonepb.WatchResponse, error) {
	panic("sentRequests: Recv")
}

// Regression for TestWatchSlowConsumerDoesNotBlockOthers hanging with
// "Next after 78 of 100 events": a watch whose queue filled paused and
// dropped what its stream sent next; when Next resumed it before the mux
// synced, the watch took the stream's next response (after the dropped
// ones) and the mux, seeing a live watch on the stream, left it there, so
// the dropped events never came. Driven step by step: no goroutines, no
// timing.
func TestWatchResumedBeforeSyncIsCreatedAgain(t *testing.T) {
	m := newWatchMux(nil)
	defer m.cancel()
	stream := &sentRequests{}
	s := &session{stream: stream, byID: map[int64]*Watch{}, ids: map[*Watch]int64{}, created: map[int64]bool{}}
	w := &Watch{mux: m, key: "svc/", wake: make(chan struct{}, 1), registered: true, last: 10, index: 10}
	w.set.prefix, w.set.buffer, w.set.start = true, 2, 10
	m.watches[w] = struct{}{}
	m.pending = append(m.pending, w)
	ev := func(idx uint64) *lodestonepb.Event {
		return &lodestonepb.Event{Kv: &lodestonepb.KeyValue{Key: fmt.Appendf(nil, "svc/%d", idx), ModifyIndex: idx}}
	}
	handle := func(resp *lodestonepb.WatchResponse) {
		t.Helper()
		if err := m.handle(s, resp); err != nil {
			t.Fatal(err)
		}
	}
	mustSync := func() {
		t.Helper()
		if err := m.sync(s); err != nil {
			t.Fatal(err)
		}
	}

	mustSync()
	if got := len(stream.reqs); got != 1 || stream.reqs[0].GetCreate().GetStartIndex() != 10 {
		t.Fatalf("first sync sent %v, want one create from 10", stream.reqs)
	}
	id := stream.reqs[0].GetCreate().GetWatchId()
	handle(&lodestonepb.WatchResponse{WatchId: id, Created: true})
	handle(&lodestonepb.WatchResponse{WatchId: id, Index: 11, Events: []*lodestonepb.Event{ev(11)}})
	handle(&lodestonepb.WatchResponse{WatchId: id, Index: 12, Events: []*lodestonepb.Event{ev(12)}}) // full: paused
	handle(&lodestonepb.WatchResponse{WatchId: id, Index: 13, Events: []*lodestonepb.Event{ev(13)}}) // dropped
	ctx := context.Background()
	if b, err := w.Next(ctx); err != nil || b.Index != 11 {
		t.Fatalf("Next = %+v, %v; want the batch at 11", b, err) // resumes: 1 queued ≤ 2/2
	}
	handle(&lodestonepb.WatchResponse{WatchId: id, Index: 14, Events: []*lodestonepb.Event{ev(14)}}) // after the gap: dropped

	stream.reqs = nil
	mustSync()
	if got := len(stream.reqs); got != 2 || stream.reqs[0].GetCancel().GetWatchId() != id ||
		stream.reqs[1].GetCreate().GetStartIndex() != 12 {
		t.Fatalf("sync after the resume sent %v, want a cancel of watch %d and a create from 12", stream.reqs, id)
	}
	id2 := stream.reqs[1].GetCreate().GetWatchId()
	handle(&lodestonepb.WatchResponse{WatchId: id, Index: 15, Events: []*lodestonepb.Event{ev(15)}}) // the old copy: ignored
	handle(&lodestonepb.WatchResponse{WatchId: id2, Created: true})
	handle(&lodestonepb.WatchResponse{WatchId: id2, Index: 13, Events: []*lodestonepb.Event{ev(13)}})
	var got []uint64
	for range 2 {
		b, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range b.Events {
			got = append(got, e.GetKv().GetModifyIndex())
		}
	}
	if want := []uint64{12, 13}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events after the resume at %v, want %v (each once, no gap)", got, want)
	}
}

// A server that accepts the stream and never answers is abandoned after
// an unanswered progress request; the watch goes on elsewhere.
func TestWatchAbandonsSilentStream(t *testing.T) {
	silent := clienttest.NewWatchLog()
	silent.SetFaults(clienttest.WatchFaults{Silent: true})
	a := clienttest.Start(t, silent.Funcs())
	l := clienttest.NewWatchLog()
	b := clienttest.Start(t, l.Funcs())
	c := newWatchClient(t, Config{Endpoints: []string{a.Addr, b.Addr}, WatchProgressInterval: 20 * time.Millisecond})

	start := l.Skip()
	w := c.Watch(context.Background(), "svc/", WatchPrefix(), FromIndex(start))
	defer w.Close()
	writeMix(l, 0, 12)
	want := keysOf(l.Events("svc/", true, start))
	same(t, collect(t, w, len(want)), want)
	if silent.Streams() == 0 {
		t.Error("the silent endpoint was never tried")
	}
}

// A "from now" watch learns its position from the created response, so a
// break before any event resumes there rather than at a later "now".
func TestWatchFromNowResumesAtCreatedIndex(t *testing.T) {
	l := clienttest.NewWatchLog()
	srv := clienttest.Start(t, l.Funcs())
	c := newWatchClient(t, Config{Endpoints: []string{srv.Addr}})
	writeMix(l, 0, 10)
	created := l.Index()

	w := c.Watch(context.Background(), "svc/", WatchPrefix(), WithProgressNotify())
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := w.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !b.IsProgress() || b.Index != created {
		t.Fatalf("first batch = %+v, want progress at the created index %d", b, created)
	}
	srv.DropConnections()
	writeMix(l, 10, 12)
	want := keysOf(l.Events("svc/", true, created))
	var got []evKey
	for len(got) < len(want) {
		b, err := w.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, keysOf(b.Events)...)
	}
	same(t, got, want)
	creates := l.Creates()
	if last := creates[len(creates)-1]; len(creates) < 2 || last.GetStartIndex() != created {
		t.Errorf("creates = %v, want a resume with start_index %d", creates, created)
	}
}

// Close, the watch's ctx and Client.Close end a watch with the documented
// errors, and the server is told to cancel it.
func TestWatchEnds(t *testing.T) {
	l := clienttest.NewWatchLog()
	srv := clienttest.Start(t, l.Funcs())
	c := newWatchClient(t, Config{Endpoints: []string{srv.Addr}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l.Skip() // a created response then carries index 1

	closed := c.Watch(ctx, "a", WithProgressNotify())
	if _, err := closed.Next(ctx); err != nil { // created
		t.Fatal(err)
	}
	closed.Close()
	if _, err := closed.Next(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Next after Close = %v, want ErrClosed", err)
	}

	wctx, wcancel := context.WithCancel(ctx)
	byCtx := c.Watch(wctx, "b")
	wcancel()
	if _, err := byCtx.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Next after the watch ctx ended = %v, want context.Canceled", err)
	}

	short, scancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer scancel()
	open := c.Watch(ctx, "c")
	if _, err := open.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Next with an expiring ctx = %v, want DeadlineExceeded", err)
	}
	if err := l.WaitCreate(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	l.Put("c", "1")
	if b, err := open.Next(ctx); err != nil || len(b.Events) != 1 {
		t.Errorf("Next after a Next ctx expired = %+v, %v; want the event (the watch goes on)", b, err)
	}

	c.Close()
	if _, err := open.Next(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Next after Client.Close = %v, want ErrClosed", err)
	}
	if _, err := c.Watch(ctx, "d").Next(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Watch after Client.Close: Next = %v, want ErrClosed", err)
	}
}

// Requests every server refuses end the watch instead of retrying forever.
func TestWatchRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t.Run("empty key without prefix", func(t *testing.T) {
		c := newWatchClient(t, Config{Endpoints: []string{"127.0.0.1:1"}})
		_, err := c.Watch(ctx, "").Next(ctx)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Next = %v, want ErrInvalidArgument", err)
		}
	})
	t.Run("server without Watch", func(t *testing.T) {
		srv := clienttest.Start(t, &clienttest.Funcs{})
		c := newWatchClient(t, Config{Endpoints: []string{srv.Addr}})
		_, err := c.Watch(ctx, "k").Next(ctx)
		var e *Error
		if !errors.As(err, &e) || e.Code != codes.Unimplemented {
			t.Errorf("Next = %v, want an *Error with code Unimplemented", err)
		}
	})
	t.Run("canceled by the server", func(t *testing.T) {
		srv := clienttest.Start(t, &clienttest.Funcs{Watch: func(stream lodestonepb.Watch_WatchServer) error {
			r, err := stream.Recv()
			if err != nil {
				return err
			}
			if err := stream.Send(&lodestonepb.WatchResponse{WatchId: r.GetCreate().GetWatchId(), Canceled: true, CancelReason: "too many watches"}); err != nil {
				return err
			}
			<-stream.Context().Done()
			return nil
		}})
		c := newWatchClient(t, Config{Endpoints: []string{srv.Addr}})
		_, err := c.Watch(ctx, "x").Next(ctx)
		var ce *WatchCanceledError
		if !errors.Is(err, ErrWatchCanceled) || !errors.As(err, &ce) || ce.Reason != "too many watches" {
			t.Errorf("Next = %v, want a WatchCanceledError with the server's reason", err)
		}
	})
	t.Run("give up", func(t *testing.T) {
		c := newWatchClient(t, Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: 100 * time.Millisecond})
		_, err := c.Watch(ctx, "k", WatchGiveUpAfter(50*time.Millisecond)).Next(ctx)
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("Next = %v, want ErrUnavailable", err)
		}
	})
}

// deliver is the dedup and batching core; it is checked here without a
// stream.
func TestWatchDeliver(t *testing.T) {
	ev := func(idx uint64, key string) *lodestonepb.Event {
		return &lodestonepb.Event{Kv: &lodestonepb.KeyValue{Key: []byte(key), ModifyIndex: idx}}
	}
	w := &Watch{set: watchSettings{buffer: 4}, last: 10, wake: make(chan struct{}, 1)}
	for _, step := range []struct {
		resp     *lodestonepb.WatchResponse
		wantFull bool
		wantLast uint64
		wantQ    int
	}{
		{&lodestonepb.WatchResponse{Index: 9, Events: []*lodestonepb.Event{ev(8, "a"), ev(9, "b")}}, false, 10, 0},                 // all old
		{&lodestonepb.WatchResponse{Index: 12, Events: []*lodestonepb.Event{ev(10, "a"), ev(11, "b"), ev(12, "c")}}, false, 12, 1}, // 10 dropped
		{&lodestonepb.WatchResponse{Index: 15}, false, 15, 1},                                                                      // progress extends the queued batch
		{&lodestonepb.WatchResponse{Index: 17, Events: []*lodestonepb.Event{ev(16, "a"), ev(17, "a")}}, true, 17, 2},               // 4 events queued: full
		{&lodestonepb.WatchResponse{Index: 18, Events: []*lodestonepb.Event{ev(18, "a")}}, false, 17, 2},                           // paused: ignored
	} {
		if got := w.deliver(step.resp); got != step.wantFull {
			t.Errorf("deliver(%v) full = %v, want %v", step.resp, got, step.wantFull)
		}
		if w.last != step.wantLast || len(w.queue) != step.wantQ {
			t.Errorf("after deliver(%v): last %d, queue %d; want %d, %d", step.resp, w.last, len(w.queue), step.wantLast, step.wantQ)
		}
	}
	if got, want := w.queue[0].Index, uint64(15); got != want {
		t.Errorf("first batch Index = %d, want %d (extended by progress)", got, want)
	}
	if got := keysOf(w.queue[0].Events); len(got) != 2 || got[0].index != 11 {
		t.Errorf("first batch events = %v, want 11 and 12", got)
	}
}

// A member that lost its leader (partitioned) holds watches back; the
// client moves them to a member that has one.
func TestWatchLeavesLeaderlessMember(t *testing.T) {
	cutOff := clienttest.NewWatchLog()
	cutOff.SetFaults(clienttest.WatchFaults{NoLeader: true})
	a := clienttest.Start(t, cutOff.Funcs())
	l := clienttest.NewWatchLog()
	b := clienttest.Start(t, l.Funcs())
	c := newWatchClient(t, Config{Endpoints: []string{a.Addr, b.Addr}, WatchProgressInterval: 20 * time.Millisecond})

	start := l.Skip()
	w := c.Watch(context.Background(), "svc/", WatchPrefix(), FromIndex(start))
	defer w.Close()
	writeMix(l, 0, 12)
	want := keysOf(l.Events("svc/", true, start))
	same(t, collect(t, w, len(want)), want)
	if cutOff.Streams() == 0 {
		t.Error("the leaderless endpoint was never tried")
	}
}

// A server that ends a running watch without a resume index (shutting
// down) does not end it for the caller: it resumes on another member.
func TestWatchServerEndsRunningWatch(t *testing.T) {
	l := clienttest.NewWatchLog()
	start := l.Skip()
	first := l.Put("k", "1")
	firstEvents := l.Events("k", false, start)
	a := clienttest.Start(t, &clienttest.Funcs{Watch: func(stream lodestonepb.Watch_WatchServer) error {
		r, err := stream.Recv()
		if err != nil {
			return err
		}
		id := r.GetCreate().GetWatchId()
		for _, resp := range []*lodestonepb.WatchResponse{
			{WatchId: id, Created: true},
			{WatchId: id, Index: first, Events: firstEvents},
			{WatchId: id, Canceled: true, CancelReason: "the server is shutting down"},
		} {
			if err := stream.Send(resp); err != nil {
				return err
			}
		}
		<-stream.Context().Done()
		return nil
	}})
	b := clienttest.Start(t, l.Funcs())
	c := newWatchClient(t, Config{Endpoints: []string{a.Addr, b.Addr}})
	w := c.Watch(context.Background(), "k", FromIndex(start))
	defer w.Close()
	l.Put("k", "2")
	want := keysOf(l.Events("k", false, start))
	same(t, collect(t, w, len(want)), want)
	if creates := l.Creates(); len(creates) != 1 || creates[0].GetStartIndex() != first {
		t.Errorf("creates on the second member = %v, want one from index %d", creates, first)
	}
}
