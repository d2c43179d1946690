package peer

import "github.com/prometheus/client_golang/prometheus"

// metrics count, per peer, what the transport sent, dropped and merged,
// and how often a peer's stream ended.
type metrics struct {
	peerSent    *prometheus.CounterVec
	peerDropped *prometheus.CounterVec
	peerMerged  *prometheus.CounterVec
	// learnerAppendsMerged counts appends folded into the one before
	// them on a learner's stream (appendhold.go).
	learnerAppendsMerged *prometheus.CounterVec
	peerStreamEnds       *prometheus.CounterVec
	// refused counts what the peer port refused, by reason (identity.go).
	refused       *prometheus.CounterVec
	snapshotBytes prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	byPeer := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "lodestone", Name: name, Help: help}, []string{"peer"})
	}
	m := &metrics{
		peerSent:    byPeer("peer_messages_sent_total", "Raft messages written to a peer stream."),
		peerDropped: byPeer("peer_messages_dropped_total", "Raft messages dropped because the peer's queue was full."),
		peerMerged: byPeer("peer_commit_notices_merged_total",
			"Entry-less commit appends not sent because the next append to the peer carried the same news."),
		learnerAppendsMerged: byPeer("peer_learner_appends_merged_total",
			"Appends to a learner folded into the one held before them and sent with it (--learner-append-hold)."),
		peerStreamEnds: byPeer("peer_stream_ends_total",
			"Raft streams to a peer that failed or could not be opened, each followed by a redial with backoff; one that climbs steadily is a peer down, cut off or refusing."),
	}
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "lodestone", Name: "peer_refused_total",
		Help: "Raft streams, peer calls and snapshots the peer port refused, by reason: a sender of another cluster or of none, a snapshot over a limit, truncated, damaged or of another cluster."},
		[]string{"reason"})
	for _, r := range refusedReasons {
		m.refused.WithLabelValues(r) // NB: every reason reads 0, not absent, until it happens
	}
	m.snapshotBytes = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "lodestone", Name: "peer_snapshot_received_bytes_total",
		Help: "Bytes of snapshots received from peers that passed every check and went to Raft."})
	reg.MustRegister(m.peerSent, m.peerDropped, m.peerMerged, m.learnerAppendsMerged, m.peerStreamEnds, m.refused, m.snapshotBytes)
	return m
}
