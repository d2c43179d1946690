package httppark

import "github.com/prometheus/client_golang/prometheus"

var (
	parkedDesc = prometheus.NewDesc("lodestone_http_parked_requests",
		"Blocking HTTP requests parked without a goroutine, waiting for a change or their wait.", nil, nil)
	resumedDesc = prometheus.NewDesc("lodestone_http_parked_resumed_total",
		"Parked requests answered (a change or the end of their wait).", nil, nil)
	goneDesc = prometheus.NewDesc("lodestone_http_parked_clients_gone_total",
		"Parked requests dropped because their client closed the connection.", nil, nil)
	wakeupsDesc = prometheus.NewDesc("lodestone_http_parked_wakeups_total",
		"Parked requests woken by events; those whose answer had not changed went back to waiting.", nil, nil)
)

// Describe and Collect make a Lot a prometheus.Collector.
func (l *Lot) Describe(ch chan<- *prometheus.Desc) {
	ch <- parkedDesc
	ch <- resumedDesc
	ch <- goneDesc
	ch <- wakeupsDesc
}

func (l *Lot) Collect(ch chan<- prometheus.Metric) {
	st := l.Stats()
	ch <- prometheus.MustNewConstMetric(parkedDesc, prometheus.GaugeValue, float64(st.Parked))
	ch <- prometheus.MustNewConstMetric(resumedDesc, prometheus.CounterValue, float64(st.Resumed))
	ch <- prometheus.MustNewConstMetric(goneDesc, prometheus.CounterValue, float64(st.Gone))
	ch <- prometheus.MustNewConstMetric(wakeupsDesc, prometheus.CounterValue, float64(st.Wakeups))
}
