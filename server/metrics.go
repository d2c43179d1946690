package server

import (
	"regexp"

	"github.com/lodestone-kv/lodestone/internal/buildinfo"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/store/valuefile"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the numbers an operator reads during an incident. They live
// on the server's own registry so several servers can share a process.
// metrics are the server's own; the Raft node and the peer transport
// register theirs on the same registry.
type metrics struct {
	reg *prometheus.Registry

	requests *prometheus.CounterVec // gRPC by method and code
	// refusedConns counts connections closed at accept, by listener
	// (grpc, http) and reason (per_client).
	refusedConns *prometheus.CounterVec
	// refused counts requests refused by a size limit before they were
	// read or answered, by api (grpc, http) and limit (the flag's name).
	refused   *prometheus.CounterVec
	pollDelay prometheus.Histogram // pollprobe.go
	promoted  prometheus.Counter   // promote.go
	// watchStreams counts the gRPC Watch streams open now (watch.go).
	watchStreams prometheus.Gauge
}

func newMetrics() *metrics {
	reg := prometheus.NewRegistry()
	// NB: the GC's CPU by kind (go_cpu_classes_gc_*: mark assist,
	// dedicated, idle, pause, total) beside the default Go metrics. On a
	// busy core it is a cycle's marking that delays writes, and
	// go_gc_duration_seconds counts only its pauses.
	gcCPU := collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/cpu/classes/gc/`)}
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(gcCPU)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), newSchedLatency(), buildinfo.NewCollector())
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
	m.refusedConns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lodestone", Name: "connections_refused_total",
		Help: "Client connections closed at accept, by listener (grpc, http) and reason (per_client: the source IP already holds --max-*-connections-per-client).",
	}, []string{"listener", "reason"})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lodestone", Name: "requests_refused_total",
		Help: "Requests refused by a size limit, by api (grpc, http) and limit (the flag that sets it).",
	}, []string{"api", "limit"})
	for _, l := range []string{"grpc", "http"} {
		m.refusedConns.WithLabelValues(l, "per_client")
	}
	m.promoted = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "lodestone", Name: "members_promoted_total",
		Help: "Learners this node promoted to voter as leader once they had caught up.",
	})
	m.watchStreams = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "lodestone", Name: "watch_streams", Help: "gRPC Watch streams open now (each carries many watches).",
	})
	reg.MustRegister(m.requests, m.pollDelay, m.refusedConns, m.refused, m.promoted, m.watchStreams)
	return m
}

// sessionMetrics are what an operator needs about sessions (how many
// exist and why they end) and blocking queries (how many wait now).
type sessionMetrics struct {
	invalidated *prometheus.CounterVec
	blocking    *prometheus.GaugeVec // by api: grpc, http
}

func newSessionMetrics(reg prometheus.Registerer, st *store.Store) *sessionMetrics {
	m := &sessionMetrics{
		invalidated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "sessions_invalidated_total",
			Help: "Sessions this node invalidated as leader, by reason (ttl).",
		}, []string{"reason"}),
		blocking: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "lodestone", Name: "blocking_queries_in_flight",
			Help: "Catalog, session and KV blocking queries waiting for a change, by api (grpc, http).",
		}, []string{"api"}),
	}
	active := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "lodestone", Name: "sessions_active",
		Help: "Sessions in the replicated state on this node.",
	}, func() float64 {
		list, _ := st.Sessions()
		return float64(len(list))
	})
	// Export the series at zero before the first event, so dashboards and
	// rate() see them from the start.
	m.invalidated.WithLabelValues("ttl")
	m.blocking.WithLabelValues("grpc")
	m.blocking.WithLabelValues("http")
	reg.MustRegister(m.invalidated, m.blocking, active)
	return m
}

// registerValueMetrics exports what the store's value file holds
// (store/valuefile): its length, what its live values take, and the slots
// waiting for reuse. A file far longer than its live slots after a burst
// of deletes is expected (it never shrinks); pending bytes that only grow
// mean a snapshot is held too long. A base file is a snapshot a member
// restored from: it stays open, even once removed from snap/, until no
// key's value lies in it.
func registerValueMetrics(reg prometheus.Registerer, st *store.Store) {
	gauge := func(name, help string, v func(valuefile.Stats) uint64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "lodestone", Subsystem: "value_file", Name: name, Help: help},
			func() float64 { return float64(v(st.ValueStats())) })
	}
	reg.MustRegister(
		gauge("bytes", "Length of the value file, the peak of what it held.", func(s valuefile.Stats) uint64 { return s.FileBytes }),
		gauge("values", "Values in the value file.", func(s valuefile.Stats) uint64 { return s.Values }),
		gauge("value_bytes", "Bytes of the values in the value file.", func(s valuefile.Stats) uint64 { return s.ValueBytes }),
		gauge("slot_bytes", "Bytes of the slots the values take.", func(s valuefile.Stats) uint64 { return s.SlotBytes }),
		gauge("free_bytes", "Bytes of free slots, reused by values of their size.", func(s valuefile.Stats) uint64 { return s.FreeBytes }),
		gauge("pending_bytes", "Bytes of slots freed while a snapshot was being written, reused once it is done.", func(s valuefile.Stats) uint64 { return s.PendingBytes }),
		gauge("base_files", "Snapshot files held open because restored values still lie in them.", func(s valuefile.Stats) uint64 { return uint64(s.BaseFiles) }),
		gauge("base_bytes", "Bytes of the values that lie in those snapshot files.", func(s valuefile.Stats) uint64 { return s.BaseBytes }),
	)
}
