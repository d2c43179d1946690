package raftnode

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// How the interaction environment prints what happens: compact, with
// member names for ids, and nothing that differs between two runs of a
// script (no paths, no wall-clock times).

// describeMsg renders a message as "n1->n2 MsgApp term=2 ..." with the
// fields that matter for its type.
func (env *interactionEnv) describeMsg(m raftpb.Message) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s->%s %s", env.name(m.From), env.name(m.To), m.Type)
	if m.Term != 0 {
		fmt.Fprintf(&b, " term=%d", m.Term)
	}
	switch m.Type {
	case raftpb.MsgApp:
		fmt.Fprintf(&b, " log=%d/%d commit=%d", m.LogTerm, m.Index, m.Commit)
		if len(m.Entries) > 0 {
			fmt.Fprintf(&b, " entries=%s", describeEntries(m.Entries))
		}
	case raftpb.MsgAppResp:
		fmt.Fprintf(&b, " index=%d", m.Index)
		if m.Reject {
			fmt.Fprintf(&b, " rejected hint=%d/%d", m.LogTerm, m.RejectHint)
		}
	case raftpb.MsgHeartbeat:
		fmt.Fprintf(&b, " commit=%d", m.Commit)
	case raftpb.MsgVote, raftpb.MsgPreVote:
		fmt.Fprintf(&b, " log=%d/%d", m.LogTerm, m.Index)
	case raftpb.MsgVoteResp, raftpb.MsgPreVoteResp:
		if m.Reject {
			b.WriteString(" rejected")
		} else {
			b.WriteString(" granted")
		}
	case raftpb.MsgSnap:
		md := m.Snapshot.Metadata
		fmt.Fprintf(&b, " snapshot=%d/%d %s", md.Term, md.Index, env.describeConf(md.ConfState))
	case raftpb.MsgProp:
		fmt.Fprintf(&b, " entries=%d", len(m.Entries))
	case raftpb.MsgReadIndexResp:
		fmt.Fprintf(&b, " index=%d", m.Index)
	}
	return b.String()
}

// describeEntries renders consecutive entries as their index range, and
// names the kinds that are not client writes.
func describeEntries(ents []raftpb.Entry) string {
	s := span(ents[0].Index, ents[len(ents)-1].Index)
	var kinds []string
	for _, e := range ents {
		switch {
		case e.Type != raftpb.EntryNormal:
			kinds = append(kinds, fmt.Sprintf("%d:conf", e.Index))
		case len(e.Data) == 0:
			kinds = append(kinds, fmt.Sprintf("%d:empty", e.Index))
		}
	}
	if len(kinds) > 0 {
		s += " (" + strings.Join(kinds, " ") + ")"
	}
	return s
}

// describeConf renders a conf state by member names.
func (env *interactionEnv) describeConf(cs raftpb.ConfState) string {
	s := "voters=(" + env.names(cs.Voters) + ")"
	if len(cs.Learners) > 0 {
		s += " learners=(" + env.names(cs.Learners) + ")"
	}
	return s
}

func (env *interactionEnv) names(ids []uint64) string {
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = env.name(id)
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}

// describeWrite renders one log write: what it persisted and how it ended.
func (env *interactionEnv) describeWrite(b appendBatch, d appendDone) string {
	var parts []string
	if b.snap != nil {
		parts = append(parts, fmt.Sprintf("snapshot %d", b.snap.Metadata.Index))
	}
	if len(b.ents) > 0 {
		parts = append(parts, "entries "+span(b.ents[0].Index, b.ents[len(b.ents)-1].Index))
	}
	if !raft.IsEmptyHardState(b.hs) {
		hs := fmt.Sprintf("term=%d commit=%d", b.hs.Term, b.hs.Commit)
		if b.hs.Vote != 0 {
			hs += " vote=" + env.name(b.hs.Vote)
		}
		parts = append(parts, hs)
	}
	s := strings.Join(parts, ", ")
	if d.err != nil {
		s += ": failed" // NB: the loop reports the error when it stops
	}
	return s
}

// describeSnapshot renders a snapshot job's result and the log it left.
func (env *interactionEnv) describeSnapshot(en *envNode, res snapResult) string {
	switch {
	case res.err != nil:
		return fmt.Sprintf("snapshot at %d failed: %s", res.index, env.describeErr(res.err))
	case res.stale:
		return fmt.Sprintf("snapshot at %d overtaken by the leader's", res.index)
	}
	first, _ := en.log.FirstIndex()
	last, _ := en.log.LastIndex()
	return fmt.Sprintf("took snapshot at %d; log now %d..%d", res.index, first, last)
}

// describeRole renders a node's place in the cluster.
func (env *interactionEnv) describeRole(v nodeView) string {
	switch v.state {
	case raft.StateLeader:
		return fmt.Sprintf("leader at term %d", v.term)
	case raft.StatePreCandidate:
		return fmt.Sprintf("pre-candidate at term %d", v.term)
	case raft.StateCandidate:
		return fmt.Sprintf("candidate at term %d", v.term)
	}
	if v.lead == raft.None {
		return fmt.Sprintf("follower at term %d, no leader", v.term)
	}
	return fmt.Sprintf("follower of %s at term %d", env.name(v.lead), v.term)
}

// envErrors are the conditions a Node reports, by the names scripts use.
var envErrors = []struct {
	err  error
	name string
}{
	{ErrNoLeader, "ErrNoLeader"}, {ErrNotLeader, "ErrNotLeader"}, {ErrBusy, "ErrBusy"},
	{ErrInvalidMember, "ErrInvalidMember"}, {ErrUnknownMember, "ErrUnknownMember"},
	{ErrQuorum, "ErrQuorum"}, {ErrNotReady, "ErrNotReady"}, {ErrReadTimeout, "ErrReadTimeout"},
	{ErrLeaderChanged, "ErrLeaderChanged"}, {ErrStopped, "ErrStopped"}, {errDiskFailed, "disk failed"},
}

// describeErr names a known condition; what a wrapping error adds (which
// member, how many voters) follows in parentheses, with member names.
func (env *interactionEnv) describeErr(err error) string {
	msg := env.ids.Replace(err.Error())
	for _, e := range envErrors {
		if !errors.Is(err, e.err) {
			continue
		}
		if err == e.err {
			return e.name
		}
		detail := strings.TrimPrefix(strings.TrimPrefix(msg, e.err.Error()), ": ")
		return fmt.Sprintf("%s (%s)", e.name, detail)
	}
	return msg
}
