package webui

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Live is a page's live region as an event stream: Render draws it, Wait
// returns once what it shows may have changed (the server's own change
// notice: a blocking index moving, a leader change, the next sample of its
// metrics) or ctx ends.
type Live struct {
	Render func(ctx context.Context) (string, error)
	Wait   func(ctx context.Context) error
}

// minGap is the least time between two renders of a stream: a burst of
// writes is drawn once, and a Wait that returns at once cannot spin.
const minGap = 200 * time.Millisecond

// keepalive is how often a quiet stream sends a comment, so a connection
// whose browser went away is noticed and closed.
const keepalive = 25 * time.Second

// Stream serves l as text/event-stream until the browser goes away or ctx
// ends: the region at once, then again after each Wait, only when it
// differs from what was last sent. A Render error ends the stream with a
// "stop" event carrying it (a token revoked, a key deleted); the page
// keeps what it shows and says so.
func Stream(w http.ResponseWriter, r *http.Request, l Live) {
	f, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming is not supported on this connection", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, "retry: 2000\n\n")
	f.Flush()

	ctx := r.Context()
	last := ""
	var drawn time.Time
	for first := true; ; first = false {
		if !first {
			if err := waitOrPing(ctx, w, f, l.Wait); err != nil {
				return
			}
			if gap := minGap - time.Since(drawn); gap > 0 {
				t := time.NewTimer(gap)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return
				}
			}
		}
		drawn = time.Now()
		html, err := l.Render(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			writeEvent(w, "stop", err.Error())
			f.Flush()
			return
		}
		if html == last {
			continue
		}
		last = html
		writeEvent(w, "html", html)
		f.Flush()
	}
}

// waitOrPing runs wait, sending a comment every keepalive meanwhile; a
// failed write means the browser is gone.
func waitOrPing(ctx context.Context, w http.ResponseWriter, f http.Flusher, wait func(context.Context) error) error {
	done := make(chan error, 1)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { done <- wait(wctx) }()
	t := time.NewTicker(keepalive)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-t.C:
			if _, err := fmt.Fprint(w, ": ping\n\n"); err != nil {
				return err
			}
			f.Flush()
		}
	}
}

// writeEvent writes one event; every line of data gets its own data field,
// which the browser joins with newlines again.
func writeEvent(w http.ResponseWriter, event, data string) {
	var b strings.Builder
	b.WriteString("event: ")
	b.WriteString(event)
	b.WriteByte('\n')
	for _, line := range strings.Split(data, "\n") {
		b.WriteString("data: ")
		b.WriteString(strings.TrimSuffix(line, "\r"))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	fmt.Fprint(w, b.String())
}
