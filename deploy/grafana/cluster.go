package grafana

import "github.com/grafana/grafana-foundation-sdk/go/dashboard"

// cluster is the first dashboard an operator opens: who is up and who
// leads, whether writes commit and how fast, what clients get, and the
// processes' health.
func cluster() *dashboard.DashboardBuilder {
	b := newDashboard("lodestone-cluster", "Lodestone / Cluster",
		"Members, leadership, replication, write latency, client requests, admission control and the server processes.")
	variables(b, "lodestone_raft_term", "Servers")
	b.WithVariable(labelVariable("agent_job", "Agents", "label_values(lodestone_agent_checks_run_total, job)", false))

	row(b, "Members",
		single("Servers up / quorum", "Servers answering scrapes, and how many must be up for writes to commit (recording.yml). Up equal to quorum: one more loss stops every write.", "none",
			q(`job:lodestone_servers_up:sum{job=~"$job"}`, "up"),
			q(`job:lodestone_quorum:size{job=~"$job"}`, "quorum")),
		single("Leader", "The server that says it leads. None for more than an election timeout: no writes (quorum-loss.md).", "none",
			q(`max by (instance) (lodestone_is_leader{job=~"$job"}) == 1`, "{{instance}}")).
			TextMode("name"),
		single("Leader changes (1h)", "Elections seen in the last hour; more than a few: slow-leader.md.", "none",
			q(`max(increase(lodestone_leader_changes_total{job=~"$job"}[1h]))`, "changes")).
			Thresholds(thresholds(nil, "green", 3.0, "orange", 10.0, "red")).
			ColorMode("background"),
		single("Term", "The Raft term; climbing without a leader is failed elections.", "none",
			q(`max(lodestone_raft_term{job=~"$job"})`, "term")),
		graph("Up", "1 while the server answers scrapes.", "none",
			q(sel("up"), "{{instance}}")).Max(1).Min(0),
		graph("Leadership", "1 on the leader. Leadership moving between servers is flapping; a step-down for a slow disk shows in the next panel.", "none",
			q(sel("lodestone_is_leader"), "{{instance}}")).Max(1).Min(0),
		graph("Leader changes and step-downs (per hour)", "Elections each server saw, and leaderships it gave up for a slow disk (--slow-leader-threshold).", "none",
			q(`increase(`+sel("lodestone_leader_changes_total")+`[1h])`, "{{instance}} changes"),
			q(`increase(`+sel("lodestone_leader_step_downs_total")+`[1h])`, "{{instance}} step-downs ({{reason}})")),
		graph("Campaign cooldown", "Seconds left during which a server that stepped down for a slow disk does not campaign.", "s",
			q(sel("lodestone_campaign_cooldown_seconds"), "{{instance}}")),
	)

	row(b, "Replication",
		graph("Commit and applied index", "The Raft commit index and the index applied to the state machine; a server whose line stops is not following.", "none",
			q(sel("lodestone_raft_commit_index"), "{{instance}} commit"),
			q(sel("lodestone_raft_applied_index"), "{{instance}} applied")),
		graph("Entries behind the leader", "The highest commit index any server reports minus what this server applied.", "none",
			q(`scalar(max(lodestone_raft_commit_index{job=~"$job"})) - `+sel("lodestone_raft_applied_index"), "{{instance}}")),
		graph("Append-ack p99 per follower (on the leader)", "From an append leaving the leader to the follower's acknowledgement: network both ways and the follower's fsync. The slow follower's line climbs (slow-leader.md).", "s",
			q(sel("peer:lodestone_peer_append_ack_seconds:p99"), "{{instance}} → {{peer}}")).
			Thresholds(thresholds(nil, "green", 0.5, "red")),
		graph("Append acks per second per follower", "A follower that is down stops acknowledging: its line drops to 0.", "ops",
			q(rate(sel("lodestone_peer_append_ack_seconds_count")), "{{instance}} → {{peer}}")),
		graph("Raft messages sent per peer", "Messages written to each peer's stream, commit notices merged into the next append, and appends to a learner folded into the one held before them.", "ops",
			q(rate(sel("lodestone_peer_messages_sent_total")), "{{instance}} → {{peer}}"),
			q(rate(sel("lodestone_peer_commit_notices_merged_total")), "{{instance}} → {{peer}} merged"),
			q(rate(sel("lodestone_peer_learner_appends_merged_total")), "{{instance}} → {{peer}} folded (learner)")),
		graph("Learners promoted, snapshots received", "Learners the leader promoted to voter, and snapshot bytes received from peers (a follower far behind).", "none",
			q(`increase(`+sel("lodestone_members_promoted_total")+`[1h])`, "{{instance}} promoted (1h)"),
			q(rate(sel("lodestone_peer_snapshot_received_bytes_total")), "{{instance}} snapshot bytes/s")),
	)

	row(b, "Writes",
		graph("Proposals by result", "ok, dropped (no leader) and failed proposals per second.", "ops",
			q(`sum by (instance, result) (`+rate(sel("lodestone_proposals_total"))+`)`, "{{instance}} {{result}}")),
		graph("Group commit: proposals per Ready", "Mean proposals that shared one Raft Ready: how much batching the load gets.", "none",
			q(rate(sel("lodestone_proposal_batch_size_sum"))+" / "+rate(sel("lodestone_proposal_batch_size_count")), "{{instance}}")),
		graph("Commit latency", "From proposal to applied on the proposing server (recording.yml). p99 above a second: slow-leader.md.", "s",
			q(sel("instance:lodestone_commit_latency_seconds:p99"), "{{instance}} p99"),
			q(sel("instance:lodestone_commit_latency_seconds:p50"), "{{instance}} p50")).
			Thresholds(thresholds(nil, "green", 1.0, "red")),
		graph("Log write (fsync) p99", "One log write with entries, fsync included, as the slow-leader check sees it, and one raftlog Save. The leader's above 500ms: slow-leader.md.", "s",
			q(sel("instance:lodestone_log_write_latency_seconds:p99"), "{{instance}} log write"),
			q(sel("instance:lodestone_raftlog_save_duration_seconds:p99"), "{{instance}} save")).
			Thresholds(thresholds(nil, "green", 0.5, "red")),
		graph("Read index and apply p99", "Linearizable reads (ReadIndex round plus wait for apply) and applying one batch of committed entries.", "s",
			q(sel("instance:lodestone_read_index_latency_seconds:p99"), "{{instance}} read index"),
			q(sel("instance:lodestone_apply_latency_seconds:p99"), "{{instance}} apply")),
		graph("Applied before the local fsync", "Committed entries a server applied while its own log write of them still ran: its peers' disks carried them. Most of its writes here: its disk is the slowest.", "ops",
			q(rate(sel("lodestone_raft_entries_applied_before_local_fsync_total")), "{{instance}}")),
	)

	row(b, "Clients",
		graph("gRPC requests by code", "Client gRPC requests per second by status code.", "reqps",
			q(`sum by (code) (`+rate(sel("lodestone_grpc_requests_total"))+`)`, "{{code}}")),
		graph("gRPC errors by method", "Requests that did not end OK, by method and code. ResourceExhausted: admission control or a limit.", "reqps",
			q(`sum by (method, code) (`+rate(sel("lodestone_grpc_requests_total", `code!="OK"`))+`)`, "{{method}} {{code}}")),
		graph("Held for a leader", "Requests that found no leader and waited (--rpc-hold-timeout), and those that gave up.", "reqps",
			q(`sum by (instance, path) (`+rate(sel("lodestone_rpc_held_total"))+`)`, "{{instance}} {{path}} held"),
			q(`sum by (instance, path) (`+rate(sel("lodestone_rpc_hold_timeouts_total"))+`)`, "{{instance}} {{path}} timed out")),
		graph("Refused: ACLs and connection caps", "Requests ACLs refused (token: nobody issued it; permission: it lacks the right), and connections closed at accept by the per-client caps.", "reqps",
			q(`sum by (instance, api, reason) (`+rate(sel("lodestone_acl_denied_total"))+`)`, "{{instance}} ACL {{api}} {{reason}}"),
			q(`sum by (instance, listener, reason) (`+rate(sel("lodestone_connections_refused_total"))+`)`, "{{instance}} conn {{listener}} {{reason}}")),
		graph("Client connections", "Open client connections: gRPC (Lodestone clients, gateways, the CLI) and HTTP (a Consul blocking query holds one).", "none",
			q(sel("lodestone_grpc_connections"), "{{instance}} gRPC"),
			q(sel("lodestone_http_connections"), "{{instance}} HTTP")),
		graph("Sessions", "Sessions in the replicated state, and sessions the leader invalidated (TTL).", "none",
			q(sel("lodestone_sessions_active"), "{{instance}} active"),
			q(`sum by (instance, reason) (increase(`+sel("lodestone_sessions_invalidated_total")+`[$__rate_interval]))`, "{{instance}} invalidated ({{reason}})")),
	)

	row(b, "Admission control",
		graph("Admitted rate by class", "Requests per second each server admits now, ramp applied; 0: the class is not gated (return-to-service.md).", "reqps",
			q(sel("lodestone_admission_limit_per_second"), "{{instance}} {{class}}")),
		graph("Refused by admission control", "Requests refused with a retry-after. Still refusing long after an outage: return-to-service.md.", "reqps",
			q(`sum by (instance, class) (`+rate(sel("lodestone_admission_rejected_total"))+`)`, "{{instance}} {{class}}")),
		graph("Held while short of CPU", "New connections and watch creates a gated server held because its goroutines waited over --admission-max-sched-delay for a CPU (configuration.md).", "reqps",
			q(`sum by (instance, kind) (`+rate(sel("lodestone_admission_load_holds_total"))+`)`, "{{instance}} {{kind}}")),
	)

	row(b, "Processes",
		graph("CPU", "CPU seconds per second each server uses.", "percentunit",
			q(rate(sel("process_cpu_seconds_total")), "{{instance}}")),
		graph("Memory", "Resident memory, and the Go heap in use. The heap grows to --gc-heap-floor-mib before a collection; KV values are not in it (Value file).", "bytes",
			q(sel("process_resident_memory_bytes"), "{{instance}} RSS"),
			q(sel("go_memstats_heap_inuse_bytes"), "{{instance}} heap in use")),
		graph("Value file", "Where each server's KV values are: the value file's length, the slots live values take, the free slots, and values still in the snapshot it restored from (store/valuefile). Pending bytes that only grow: a snapshot is held too long.", "bytes",
			q(sel("lodestone_value_file_bytes"), "{{instance}} file"),
			q(sel("lodestone_value_file_slot_bytes"), "{{instance}} live slots"),
			q(sel("lodestone_value_file_free_bytes"), "{{instance}} free"),
			q(sel("lodestone_value_file_pending_bytes"), "{{instance}} pending"),
			q(sel("lodestone_value_file_base_bytes"), "{{instance}} in the restored snapshot")),
		graph("Garbage collection", "Collections per second and GOGC in force; a leader collecting every second or two stalls writes.", "none",
			q(rate(sel("go_gc_duration_seconds_count")), "{{instance}} GCs/s"),
			q(sel("go_gc_gogc_percent"), "{{instance}} GOGC %")),
		graph("Scheduler and network-input delay p99", "How long runnable goroutines wait for a processor, and how late the process notices network input (watch-overload.md). Tens of ms: the process is short of CPU.", "s",
			q(sel("instance:lodestone_runtime_sched_latency_seconds:p99"), "{{instance}} scheduler"),
			q(sel("instance:lodestone_runtime_poll_delay_seconds:p99"), "{{instance}} network input")),
		graph("Goroutines", "Goroutines per server.", "none",
			q(sel("go_goroutines"), "{{instance}}")),
		graph("Gossip pool", "Pool members by state as each member sees them (servers with --gossip-listen, and agents).", "none",
			q(`sum by (instance, state) (`+sel("lodestone_gossip_members")+`)`, "{{instance}} {{state}}")),
	)

	row(b, "Agents",
		graph("Check runs by status", "Checks the agents ran per second, by result.", "ops",
			q(`sum by (status) (rate(lodestone_agent_checks_run_total{job=~"$agent_job"}[$__rate_interval]))`, "{{status}}")),
		graph("Check transitions", "Checks changing status: each is one write to the registry.", "ops",
			q(`sum by (status) (rate(lodestone_agent_check_transitions_total{job=~"$agent_job"}[$__rate_interval]))`, "{{status}}")),
		graph("Registry writes by result", "What agents wrote to the registry; errors mean an agent cannot reach it or is refused.", "ops",
			q(`sum by (kind, result) (rate(lodestone_agent_registry_writes_total{job=~"$agent_job"}[$__rate_interval]))`, "{{kind}} {{result}}")),
		graph("Anti-entropy runs", "Reads of each agent's node back from the registry, by result.", "ops",
			q(`sum by (result) (rate(lodestone_agent_anti_entropy_runs_total{job=~"$agent_job"}[$__rate_interval]))`, "{{result}}")),
	)
	return b
}
