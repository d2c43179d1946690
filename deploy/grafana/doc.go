// Package grafana holds Lodestone's Grafana dashboards (*.json) and the
// code that writes them: cluster, Raft log, watches and blocking queries,
// and gateway. The JSON files are generated (go run ./grafana/cmd/gen
// grafana, from deploy/); a test fails when they differ from what the code
// writes, so edit the Go code, not the JSON.
//
// Every query reads through the datasource variable DS_PROMETHEUS, so the
// files import into any Grafana; percentiles come from the recording
// rules in deploy/prometheus/recording.yml. That every metric a panel
// reads is one the binaries export is checked by deploy/metricnames.
package grafana
