package harness

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Op performs one operation on behalf of client (0-based); seq counts that
// client's operations from 0. It must return when ctx is done. Ops of
// different clients run concurrently; one client's ops run one at a time.
type Op func(ctx context.Context, client, seq int) error

// DriveConfig says how hard and how long to drive a system.
type DriveConfig struct {
	Clients   int           // concurrent closed-loop clients; must be >= 1
	Warmup    time.Duration // ops finishing before this are run but not counted
	Duration  time.Duration // length of the measured window after Warmup
	OpTimeout time.Duration // per-op deadline; 0 means 10s
	// Classes, when > 0, splits the acknowledged ops' latencies by
	// Class(client, seq), which must lie in [0, Classes): a mixed
	// workload's reads and writes, say, each get their own percentiles.
	Classes int
	Class   func(client, seq int) int
}

// Result is what one Drive measured inside its window.
type Result struct {
	Window    time.Duration   // length of the measured window
	Latencies []time.Duration // one per acknowledged op completed in the window, ascending
	Errors    int             // failed ops completed in the window
	FirstErr  error           // the first failure seen anywhere (warm-up included), or nil
	// ByClass holds, with DriveConfig.Classes set, the latencies of
	// Latencies split by class, each ascending.
	ByClass [][]time.Duration
}

// Ops is the number of acknowledged ops completed in the window.
func (r Result) Ops() int { return len(r.Latencies) }

// Throughput is acknowledged ops per second over the window.
func (r Result) Throughput() float64 { return float64(r.Ops()) / r.Window.Seconds() }

// Percentile is the p-th percentile latency of acknowledged ops.
func (r Result) Percentile(p float64) time.Duration { return Percentile(r.Latencies, p) }

// Drive runs cfg.Clients closed-loop clients, each calling op back to back
// for cfg.Warmup+cfg.Duration. An op is counted (throughput, latency or
// error) when it completes inside the measured window [start+Warmup,
// start+Warmup+Duration], so ops in flight across either edge neither
// inflate nor deflate the rate. Each op's latency is its own wall time,
// measured with the monotonic clock. Drive returns ctx.Err() if ctx ends
// first, after every client has returned.
func Drive(ctx context.Context, cfg DriveConfig, op Op) (Result, error) {
	timeout := cfg.OpTimeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	start := time.Now()
	from := start.Add(cfg.Warmup)
	end := from.Add(cfg.Duration)

	type clientResult struct {
		lat      []time.Duration
		byClass  [][]time.Duration
		errors   int
		firstErr error
	}
	results := make([]clientResult, cfg.Clients)
	var wg sync.WaitGroup
	for c := range cfg.Clients {
		wg.Go(func() {
			r := &results[c]
			r.byClass = make([][]time.Duration, cfg.Classes)
			for seq := 0; ctx.Err() == nil; seq++ {
				t0 := time.Now()
				if !t0.Before(end) {
					return
				}
				octx, cancel := context.WithTimeout(ctx, timeout)
				err := op(octx, c, seq)
				cancel()
				t1 := time.Now()
				if err != nil && r.firstErr == nil {
					r.firstErr = err
				}
				if t1.Before(from) || t1.After(end) {
					continue
				}
				if err != nil {
					r.errors++
				} else {
					r.lat = append(r.lat, t1.Sub(t0))
					if cfg.Classes > 0 {
						k := cfg.Class(c, seq)
						r.byClass[k] = append(r.byClass[k], t1.Sub(t0))
					}
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}

	res := Result{Window: end.Sub(from), ByClass: make([][]time.Duration, cfg.Classes)}
	for _, r := range results {
		res.Latencies = append(res.Latencies, r.lat...)
		for k, lat := range r.byClass {
			res.ByClass[k] = append(res.ByClass[k], lat...)
		}
		res.Errors += r.errors
		if res.FirstErr == nil {
			res.FirstErr = r.firstErr
		}
	}
	slices.Sort(res.Latencies)
	for _, lat := range res.ByClass {
		slices.Sort(lat)
	}
	return res, nil
}
