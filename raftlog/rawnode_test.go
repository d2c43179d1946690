package raftlog_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"maps"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
)

// node is a minimal server: one raft.RawNode on a Log, driven through the
// Ready duties of doc.go, applying "key=value" entries to a map.
type node struct {
	t       *testing.T
	l       *raftlog.Log
	storage raft.Storage // l, or a wrapper around it
	rn      *raft.RawNode
	kv      map[string]string
	cs      raftpb.ConfState // latest applied, for CreateSnapshot
	applied uint64
}

// startNode builds the RawNode the way a restarting server must: state
// machine from the snapshot's data (ReadSnapshotData), Applied = snapshot index, ConfState from
// InitialState.
func startNode(t *testing.T, l *raftlog.Log, storage raft.Storage) *node {
	t.Helper()
	snap, err := l.ReadSnapshotData()
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, l: l, storage: storage, kv: map[string]string{}, applied: snap.Metadata.Index}
	if len(snap.Data) > 0 {
		if err := json.Unmarshal(snap.Data, &n.kv); err != nil {
			t.Fatal(err)
		}
	}
	_, n.cs, _ = storage.InitialState()
	n.rn, err = raft.NewRawNode(&raft.Config{
		ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: storage, Applied: n.applied,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 64, PreVote: true, CheckQuorum: true,
		Logger: &raft.DefaultLogger{Logger: discardStdLogger()},
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// drain handles Readys until there are none: persist (ApplySnapshot, Save),
// send (dropped: the only peer is an unreachable learner), apply, advance.
func (n *node) drain() {
	n.t.Helper()
	for n.rn.HasReady() {
		rd := n.rn.Ready()
		if !raft.IsEmptySnap(rd.Snapshot) {
			if err := n.l.ApplySnapshot(rd.Snapshot); err != nil {
				n.t.Fatal(err)
			}
		}
		if err := n.l.Save(rd.HardState, rd.Entries); err != nil {
			n.t.Fatal(err)
		}
		for _, e := range rd.CommittedEntries {
			switch e.Type {
			case raftpb.EntryNormal:
				if k, v, ok := bytes.Cut(e.Data, []byte("=")); ok {
					n.kv[string(k)] = string(v)
				}
			case raftpb.EntryConfChange:
				var cc raftpb.ConfChange
				if err := cc.Unmarshal(e.Data); err != nil {
					n.t.Fatal(err)
				}
				n.cs = *n.rn.ApplyConfChange(cc)
			case raftpb.EntryConfChangeV2:
				var cc raftpb.ConfChangeV2
				if err := cc.Unmarshal(e.Data); err != nil {
					n.t.Fatal(err)
				}
				n.cs = *n.rn.ApplyConfChange(cc)
			}
			n.applied = e.Index
		}
		n.rn.Advance(rd)
	}
}

func (n *node) propose(data string) {
	n.t.Helper()
	if err := n.rn.Propose([]byte(data)); err != nil {
		n.t.Fatal(err)
	}
	n.drain()
}

func (n *node) proposeConfChange(cc raftpb.ConfChangeV2) {
	n.t.Helper()
	if err := n.rn.ProposeConfChange(cc); err != nil {
		n.t.Fatal(err)
	}
	n.drain()
}

func (n *node) snapshot(keep uint64) {
	n.t.Helper()
	data, err := json.Marshal(n.kv)
	if err != nil {
		n.t.Fatal(err)
	}
	if _, err := n.l.CreateSnapshot(n.applied, &n.cs, data); err != nil {
		n.t.Fatal(err)
	}
	if err := n.l.Compact(n.applied - keep); err != nil {
		n.t.Fatal(err)
	}
}

// TestRawNodeRestart drives a real raft.RawNode on a Log: bootstrap, elect,
// propose, snapshot and compact, a joint-consensus conf change after the
// snapshot; then restarts from the reopened Log the way doc.go prescribes and
// checks the replayed state machine and ConfState equal the ones before the
// restart.
func TestRawNodeRestart(t *testing.T) {
	dir := t.TempDir()
	l := mustOpen(t, dir, raftlog.Options{})
	n := startNode(t, l, l)
	if err := n.rn.Bootstrap([]raft.Peer{{ID: 1}}); err != nil {
		t.Fatal(err)
	}
	n.drain()
	if err := n.rn.Campaign(); err != nil {
		t.Fatal(err)
	}
	n.drain()
	if got := n.rn.Status().RaftState; got != raft.StateLeader {
		t.Fatalf("state %v, want leader", got)
	}
	for i := range 30 {
		n.propose(fmt.Sprintf("k%d=v%d", i%7, i))
	}
	n.snapshot(5)
	n.proposeConfChange(raftpb.ConfChangeV2{
		Transition: raftpb.ConfChangeTransitionJointExplicit,
		Changes:    []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddLearnerNode, NodeID: 2}},
	})
	jointCS := n.cs
	for i := range 10 {
		n.propose(fmt.Sprintf("late%d=%d", i, i))
	}
	n.proposeConfChange(raftpb.ConfChangeV2{}) // leave the joint config
	n.propose("last=1")
	wantKV, wantCS, wantApplied := maps.Clone(n.kv), n.cs, n.applied
	if len(jointCS.VotersOutgoing) == 0 || len(wantCS.Learners) != 1 {
		t.Fatalf("setup: joint conf state %+v, final %+v", jointCS, wantCS)
	}
	mustClose(t, l)

	t.Run("replay from snapshot ConfState", func(t *testing.T) {
		l := mustOpen(t, dir, raftlog.Options{})
		defer mustClose(t, l)
		n := startNode(t, l, l)
		n.drain()
		if n.applied != wantApplied {
			t.Fatalf("applied %d after replay, want %d", n.applied, wantApplied)
		}
		if !maps.Equal(n.kv, wantKV) {
			t.Errorf("state machine after replay = %v, want %v", n.kv, wantKV)
		}
		if err := n.cs.Equivalent(wantCS); err != nil {
			t.Errorf("conf state after replay: %v", err)
		}
	})

	// Why there is no SaveConfState: had InitialState returned the ConfState
	// applied last (here: the joint one, as if saved after EnterJoint), raft
	// would re-apply the EnterJoint entry on top of it and panic.
	t.Run("latest ConfState would crash-loop", func(t *testing.T) {
		l := mustOpen(t, dir, raftlog.Options{})
		defer mustClose(t, l)
		n := startNode(t, l, latestConfState{l, jointCS})
		defer func() {
			if r := recover(); r == nil {
				t.Errorf("replay on top of the latest ConfState did not panic")
			} else {
				t.Logf("raft panicked as expected: %v", r)
			}
		}()
		n.drain()
	})
}

// latestConfState is a storage whose InitialState returns a fixed ConfState.
type latestConfState struct {
	*raftlog.Log
	cs raftpb.ConfState
}

func (s latestConfState) InitialState() (raftpb.HardState, raftpb.ConfState, error) {
	hs, _, err := s.Log.InitialState()
	return hs, s.cs, err
}

func discardStdLogger() *log.Logger { return log.New(io.Discard, "", 0) }
