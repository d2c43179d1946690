// Package ctxtime waits for a duration or for a context to end, whichever
// comes first. It is the sleep of the retry loops, polls and pacing steps
// in the client, the chaos harness and the benchmarks, so that none of
// them outlives its context or keeps a private copy of the same select.
package ctxtime

import (
	"context"
	"time"
)

// Sleep waits d or until ctx ends, whichever is first. It returns nil when
// d elapsed and ctx.Err() when ctx ended first; a ctx that has already
// ended returns its error at once, even for d <= 0. A live ctx and d <= 0
// return nil at once. The timer Sleep starts is stopped before it returns.
// Sleep is safe for concurrent use.
func Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
