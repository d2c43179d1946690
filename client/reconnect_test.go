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
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepts atomic.Int64
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			accepts.Add(1)
			_ = conn.Close()
		}
	}()
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
