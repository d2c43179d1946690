package raftnode

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3/raftpb"
)

// maxSentAppends bounds the appends timed per peer. A peer that stops
// answering would otherwise grow its queue by the write rate; at the
// bound the older half is dropped untimed (half, so that a peer that
// stays silent costs one copy per maxSentAppends/2 appends, not one per
// append), and the peer shows in lodestone_peer_stream_ends_total and in
// its count of timed appends standing still.
const maxSentAppends = 4096

// appendAcks times replication on the leader: each append from its
// hand-off to a peer's stream to that peer's acknowledgement of its last
// entry. The time holds the network both ways, the peer's queue and its
// fsync, so the slow follower is the one whose tail climbs; etcd's peer
// round-trip histogram answers the same question with probes, this one
// with the appends themselves. Touched only by the raft loop.
type appendAcks struct {
	pending map[uint64][]sentAppend // by peer, ascending last index
	observe func(peer uint64, d time.Duration)
}

// sentAppend is an append in flight: its last entry and when it left.
type sentAppend struct {
	last uint64
	at   time.Time
}

func newAppendAcks(observe func(peer uint64, d time.Duration)) *appendAcks {
	return &appendAcks{pending: make(map[uint64][]sentAppend), observe: observe}
}

// observeByPeer records into vec under each peer's id, keeping each
// peer's child: a label lookup per acknowledgement would allocate. Like
// appendAcks, it belongs to the raft loop.
func observeByPeer(vec *prometheus.HistogramVec) func(peer uint64, d time.Duration) {
	children := map[uint64]prometheus.Observer{}
	return func(peer uint64, d time.Duration) {
		o, ok := children[peer]
		if !ok {
			o = vec.WithLabelValues(fmt.Sprintf("%x", peer))
			children[peer] = o
		}
		o.Observe(d.Seconds())
	}
}

// sent notes an outgoing message; only appends that carry entries count.
func (a *appendAcks) sent(m raftpb.Message, now time.Time) {
	if m.Type != raftpb.MsgApp || len(m.Entries) == 0 {
		return
	}
	last := m.Entries[len(m.Entries)-1].Index
	q := a.pending[m.To]
	// A resend after a rejection covers entries already in flight: their
	// first send's time stands, so the retry counts in their lag.
	if n := len(q); n > 0 && q[n-1].last >= last {
		return
	}
	if len(q) == maxSentAppends {
		q = q[:copy(q, q[len(q)/2:])]
	}
	a.pending[m.To] = append(q, sentAppend{last: last, at: now})
}

// received notes an incoming message: an accepting MsgAppResp times
// every append it covers. A rejection times nothing; the entries are
// resent and their later acknowledgement times them.
func (a *appendAcks) received(m raftpb.Message, now time.Time) {
	if m.Type != raftpb.MsgAppResp || m.Reject {
		return
	}
	q := a.pending[m.From]
	i := 0
	for ; i < len(q) && q[i].last <= m.Index; i++ {
		a.observe(m.From, now.Sub(q[i].at))
	}
	if i > 0 {
		a.pending[m.From] = q[:copy(q, q[i:])]
	}
}

// reset forgets every append in flight, on losing leadership: later
// acknowledgements answer another term's appends.
func (a *appendAcks) reset() { clear(a.pending) }

// forget drops a peer removed from the cluster.
func (a *appendAcks) forget(peer uint64) { delete(a.pending, peer) }
