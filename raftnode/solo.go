package raftnode

import (
	"slices"

	"go.etcd.io/raft/v3"
)

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

// advanceElection moves a restarted voter of several most of an election
// timeout ahead, as etcd does at boot (its initial election tick advance):
// after a whole cluster restarts, its members otherwise sat idle for one
// to two timeouts once their state was restored, a third of the time to a
// first read after restarting three members of a million keys
// (bench-scale). PreVote and CheckQuorum keep it harmless where a leader
// lives: its heartbeat, every tick, resets the clock, and the voters
// refuse a pre-vote while they hear from it. It runs once, after the
// committed entries at start are applied, so the voters are current.
func (n *Node) advanceElection() {
	if !n.restarted {
		return
	}
	n.restarted = false
	cs := n.confState
	if len(cs.Voters) < 2 || !slices.Contains(cs.Voters, n.id) {
		return
	}
	for range n.cfg.ElectionTicks - 2 {
		n.rn.Tick()
	}
}
