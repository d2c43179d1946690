package server

import (
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the numbers an operator reads during an incident. They live
// on the server's own registry so several servers can share a process.
// metrics are the server's own; the Raft node and the peer transport
// register theirs on the same registry.
type metrics struct {
	reg *prometheus.Registry

	requests  *prometheus.CounterVec // gRPC by method and code
	pollDelay prometheus.Histogram   // pollprobe.go
}

func newMetrics() *metrics {
	reg := prometheus.NewRegistry()
	// NB: the GC's CPU by kind (go_cpu_classes_gc_*: mark assist,
	// dedicated, idle, pause, total) beside the default Go metrics. On a
	// busy core it is a cycle's marking that delays writes, and
	// go_gc_duration_seconds counts only its pauses.
	gcCPU := collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/cpu/classes/gc/`)}
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(gcCPU)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), newSchedLatency())
	m := &metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "grpc_requests_total", Help: "Client gRPC requests by method and status code.",
		}, []string{"method", "code"}),
		pollDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "lodestone", Name: "runtime_poll_delay_seconds",
			Help:    "How long a datagram this server sends itself on loopback waits before it is read: how late the process notices network input.",
			Buckets: runtimeDelayBuckets,
		}),
	}
	reg.MustRegister(m.requests, m.pollDelay)
	return m
}
