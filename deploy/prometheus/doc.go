// Package prometheus holds Lodestone's Prometheus files and the tests that
// keep them true:
//
//   - alerts.yml: an alert per failure mode in docs/runbooks/, each naming
//     its runbook in runbook_url;
//   - recording.yml: the percentiles and quorum arithmetic the dashboards
//     (deploy/grafana) and the alerts read;
//   - prometheus.yml: an example scrape configuration for servers, agents
//     and gateways over TLS;
//   - tests/*.yml: promtool unit tests that fire every alert from synthetic
//     series and keep it silent on a healthy one.
//
// promtool (Debian's prometheus package) checks the rules and the
// configuration and runs the unit tests; the Go tests here run it and
// check what promtool cannot: that every alert has a firing and a silent
// case and a runbook that exists. That every metric named here is one the
// binaries export is checked by deploy/metricnames.
//
// The package has no code of its own, only these files and their tests.
package prometheus
