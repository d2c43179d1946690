package raftnode

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the loop's figures an operator reads during an incident.
type metrics struct {
	proposals           *prometheus.CounterVec // by result: ok, dropped, failed
	proposalBatch       prometheus.Histogram
	commitLatency       prometheus.Histogram // propose → applied on the proposer
	applyLatency        prometheus.Histogram // one batch of committed entries
	readIndexLatency    prometheus.Histogram
	readIndexBatch      prometheus.Histogram // reads confirmed by one ReadIndex round (read.go)
	leaderReads         prometheus.Counter   // default-mode reads served by the leader without a round
	followerLeaderReads prometheus.Counter
	leaderIndexCalls    prometheus.Counter
	readyLatency        prometheus.Histogram // one whole Ready: save, send, apply
	leaderChanges       prometheus.Counter
	isLeader            prometheus.Gauge
	term                prometheus.Gauge
	commitIndex         prometheus.Gauge
	appliedIndex        prometheus.Gauge
	appliedEarly        prometheus.Counter // committed entries applied before this node's log write of them finished
	snapshots           prometheus.Counter
	snapshotTriggers    *prometheus.CounterVec // by trigger: entries, bytes, member
	snapshotLogBytes    prometheus.Gauge       // entry bytes applied since the newest snapshot's view
	snapshotIndex       prometheus.Gauge
	peerAppendAck       *prometheus.HistogramVec // appendacks.go
}

// latencyBuckets span 100µs .. 13s.
var latencyBuckets = prometheus.ExponentialBuckets(0.0001, 2, 18)

// commitBuckets span the same range at twice the resolution. NB: a
// quantile is interpolated inside the bucket that holds it, so with
// buckets a factor 2 apart two p99s of the same latency could read up to
// 2x apart: the drill's steady spread (target 2x) and its ramp ratio
// were decided by which bucket a p99 fell in. A factor of sqrt(2) bounds
// that error at 1.41x for 17 more series.
var commitBuckets = prometheus.ExponentialBuckets(0.0001, math.Sqrt2, 35)

func newMetrics(reg prometheus.Registerer) *metrics {
	latency := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "lodestone", Name: name, Help: help, Buckets: latencyBuckets})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "lodestone", Name: name, Help: help})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "lodestone", Name: name, Help: help})
	}
	m := &metrics{
		proposals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "proposals_total", Help: "Proposals by outcome (ok, dropped: no leader, failed).",
		}, []string{"result"}),
		proposalBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "lodestone", Name: "proposal_batch_size", Help: "Proposals that shared one Ready (group commit).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		commitLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "lodestone", Name: "commit_latency_seconds", Help: "From proposal to applied result on the proposing node.",
			Buckets: commitBuckets,
		}),
		applyLatency:     latency("apply_latency_seconds", "Applying one batch of committed entries to the state machine."),
		readIndexLatency: latency("read_index_latency_seconds", "Linearizable read: ReadIndex confirmation plus wait for apply."),
		readIndexBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "lodestone", Name: "read_index_batch_size", Help: "Linearizable reads that shared one ReadIndex round (one heartbeat to every follower).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 13),
		}),
		readyLatency: latency("ready_latency_seconds", "Handling one Raft Ready: persist, send, apply."),
		leaderReads: counter("leader_reads_total",
			"Consul-API reads in the default consistency mode served by the leader from its applied state, without a ReadIndex round."),
		followerLeaderReads: counter("follower_leader_reads_total",
			"Consul-API reads in the default consistency mode served by this follower at the leader's commit index (see leader_index_calls_total)."),
		leaderIndexCalls: counter("leader_index_calls_total",
			"Calls this follower made to ask the leader for its commit index; each answers every default-mode read waiting when it was sent."),
		leaderChanges: counter("leader_changes_total", "Leader changes seen by this node."),
		isLeader:      gauge("is_leader", "1 if this node is the Raft leader."),
		term:          gauge("raft_term", "Current Raft term."),
		commitIndex:   gauge("raft_commit_index", "Raft commit index."),
		appliedIndex:  gauge("raft_applied_index", "Index applied to the state machine."),
		appliedEarly: counter("raft_entries_applied_before_local_fsync_total",
			"Committed entries applied while this node's own log write of them was still running (raftnode/earlyapply.go); the rest waited for it."),
		snapshots:     counter("snapshots_total", "State machine snapshots taken."),
		snapshotIndex: gauge("snapshot_index", "Index of the newest snapshot."),
		snapshotTriggers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "snapshot_triggers_total",
			Help: "Snapshots started, by what made them due: entries (--snapshot-entries), bytes (--snapshot-bytes), member (a member was added).",
		}, []string{"trigger"}),
		snapshotLogBytes: gauge("snapshot_log_bytes",
			"Entry bytes applied after the newest snapshot's index: about what a restart would replay on top of it (compare --snapshot-bytes)."),
		peerAppendAck: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "lodestone", Name: "peer_append_ack_seconds",
			Help:    "On the leader: from an append's hand-off to a peer's stream to the peer's acknowledgement of its last entry (network both ways, the peer's queue and fsync). The slow follower is the one whose tail climbs.",
			Buckets: latencyBuckets,
		}, []string{"peer"}),
	}
	reg.MustRegister(m.proposals, m.proposalBatch, m.commitLatency, m.applyLatency, m.readIndexLatency, m.readIndexBatch,
		m.leaderReads, m.followerLeaderReads, m.leaderIndexCalls, m.readyLatency, m.leaderChanges, m.isLeader,
		m.term, m.commitIndex, m.appliedIndex, m.appliedEarly, m.snapshots, m.snapshotIndex, m.snapshotTriggers, m.snapshotLogBytes, m.peerAppendAck)
	return m
}
