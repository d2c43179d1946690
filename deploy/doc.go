// Package deploy holds the tests of Lodestone's deployment files: the
// container image and compose cluster (compose/), the Kubernetes manifests
// (k8s/), the systemd unit (systemd/), the Grafana dashboards (grafana/)
// and the Prometheus rules (prometheus/), whose queried metrics
// metricnames/ checks against what the binaries serve. It is a module of
// its own so the Kubernetes API types, Grafana's dashboard SDK and the
// PromQL parser its checks use stay out of the server's dependencies.
package deploy
