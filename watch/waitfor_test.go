package watch_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/watch"
	"github.com/lodestone-kv/lodestone/watch/watchtest"
)

// TestWaitFor: events under the prefix only wake the waiter to ask again;
// it returns true only once changed says so, and false on timeout even
// though events came.
func TestWaitFor(t *testing.T) {
	ctx := testCtx(t)
	clk := watchtest.NewClock(time.Unix(0, 0))
	h := newHub(t, watch.Config{Shards: 2, Clock: clk})
	var state atomic.Bool
	var asked atomic.Int32
	changed := func() bool {
		asked.Add(1)
		return state.Load()
	}
	req := watch.Request{Key: "svc/", Prefix: true, StartIndex: 2}

	// An event that does not change the answer: it wakes the waiter, which
	// asks again and sleeps until the timeout.
	h.Publish(3, []watch.Event{put("svc/a", "1")})
	done := make(chan bool, 1)
	go func() {
		ok, err := h.WaitFor(ctx, req, time.Minute, changed)
		if err != nil {
			t.Errorf("WaitFor: %v", err)
		}
		done <- ok
	}()
	clk.BlockUntilTimers(1)
	clk.Advance(time.Minute)
	if ok := <-done; ok {
		t.Fatal("WaitFor reported a change that changed() never reported")
	}
	if n := asked.Load(); n < 2 {
		t.Fatalf("changed asked %d times, want at least 2 (start, after the wake-up)", n)
	}

	// A change the event announces: returns true at once.
	req.StartIndex = 3
	go func() {
		ok, err := h.WaitFor(ctx, req, time.Hour, changed)
		if err != nil {
			t.Errorf("WaitFor: %v", err)
		}
		done <- ok
	}()
	state.Store(true) // the store applies before the hub publishes
	h.Publish(4, []watch.Event{put("svc/b", "1")})
	if ok := <-done; !ok {
		t.Fatal("WaitFor missed the change")
	}
}
