package client

import (
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// TestReconnectBackoffPacesRedials: an endpoint whose connections fail is
// dialed again only after ReconnectBase (times 1.6 per failure, up to
// ReconnectMax), however fast calls keep coming; calls meanwhile fail
// without a dial. The same calls against a tiny ReconnectBase dial many
// times more, so the count is the setting's doing.
func TestReconnectBackoffPacesRedials(t *testing.T) {
	t.Parallel()
	const window = time.Second
	paced := redialsIn(t, 250*time.Millisecond, window)
	eager := redialsIn(t, 5*time.Millisecond, window)
	t.Logf("dials in %v: %d at 250ms, %d at 5ms", window, paced, eager)
	// 250ms, jittered by 20%, fits at most 1 + 1s/200ms = 6 dials in a
	// second; one more for a dial that began as the window ended.
	if paced > 7 {
		t.Errorf("ReconnectBase 250ms: %d dials in %v, want at most 7", paced, window)
	}
	if eager < 4*paced || eager < 20 {
		t.Errorf("ReconnectBase 5ms: %d dials in %v, want at least 20 and 4x the %d at 250ms", eager, window, paced)
	}
}

// redialsIn counts the connections a client makes to an endpoint that
// accepts each one and closes it at once, while calls go to it back to
// back for window, with both reconnect settings at base.
func redialsIn(t *testing.T, base, window time.Duration) int64 {
	t.Helper()
	l, accepts, _ := closingListener(t, "127.0.0.1:0")
	cfg := fastRetry(l.Addr().String())
	cfg.ReconnectBase, cfg.ReconnectMax = base, base
	c := newTestClient(t, cfg)
	ctx := testCtx(t, window)
	for ctx.Err() == nil {
		if _, err := c.Get(ctx, "k"); err == nil {
			t.Fatal("Get succeeded against an endpoint that closes every connection")
		}
	}
	_ = l.Close()
	return accepts.Load()
}

// TestFailedEndpointRedialedOnlyWhenPicked: a call that failed over from
// an endpoint it could not connect to leaves nothing redialing it. With a
// listener back at that address, nothing connects there while calls keep
// going to the other endpoint for 40 times ReconnectMax (gRPC's own
// backoff would have redialed it every few milliseconds), and the first
// call that picks it again connects there.
func TestFailedEndpointRedialedOnlyWhenPicked(t *testing.T) {
	t.Parallel()
	dead := refusedEndpoint(t)
	live, _ := memoryServer(t, "b")
	cfg := fastRetry(dead, live.Addr)
	// NB: gRPC's own backoff is ReconnectBase too: at 1 ms it could end
	// before the failed attempt's release, which then found the
	// connection CONNECTING again (a redial in the background) and kept it.
	cfg.ReconnectBase, cfg.ReconnectMax = 250*time.Millisecond, 250*time.Millisecond
	c := newTestClient(t, cfg)
	ctx := testCtx(t, 10*time.Second)
	if _, err := c.Get(ctx, "k"); err != nil {
		t.Fatalf("Get with %s refusing: %v", dead, err)
	}
	c.mu.Lock()
	held := c.conns[dead] != nil && c.conns[dead].cc != nil
	c.mu.Unlock()
	if held {
		t.Fatalf("after failing over from %s the client still holds a connection to it", dead)
	}

	_, accepts, accepted := closingListener(t, dead)
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
		if _, err := c.Get(ctx, "k"); err != nil {
			t.Fatalf("Get while %s is healthy: %v", live.Addr, err)
		}
	}
	if n := accepts.Load(); n != 0 {
		t.Fatalf("%d connections to %s while no call picked it, want 0", n, dead)
	}

	live.Stop()
	_, _ = c.Get(testCtx(t, time.Second), "k")
	select {
	case <-accepted:
	case <-ctx.Done():
		t.Fatalf("a Get with %s stopped never connected to %s", live.Addr, dead)
	}
}

// closingListener listens at addr and closes every connection it
// accepts, counting them; accepted has a value once one came. It closes
// when the test ends.
func closingListener(t *testing.T, addr string) (l net.Listener, accepts *atomic.Int64, accepted <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	accepts = new(atomic.Int64)
	came := make(chan struct{}, 1)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			accepts.Add(1)
			_ = conn.Close()
			select {
			case came <- struct{}{}:
			default:
			}
		}
	}()
	return l, accepts, came
}

// TestRedialDelay: the wait before a failed endpoint is dialed again is
// gRPC's reconnect backoff: ReconnectBase, times 1.6 per further failure,
// capped at ReconnectMax, then jittered by ±20%.
func TestRedialDelay(t *testing.T) {
	base, max := time.Second, 5*time.Second
	lo := func() float64 { return 0 }
	hi := func() float64 { return 1 }
	for _, tc := range []struct {
		failures int
		mid      time.Duration
	}{
		{1, time.Second},
		{2, 1600 * time.Millisecond},
		{3, 2560 * time.Millisecond},
		{4, 4096 * time.Millisecond},
		{5, 5 * time.Second},
		{1000, 5 * time.Second},
	} {
		for _, r := range []struct {
			rnd  func() float64
			want time.Duration
		}{{lo, tc.mid * 8 / 10}, {hi, tc.mid * 12 / 10}} {
			got := redialDelay(tc.failures, base, max, r.rnd)
			if d := got - r.want; d < -time.Microsecond || d > time.Microsecond {
				t.Errorf("redialDelay(%d failures) = %v, want %v", tc.failures, got, r.want)
			}
		}
	}
}
