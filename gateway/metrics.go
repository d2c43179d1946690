package gateway

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lodestone-kv/lodestone/internal/buildinfo"
)

// Status classes as metric label values; index 0 is for errors that
// produced no HTTP status from the origin (connect failures, timeouts).
var classes = [6]string{"error", "1xx", "2xx", "3xx", "4xx", "5xx"}

func classOf(status int) int {
	if status < 100 || status > 599 {
		return 0
	}
	return status / 100
}

// latencyBuckets span 0.5ms to ~12s.
var latencyBuckets = prometheus.ExponentialBuckets(0.0005, 2.5, 12)

// metrics are the gateway's Prometheus collectors, registered on its own
// registry (Gateway.Registry; served on the admin port's /metrics). Hot
// paths use children cached on routes, services and origins, so a request
// does no label lookups.
type metrics struct {
	reg *prometheus.Registry

	routeRequests *prometheus.CounterVec   // route, class
	routeLatency  *prometheus.HistogramVec // route
	routeRetries  *prometheus.CounterVec   // route

	originRequests *prometheus.CounterVec   // service, origin, class
	originLatency  *prometheus.HistogramVec // service, origin

	connsOpen   *prometheus.GaugeVec   // service
	connsOpened *prometheus.CounterVec // service
	ejections   *prometheus.CounterVec // service

	shed          *prometheus.CounterVec // reason
	unrouted      prometheus.Counter
	budgetSpent   prometheus.Counter
	updates       prometheus.Counter
	persistErrors prometheus.Counter
}

// Reasons a request is shed (label of gateway_shed_requests_total).
const (
	shedOverload  = "overload"     // MaxInFlight reached and no slot within MaxQueueTime
	shedNoOrigin  = "no_origin"    // the service has no healthy instance
	shedSaturated = "origin_limit" // every origin in reach ejected or at its limit
)

func newMetrics(g *Gateway) *metrics {
	reg := prometheus.NewRegistry()
	m := &metrics{
		reg: reg,
		routeRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_requests_total", Help: "Requests answered, by route and status class (error: no status from any origin).",
		}, []string{"route", "class"}),
		routeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gateway_request_duration_seconds", Help: "Time from admission to the end of the response, by route.", Buckets: latencyBuckets,
		}, []string{"route"}),
		routeRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_retries_total", Help: "Retried attempts, by route.",
		}, []string{"route"}),
		originRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_origin_requests_total", Help: "Attempts sent to origins, by service, origin (instance id) and status class.",
		}, []string{"service", "origin", "class"}),
		originLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "gateway_origin_request_duration_seconds", Help: "Attempt latency to the end of the response, by service and origin.", Buckets: latencyBuckets,
		}, []string{"service", "origin"}),
		connsOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gateway_origin_connections_open", Help: "Open connections to origins, by service.",
		}, []string{"service"}),
		connsOpened: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_origin_connections_opened_total", Help: "Connections opened to origins, by service (rate() gives opened per second).",
		}, []string{"service"}),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_ejections_total", Help: "Origins ejected as outliers, by service.",
		}, []string{"service"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_shed_requests_total", Help: "Requests answered 503 without reaching an origin, by reason (overload, no_origin, origin_limit).",
		}, []string{"reason"}),
		unrouted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gateway_unrouted_requests_total", Help: "Requests no route matched (answered 404).",
		}),
		budgetSpent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gateway_retry_budget_exhausted_total", Help: "Retries not made because the retry budget was spent.",
		}),
		updates: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gateway_table_updates_total", Help: "Updates applied to the routing table.",
		}),
		persistErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gateway_persist_errors_total", Help: "Failed writes of the routing table to the state dir.",
		}),
	}
	for _, r := range []string{shedOverload, shedNoOrigin, shedSaturated} {
		m.shed.WithLabelValues(r)
	}
	reg.MustRegister(m.routeRequests, m.routeLatency, m.routeRetries, m.originRequests, m.originLatency,
		m.connsOpen, m.connsOpened, m.ejections, m.shed, m.unrouted, m.budgetSpent, m.updates, m.persistErrors,
		&tableCollector{g: g},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "gateway_in_flight_requests", Help: "Requests admitted and not finished.",
		}, func() float64 { return float64(g.admit.inFlight()) }),
		buildinfo.NewCollector(),
	)
	return m
}

// routeMetrics are one route's cached children.
type routeMetrics struct {
	requests [6]prometheus.Counter
	latency  prometheus.Observer
	retries  prometheus.Counter
}

func (m *metrics) forRoute(name string) *routeMetrics {
	rm := &routeMetrics{latency: m.routeLatency.WithLabelValues(name), retries: m.routeRetries.WithLabelValues(name)}
	for i, c := range classes {
		rm.requests[i] = m.routeRequests.WithLabelValues(name, c)
	}
	return rm
}

func (m *metrics) deleteRoute(name string) {
	m.routeRequests.DeletePartialMatch(prometheus.Labels{"route": name})
	m.routeLatency.DeleteLabelValues(name)
	m.routeRetries.DeleteLabelValues(name)
}

// serviceMetrics are one service's cached children.
type serviceMetrics struct {
	connsOpen   prometheus.Gauge
	connsOpened prometheus.Counter
	ejections   prometheus.Counter
}

func (m *metrics) forService(name string) *serviceMetrics {
	return &serviceMetrics{
		connsOpen:   m.connsOpen.WithLabelValues(name),
		connsOpened: m.connsOpened.WithLabelValues(name),
		ejections:   m.ejections.WithLabelValues(name),
	}
}

// originMetrics are one origin's cached children.
type originMetrics struct {
	requests [6]prometheus.Counter
	latency  prometheus.Observer
}

func (m *metrics) forOrigin(service, id string) *originMetrics {
	om := &originMetrics{latency: m.originLatency.WithLabelValues(service, id)}
	for i, c := range classes {
		om.requests[i] = m.originRequests.WithLabelValues(service, id, c)
	}
	return om
}

// deleteOrigin drops a gone origin's series. NB: by exact labels, not
// DeletePartialMatch, which scans every series: under churn this runs for
// every deregistration.
func (m *metrics) deleteOrigin(service, id string) {
	for _, c := range classes {
		m.originRequests.DeleteLabelValues(service, id, c)
	}
	m.originLatency.DeleteLabelValues(service, id)
}

// tableCollector exports what the current table and the registry link say,
// computed at scrape time.
type tableCollector struct{ g *Gateway }

var (
	descStaleness = prometheus.NewDesc("gateway_table_staleness_seconds",
		"Seconds since the routing table was last known to match the registry: 0 while the source is connected, else the time since it lost the registry (or, on a cold start from the state dir, since the table was saved).", nil, nil)
	descConnected = prometheus.NewDesc("gateway_registry_connected", "1 while the source is connected to the registry.", nil, nil)
	descIndex     = prometheus.NewDesc("gateway_table_index", "Registry index of the routing table.", nil, nil)
	descOrigins   = prometheus.NewDesc("gateway_origins", "Healthy origins in the routing table, by service.", []string{"service"}, nil)
	descEjected   = prometheus.NewDesc("gateway_origins_ejected", "Origins currently ejected, by service.", []string{"service"}, nil)
	descSubsets   = prometheus.NewDesc("gateway_subsets", "Subsets the service's ring is cut into.", []string{"service"}, nil)
)

func (c *tableCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descStaleness, descConnected, descIndex, descOrigins, descEjected, descSubsets} {
		ch <- d
	}
}

func (c *tableCollector) Collect(ch chan<- prometheus.Metric) {
	g := c.g
	now := g.clock.Now()
	ch <- prometheus.MustNewConstMetric(descStaleness, prometheus.GaugeValue, g.Staleness().Seconds())
	conn := 0.0
	if g.connected.Load() {
		conn = 1
	}
	ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, conn)
	t := g.table.Load()
	ch <- prometheus.MustNewConstMetric(descIndex, prometheus.GaugeValue, float64(t.index))
	for name, s := range t.services {
		ch <- prometheus.MustNewConstMetric(descOrigins, prometheus.GaugeValue, float64(len(s.members)), name)
		ch <- prometheus.MustNewConstMetric(descEjected, prometheus.GaugeValue, float64(s.ejectedCount(now.UnixNano())), name)
		ch <- prometheus.MustNewConstMetric(descSubsets, prometheus.GaugeValue, float64(int(1)<<s.bits), name)
	}
}

// retryAfterValue renders a Retry-After in whole seconds, at least 1.
func retryAfterValue(secs float64) string {
	s := int(secs + 0.999)
	if s < 1 {
		s = 1
	}
	return strconv.Itoa(s)
}
