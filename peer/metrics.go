package peer

import "github.com/prometheus/client_golang/prometheus"

// metrics count, per peer, what the transport sent, dropped and merged,
// and how often a peer's stream ended.
type metrics struct {
	peerSent       *prometheus.CounterVec
	peerDropped    *prometheus.CounterVec
	peerMerged     *prometheus.CounterVec
	peerStreamEnds *prometheus.CounterVec
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
		peerStreamEnds: byPeer("peer_stream_ends_total",
			"Raft streams to a peer that failed or could not be opened, each followed by a redial with backoff; one that climbs steadily is a peer down, cut off or refusing."),
	}
	reg.MustRegister(m.peerSent, m.peerDropped, m.peerMerged, m.peerStreamEnds)
	return m
}
