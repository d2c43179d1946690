package raftnode

import "go.etcd.io/raft/v3"

// campaignAlone starts an election at once when this node is the only
// voter, instead of waiting out an election timeout that nobody else can
// end: a one-member cluster (lodestone dev) then leads within a few log
// writes of starting, not 1-2 election timeouts later. It campaigns once
// per start, and only after raft applied every committed entry, since
// raft refuses to campaign over an unapplied conf change (the bootstrap
// entries of a fresh log are some). It reports whether it campaigned, so
// the caller handles the Ready that made.
func (n *Node) campaignAlone() bool {
	if n.soloDone {
		return false
	}
	cs := n.confState
	if len(cs.Voters) != 1 || cs.Voters[0] != n.id || len(cs.VotersOutgoing) != 0 {
		if len(cs.Voters) > 1 {
			n.soloDone = true // NB: a cluster of several elects the usual way
		}
		return false
	}
	bs := n.rn.BasicStatus()
	if bs.RaftState != raft.StateFollower || bs.Lead != raft.None {
		n.soloDone = true
		return false
	}
	if bs.Applied < bs.HardState.Commit {
		return false
	}
	n.soloDone = true
	n.logger.Info("only voter: campaigning at once")
	_ = n.rn.Campaign() // NB: a refusal is logged by raft; the election timeout still elects
	return true
}
