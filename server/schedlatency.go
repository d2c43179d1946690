package server

import (
	"math"
	rtmetrics "runtime/metrics"

	"github.com/prometheus/client_golang/prometheus"
)

// runtimeDelayBuckets are the bounds of both runtime delay histograms
// (poll delay and scheduling latency), so the two read side by side:
// 50µs .. 1.6s.
var runtimeDelayBuckets = prometheus.ExponentialBuckets(0.00005, 2, 16)

// schedLatency exports the Go scheduler's run-queue latency
// (/sched/latencies:seconds: how long goroutines wait runnable before
// they run) as lodestone_runtime_sched_latency_seconds, in
// runtimeDelayBuckets. NB: not client_golang's Go collector, which folds
// the runtime's fine buckets into a handful a decade or more apart.
type schedLatency struct {
	desc *prometheus.Desc
}

func newSchedLatency() schedLatency {
	return schedLatency{desc: prometheus.NewDesc("lodestone_runtime_sched_latency_seconds",
		"How long goroutines wait runnable before they run (the Go scheduler's /sched/latencies): how short of CPU the process is.", nil, nil)}
}

func (c schedLatency) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c schedLatency) Collect(ch chan<- prometheus.Metric) {
	h := schedLatencies()()
	if h == nil {
		return // a runtime without the metric
	}
	count, sum, buckets := foldHistogram(h, runtimeDelayBuckets)
	ch <- prometheus.MustNewConstHistogram(c.desc, count, sum, buckets)
}

// foldHistogram turns a runtime histogram into cumulative counts at
// bounds. A runtime bucket counts at a bound when all of it lies at or
// below the bound. The runtime keeps no sum; each bucket adds its count
// times its midpoint (its finite edge, for an open-ended one).
func foldHistogram(h *rtmetrics.Float64Histogram, bounds []float64) (count uint64, sum float64, buckets map[float64]uint64) {
	buckets = make(map[float64]uint64, len(bounds))
	for _, b := range bounds {
		buckets[b] = 0
	}
	for i, n := range h.Counts {
		if n == 0 {
			continue
		}
		lo, hi := h.Buckets[i], h.Buckets[i+1]
		count += n
		mid := lo/2 + hi/2
		switch {
		case math.IsInf(hi, 1):
			mid = lo
		case math.IsInf(lo, -1):
			mid = hi
		}
		sum += mid * float64(n)
		for _, b := range bounds {
			if hi <= b {
				buckets[b] += n
			}
		}
	}
	return count, sum, buckets
}

// schedLatencies reads the scheduler's latency histogram, reusing one
// sample (and its counts) from read to read.
func schedLatencies() func() *rtmetrics.Float64Histogram {
	s := []rtmetrics.Sample{{Name: "/sched/latencies:seconds"}}
	return func() *rtmetrics.Float64Histogram {
		rtmetrics.Read(s)
		if s[0].Value.Kind() != rtmetrics.KindFloat64Histogram {
			return nil
		}
		return s[0].Value.Float64Histogram()
	}
}
