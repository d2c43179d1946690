package server

import (
	"math"
	rtmetrics "runtime/metrics"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// loadGate tells admission when this process is short of CPU, so that
// while the policy gates them it holds the work whose setup costs most
// (new client connections, watch creates) and leaves the processor to
// the work already admitted, the Raft loop's among it. Its signal is the
// Go scheduler's run-queue latency (/sched/latencies), which also grows
// when the kernel runs other processes on this one's cores. It reads it
// at most every loadWindow and only when admission asks, so a server with
// nothing to admit pays nothing for it.
//
// NB: rates alone could not do this. The connection and watch rates that
// a quiet core takes are more than the same core takes while every
// server sharing it sets up its returning clients at once: with the rates
// alone, a restart of every member queued their commits behind that
// setup for up to a second (make drill); the load, not a rate, says when
// to stop.
type loadGate struct {
	max  time.Duration                      // a window is overloaded when over 1% of its waits exceed this; 0: off
	read func() *rtmetrics.Float64Histogram // cumulative; nil: the runtime lacks it

	mu   sync.Mutex
	at   time.Time // when the verdict was taken
	prev []uint64  // the histogram's counts then
	over bool
	let  [numSetups]time.Time // when hold last let a setup through while overloaded

	overloaded prometheus.Gauge
	holds      *prometheus.CounterVec
}

// Setup kinds the gate holds.
const (
	setupConn = iota
	setupWatch
	numSetups
)

var setupNames = [numSetups]string{"connection", "watch"}

const (
	// loadWindow is how often the gate re-reads the scheduler's latencies:
	// short enough to close within a reconnect storm's first burst.
	loadWindow = 10 * time.Millisecond
	// loadFloor is how often an overloaded gate still lets one setup of
	// each kind through: a server that its own steady work keeps over
	// the mark must not keep its clients out for good.
	loadFloor = 250 * time.Millisecond
	// loadSlowShare is the share of a window's waits over max that makes
	// it overloaded: its p99.
	loadSlowShare = 0.01
)

func newLoadGate(max time.Duration, reg prometheus.Registerer) *loadGate {
	g := &loadGate{
		max:  max,
		read: schedLatencies(),
		overloaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "lodestone", Name: "admission_overloaded",
			Help: "1 while this server's latest look at its scheduler found it short of CPU (--admission-max-sched-delay): gated connections and watch creates are held meanwhile.",
		}),
		holds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "admission_load_holds_total",
			Help: "New client connections (accepts delayed) and watch creates (refused) held because this server was short of CPU, by kind.",
		}, []string{"kind"}),
	}
	for _, k := range setupNames {
		g.holds.WithLabelValues(k)
	}
	reg.MustRegister(g.overloaded, g.holds)
	return g
}

// hold reports whether a setup of kind k should wait: the process is
// overloaded and the last setup of that kind let through meanwhile came
// less than loadFloor ago. The caller counts what it held in g.holds.
func (g *loadGate) hold(now time.Time, k int) bool {
	if g.max <= 0 {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.overloadedAt(now) {
		return false
	}
	if now.Sub(g.let[k]) >= loadFloor {
		g.let[k] = now
		return false
	}
	return true
}

// overloadedAt reports whether, in the latest window up to now, more than
// loadSlowShare of the goroutines that became runnable waited over g.max
// for a processor. The first look has no window and says no.
func (g *loadGate) overloadedAt(now time.Time) bool {
	if !g.at.IsZero() && now.Sub(g.at) < loadWindow {
		return g.over
	}
	h := g.read()
	if h == nil {
		return false
	}
	var total, slow uint64
	for i, n := range h.Counts {
		if i < len(g.prev) {
			n -= g.prev[i]
		}
		total += n
		if lo := h.Buckets[i]; !math.IsInf(lo, -1) && lo >= g.max.Seconds() {
			slow += n
		}
	}
	g.over = !g.at.IsZero() && slow > 0 && float64(slow) > loadSlowShare*float64(total)
	g.prev = append(g.prev[:0], h.Counts...)
	g.at = now
	g.overloaded.Set(b2f(g.over))
	return g.over
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
