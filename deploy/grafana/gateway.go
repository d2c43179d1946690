package grafana

import "github.com/grafana/grafana-foundation-sdk/go/dashboard"

// gateway shows the edge gateway: its traffic, each service's origins and
// their ejection, what protection sheds and retries, and the registry
// feed (gateway-cut-off.md, origin-ejections.md).
func gateway() *dashboard.DashboardBuilder {
	b := newDashboard("lodestone-gateway", "Lodestone / Gateway",
		"Requests and latency by route, each service's origins with their requests, latency and ejections, shedding, retries and the registry feed (docs/runbooks/gateway-cut-off.md, docs/runbooks/origin-ejections.md).")
	variables(b, "gateway_registry_connected", "Gateways")
	b.WithVariable(labelVariable("service", "Service", `label_values(gateway_origins{job=~"$job", instance=~"$instance"}, service)`, true))

	svc := `service=~"$service"`
	row(b, "Registry feed",
		single("Registry connected", "1 while the gateway's watch stream to the registry is up.", "none",
			q(`min(`+sel("gateway_registry_connected")+`)`, "connected")).
			Thresholds(thresholds(nil, "red", 1.0, "green")).
			ColorMode("background"),
		single("Table staleness", "Seconds since the routing table last matched the registry: 0 while connected (gateway-cut-off.md).", "s",
			q(`max(`+sel("gateway_table_staleness_seconds")+`)`, "staleness")).
			Thresholds(thresholds(nil, "green", 60.0, "orange", 900.0, "red")),
		single("Table index", "The registry index the routing table is at; it moves with the registry's commits while connected.", "none",
			q(`max(`+sel("gateway_table_index")+`)`, "index")),
		single("In flight", "Requests admitted and not finished, all gateways chosen.", "none",
			q(`sum(`+sel("gateway_in_flight_requests")+`)`, "in flight")),
		graph("Feed", "Connected (1/0), staleness, routing-table updates applied, and failed writes of the table to the state dir.", "none",
			q(sel("gateway_registry_connected"), "{{instance}} connected"),
			q(sel("gateway_table_staleness_seconds"), "{{instance}} staleness (s)"),
			q(`increase(`+sel("gateway_table_updates_total")+`[$__rate_interval])`, "{{instance}} updates"),
			q(`increase(`+sel("gateway_persist_errors_total")+`[$__rate_interval])`, "{{instance}} persist errors")),
		graph("In flight", "Requests admitted and not finished; at --max-in-flight new ones queue, then are shed.", "none",
			q(sel("gateway_in_flight_requests"), "{{instance}}")),
	)

	row(b, "Routes",
		graph("Requests by class", "Requests answered per second by status class; error: no status from any origin.", "reqps",
			q(`sum by (class) (`+rate(sel("gateway_requests_total"))+`)`, "{{class}}")),
		graph("Error share by route", "5xx and no-status answers over all answers, after retries (recording.yml). Above 5%: origin-ejections.md.", "percentunit",
			q(sel("route:gateway_requests_errors:ratio_rate5m"), "{{instance}} {{route}}")).
			Thresholds(thresholds(nil, "green", 0.05, "red")),
		graph("Latency p99 by route", "From admission to the end of the response.", "s",
			q(sel("route:gateway_request_duration_seconds:p99"), "{{instance}} {{route}}")),
		graph("Unrouted", "Requests no route matched (404).", "reqps",
			q(rate(sel("gateway_unrouted_requests_total")), "{{instance}}")),
	)

	row(b, "Origins",
		graph("Origins and ejected origins", "Healthy origins in the table per service, and those ejected now as outliers (at most half: origin-ejections.md).", "none",
			q(sel("gateway_origins", svc), "{{instance}} {{service}} origins"),
			q(sel("gateway_origins_ejected", svc), "{{instance}} {{service}} ejected")),
		graph("Ejections", "Origins ejected per interval, by service.", "none",
			q(`sum by (service) (increase(`+sel("gateway_ejections_total", svc)+`[$__rate_interval]))`, "{{service}}")),
		graph("Origin requests by class", "Attempts sent to each origin by status class; one origin's 5xx or errors: it fails where the others do not.", "reqps",
			q(`sum by (service, origin, class) (`+rate(sel("gateway_origin_requests_total", svc))+`)`, "{{origin}} {{class}}")),
		graph("Origin latency p99", "Each origin's attempt latency to the end of the response (recording.yml).", "s",
			q(sel("origin:gateway_origin_request_duration_seconds:p99", svc), "{{origin}}")),
		graph("Origin connections", "Open connections to each service's origins, and connections opened per second (churn).", "none",
			q(sel("gateway_origin_connections_open", svc), "{{instance}} {{service}} open"),
			q(rate(sel("gateway_origin_connections_opened_total", svc)), "{{instance}} {{service}} opened/s")),
		graph("Subsets", "Subsets each service's ring is cut into; each shard pools connections to one.", "none",
			q(sel("gateway_subsets", svc), "{{instance}} {{service}}")),
	)

	row(b, "Protection",
		graph("Shed by reason", "503s answered without reaching an origin: overload (no slot within --max-queue-time), no_origin (no healthy instance), origin_limit (every origin in reach ejected or at its limit).", "reqps",
			q(`sum by (reason) (`+rate(sel("gateway_shed_requests_total"))+`)`, "{{reason}}")),
		graph("Retries and retry budget", "Retried attempts by route, and retries not made because the budget (20% of requests) was spent.", "reqps",
			q(`sum by (route) (`+rate(sel("gateway_retries_total"))+`)`, "{{route}} retries"),
			q(`sum(`+rate(sel("gateway_retry_budget_exhausted_total"))+`)`, "budget spent")),
	)
	return b
}
