package watch_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/watch"
	"github.com/lodestone-kv/lodestone/watch/watchtest"
)

// advanceInterval moves clk through one progress interval, one timer
// round (a slice of it) at a time.
func advanceInterval(clk *watchtest.Clock, every time.Duration) {
	for range watch.ProgressSlices {
		clk.BlockUntilTimers(1)
		clk.Advance(every / watch.ProgressSlices)
	}
}

// TestProgressFakeClock: the progress timer runs on the hub's Clock; an
// idle watcher learns the current index when the test moves time.
func TestProgressFakeClock(t *testing.T) {
	ctx := testCtx(t)
	clk := watchtest.NewClock(time.Unix(1000, 0))
	h := newHub(t, watch.Config{Shards: 2, Clock: clk, ProgressInterval: 10 * time.Second})
	w, err := h.Watch(ctx, watch.Request{Key: "quiet"})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 5; i++ {
		h.Publish(i, []watch.Event{put("busy", "v")})
	}
	advanceInterval(clk, 10*time.Second)
	b, err := w.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !b.IsProgress() || b.Index != 5 {
		t.Fatalf("got %s, want progress index=5", formatBatch(b))
	}
	h.Publish(7, nil) // an index with no events still moves progress
	advanceInterval(clk, 10*time.Second)
	if b, err = w.Next(ctx); err != nil || b.Index != 7 {
		t.Fatalf("got %s, %v; want progress index=7", formatBatch(b), err)
	}
}

// TestProgressTimerSkipsWatchersThatHeard: a timer round tells only the
// watchers that heard nothing since the previous timer round of their
// slice; one that got an event in between is not told again. Hub.Progress
// tells every watcher behind.
func TestProgressTimerSkipsWatchersThatHeard(t *testing.T) {
	ctx := testCtx(t)
	h := newManualHub(t, watch.Config{Shards: 2, ProgressInterval: -1})
	a, err := h.Watch(ctx, watch.Request{Key: "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.Watch(ctx, watch.Request{Key: "b"})
	if err != nil {
		t.Fatal(err)
	}
	next := func(w *watch.Watcher, progress bool, index uint64) {
		t.Helper()
		got, err := w.Next(ctx)
		if err != nil || got.IsProgress() != progress || got.Index != index {
			t.Fatalf("got %s, %v; want index %d (progress: %v)", formatBatch(got), err, index, progress)
		}
	}
	nothingFor := func(w *watch.Watcher, name string) {
		t.Helper()
		if got, err := w.Next(doneCtx); !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: got %s, %v; want nothing pending", name, formatBatch(got), err)
		}
	}
	interval := func() { h.TimerRounds(watch.ProgressSlices) }

	h.Publish(1, []watch.Event{put("a", "1")})
	h.Sync()
	next(a, false, 1)
	h.Publish(2, []watch.Event{put("c", "2")})
	interval() // a heard index 1 since the hub started: skipped; b: told 2
	next(b, true, 2)
	nothingFor(a, "a after the first interval")

	h.Publish(3, []watch.Event{put("b", "3")})
	h.Sync()
	next(b, false, 3)
	h.Publish(4, []watch.Event{put("c", "4")})
	interval() // a heard nothing since its slice's last round: told 4; b heard 3: skipped
	next(a, true, 4)
	nothingFor(b, "b after the second interval")

	h.Publish(5, nil)
	h.Progress() // explicit: every watcher behind
	next(a, true, 5)
	next(b, true, 5)
}

// TestNoProgress: a NoProgress watcher is told nothing by timer rounds or
// Hub.Progress, while a plain watcher of the same quiet key is; it still
// gets its events.
func TestNoProgress(t *testing.T) {
	ctx := testCtx(t)
	h := newManualHub(t, watch.Config{Shards: 2, ProgressInterval: -1})
	plain, err := h.Watch(ctx, watch.Request{Key: "quiet"})
	if err != nil {
		t.Fatal(err)
	}
	silent, err := h.Watch(ctx, watch.Request{Key: "quiet", NoProgress: true})
	if err != nil {
		t.Fatal(err)
	}
	h.Publish(1, []watch.Event{put("busy", "1")})
	h.TimerRounds(watch.ProgressSlices)
	h.Progress()
	if b, err := plain.Next(doneCtx); err != nil || !b.IsProgress() || b.Index != 1 {
		t.Fatalf("plain watcher: got %s, %v; want progress index=1", formatBatch(b), err)
	}
	if b, err := silent.Next(doneCtx); !errors.Is(err, context.Canceled) {
		t.Fatalf("NoProgress watcher: got %s, %v; want nothing pending", formatBatch(b), err)
	}
	h.Publish(2, []watch.Event{put("quiet", "2")})
	h.Sync()
	if b, err := silent.Next(doneCtx); err != nil || len(b.Events) != 1 || b.Index != 2 {
		t.Fatalf("NoProgress watcher: got %s, %v; want the put at 2", formatBatch(b), err)
	}
}

// TestProgressTimerRoundsAreSliced: one timer round visits one slice of
// the watchers, so a round's notifications are a sixteenth of an
// interval's; every quiet watcher is told once per interval.
func TestProgressTimerRoundsAreSliced(t *testing.T) {
	ctx := testCtx(t)
	h := newManualHub(t, watch.Config{Shards: 3, ProgressInterval: -1})
	const n = 10 * watch.ProgressSlices
	var ws []*watch.Watcher
	for i := range n {
		w, err := h.Watch(ctx, watch.Request{Key: fmt.Sprintf("quiet/%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	h.Publish(1, []watch.Event{put("busy", "1")})
	h.Sync()
	told := map[int]int{} // watcher → progress notifications
	take := func() int {
		got := 0
		for i, w := range ws {
			if b, err := w.Next(doneCtx); err == nil {
				if !b.IsProgress() || b.Index != 1 {
					t.Fatalf("watcher %d: got %s, want progress index=1", i, formatBatch(b))
				}
				told[i]++
				got++
			}
		}
		return got
	}
	for r := range watch.ProgressSlices {
		h.TimerRounds(1)
		if got := take(); got != n/watch.ProgressSlices {
			t.Fatalf("timer round %d told %d watchers, want one slice: %d", r, got, n/watch.ProgressSlices)
		}
	}
	for i := range ws {
		if told[i] != 1 {
			t.Fatalf("watcher %d told %d times in one interval, want once", i, told[i])
		}
	}
}

// TestProgressOfOnlyListed: ProgressOf tells the watchers it is given
// (idle and behind) and no other, covering the Publish before it; a
// watcher listed twice is told once, a closed one is skipped.
func TestProgressOfOnlyListed(t *testing.T) {
	ctx := testCtx(t)
	h := newManualHub(t, watch.Config{Shards: 3, ProgressInterval: -1})
	var mine, others []*watch.Watcher
	for i := range 6 {
		w, err := h.Watch(ctx, watch.Request{Key: fmt.Sprintf("quiet/%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			mine = append(mine, w)
		} else {
			others = append(others, w)
		}
	}
	closed, err := h.Watch(ctx, watch.Request{Key: "quiet/closed"})
	if err != nil {
		t.Fatal(err)
	}
	h.Publish(1, []watch.Event{put("busy", "1")})
	closed.Close()
	h.ProgressOf(append([]*watch.Watcher{mine[0], closed}, mine...)) // mine[0] twice
	for i, w := range mine {
		b, err := w.Next(doneCtx)
		if err != nil || !b.IsProgress() || b.Index != 1 {
			t.Fatalf("listed watcher %d: got %s, %v; want progress index=1", i, formatBatch(b), err)
		}
		if b, err := w.Next(doneCtx); !errors.Is(err, context.Canceled) {
			t.Fatalf("listed watcher %d told twice: got %s, %v", i, formatBatch(b), err)
		}
	}
	for i, w := range others {
		if b, err := w.Next(doneCtx); !errors.Is(err, context.Canceled) {
			t.Fatalf("unlisted watcher %d: got %s, %v; want nothing pending", i, formatBatch(b), err)
		}
	}
	if _, err := closed.Next(doneCtx); !errors.Is(err, watch.ErrClosed) {
		t.Fatalf("closed watcher: got %v, want ErrClosed", err)
	}
}

// TestProgressOfCoversEarlierPublish: on a running hub, a watcher listed
// by ProgressOf right after a Publish is told an index at least that
// Publish's, whichever shard it is on.
func TestProgressOfCoversEarlierPublish(t *testing.T) {
	ctx := testCtx(t)
	h := newHub(t, watch.Config{Shards: 4, ProgressInterval: -1})
	var ws []*watch.Watcher
	for i := range 8 {
		w, err := h.Watch(ctx, watch.Request{Key: fmt.Sprintf("quiet/%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	for i := uint64(1); i <= 50; i++ {
		h.Publish(i, []watch.Event{put("busy", "v")})
		h.ProgressOf(ws[i%8 : i%8+1])
		b, err := ws[i%8].Next(ctx)
		if err != nil || !b.IsProgress() || b.Index < i {
			t.Fatalf("round %d: got %s, %v; want progress index>=%d", i, formatBatch(b), err, i)
		}
	}
}

// TestProgressTimerSlicesByReady: the watchers of one Ready list are told
// in the same timer round, all of them, so a consumer serving them (a
// gRPC stream) is woken once per interval for its quiet watchers rather
// than once per round; Ready lists made one after another are told in
// different rounds, and every watcher once per interval.
func TestProgressTimerSlicesByReady(t *testing.T) {
	ctx := testCtx(t)
	h := newManualHub(t, watch.Config{Shards: 3, ProgressInterval: -1})
	const readies, per = 4, 10
	type consumer struct {
		ready *watch.Ready
		ws    map[*watch.Watcher]int // watcher → notifications
		round int                    // the timer round that told it, -1 before
	}
	var cs []*consumer
	for r := range readies {
		c := &consumer{ready: watch.NewReady(), ws: map[*watch.Watcher]int{}, round: -1}
		for i := range per {
			w, err := h.Watch(ctx, watch.Request{Key: fmt.Sprintf("quiet/%d/%d", r, i), Ready: c.ready})
			if err != nil {
				t.Fatal(err)
			}
			c.ws[w] = 0
		}
		cs = append(cs, c)
	}
	h.Publish(1, []watch.Event{put("busy", "1")})
	h.Sync()
	for round := range watch.ProgressSlices {
		h.TimerRounds(1)
		for i, c := range cs {
			taken := c.ready.Take()
			if len(taken) != 0 && len(taken) != per {
				t.Fatalf("round %d: Ready %d listed %d of its %d watchers, want all or none", round, i, len(taken), per)
			}
			for _, w := range taken {
				b, err := w.Next(doneCtx)
				if err != nil || !b.IsProgress() || b.Index != 1 {
					t.Fatalf("round %d, Ready %d: got %s, %v; want progress index=1", round, i, formatBatch(b), err)
				}
				c.ws[w]++
			}
			if len(taken) > 0 {
				if c.round >= 0 {
					t.Fatalf("Ready %d told in rounds %d and %d of one interval", i, c.round, round)
				}
				c.round = round
			}
		}
	}
	rounds := map[int]bool{}
	for i, c := range cs {
		for _, n := range c.ws {
			if n != 1 {
				t.Fatalf("a watcher of Ready %d told %d times in one interval, want once", i, n)
			}
		}
		if rounds[c.round] {
			t.Fatalf("Ready %d told in round %d with another Ready made just before it", i, c.round)
		}
		rounds[c.round] = true
	}
}
