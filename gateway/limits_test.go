package gateway

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// manualClock is a hand-stepped Clock for this package's internal tests
// (gatewaytest.Clock is the exported one; importing it here would be a
// cycle).
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func TestRetryBudget(t *testing.T) {
	clk := &manualClock{now: time.Unix(100, 0)}
	b := newRetryBudget(clk, 0.2, 10)
	for i := range 10 {
		if !b.withdraw() {
			t.Fatalf("withdraw %d failed: the bucket starts full (10 tokens)", i)
		}
	}
	if b.withdraw() {
		t.Fatal("withdraw succeeded on an empty bucket")
	}
	for range 5 {
		b.deposit() // 5 requests × 0.2 = one retry
	}
	if !b.withdraw() {
		t.Fatal("5 requests at ratio 0.2 did not earn one retry")
	}
	if b.withdraw() {
		t.Fatal("one retry earned, two spent")
	}
	clk.advance(300 * time.Millisecond) // floor: 10/s → 3 tokens
	for i := range 3 {
		if !b.withdraw() {
			t.Fatalf("withdraw %d after 300ms failed: the floor refills 10/s", i)
		}
	}
	if b.withdraw() {
		t.Fatal("the floor refilled more than 10/s")
	}
	clk.advance(time.Hour)
	n := 0
	for b.withdraw() {
		n++
	}
	if got, want := n, 10; got != want {
		t.Errorf("after an idle hour %d retries were allowed, want the cap %d (no saved-up storm)", got, want)
	}
}

// waitFor spins (yielding) until cond holds; it waits for state another
// goroutine is about to reach, not for time to pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}

func TestLimiter(t *testing.T) {
	ctx := context.Background()
	t.Run("sheds at once without a queue", func(t *testing.T) {
		l := newLimiter(2, -1, time.Minute)
		for range 2 {
			if err := l.acquire(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.acquire(ctx); !errors.Is(err, ErrOverloaded) {
			t.Fatalf("acquire over the limit = %v, want ErrOverloaded", err)
		}
		l.release()
		if err := l.acquire(ctx); err != nil {
			t.Fatalf("acquire after a release = %v", err)
		}
	})
	t.Run("a release hands the slot to the waiter", func(t *testing.T) {
		l := newLimiter(1, 4, time.Minute)
		if err := l.acquire(ctx); err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() { got <- l.acquire(ctx) }()
		waitFor(t, "the waiter to queue", func() bool { return l.nwait.Load() == 1 })
		l.release()
		if err := <-got; err != nil {
			t.Fatalf("waiter = %v, want the handed-over slot", err)
		}
		if got, want := l.inFlight(), int64(1); got != want {
			t.Fatalf("in flight = %d, want %d", got, want)
		}
		l.release()
	})
	t.Run("queue time is bounded", func(t *testing.T) {
		l := newLimiter(1, 4, 20*time.Millisecond)
		if err := l.acquire(ctx); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err := l.acquire(ctx)
		if !errors.Is(err, ErrOverloaded) {
			t.Fatalf("acquire = %v, want ErrOverloaded after the queue time", err)
		}
		if waited := time.Since(start); waited < 20*time.Millisecond {
			t.Fatalf("gave up after %v, before MaxQueueTime", waited)
		}
		if l.nwait.Load() != 0 || len(l.waiters) != 0 {
			t.Fatal("a timed-out waiter stayed queued")
		}
		l.release()
		if got := l.inFlight(); got != 0 {
			t.Fatalf("in flight = %d after every release, want 0", got)
		}
	})
	t.Run("a full queue sheds at once", func(t *testing.T) {
		l := newLimiter(1, 1, time.Minute)
		if err := l.acquire(ctx); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		got := make(chan error, 1)
		go func() { got <- l.acquire(wctx) }()
		waitFor(t, "the waiter to queue", func() bool { return l.nwait.Load() == 1 })
		if err := l.acquire(ctx); !errors.Is(err, ErrOverloaded) {
			t.Fatalf("acquire with a full queue = %v, want ErrOverloaded", err)
		}
		cancel()
		if err := <-got; !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled waiter = %v, want context.Canceled", err)
		}
		l.release()
		if got := l.inFlight(); got != 0 {
			t.Fatalf("in flight = %d, want 0", got)
		}
	})
	t.Run("never more than max under contention", func(t *testing.T) {
		l := newLimiter(4, 64, time.Minute)
		var cur, peak atomic.Int64
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for range 200 {
					if err := l.acquire(ctx); err != nil {
						t.Error(err)
						return
					}
					n := cur.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					runtime.Gosched()
					cur.Add(-1)
					l.release()
				}
			})
		}
		wg.Wait()
		if p := peak.Load(); p > 4 {
			t.Errorf("peak concurrency %d exceeds the limit 4", p)
		}
		if got := l.inFlight(); got != 0 {
			t.Errorf("in flight = %d after all released, want 0", got)
		}
	})
}
