package watch

import (
	"context"
	"time"
)

// WaitFor is Wait for reads whose answer depends on more than the events
// req selects can tell apart (a catalog list whose index moves only for
// some of the events under its prefix): it blocks until changed reports
// true, until timeout elapses on the hub's Clock, or until ctx is done, and
// uses the events req selects after req.StartIndex only as wake-ups to ask
// changed again. It reports whether changed became true. Timing out is not
// an error; changed is asked once more at the end.
//
// changed must be cheap and must read state that is updated BEFORE the
// events that announce it are published (the store, applied before
// Publish), so a wake-up never finds stale state.
//
// Errors: those of Wait.
func (h *Hub) WaitFor(ctx context.Context, req Request, timeout time.Duration, changed func() bool) (bool, error) {
	deadline := h.clock.Now().Add(timeout)
	for {
		if changed() {
			return true, nil
		}
		left := deadline.Sub(h.clock.Now())
		if left <= 0 {
			return false, nil
		}
		res, err := h.Wait(ctx, req, left)
		if err != nil {
			return false, err
		}
		if !res.Changed {
			return changed(), nil
		}
		// NB: the events up to res.Index were seen; waiting from there
		// again keeps an unrelated event under the prefix from waking us
		// in a loop.
		req.StartIndex = max(req.StartIndex, res.Index)
	}
}
