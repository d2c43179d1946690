package dnsapi

import (
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// metricTypes are the query types counted by name; every other type counts
// as "other", so a client cannot grow the label set.
var metricTypes = []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypeANY, dns.TypeTXT, dns.TypeSOA,
	dns.TypeNS, dns.TypePTR, dns.TypeCNAME, dns.TypeMX, dns.TypeAXFR}

// maxRcode bounds the rcodes counted by name; above it, "other".
const maxRcode = dns.RcodeNotZone

type metrics struct {
	queries  *prometheus.CounterVec
	duration prometheus.Histogram
	refused  *prometheus.CounterVec
	tcpOpen  prometheus.GaugeFunc
	fastPath *prometheus.CounterVec
	flushes  prometheus.Counter
	cached   prometheus.GaugeFunc

	// counters caches queries' children by qtype<<16|rcode, so a query
	// costs no label hashing; at most 4096 are kept (labels are bounded
	// anyway, the keys are not).
	mu       sync.RWMutex
	counters map[uint32]prometheus.Counter
}

func newMetrics(tcpOpen, cachedBytes func() float64) *metrics {
	m := &metrics{
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "dns_queries_total",
			Help: "DNS questions answered, by query type (other: types not named) and response code.",
		}, []string{"type", "rcode"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "lodestone", Name: "dns_query_duration_seconds",
			Help:    "Time from a DNS question read to its answer ready to write (forwarded questions included).",
			Buckets: []float64{25e-6, 50e-6, 100e-6, 250e-6, 500e-6, .001, .0025, .005, .01, .025, .1, .5, 2},
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "dns_refused_total",
			Help: "DNS work refused by a limit, by reason (tcp_connections: --dns-max-tcp-connections; recursions: forwards in flight at the cap, answered SERVFAIL; udp_handoff: UDP questions dropped with the full handler's queue full).",
		}, []string{"reason"}),
		tcpOpen: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "lodestone", Name: "dns_tcp_connections",
			Help: "Open TCP connections on the DNS listener.",
		}, tcpOpen),
		fastPath: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "dns_udp_fast_path_total",
			Help: "UDP datagrams read by the fast path, by outcome (answered: from a kept answer; not_kept: a service question with no current answer kept, passed to the full handler, which keeps one; other: any other datagram, passed to the full handler).",
		}, []string{"outcome"}),
		flushes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "dns_answer_cache_flushes_total",
			Help: "Times the kept service answers reached their bound (AnswerCacheBytes) and were all dropped.",
		}),
		cached: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "lodestone", Name: "dns_answer_cache_bytes",
			Help: "Bytes of packed service answers kept.",
		}, cachedBytes),
		counters: map[uint32]prometheus.Counter{},
	}
	for _, r := range []string{reasonTCP, reasonRecursions, reasonHandoff} {
		m.refused.WithLabelValues(r)
	}
	for _, o := range []string{outcomeAnswered, outcomeNotKept, outcomeOther} {
		m.fastPath.WithLabelValues(o)
	}
	return m
}

const (
	reasonTCP        = "tcp_connections"
	reasonRecursions = "recursions"
	reasonHandoff    = "udp_handoff"

	outcomeAnswered = "answered"
	outcomeNotKept  = "not_kept"
	outcomeOther    = "other"
)

func (m *metrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.queries, m.duration, m.refused, m.tcpOpen, m.fastPath, m.flushes, m.cached} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *metrics) observe(qtype uint16, rcode int, took time.Duration) {
	m.duration.Observe(took.Seconds())
	key := uint32(qtype)<<16 | uint32(rcode&0xffff)
	m.mu.RLock()
	c := m.counters[key]
	m.mu.RUnlock()
	if c == nil {
		c = m.queries.WithLabelValues(typeLabel(qtype), rcodeLabel(rcode))
		m.mu.Lock()
		if len(m.counters) < 4096 {
			m.counters[key] = c
		}
		m.mu.Unlock()
	}
	c.Inc()
}

func typeLabel(qtype uint16) string {
	for _, t := range metricTypes {
		if t == qtype {
			return dns.TypeToString[t]
		}
	}
	return "other"
}

func rcodeLabel(rcode int) string {
	if s, ok := dns.RcodeToString[rcode]; ok && rcode <= maxRcode {
		return s
	}
	return "other"
}
