package raftnode

import (
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Proposals in flight when the leader changes. The old leader may have
// replicated one to a quorum before it went, and the new leader then
// commits it with its own first entry; or it may be lost. Failing every
// waiter at once (ErrLeaderChanged: outcome unknown) turned each election
// into an error for every caller with a write in flight, most of which
// were about to succeed.
//
// So with Config.LeaderChangeWait set, the waiters of a leader change are
// kept as a batch with the term of the leader they were sent to, T. Only
// the waiters whose proposals the loop already handed to raft (in term T
// or earlier) are: one registered but still on its way to the loop is
// taken by raft after the change, in a later term, and may commit there. Once
// this member applies an entry of a later term, every entry of term T or
// earlier that will ever commit lies before it, and is applied. A
// proposal still waiting then was never appended by a leader of term T or
// earlier, and no later leader appends it: a follower stamps the MsgProp
// it forwards with its term (LogTerm, which raft ignores in a MsgProp),
// and a member drops a stamped MsgProp unless it leads that very term
// (acceptForwarded), so a proposal delayed past an election is never
// forwarded on or appended in a later term. Its waiter is answered
// ErrNoLeader: not applied, retry (the server's hold does). A batch still
// waiting after LeaderChangeWait (no new leader applied anything here) is
// answered ErrLeaderChanged: outcome unknown.
//
// NB: a MsgProp without a stamp (from a build before this) is taken as
// before, so during a rolling upgrade an old follower's delayed proposal
// can still be forwarded on; the new build's answer to its own callers
// relies only on its own stamps and on the new build's receivers.

// orphanBatch is the waiters of one leader change.
type orphanBatch struct {
	term  uint64    // the term of the leader they were sent to
	since time.Time // when the leader changed
	ids   []uint64
}

// orphanProposals takes the waiters of a leader change from a leader of
// term; the loop calls it.
func (n *Node) orphanProposals(term uint64) {
	if n.cfg.LeaderChangeWait <= 0 {
		n.waits.failAll(ErrLeaderChanged)
		return
	}
	if ids := n.waits.pending(); len(ids) > 0 {
		n.orphans = append(n.orphans, orphanBatch{term: term, since: n.clock.Now(), ids: ids})
	}
}

// settleOrphans answers the batches that are settled (this member applied
// an entry of a later term: ErrNoLeader) or that waited LeaderChangeWait
// (ErrLeaderChanged). Waiters already answered (their entry was applied)
// are skipped.
func (n *Node) settleOrphans() {
	if len(n.orphans) == 0 {
		return
	}
	now := n.clock.Now()
	keep := n.orphans[:0]
	for _, b := range n.orphans {
		settled := n.appliedTerm > b.term
		if settled || now.Sub(b.since) >= n.cfg.LeaderChangeWait {
			err := ErrLeaderChanged
			if settled {
				err = ErrNoLeader
			}
			for _, id := range b.ids {
				n.waits.trigger(id, proposalResult{err: err})
			}
			continue
		}
		keep = append(keep, b)
	}
	clear(n.orphans[len(keep):])
	n.orphans = keep
}

// acceptForwarded reports whether a MsgProp from another member may reach
// raft: one stamped with a term only if this member leads that term now,
// since raft would otherwise forward it on or append it in a later term,
// after its proposer settled it as never applied.
func (n *Node) acceptForwarded(m raftpb.Message) bool {
	if m.LogTerm == 0 || m.From == n.id {
		return true
	}
	bs := n.rn.BasicStatus()
	if bs.RaftState == raft.StateLeader && bs.Term == m.LogTerm {
		return true
	}
	n.metrics.proposals.WithLabelValues("dropped").Inc()
	n.logger.Debug("dropping a proposal forwarded in another term", "from", fmt.Sprintf("%x", m.From), "term", m.LogTerm, "now", bs.Term)
	return false
}
