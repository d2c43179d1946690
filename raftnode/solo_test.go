package raftnode

import (
	"log/slog"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// advanceNode is a Node with just what advanceElection uses: a RawNode of
// voters (id 1 among them) at term 1 with no leader, as after a restart.
func advanceNode(t *testing.T, voters []uint64, restarted bool) *Node {
	t.Helper()
	st := raft.NewMemoryStorage()
	cs := raftpb.ConfState{Voters: voters}
	if err := st.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 1, Term: 1, ConfState: cs}}); err != nil {
		t.Fatal(err)
	}
	rn, err := raft.NewRawNode(&raft.Config{ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: st,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 16, CheckQuorum: true, PreVote: true,
		Logger: raftLogger{slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	return &Node{id: 1, rn: rn, confState: cs, restarted: restarted, cfg: Config{ElectionTicks: 10}}
}

// ticksToCampaign ticks n until it leaves the follower state, at most
// limit times, and says how many ticks that took (limit+1: it did not).
func ticksToCampaign(n *Node, limit int) int {
	for k := 1; k <= limit; k++ {
		n.rn.Tick()
		if n.rn.BasicStatus().RaftState != raft.StateFollower {
			return k
		}
	}
	return limit + 1
}

// A restarted voter of several campaigns within ElectionTicks+1 ticks of
// silence (raft draws its timeout from [ElectionTicks, 2*ElectionTicks),
// so without the advance it would take at least ElectionTicks, and in
// most draws more than ElectionTicks+1). A fresh member and a lone voter
// take at least ElectionTicks, as raft alone does. (A node outside the
// voters is not tested: raft never lets it campaign, advanced or not.)
func TestAdvanceElection(t *testing.T) {
	for trial := range 20 {
		n := advanceNode(t, []uint64{1, 2, 3}, true)
		n.advanceElection()
		if k := ticksToCampaign(n, 11); k > 11 {
			t.Fatalf("trial %d: a restarted voter of three did not campaign within 11 ticks", trial)
		}
	}
	for _, tc := range []struct {
		name      string
		voters    []uint64
		restarted bool
	}{
		{"fresh member", []uint64{1, 2, 3}, false},
		{"restarted lone voter", []uint64{1}, true},
	} {
		n := advanceNode(t, tc.voters, tc.restarted)
		n.advanceElection()
		if k := ticksToCampaign(n, 9); k <= 9 {
			t.Errorf("%s: campaigned after %d ticks, before any election timeout", tc.name, k)
		}
	}
}
