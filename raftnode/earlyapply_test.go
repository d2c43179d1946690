package raftnode

import (
	"slices"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// ents makes entries from..to of term, normal unless listed in conf.
func ents(term, from, to uint64, conf ...uint64) []raftpb.Entry {
	var out []raftpb.Entry
	for i := from; i <= to; i++ {
		e := raftpb.Entry{Term: term, Index: i, Type: raftpb.EntryNormal}
		if slices.Contains(conf, i) {
			e.Type = raftpb.EntryConfChangeV2
		}
		out = append(out, e)
	}
	return out
}

func appendMsg(commit uint64, es []raftpb.Entry) raftpb.Message {
	return raftpb.Message{Type: raftpb.MsgStorageAppend, Commit: commit, Entries: es}
}

// indexes renders entries as index/term pairs.
func indexes(es []raftpb.Entry) [][2]uint64 {
	var out [][2]uint64
	for _, e := range es {
		out = append(out, [2]uint64{e.Index, e.Term})
	}
	return out
}

func TestPendingEntries(t *testing.T) {
	type step struct {
		m       *raftpb.Message // recorded first, if set
		applied uint64
		limit   uint64
		want    [][2]uint64 // committed(applied, limit)
	}
	msg := func(m raftpb.Message) *raftpb.Message { return &m }
	snap := raftpb.Message{Type: raftpb.MsgStorageAppend, Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 20, Term: 3}}}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"nothing committed yet", []step{
			{m: msg(appendMsg(0, ents(1, 1, 3))), applied: 0, limit: 100, want: nil},
		}},
		{"commit arrives in a later hard state", []step{
			{m: msg(appendMsg(0, ents(1, 1, 3))), applied: 0, limit: 100, want: nil},
			{m: msg(appendMsg(2, nil)), applied: 0, limit: 100, want: [][2]uint64{{1, 1}, {2, 1}}},
		}},
		{"an append without a hard state does not lower the commit index", []step{
			{m: msg(appendMsg(3, ents(1, 1, 3))), applied: 0, limit: 100, want: [][2]uint64{{1, 1}, {2, 1}, {3, 1}}},
			{m: msg(appendMsg(0, ents(1, 4, 4))), applied: 1, limit: 100, want: [][2]uint64{{2, 1}, {3, 1}}},
		}},
		{"the limit holds entries back", []step{
			{m: msg(appendMsg(5, ents(1, 1, 5))), applied: 0, limit: 2, want: [][2]uint64{{1, 1}, {2, 1}}},
			{applied: 2, limit: 2, want: nil},
		}},
		{"a conf change waits for raft", []step{
			{m: msg(appendMsg(5, ents(1, 1, 5, 3))), applied: 0, limit: 100, want: [][2]uint64{{1, 1}, {2, 1}}},
			{applied: 2, limit: 100, want: nil},
			{applied: 3, limit: 100, want: [][2]uint64{{4, 1}, {5, 1}}},
		}},
		{"a gap after applied waits for raft", []step{
			{m: msg(appendMsg(9, ents(1, 5, 9))), applied: 2, limit: 100, want: nil},
			{applied: 4, limit: 100, want: [][2]uint64{{5, 1}, {6, 1}, {7, 1}, {8, 1}, {9, 1}}},
		}},
		{"a new leader's entries replace an uncommitted tail", []step{
			{m: msg(appendMsg(2, ents(1, 1, 5))), applied: 0, limit: 100, want: [][2]uint64{{1, 1}, {2, 1}}},
			{m: msg(appendMsg(4, ents(2, 3, 4))), applied: 2, limit: 100, want: [][2]uint64{{3, 2}, {4, 2}}},
			{m: msg(appendMsg(5, ents(2, 5, 5))), applied: 4, limit: 100, want: [][2]uint64{{5, 2}}},
		}},
		{"an append from before what is kept replaces all of it", []step{
			{m: msg(appendMsg(0, ents(1, 3, 5))), applied: 2, limit: 100, want: nil},
			{m: msg(appendMsg(4, ents(2, 3, 4))), applied: 2, limit: 100, want: [][2]uint64{{3, 2}, {4, 2}}},
		}},
		{"an append after a gap starts over", []step{
			{m: msg(appendMsg(0, ents(1, 1, 2))), applied: 0, limit: 100, want: nil},
			{m: msg(appendMsg(6, ents(1, 5, 6))), applied: 0, limit: 100, want: nil},
			{applied: 4, limit: 100, want: [][2]uint64{{5, 1}, {6, 1}}},
		}},
		{"a snapshot drops everything kept", []step{
			{m: msg(appendMsg(0, ents(1, 1, 30))), applied: 0, limit: 100, want: nil},
			{m: &snap, applied: 0, limit: 100, want: nil},
			{m: msg(appendMsg(22, ents(3, 21, 22))), applied: 20, limit: 100, want: [][2]uint64{{21, 3}, {22, 3}}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p pendingEntries
			for i, s := range tc.steps {
				if s.m != nil {
					p.record(*s.m)
				}
				p.release(s.applied)
				if got := indexes(p.committed(s.applied, s.limit)); !slices.Equal(got, s.want) {
					t.Fatalf("step %d: committed(%d, %d) = %v, want %v", i, s.applied, s.limit, got, s.want)
				}
			}
		})
	}
}

// release keeps what is not applied and lets go of the rest, reusing the
// backing array once everything is applied.
func TestPendingEntriesRelease(t *testing.T) {
	var p pendingEntries
	p.record(appendMsg(0, ents(1, 1, 10)))
	p.release(4)
	if got := indexes(p.ents); len(got) != 6 || got[0][0] != 5 {
		t.Fatalf("after release(4): %v, want 5..10", got)
	}
	p.release(10)
	if len(p.ents) != 0 || cap(p.ents) == 0 {
		t.Fatalf("after release(10): len %d cap %d, want empty with its array kept", len(p.ents), cap(p.ents))
	}
	full := p.ents[:cap(p.ents)]
	for i, e := range full {
		if e.Index != 0 {
			t.Fatalf("released slot %d still holds entry %d", i, e.Index)
		}
	}
}
