package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/lodestone-kv/lodestone/client"
)

// feed is the registry-specific half of a registry-backed Source
// (KVSource, CatalogSource); runFeed is the shared half: connection
// reporting, backoff with jitter, resume from the last index delivered,
// and a full reload only when the registry no longer retains that index.
type feed interface {
	// reload reads the whole state as one Reset update (which the runner
	// delivers) and sets the resume point to its index.
	reload(ctx context.Context) (Update, error)
	// probe checks that some registry answers before a resume is reported
	// connected.
	probe(ctx context.Context) error
	// follow watches from the resume point, delivering every batch and
	// moving the resume point with it, until the watch ends. An error
	// matching client.ErrCompacted makes the next round reload.
	follow(ctx context.Context, sink Sink) error
	// resumeIndex is the index delivered last (for logs).
	resumeIndex() uint64
	// what names what is watched (for errors).
	what() string
}

// SourceStats counts how a registry-backed source (re)joined the registry.
type SourceStats struct {
	Reloads int64 // full reads; 1 for a fresh start, 0 for a resume from a persisted index
	Resumes int64 // watches re-created from the last index after a break
}

// feedRunner runs a feed with the retry settings of a KVSourceConfig.
type feedRunner struct {
	cfg     KVSourceConfig
	log     *slog.Logger
	reloads atomic.Int64
	resumes atomic.Int64
}

// stats returns the counts so far.
func (r *feedRunner) stats() SourceStats {
	return SourceStats{Reloads: r.reloads.Load(), Resumes: r.resumes.Load()}
}

// run implements Source.Run for f; reload says whether f has no resume
// point (Run's from == 0).
func (r *feedRunner) run(ctx context.Context, f feed, reload bool, sink Sink) error {
	failures := 0
	for {
		var (
			err   error
			state *Update
		)
		if reload {
			var u Update
			if u, err = f.reload(ctx); err == nil {
				reload, state = false, &u
				r.reloads.Add(1)
			}
		} else {
			err = f.probe(ctx)
		}
		if err == nil {
			failures = 0
			// NB: the state first: connected makes the gateway ready, and
			// a fresh gateway must not report ready with an empty table.
			if state != nil {
				sink.Apply(*state)
			}
			sink.SetConnected(true, nil)
			err = f.follow(ctx, sink)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch {
		case errors.Is(err, client.ErrCompacted):
			r.log.Info("gateway: resume index no longer retained by the registry; reloading", "index", f.resumeIndex(), "err", err)
			reload = true
			continue
		case errors.Is(err, client.ErrInvalidArgument), errors.Is(err, client.ErrWatchCanceled):
			sink.SetConnected(false, err)
			return fmt.Errorf("watch %s: %w", f.what(), err)
		}
		sink.SetConnected(false, err)
		failures++
		d := backoffDelay(failures, r.cfg.BackoffBase, r.cfg.BackoffMax)
		r.log.Debug("gateway: registry unreachable; retrying", "in", d, "index", f.resumeIndex(), "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
		if !reload {
			r.resumes.Add(1)
		}
	}
}

// backoffDelay is the jittered exponential delay before retry n (≥ 1):
// uniformly in [d/2, d] with d = base × 2^(n-1) capped at max.
func backoffDelay(n int, base, maxD time.Duration) time.Duration {
	d := base
	for i := 1; i < n && d < maxD; i++ {
		d *= 2
	}
	d = min(d, maxD)
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}
