package watch

import "github.com/prometheus/client_golang/prometheus"

// metrics are the Hub's own Prometheus metrics, created in New and exposed
// by the Hub as a prometheus.Collector. Nothing is registered globally.
//
// NB: consumers (Next) touch no metric: a counter every consumer
// increments would be one contended cache line shared by 100k streams.
// Shards count in scratch and add once per step; occupancy is sampled by
// the progress tick.
type metrics struct {
	published prometheus.Counter
	delivered prometheus.Counter
	cut       *prometheus.CounterVec
	lag       prometheus.Histogram
	occupancy prometheus.Histogram

	// Read at scrape time.
	watchersDesc *prometheus.Desc
	shardLagDesc *prometheus.Desc
	indexDesc    *prometheus.Desc
	oldestDesc   *prometheus.Desc
	retainedDesc *prometheus.Desc
	bytesDesc    *prometheus.Desc
	encodedDesc  *prometheus.Desc
	decodedDesc  *prometheus.Desc
}

func newMetrics() *metrics {
	const ns, sub = "lodestone", "watch"
	m := &metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "events_published_total",
			Help: "Events given to Publish.",
		}),
		delivered: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "events_delivered_total",
			Help: "Events copied into watcher buffers (one per matching watcher).",
		}),
		cut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: sub, Name: "watchers_cut_total",
			Help: "Watchers cut loose, by reason: overflow (slow consumer), replay (catch-up larger than the buffer), lag (shard behind the log), restore (snapshot installed).",
		}, []string{"reason"}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "delivery_lag_seconds",
			Help:    "Time from Publish to the event being in a watcher's buffer, per shard and index.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12), // 1µs … ~4s
		}),
		occupancy: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "buffer_occupancy_ratio",
			Help:    "Watcher buffer fill (buffered events / capacity), sampled on every progress tick.",
			Buckets: []float64{0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1},
		}),
		watchersDesc: prometheus.NewDesc(ns+"_"+sub+"_watchers",
			"Watchers linked in each shard.", []string{"shard"}, nil),
		shardLagDesc: prometheus.NewDesc(ns+"_"+sub+"_shard_lag_entries",
			"Log entries published but not yet applied by each shard.", []string{"shard"}, nil),
		indexDesc: prometheus.NewDesc(ns+"_"+sub+"_index",
			"Last index published to the hub.", nil, nil),
		oldestDesc: prometheus.NewDesc(ns+"_"+sub+"_oldest_index",
			"Smallest start index a watcher can resume from.", nil, nil),
		retainedDesc: prometheus.NewDesc(ns+"_"+sub+"_retained_events",
			"Events retained in the log for resuming watchers.", nil, nil),
		bytesDesc: prometheus.NewDesc(ns+"_"+sub+"_retained_bytes",
			"Estimated bytes of events retained in the log.", nil, nil),
		encodedDesc: prometheus.NewDesc(ns+"_"+sub+"_encoded_bytes",
			"Bytes of the chunks holding the log's encoded (older than the newest 4,096 entries) events.", nil, nil),
		decodedDesc: prometheus.NewDesc(ns+"_"+sub+"_events_decoded_total",
			"Events decoded from the log's encoding: read by a shard more than 4,096 entries behind, or replayed for a watcher resuming from that far back.", nil, nil),
	}
	for _, r := range []string{reasonOverflow, reasonReplay, reasonLag, reasonRestore} {
		m.cut.WithLabelValues(r)
	}
	return m
}

var _ prometheus.Collector = (*Hub)(nil)

// Describe implements prometheus.Collector.
func (h *Hub) Describe(ch chan<- *prometheus.Desc) {
	m := h.metrics
	m.published.Describe(ch)
	m.delivered.Describe(ch)
	m.cut.Describe(ch)
	m.lag.Describe(ch)
	m.occupancy.Describe(ch)
	for _, d := range []*prometheus.Desc{m.watchersDesc, m.shardLagDesc, m.indexDesc, m.oldestDesc, m.retainedDesc, m.bytesDesc, m.encodedDesc, m.decodedDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. It takes each shard's lock
// briefly and the log's read lock; never a watcher's.
func (h *Hub) Collect(ch chan<- prometheus.Metric) {
	m := h.metrics
	m.published.Collect(ch)
	m.delivered.Collect(ch)
	m.cut.Collect(ch)
	m.lag.Collect(ch)
	m.occupancy.Collect(ch)

	l := &h.log
	l.mu.RLock()
	next, last, floor, events, bytes, encoded := l.next, l.last, l.floor, l.events, l.bytes, l.arena.held
	l.mu.RUnlock()
	for _, s := range h.shards {
		s.mu.Lock()
		n, cursor := s.n, s.cursor
		s.mu.Unlock()
		ch <- prometheus.MustNewConstMetric(m.watchersDesc, prometheus.GaugeValue, float64(n), s.label)
		lag := 0.0
		if next > cursor {
			lag = float64(next - cursor)
		}
		ch <- prometheus.MustNewConstMetric(m.shardLagDesc, prometheus.GaugeValue, lag, s.label)
	}
	ch <- prometheus.MustNewConstMetric(m.indexDesc, prometheus.GaugeValue, float64(last))
	ch <- prometheus.MustNewConstMetric(m.oldestDesc, prometheus.GaugeValue, float64(floor))
	ch <- prometheus.MustNewConstMetric(m.retainedDesc, prometheus.GaugeValue, float64(events))
	ch <- prometheus.MustNewConstMetric(m.bytesDesc, prometheus.GaugeValue, float64(bytes))
	ch <- prometheus.MustNewConstMetric(m.encodedDesc, prometheus.GaugeValue, float64(encoded))
	ch <- prometheus.MustNewConstMetric(m.decodedDesc, prometheus.CounterValue, float64(l.decoded.Load()))
}
