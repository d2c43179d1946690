package server

import (
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the numbers an operator reads during an incident. They live
// on the server's own registry so several servers can share a process.
type metrics struct {
	reg *prometheus.Registry

	proposals        *prometheus.CounterVec // by result: ok, dropped, failed
	proposalBatch    prometheus.Histogram
	commitLatency    prometheus.Histogram // propose → applied on the proposer
	applyLatency     prometheus.Histogram // one batch of committed entries
	readIndexLatency prometheus.Histogram
	leaderReads      prometheus.Counter // default-mode Consul reads served by the leader without a round
	// A follower's default-mode reads, and the questions to the leader
	// (on Peer.LeaderIndexStream) that answered them (leaderindex.go).
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
	snapshotIndex       prometheus.Gauge
	peerSent            *prometheus.CounterVec
	peerDropped         *prometheus.CounterVec
	peerMerged          *prometheus.CounterVec
	peerStreamEnds      *prometheus.CounterVec
	peerAppendAck       *prometheus.HistogramVec // appendacks.go
	requests            *prometheus.CounterVec   // gRPC by method and code
	pollDelay           prometheus.Histogram     // pollprobe.go
}

func newMetrics() *metrics {
	reg := prometheus.NewRegistry()
	// NB: the GC's CPU by kind (go_cpu_classes_gc_*: mark assist,
	// dedicated, idle, pause, total) beside the default Go metrics. On a
	// busy core it is a cycle's marking that delays writes, and
	// go_gc_duration_seconds counts only its pauses.
	gcCPU := collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/cpu/classes/gc/`)}
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(gcCPU)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), newSchedLatency())
	latency := func(name, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "lodestone", Name: name, Help: help,
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18), // 100µs .. 13s
		})
	}
	m := &metrics{
		reg: reg,
		proposals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "proposals_total", Help: "Proposals by outcome (ok, dropped: no leader, failed).",
		}, []string{"result"}),
		proposalBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "lodestone", Name: "proposal_batch_size", Help: "Proposals that shared one Ready (group commit).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		commitLatency:    latency("commit_latency_seconds", "From proposal to applied result on the proposing node."),
		applyLatency:     latency("apply_latency_seconds", "Applying one batch of committed entries to the state machine."),
		readIndexLatency: latency("read_index_latency_seconds", "Linearizable read: ReadIndex confirmation plus wait for apply."),
		readyLatency:     latency("ready_latency_seconds", "Handling one Raft Ready: persist, send, apply."),
		leaderReads: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "leader_reads_total",
			Help: "Consul-API reads in the default consistency mode served by the leader from its applied state, without a ReadIndex round.",
		}),
		followerLeaderReads: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "follower_leader_reads_total",
			Help: "Consul-API reads in the default consistency mode served by this follower at the leader's commit index (see leader_index_calls_total).",
		}),
		leaderIndexCalls: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "leader_index_calls_total",
			Help: "Calls this follower made to ask the leader for its commit index; each answers every default-mode read waiting when it was sent.",
		}),
		leaderChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "leader_changes_total", Help: "Leader changes seen by this node.",
		}),
		isLeader:     prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "lodestone", Name: "is_leader", Help: "1 if this node is the Raft leader."}),
		term:         prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "lodestone", Name: "raft_term", Help: "Current Raft term."}),
		commitIndex:  prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "lodestone", Name: "raft_commit_index", Help: "Raft commit index."}),
		appliedIndex: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "lodestone", Name: "raft_applied_index", Help: "Index applied to the state machine."}),
		appliedEarly: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "raft_entries_applied_before_local_fsync_total",
			Help: "Committed entries applied while this node's own log write of them was still running (server/earlyapply.go); the rest waited for it.",
		}),
		snapshots:     prometheus.NewCounter(prometheus.CounterOpts{Namespace: "lodestone", Name: "snapshots_total", Help: "State machine snapshots taken."}),
		snapshotIndex: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "lodestone", Name: "snapshot_index", Help: "Index of the newest snapshot."}),
		peerSent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "peer_messages_sent_total", Help: "Raft messages written to a peer stream.",
		}, []string{"peer"}),
		peerDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "peer_messages_dropped_total", Help: "Raft messages dropped because the peer's queue was full.",
		}, []string{"peer"}),
		peerMerged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "peer_commit_notices_merged_total", Help: "Entry-less commit appends not sent because the next append to the peer carried the same news.",
		}, []string{"peer"}),
		peerStreamEnds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "peer_stream_ends_total",
			Help: "Raft streams to a peer that failed or could not be opened, each followed by a redial with backoff; one that climbs steadily is a peer down, cut off or refusing.",
		}, []string{"peer"}),
		peerAppendAck: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "lodestone", Name: "peer_append_ack_seconds",
			Help:    "On the leader: from an append's hand-off to a peer's stream to the peer's acknowledgement of its last entry (network both ways, the peer's queue and fsync). The slow follower is the one whose tail climbs.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18), // 100µs .. 13s, as the other latencies
		}, []string{"peer"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "grpc_requests_total", Help: "Client gRPC requests by method and status code.",
		}, []string{"method", "code"}),
		pollDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "lodestone", Name: "runtime_poll_delay_seconds",
			Help:    "How long a datagram this server sends itself on loopback waits before it is read: how late the process notices network input.",
			Buckets: runtimeDelayBuckets,
		}),
	}
	reg.MustRegister(m.proposals, m.proposalBatch, m.commitLatency, m.applyLatency, m.readIndexLatency, m.leaderReads, m.followerLeaderReads, m.leaderIndexCalls, m.readyLatency,
		m.leaderChanges, m.isLeader, m.term, m.commitIndex, m.appliedIndex, m.appliedEarly, m.snapshots, m.snapshotIndex,
		m.peerSent, m.peerDropped, m.peerMerged, m.peerStreamEnds, m.peerAppendAck, m.requests, m.pollDelay)
	return m
}
