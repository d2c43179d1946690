package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/internal/member"
	"github.com/lodestone-kv/lodestone/raftlog"
	"github.com/lodestone-kv/lodestone/store"
)

// RecoverOptions configures Recover.
type RecoverOptions struct {
	// DataDir is the stopped node's --data-dir.
	DataDir string
	// Name is the node's --name (its Raft id is derived from it).
	Name string
	// DryRun prints the plan and changes nothing.
	DryRun bool
	// LockTimeout is how long to wait for a running node's lock; 0 means
	// one second.
	LockTimeout time.Duration
}

// ErrRunning is returned when the node whose data Recover was given is
// still running: its raft log is locked.
var ErrRunning = errors.New("snapshot: node is running")

// RecoverPlan is what Recover does (or, with DryRun, would do).
type RecoverPlan struct {
	Member       string
	Term         uint64
	Commit       uint64
	SnapIndex    uint64
	First, Last  uint64
	Removed      []string // "name (id)" of every other member
	NewCommit    uint64
	Uncommitted  uint64 // entries after the stored commit index, kept too
	AlreadyAlone bool
}

// Recover turns a stopped node's data into a one-node cluster after the
// others are lost for good (quorum loss). It keeps every entry the node
// holds, committed or not (a stored commit index may lag the real one, so
// entries after it may have been acknowledged to clients), and appends
// one conf change per other member removing it, with the commit index set
// past them. When the node starts (with --initial-cluster listing only
// itself) it applies the removals and elects itself; members are then
// added back with `lodestone members add`.
//
// It prints the plan to out before changing anything and refuses while
// the node runs (ErrRunning).
func Recover(o RecoverOptions, out io.Writer) (RecoverPlan, error) {
	if o.LockTimeout == 0 {
		o.LockTimeout = time.Second
	}
	dir := filepath.Join(o.DataDir, "raft")
	if _, err := os.Stat(filepath.Join(dir, "raft.db")); err != nil {
		return RecoverPlan{}, fmt.Errorf("--data-dir %s holds no raft log (%s): %w", o.DataDir, filepath.Join(dir, "raft.db"), err)
	}
	lg, err := raftlog.Open(dir, raftlog.Options{LockTimeout: o.LockTimeout, RotateFreeRatio: -1})
	if errors.Is(err, raftlog.ErrLocked) {
		return RecoverPlan{}, fmt.Errorf("%w: %s is locked by a running process; stop the node first", ErrRunning, filepath.Join(dir, "raft.db"))
	}
	if err != nil {
		return RecoverPlan{}, fmt.Errorf("open raft log: %w", err)
	}
	plan, err := recoverLog(lg, o, out)
	if cerr := lg.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("close raft log: %w", cerr)
	}
	return plan, err
}

func recoverLog(lg *raftlog.Log, o RecoverOptions, out io.Writer) (RecoverPlan, error) {
	self := member.ID(o.Name)
	hs, _, err := lg.InitialState()
	if err != nil {
		return RecoverPlan{}, fmt.Errorf("read hard state: %w", err)
	}
	snap, err := lg.Snapshot()
	if err != nil {
		return RecoverPlan{}, fmt.Errorf("read snapshot: %w", err)
	}
	first, err := lg.FirstIndex()
	if err != nil {
		return RecoverPlan{}, err
	}
	last, err := lg.LastIndex()
	if err != nil {
		return RecoverPlan{}, err
	}
	// Replay the configuration: the snapshot's, then every conf change.
	voters, learners := map[uint64]bool{}, map[uint64]bool{}
	for _, id := range snap.Metadata.ConfState.Voters {
		voters[id] = true
	}
	for _, id := range snap.Metadata.ConfState.Learners {
		learners[id] = true
	}
	names := map[uint64]string{}
	var ents []raftpb.Entry
	if last >= first {
		if ents, err = lg.Entries(first, last+1, 1<<62); err != nil {
			return RecoverPlan{}, fmt.Errorf("read entries %d..%d: %w", first, last, err)
		}
	}
	for _, e := range ents {
		var cc raftpb.ConfChangeV2
		switch e.Type {
		case raftpb.EntryConfChange:
			var v1 raftpb.ConfChange
			if err := v1.Unmarshal(e.Data); err != nil {
				return RecoverPlan{}, fmt.Errorf("decode conf change at index %d: %w", e.Index, err)
			}
			cc = v1.AsV2()
		case raftpb.EntryConfChangeV2:
			if err := cc.Unmarshal(e.Data); err != nil {
				return RecoverPlan{}, fmt.Errorf("decode conf change at index %d: %w", e.Index, err)
			}
		default:
			continue
		}
		if len(cc.Changes) > 1 {
			return RecoverPlan{}, fmt.Errorf("the log holds a joint configuration change at index %d, which recover does not handle", e.Index)
		}
		for _, ch := range cc.Changes {
			switch ch.Type {
			case raftpb.ConfChangeAddNode:
				voters[ch.NodeID], learners[ch.NodeID] = true, false
			case raftpb.ConfChangeAddLearnerNode:
				voters[ch.NodeID], learners[ch.NodeID] = false, true
			case raftpb.ConfChangeRemoveNode:
				voters[ch.NodeID], learners[ch.NodeID] = false, false
			}
		}
	}
	if !voters[self] {
		var vs []string
		for id, ok := range voters {
			if ok {
				vs = append(vs, fmt.Sprintf("%x", id))
			}
		}
		sort.Strings(vs)
		return RecoverPlan{}, fmt.Errorf("member %q (id %x) is not a voter in this data (voters: %s); pass the node's --name", o.Name, self, strings.Join(vs, ", "))
	}
	if in, err := memberNames(snap.Data); err == nil {
		names = in
	}
	var others []uint64
	for id := range voters {
		if voters[id] && id != self {
			others = append(others, id)
		}
	}
	for id := range learners {
		if learners[id] {
			others = append(others, id)
		}
	}
	sort.Slice(others, func(i, j int) bool { return others[i] < others[j] })
	plan := RecoverPlan{
		Member: o.Name, Term: hs.Term, Commit: hs.Commit, SnapIndex: snap.Metadata.Index,
		First: first, Last: last, NewCommit: last + uint64(len(others)), AlreadyAlone: len(others) == 0,
	}
	if last > hs.Commit {
		plan.Uncommitted = last - hs.Commit
	}
	for _, id := range others {
		label := fmt.Sprintf("%x", id)
		if n := names[id]; n != "" {
			label = n + " (" + label + ")"
		}
		plan.Removed = append(plan.Removed, label)
	}
	fmt.Fprintf(out, "member %s (%x): term %d, snapshot at %d, log %d..%d, stored commit %d\n", o.Name, self, hs.Term, plan.SnapIndex, first, last, hs.Commit)
	if plan.AlreadyAlone {
		fmt.Fprintln(out, "it is already the only member; nothing to do")
		return plan, nil
	}
	fmt.Fprintf(out, "will keep every entry up to %d", last)
	if plan.Uncommitted > 0 {
		fmt.Fprintf(out, " (including %d after the stored commit index, which may have been acknowledged)", plan.Uncommitted)
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "will remove %d member(s) at indices %d..%d, term %d: %s\n", len(others), last+1, plan.NewCommit, hs.Term, strings.Join(plan.Removed, ", "))
	fmt.Fprintf(out, "will set the commit index to %d\n", plan.NewCommit)
	if o.DryRun {
		fmt.Fprintln(out, "dry run: nothing changed")
		return plan, nil
	}
	var add []raftpb.Entry
	for i, id := range others {
		cc := raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode, NodeID: id}
		data, err := cc.Marshal()
		if err != nil {
			return plan, fmt.Errorf("encode removal of %x: %w", id, err)
		}
		add = append(add, raftpb.Entry{Type: raftpb.EntryConfChange, Term: hs.Term, Index: last + 1 + uint64(i), Data: data})
	}
	nhs := raftpb.HardState{Term: hs.Term, Vote: hs.Vote, Commit: plan.NewCommit}
	if err := lg.Save(nhs, add); err != nil {
		return plan, fmt.Errorf("append removals: %w", err)
	}
	fmt.Fprintf(out, "done: start the node with --initial-cluster %s=<its peer address>, then add members back with 'lodestone members add'\n", o.Name)
	return plan, nil
}

// memberNames reads member names from a store snapshot stream.
func memberNames(data []byte) (map[uint64]string, error) {
	out := map[uint64]string{}
	if len(data) == 0 {
		return out, nil
	}
	st := store.New()
	if err := st.Restore(bytes.NewReader(data)); err != nil {
		return nil, err
	}
	for _, m := range st.Members() {
		out[m.GetId()] = m.GetName()
	}
	return out, nil
}
