package watch_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/watch"
	"github.com/lodestone-kv/lodestone/watch/watchtest"
)

// testCtx bounds a test that would otherwise hang on a bug. Tests never
// wait on it for state; they wait on Next, which returns as soon as the
// state is there.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// doneCtx is already cancelled: Next with it returns only what is ready
// (else context.Canceled), without waiting.
var doneCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

func newHub(t *testing.T, cfg watch.Config) *watch.Hub {
	t.Helper()
	if cfg.Clock == nil {
		cfg.Clock = watchtest.NewClock(time.Unix(0, 0))
	}
	if cfg.ProgressInterval == 0 {
		cfg.ProgressInterval = -1
	}
	h, err := watch.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// newManualHub returns a manual hub (see watch.NewManual) closed when the
// test ends; a zero ProgressInterval means no timer.
func newManualHub(tb testing.TB, cfg watch.Config) *watch.Hub {
	tb.Helper()
	if cfg.ProgressInterval == 0 {
		cfg.ProgressInterval = -1
	}
	h, err := watch.NewManual(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { h.Close() })
	return h
}

func put(key, value string) watch.Event {
	return watch.Event{Type: watch.Put, KV: watch.KeyValue{Key: key, Value: []byte(value)}}
}

func del(key string) watch.Event {
	return watch.Event{Type: watch.Delete, KV: watch.KeyValue{Key: key}}
}

// model is the reference the hub's output is checked against: every
// published event, in order, filtered by brute force.
type model struct {
	mu  sync.Mutex
	evs []watch.Event // with Index set
}

// publish records the events (with their index) before handing them to the
// hub, so a watcher can never see an event the model does not know.
func (m *model) publish(h *watch.Hub, index uint64, evs []watch.Event) {
	m.mu.Lock()
	for _, ev := range evs {
		ev.Index = index
		m.evs = append(m.evs, ev)
	}
	m.mu.Unlock()
	h.Publish(index, evs)
}

// want returns the events req selects with after < index ≤ upTo.
func (m *model) want(req watch.Request, after, upTo uint64) []watch.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []watch.Event
	for _, ev := range m.evs {
		if ev.Index <= after || ev.Index > upTo {
			continue
		}
		if req.Prefix && !strings.HasPrefix(ev.KV.Key, req.Key) || !req.Prefix && ev.KV.Key != req.Key {
			continue
		}
		if req.NoPut && ev.Type == watch.Put || req.NoDelete && ev.Type == watch.Delete {
			continue
		}
		if !req.PrevKV {
			ev.PrevKV = nil
		}
		out = append(out, ev)
	}
	return out
}

func eventsString(evs []watch.Event) string {
	parts := make([]string, len(evs))
	for i, ev := range evs {
		parts[i] = formatEvent(ev)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// readUntil reads w until a batch with Index ≥ index and returns all events.
func readUntil(t *testing.T, ctx context.Context, w *watch.Watcher, index uint64) []watch.Event {
	t.Helper()
	var evs []watch.Event
	for {
		b, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("Next: %v (after %d events, waiting for index %d)", err, len(evs), index)
		}
		evs = append(evs, b.Events...)
		if b.Index >= index {
			return evs
		}
	}
}

// TestPerKeyOrder checks docs/architecture.md, "Watches have no gaps, no
// duplicates and no reordering": every watcher sees its events in index
// order, exactly once, whatever shard it landed on.
func TestPerKeyOrder(t *testing.T) {
	ctx := testCtx(t)
	h := newHub(t, watch.Config{Shards: 4, WatcherBuffer: 100_000})
	var m model
	keys := []string{"k/0", "k/1", "k/2", "k/3", "k/4", "j/0", "j/1"}
	var reqs []watch.Request
	for _, k := range keys {
		reqs = append(reqs, watch.Request{Key: k})
	}
	reqs = append(reqs, watch.Request{Key: "k/", Prefix: true}, watch.Request{Key: "", Prefix: true, NoDelete: true})
	var ws []*watch.Watcher
	for _, r := range reqs {
		w, err := h.Watch(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 3000
	for i := uint64(1); i <= n; i++ {
		var evs []watch.Event
		for range rng.IntN(3) + 1 {
			k := keys[rng.IntN(len(keys))]
			if rng.IntN(4) == 0 {
				evs = append(evs, del(k))
			} else {
				evs = append(evs, put(k, fmt.Sprint(i)))
			}
		}
		m.publish(h, i, evs)
	}
	h.Progress() // idle watchers learn index n
	for i, w := range ws {
		got := readUntil(t, ctx, w, n)
		want := m.want(reqs[i], 0, n)
		if g, w := eventsString(got), eventsString(want); g != w {
			t.Errorf("watcher %+v:\n got %.300s\nwant %.300s", reqs[i], g, w)
		}
		for j := 1; j < len(got); j++ {
			if got[j].Index < got[j-1].Index {
				t.Fatalf("watcher %+v: index %d after %d", reqs[i], got[j].Index, got[j-1].Index)
			}
		}
	}
}

// TestResumeNoGapNoDuplicate: a client that disconnects and resumes from
// the last Index it saw, while writes continue, ends up with exactly the
// events a single uninterrupted watch would have given it.
func TestResumeNoGapNoDuplicate(t *testing.T) {
	ctx := testCtx(t)
	h := newHub(t, watch.Config{Shards: 3, RetainEvents: 1_000_000})
	var m model
	const n = 2000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := uint64(1); i <= n; i++ {
			m.publish(h, i, []watch.Event{put(fmt.Sprintf("r/%d", i%5), fmt.Sprint(i))})
		}
	}()
	req := watch.Request{Key: "r/", Prefix: true}
	var got []watch.Event
	var last uint64
	for reconnects := 0; last < n; reconnects++ {
		req.StartIndex = last
		w, err := h.Watch(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for range reconnects%3 + 1 { // read a few batches, then drop the stream
			b, err := w.Next(ctx)
			var oe *watch.OverflowError
			if errors.As(err, &oe) { // the reader fell behind: resume where it was cut
				last = oe.ResumeIndex
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.Index < last {
				t.Fatalf("Index went back from %d to %d", last, b.Index)
			}
			got = append(got, b.Events...)
			last = b.Index
			if last >= n {
				break
			}
		}
		w.Close()
	}
	<-done
	if g, w := eventsString(got), eventsString(m.want(watch.Request{Key: "r/", Prefix: true}, 0, n)); g != w {
		t.Fatalf("resumed stream differs:\n got %.400s\nwant %.400s", g, w)
	}
}

// TestSlowWatcherIsCutLoose: one watcher never reads. Publish never waits
// for it, the watchers in the same shard receive every event, and the slow
// one gets its buffer, then ErrOverflow with the index to resume after, and
// resuming there continues without a gap. (The Consul streaming outage:
// writers blocked behind readers.)
func TestSlowWatcherIsCutLoose(t *testing.T) {
	ctx := testCtx(t)
	const n, buf, step = 10_000, 64, 50
	h := newHub(t, watch.Config{Shards: 1, WatcherBuffer: buf, RetainEvents: 2 * n})
	var m model
	req := watch.Request{Key: "k"}
	slow, err := h.Watch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	fast := make([]*watch.Watcher, 3)
	got := make([][]watch.Event, 3)
	for i := range fast {
		if fast[i], err = h.Watch(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint64(1); i <= n; i++ {
		m.publish(h, i, []watch.Event{put("k", fmt.Sprint(i))})
		if i%step == 0 { // the fast consumers keep up: at most step < buf behind
			for j, w := range fast {
				got[j] = append(got[j], readUntil(t, ctx, w, i)...)
			}
		}
	}
	want := eventsString(m.want(req, 0, n))
	for j := range fast {
		if g := eventsString(got[j]); g != want {
			t.Fatalf("fast watcher %d missed events: got %d, want %d", j, len(got[j]), n)
		}
	}
	b, err := slow.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := eventsString(b.Events), eventsString(m.want(req, 0, buf)); got != want {
		t.Fatalf("slow watcher's buffer: got %.200s, want %.200s", got, want)
	}
	_, err = slow.Next(ctx)
	var oe *watch.OverflowError
	if !errors.As(err, &oe) || !errors.Is(err, watch.ErrOverflow) {
		t.Fatalf("slow watcher: got %v, want an *OverflowError", err)
	}
	if got, want := oe.ResumeIndex, uint64(buf); got != want {
		t.Fatalf("ResumeIndex: got %d, want %d", got, want)
	}
	if got, want := b.Index, oe.ResumeIndex; got != want {
		t.Fatalf("last batch Index: got %d, want the resume index %d", got, want)
	}
	if _, err2 := slow.Next(ctx); !errors.Is(err2, watch.ErrOverflow) {
		t.Fatalf("terminal error does not repeat: %v", err2)
	}
	// Resume: the rest arrives, one buffer at a time, with no gap.
	var rest []watch.Event
	for resume := oe.ResumeIndex; resume < n; {
		w, err := h.Watch(ctx, watch.Request{Key: "k", StartIndex: resume})
		if err != nil {
			t.Fatal(err)
		}
		for {
			b, err := w.Next(ctx)
			if errors.As(err, &oe) {
				resume = oe.ResumeIndex
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			rest = append(rest, b.Events...)
			if resume = b.Index; resume >= n {
				break
			}
		}
		w.Close()
	}
	if got, want := eventsString(rest), eventsString(m.want(req, buf, n)); got != want {
		t.Fatalf("resumed slow watcher: got %d events, want %d", len(rest), n-buf)
	}
}

// TestPublishNeverWaits: with no shard running at all (a manual hub that is
// never synced) and watchers that never read, 10k Publish calls return; the
// log stays within its bound. Publish's cost does not involve watchers.
func TestPublishNeverWaits(t *testing.T) {
	h := newManualHub(t, watch.Config{Shards: 2, WatcherBuffer: 1, RetainEvents: 100, ProgressInterval: -1})
	for i := range 1000 {
		if _, err := h.Watch(context.Background(), watch.Request{Key: fmt.Sprint(i % 3)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint64(1); i <= 10_000; i++ {
		h.Publish(i, []watch.Event{put(fmt.Sprint(i%3), "v")})
	}
	entries, events, floor, last := h.Retained()
	if entries != 100 || events != 100 || floor != 9900 || last != 10_000 {
		t.Fatalf("log: entries=%d events=%d floor=%d last=%d, want 100 100 9900 10000", entries, events, floor, last)
	}
	h.Sync() // the shards were behind retention: everyone is cut loose, nobody blocks
	if got := h.ShardWatchers(); got[0]+got[1] != 0 {
		t.Fatalf("watchers after lag: %v, want none", got)
	}
}

// TestProgressCoversEarlierPublish: a progress notification requested
// after a Publish reports at least that Publish's index. Regression for
// TestShardsAgreeLive hanging: a shard took the progress request after its
// catch-up with the log, so a request that arrived just after the catch-up
// read the log was answered with the older index, and a watcher that
// nothing newer matched waited forever. The hook makes that interleaving
// happen every time: the apply loop publishes and a client requests
// progress exactly between the shard's catch-up and its tick.
func TestProgressCoversEarlierPublish(t *testing.T) {
	ctx := testCtx(t)
	var once sync.Once
	var hub atomic.Pointer[watch.Hub]
	h, err := watch.NewWithCatchUpHook(watch.Config{Shards: 1, Clock: watchtest.NewClock(time.Unix(0, 0)), ProgressInterval: -1}, func(int) {
		h := hub.Load()
		if h == nil || h.Index() < 1 {
			return // not yet: wait for the test's Publish(1)
		}
		once.Do(func() {
			h.Publish(2, nil) // nothing to apply: no wake-up of its own
			h.Progress()
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	hub.Store(h)
	w, err := h.Watch(ctx, watch.Request{Key: "a", FromNow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	h.Publish(1, []watch.Event{put("b", "v")}) // wakes the shard; not for w
	nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := w.Next(nctx)
	if err != nil {
		t.Fatalf("Next: %v (no progress notification at all)", err)
	}
	if got, want := b.Index, uint64(2); got != want || len(b.Events) != 0 {
		t.Fatalf("progress after Publish(2) then Progress: got %+v, want Index %d and no events", b, want)
	}
}

// TestCompacted: a start index older than the retained window is refused
// at once with where to reload; the oldest retained start index works.
func TestCompacted(t *testing.T) {
	ctx := testCtx(t)
	h := newHub(t, watch.Config{RetainEvents: 10})
	var m model
	for i := uint64(1); i <= 100; i++ {
		m.publish(h, i, []watch.Event{put("k", fmt.Sprint(i))})
	}
	_, err := h.Watch(ctx, watch.Request{Key: "k", StartIndex: 5})
	var ce *watch.CompactedError
	if !errors.As(err, &ce) || !errors.Is(err, watch.ErrCompacted) {
		t.Fatalf("got %v, want a *CompactedError", err)
	}
	if ce.Requested != 5 || ce.Oldest != 90 || ce.Current != 100 {
		t.Fatalf("got %+v, want Requested 5, Oldest 90, Current 100", *ce)
	}
	if got, want := h.Oldest(), uint64(90); got != want {
		t.Fatalf("Oldest: got %d, want %d", got, want)
	}
	w, err := h.Watch(ctx, watch.Request{Key: "k", StartIndex: 90})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if got, want := eventsString(readUntil(t, ctx, w, 100)), eventsString(m.want(watch.Request{Key: "k"}, 90, 100)); got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

// TestLongCatchUp: a watcher resuming far back replays many chunks (the
// log lock is released between them) while Publish continues, and gets
// every event exactly once.
func TestLongCatchUp(t *testing.T) {
	ctx := testCtx(t)
	h := newHub(t, watch.Config{Shards: 2, RetainEvents: 1 << 20})
	var m model
	const n = 30_000
	for i := uint64(1); i <= n; i++ {
		m.publish(h, i, []watch.Event{put(fmt.Sprintf("c/%d", i%7), "v")})
	}
	req := watch.Request{Key: "c/", Prefix: true, StartIndex: 1, BufferSize: 1 << 20}
	w, err := h.Watch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := uint64(n + 1); i <= n+100; i++ {
		m.publish(h, i, []watch.Event{put("c/x", "live")})
	}
	if got, want := eventsString(readUntil(t, ctx, w, n+100)), eventsString(m.want(req, 1, n+100)); got != want {
		t.Fatalf("catch-up differs: got %d bytes, want %d", len(got), len(want))
	}
}

// TestCloseFreesWatcher: closing or cancelling a watcher removes it from its
// shard, wakes a blocked Next, and leaves nothing that keeps it alive.
func TestCloseFreesWatcher(t *testing.T) {
	ctx := testCtx(t)
	h := newHub(t, watch.Config{Shards: 4})
	const n = 1000
	var closers []*watch.Watcher
	var cancels []context.CancelFunc
	var cancelled []*watch.Watcher
	for i := range n {
		req := watch.Request{Key: fmt.Sprintf("k/%d", i%17), Prefix: i%2 == 0}
		if i%2 == 0 {
			w, err := h.Watch(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			closers = append(closers, w)
		} else {
			cctx, cancel := context.WithCancel(ctx)
			w, err := h.Watch(cctx, req)
			if err != nil {
				t.Fatal(err)
			}
			cancels = append(cancels, cancel)
			cancelled = append(cancelled, w)
		}
	}
	sum := func() int {
		s := 0
		for _, c := range h.ShardWatchers() {
			s += c
		}
		return s
	}
	if got, want := sum(), n; got != want {
		t.Fatalf("watchers: got %d, want %d", got, want)
	}
	// A Next blocked in another goroutine returns ErrClosed on Close.
	blocked := make(chan error)
	go func() {
		_, err := closers[0].Next(context.Background())
		blocked <- err
	}()
	for _, w := range closers {
		w.Close()
		w.Close() // idempotent
	}
	if err := <-blocked; !errors.Is(err, watch.ErrClosed) {
		t.Fatalf("blocked Next: got %v, want ErrClosed", err)
	}
	// A Next blocked when the Watch context is cancelled closes the watcher.
	go func() {
		_, err := cancelled[0].Next(context.Background())
		blocked <- err
	}()
	cancels[0]()
	if err := <-blocked; !errors.Is(err, context.Canceled) {
		t.Fatalf("blocked Next after cancel: got %v, want context.Canceled", err)
	}
	for i, c := range cancels {
		c()
		if _, err := cancelled[i].Next(context.Background()); !errors.Is(err, context.Canceled) && !errors.Is(err, watch.ErrClosed) {
			t.Fatalf("Next after cancel: got %v, want context.Canceled", err)
		}
		if _, err := cancelled[i].Next(context.Background()); !errors.Is(err, watch.ErrClosed) {
			t.Fatalf("second Next after cancel: got %v, want ErrClosed", err)
		}
	}
	if got := h.ShardWatchers(); sum() != 0 {
		t.Fatalf("watchers per shard after close: %v, want all 0", got)
	}

	// Nothing in the hub keeps a closed watcher alive.
	collected := make(chan struct{})
	func() {
		w, err := h.Watch(ctx, watch.Request{Key: "gc"})
		if err != nil {
			t.Fatal(err)
		}
		h.Publish(1, []watch.Event{put("gc", "v")})
		if _, err := w.Next(ctx); err != nil {
			t.Fatal(err)
		}
		runtime.AddCleanup(w, func(ch chan struct{}) { close(ch) }, collected)
		w.Close()
	}()
	deadline := time.After(10 * time.Second)
	for {
		runtime.GC()
		select {
		case <-collected:
			return
		case <-deadline:
			t.Fatal("closed watcher was not garbage collected")
		default:
			runtime.Gosched()
		}
	}
}

// TestCancelledWatcherIsReaped: a watcher whose Watch context is cancelled
// and that nobody reads leaves its shard at the next progress round.
func TestCancelledWatcherIsReaped(t *testing.T) {
	h := newManualHub(t, watch.Config{Shards: 3, ProgressInterval: -1})
	ctx, cancel := context.WithCancel(context.Background())
	keep, _ := h.Watch(context.Background(), watch.Request{Key: "keep"})
	for i := range 30 {
		if _, err := h.Watch(ctx, watch.Request{Key: fmt.Sprint(i), Prefix: i%2 == 0}); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	h.Progress()
	if got := h.ShardWatchers(); got[0]+got[1]+got[2] != 1 {
		t.Fatalf("watchers after reaping: %v, want only the uncancelled one", got)
	}
	keep.Close()
}

// TestWait: the blocking-query helper returns on a change after the start
// index (also one that happened before Wait was called), times out on the
// hub's clock with the index up to which nothing happened, and treats a
// too-old start index as changed.
func TestWait(t *testing.T) {
	ctx := testCtx(t)
	clk := watchtest.NewClock(time.Unix(0, 0))
	h := newHub(t, watch.Config{Shards: 2, Clock: clk, RetainEvents: 5})
	h.Publish(3, []watch.Event{put("a", "1")})
	h.Publish(4, []watch.Event{put("b", "1")})

	// Already changed after 2: returns at once.
	res, err := h.Wait(ctx, watch.Request{Key: "a", StartIndex: 2}, time.Minute)
	if err != nil || !res.Changed || res.Index < 3 {
		t.Fatalf("got %+v, %v; want changed at ≥3", res, err)
	}

	// Not changed after 3: blocks until a write.
	type result struct {
		res watch.WaitResult
		err error
	}
	done := make(chan result)
	go func() {
		res, err := h.Wait(ctx, watch.Request{Key: "a", StartIndex: 3}, 0)
		done <- result{res, err}
	}()
	h.Publish(5, []watch.Event{put("b", "2")})
	h.Publish(6, []watch.Event{put("a", "2")})
	if r := <-done; r.err != nil || !r.res.Changed || r.res.Index < 6 {
		t.Fatalf("got %+v, %v; want changed at ≥6", r.res, r.err)
	}

	// Times out on the fake clock.
	go func() {
		res, err := h.Wait(ctx, watch.Request{Key: "a", StartIndex: 6}, 30*time.Second)
		done <- result{res, err}
	}()
	clk.BlockUntilTimers(1)
	h.Publish(7, []watch.Event{put("b", "3")})
	clk.Advance(30 * time.Second)
	r := <-done
	if r.err != nil || r.res.Changed || r.res.Index < 6 {
		t.Fatalf("got %+v, %v; want a timeout at ≥6", r.res, r.err)
	}

	// Cancelled.
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		res, err := h.Wait(cctx, watch.Request{Key: "a", StartIndex: 7}, 0)
		done <- result{res, err}
	}()
	cancel()
	if r := <-done; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("got %+v, %v; want context.Canceled", r.res, r.err)
	}

	// Too old: must re-read.
	for i := uint64(10); i < 20; i++ {
		h.Publish(i, []watch.Event{put("c", "x")})
	}
	res, err = h.Wait(ctx, watch.Request{Key: "a", StartIndex: 3}, time.Minute)
	if err != nil || !res.Changed {
		t.Fatalf("got %+v, %v; want changed (compacted)", res, err)
	}
}

// TestRecycleReusesTheBatchSlice: the Events of a NextShared batch given
// back with Recycle hold the watcher's next events (no new slice), cleared
// of the old ones; a small slice is not kept, nor one given to a closed
// watcher.
func TestRecycleReusesTheBatchSlice(t *testing.T) {
	h := newManualHub(t, watch.Config{Shards: 1, ProgressInterval: -1})
	w, err := h.Watch(context.Background(), watch.Request{Key: "k/", Prefix: true})
	if err != nil {
		t.Fatal(err)
	}
	idx := uint64(0)
	batch := func(n int) watch.SharedBatch {
		t.Helper()
		for range n {
			idx++
			h.Publish(idx, []watch.Event{put(fmt.Sprintf("k/%d", idx), "v")})
		}
		h.Sync()
		b, err := w.NextShared(doneCtx)
		if err != nil || len(b.Events) != n || b.Events[n-1].Index != idx {
			t.Fatalf("got %d events up to %d, %v; want %d up to %d", len(b.Events), b.Index, err, n, idx)
		}
		return b
	}
	first := batch(20).Events
	w.Recycle(first)
	for i, ev := range first[:cap(first)] {
		if ev != nil {
			t.Fatalf("recycled slice still holds event %d (index %d)", i, ev.Index)
		}
	}
	if again := batch(20).Events; &again[0] != &first[0] {
		t.Fatal("the next batch is in a new slice, want the recycled one")
	}
	small := batch(2).Events // cap 2: below the bound, not kept
	w.Recycle(small)
	if again := batch(1).Events; &again[0] == &small[0] {
		t.Fatal("a slice of capacity 2 was kept")
	}
	last := batch(20).Events
	w.Close()
	w.Recycle(last) // closed: not kept, and no panic
	if _, err := w.NextShared(doneCtx); !errors.Is(err, watch.ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}
