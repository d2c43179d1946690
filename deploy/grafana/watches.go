package grafana

import "github.com/grafana/grafana-foundation-sdk/go/dashboard"

// watches shows the watch fan-out hub and Consul blocking queries: load,
// delivery lag and the watchers cut loose (watch-overload.md).
func watches() *dashboard.DashboardBuilder {
	b := newDashboard("lodestone-watches", "Lodestone / Watches and blocking queries",
		"Watchers per shard, delivery lag, watchers cut loose, the event log, parked blocking queries and default-mode reads (docs/runbooks/watch-overload.md).")
	variables(b, "lodestone_watch_index", "Servers")

	row(b, "Watchers",
		graph("Watchers per shard", "Watchers linked in each shard of each server. Far above what you run: more watchers than planned.", "none",
			q(sel("lodestone_watch_watchers"), "{{instance}} shard {{shard}}")),
		graph("Delivery lag", "From Publish to the event being in a watcher's buffer (recording.yml). p99 above a second: watch-overload.md.", "s",
			q(sel("instance:lodestone_watch_delivery_lag_seconds:p99"), "{{instance}} p99"),
			q(sel("instance:lodestone_watch_delivery_lag_seconds:p90"), "{{instance}} p90"),
			q(sel("instance:lodestone_watch_delivery_lag_seconds:p50"), "{{instance}} p50")).
			Thresholds(thresholds(nil, "green", 1.0, "red")),
		graph("Watchers cut loose by reason", "overflow: a slow consumer; replay: catch-up larger than the buffer; lag: the shard behind the log; restore: a snapshot installed. They resync, adding load.", "ops",
			q(`sum by (instance, reason) (`+rate(sel("lodestone_watch_watchers_cut_total"))+`)`, "{{instance}} {{reason}}")),
		graph("Shard lag", "Log entries published but not yet applied by each shard. Beyond 4,096 a shard decodes events from the log's encoding.", "none",
			q(sel("lodestone_watch_shard_lag_entries"), "{{instance}} shard {{shard}}")),
		graph("Buffer occupancy", "Mean and p99 fill of watcher buffers; near 1 means overflow cuts are coming.", "percentunit",
			q(rate(sel("lodestone_watch_buffer_occupancy_ratio_sum"))+" / "+rate(sel("lodestone_watch_buffer_occupancy_ratio_count")), "{{instance}} mean"),
			q(`histogram_quantile(0.99, sum by (instance, le) (`+rate(sel("lodestone_watch_buffer_occupancy_ratio_bucket"))+`))`, "{{instance}} p99")).
			Min(0).Max(1),
		graph("Network input delay p99", "How late the process notices network input; fan-out that keeps it busy delays Raft messages and requests too.", "s",
			q(sel("instance:lodestone_runtime_poll_delay_seconds:p99"), "{{instance}}")).
			Thresholds(thresholds(nil, "green", 0.05, "red")),
	)

	row(b, "Events",
		graph("Events published and delivered", "Events given to the hub, events copied into watcher buffers (one per matching watcher), and events decoded from the log's encoding (a shard or resuming watcher far behind).", "ops",
			q(rate(sel("lodestone_watch_events_published_total")), "{{instance}} published"),
			q(rate(sel("lodestone_watch_events_delivered_total")), "{{instance}} delivered"),
			q(rate(sel("lodestone_watch_events_decoded_total")), "{{instance}} decoded")),
		graph("Event log retained", "Events and bytes the log keeps for resuming watchers, and the bytes of its encoded (older) part.", "bytes",
			q(sel("lodestone_watch_retained_bytes"), "{{instance}} retained bytes"),
			q(sel("lodestone_watch_encoded_bytes"), "{{instance}} encoded bytes")),
		graph("Resumable index range", "The last index published and the smallest a watcher can resume from; older resumes must reload.", "none",
			q(sel("lodestone_watch_index"), "{{instance}} last"),
			q(sel("lodestone_watch_oldest_index"), "{{instance}} oldest"),
			q(sel("lodestone_watch_retained_events"), "{{instance}} events retained")),
	)

	row(b, "Blocking queries and reads",
		graph("Blocking queries waiting", "Catalog, session and KV blocking queries waiting for a change, by API, and Consul HTTP queries parked without a goroutine.", "none",
			q(`sum by (instance, api) (`+sel("lodestone_blocking_queries_in_flight")+`)`, "{{instance}} {{api}}"),
			q(sel("lodestone_http_parked_requests"), "{{instance}} parked")),
		graph("Parked queries: answered, woken, gone", "Answered (a change or the end of their wait), woken by events (woken far more than answered: queries on a busy prefix), and dropped because their client hung up.", "ops",
			q(rate(sel("lodestone_http_parked_resumed_total")), "{{instance}} answered"),
			q(rate(sel("lodestone_http_parked_wakeups_total")), "{{instance}} woken"),
			q(rate(sel("lodestone_http_parked_clients_gone_total")), "{{instance}} clients gone")),
		graph("Default-mode reads", "Consul-API reads served by the leader without a ReadIndex round, by followers at the leader's commit index, and the followers' questions for that index (one per batch).", "ops",
			q(rate(sel("lodestone_leader_reads_total")), "{{instance}} leader reads"),
			q(rate(sel("lodestone_follower_leader_reads_total")), "{{instance}} follower reads"),
			q(rate(sel("lodestone_leader_index_calls_total")), "{{instance}} leader-index calls")),
		graph("HTTP connections", "Open HTTP connections; every blocking query holds one, up to --max-http-connections.", "none",
			q(sel("lodestone_http_connections"), "{{instance}}")),
		graph("Watch admission", "New watch streams admitted per second (0: not gated) and refused, while admission control ramps.", "reqps",
			q(sel("lodestone_admission_limit_per_second", `class="watch"`), "{{instance}} admitted rate"),
			q(rate(sel("lodestone_admission_rejected_total", `class="watch"`)), "{{instance}} refused")),
	)
	return b
}
