package peer

import (
	"slices"

	"go.etcd.io/raft/v3/raftpb"
)

// A learner is in no quorum: no commit waits for its acknowledgement, so an
// append to it may wait. A leader sends every follower an append per Ready,
// and under a steady stream of single writes that is a message, a system
// call on each side, a log write and an acknowledgement per write per
// learner: with four learners serving blocking queries at 1,000 writes/s,
// the leader's core and the learners' were full before any query came. So
// a stream to a learner holds appends for up to Config.LearnerAppendHold
// and sends what came meanwhile as one: each append that continues the held
// one (same term, starting where it ends) is folded into it, its entries
// added and its commit index taken. The learner writes and acknowledges the
// run once, and raft's progress on the leader frees every in-flight append
// the acknowledgement covers. Anything but an append (a heartbeat, a vote)
// sends everything held first, in order, and so does a run reaching
// appendHoldBytes. A learner applies a write at most a hold later than it
// would have, and a read it serves waits for that too.

// appendHoldBytes is the most entry data a held run gathers before it goes:
// raft's own MaxSizePerMsg, so a run is no larger than a catch-up append.
const appendHoldBytes = 1 << 20

// appendHold is a learner stream's held appends.
type appendHold struct {
	held  []raftpb.Message
	bytes int
	// owned says that the last held append's entries are a copy of the
	// hold's own, which further folds may grow in place.
	owned bool
	out   []raftpb.Message // what next returned last; reused
}

func (h *appendHold) holding() bool { return len(h.held) > 0 }

// next takes the messages just queued for the learner (none when the hold
// expired) and returns those to send now, in order, with how many appends
// were folded into the one before. The returned slice is valid until the
// next call.
func (h *appendHold) next(msgs []raftpb.Message, expired bool) (_ []raftpb.Message, merged int) {
	flush := expired
	for _, m := range msgs {
		if m.Type != raftpb.MsgApp {
			flush = true
		}
		for _, e := range m.Entries {
			h.bytes += len(e.Data)
		}
		if h.fold(m) {
			merged++
			continue
		}
		h.held = append(h.held, m)
		h.owned = false
	}
	if !flush && h.bytes < appendHoldBytes {
		return nil, merged
	}
	h.out = append(h.out[:0], h.held...)
	clear(h.held)
	h.held, h.bytes, h.owned = h.held[:0], 0, false
	return h.out, merged
}

// fold adds m to the last held append if it continues it. The first fold
// copies that append's entries, which raft may still hold: the hold never
// writes into raft's slices, and later folds append to its copy.
func (h *appendHold) fold(m raftpb.Message) bool {
	n := len(h.held)
	if n == 0 || !continues(h.held[n-1], m) {
		return false
	}
	last := &h.held[n-1]
	if len(m.Entries) > 0 {
		if !h.owned {
			last.Entries = slices.Clip(last.Entries)
			h.owned = true
		}
		last.Entries = append(last.Entries, m.Entries...)
	}
	last.Commit = max(last.Commit, m.Commit)
	return true
}

// continues says whether b is an append that continues a: same term and
// peer, its previous entry a's last.
func continues(a, b raftpb.Message) bool {
	if a.Type != raftpb.MsgApp || b.Type != raftpb.MsgApp || a.Term != b.Term || a.To != b.To {
		return false
	}
	lastIndex, lastTerm := a.Index, a.LogTerm
	if n := len(a.Entries); n > 0 {
		lastIndex, lastTerm = a.Entries[n-1].Index, a.Entries[n-1].Term
	}
	return b.Index == lastIndex && b.LogTerm == lastTerm
}
