// Package heapfloor lets a process's heap grow to a floor before the
// garbage collector runs a cycle.
//
// Go's collector starts a cycle once the heap has grown GOGC percent past
// what the last cycle left live (plus the stacks and globals it scans). A
// server whose live heap is small but which allocates fast then collects
// every second or two: a leader answering 2,000 blocking queries a second
// holds about 40 MB live and allocates about 25 MB/s. On a busy core each
// cycle's marking takes CPU from the writes in flight, and those writes
// are the slowest percent. Run raises GOGC after each cycle so that the
// next one starts near the floor instead: as many bytes marked per cycle,
// several times fewer cycles.
//
// Above the floor nothing changes: GOGC is never set below the value the
// process started with (the GOGC environment variable, or 100), and
// GOMEMLIMIT still caps the heap. With GOGC=off there is nothing to raise
// and Run leaves it alone.
package heapfloor

import (
	"context"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Interval is how often Run looks for a finished GC cycle.
const Interval = 500 * time.Millisecond

// Start runs Run on a goroutine of its own, looking every Interval, until
// stop is called; stop returns once GOGC is back to what Run found.
func Start(floor uint64) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, floor, Interval)
	}()
	return func() {
		cancel()
		<-done
	}
}

// Run keeps the heap goal at least floor bytes until ctx ends, then puts
// back the GOGC it found. It looks for a finished GC cycle every
// interval and retunes after each one. With a zero floor or GOGC=off
// there is nothing to do, and it returns at once.
func Run(ctx context.Context, floor uint64, interval time.Duration) {
	s := newSampler()
	base, on := s.gogc()
	if floor == 0 || !on {
		return
	}
	defer debug.SetGCPercent(base)
	t := time.NewTicker(interval)
	defer t.Stop()
	seen := ^uint64(0) // NB: tune at once, before the first cycle too
	for {
		if c := s.read(); c.cycles != seen {
			seen = c.cycles
			debug.SetGCPercent(Percent(floor, c.live, c.roots, base))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Percent is the GOGC that puts the next cycle's start at floor bytes,
// given what the last cycle left live and the roots (stacks and globals)
// it scanned, and never less than base. The runtime's goal is
// live + (live + roots) * GOGC / 100, but at least its minimum heap,
// 4 MiB * GOGC / 100, which rules when the live heap is a few MiB.
func Percent(floor, live, roots uint64, base int) int {
	if live >= floor {
		return base
	}
	p := float64(floor-live) * 100 / float64(max(live+roots, 1))
	p = min(p, float64(floor)*100/minHeap, math.MaxInt32)
	return int(max(float64(base), p))
}

// minHeap is the runtime's minimum heap goal at GOGC=100
// (defaultHeapMinimum in runtime/mgcpacer.go).
const minHeap = 4 << 20

// cycle is what the runtime says of its last GC cycle.
type cycle struct {
	cycles, live, roots uint64
}

type sampler struct{ samples []metrics.Sample }

func newSampler() *sampler {
	names := []string{"/gc/cycles/total:gc-cycles", "/gc/heap/live:bytes", "/gc/scan/stack:bytes", "/gc/scan/globals:bytes", "/gc/gogc:percent"}
	s := &sampler{samples: make([]metrics.Sample, len(names))}
	for i, n := range names {
		s.samples[i].Name = n
	}
	return s
}

func (s *sampler) read() cycle {
	metrics.Read(s.samples)
	v := func(i int) uint64 {
		if s.samples[i].Value.Kind() != metrics.KindUint64 {
			return 0 // NB: a metric this runtime does not have
		}
		return s.samples[i].Value.Uint64()
	}
	return cycle{cycles: v(0), live: v(1), roots: v(2) + v(3)}
}

// gogc reads GOGC without setting it (debug.SetGCPercent would, and with
// -1 it waits for a cycle in progress); on is false for GOGC=off.
func (s *sampler) gogc() (percent int, on bool) {
	metrics.Read(s.samples)
	v := s.samples[4].Value
	if v.Kind() != metrics.KindUint64 || v.Uint64() > math.MaxInt32 { // NB: off reads as uint64(-1)
		return 0, false
	}
	return int(v.Uint64()), true
}
