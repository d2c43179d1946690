package raftnode

import (
	"reflect"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// TestNextAppendBatch checks how the log writer merges queued
// MsgStorageAppend messages into one Save: the result must be what saving
// them one by one would have left in the log (raft's append rules: a later
// entry replaces an earlier one at the same index and everything after it;
// the last hard state wins), responses in order, and a snapshot never
// merged with what came before it.
func TestNextAppendBatch(t *testing.T) {
	ents := func(term uint64, idx ...uint64) []raftpb.Entry {
		var out []raftpb.Entry
		for _, i := range idx {
			out = append(out, raftpb.Entry{Index: i, Term: term})
		}
		return out
	}
	resp := func(idx uint64) []raftpb.Message {
		return []raftpb.Message{{Type: raftpb.MsgStorageAppendResp, To: 1, Index: idx}}
	}
	app := func(e []raftpb.Entry, hs raftpb.HardState, r []raftpb.Message) raftpb.Message {
		return raftpb.Message{Type: raftpb.MsgStorageAppend, To: raft.LocalAppendThread,
			Entries: e, Term: hs.Term, Vote: hs.Vote, Commit: hs.Commit, Responses: r}
	}
	snap := &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 10, Term: 2}}
	withSnap := app(nil, raftpb.HardState{Term: 2, Commit: 10}, resp(10))
	withSnap.Snapshot = snap

	tests := []struct {
		name     string
		msgs     []raftpb.Message
		wantEnts []raftpb.Entry
		wantHS   raftpb.HardState
		wantResp []uint64 // response indexes, in order
		wantSnap *raftpb.Snapshot
		wantRest int
	}{
		{
			name:     "appends concatenate",
			msgs:     []raftpb.Message{app(ents(1, 1, 2), raftpb.HardState{Term: 1, Commit: 1}, resp(2)), app(ents(1, 3), raftpb.HardState{}, resp(3))},
			wantEnts: ents(1, 1, 2, 3),
			wantHS:   raftpb.HardState{Term: 1, Commit: 1},
			wantResp: []uint64{2, 3},
		},
		{
			name:     "later hard state wins",
			msgs:     []raftpb.Message{app(nil, raftpb.HardState{Term: 1, Vote: 2, Commit: 3}, nil), app(nil, raftpb.HardState{Term: 2, Commit: 3}, resp(3))},
			wantHS:   raftpb.HardState{Term: 2, Commit: 3},
			wantResp: []uint64{3},
		},
		{
			name:     "conflicting suffix is replaced",
			msgs:     []raftpb.Message{app(ents(1, 4, 5, 6), raftpb.HardState{}, resp(6)), app(ents(2, 5), raftpb.HardState{Term: 2}, resp(5))},
			wantEnts: append(ents(1, 4), ents(2, 5)...),
			wantHS:   raftpb.HardState{Term: 2},
			wantResp: []uint64{6, 5},
		},
		{
			name: "a third message overwrites the merged copy",
			msgs: []raftpb.Message{app(ents(1, 1, 2), raftpb.HardState{}, nil), app(ents(1, 3, 4), raftpb.HardState{}, nil),
				app(ents(2, 4, 5), raftpb.HardState{}, nil), app(ents(2, 6), raftpb.HardState{}, nil)},
			wantEnts: append(ents(1, 1, 2, 3), ents(2, 4, 5, 6)...),
		},
		{
			name:     "whole batch replaced",
			msgs:     []raftpb.Message{app(ents(1, 4, 5), raftpb.HardState{}, nil), app(ents(2, 3, 4), raftpb.HardState{Term: 2}, nil)},
			wantEnts: ents(2, 3, 4),
			wantHS:   raftpb.HardState{Term: 2},
		},
		{
			name:     "snapshot ends the batch before it",
			msgs:     []raftpb.Message{app(ents(1, 1), raftpb.HardState{}, resp(1)), withSnap, app(ents(2, 11), raftpb.HardState{}, nil)},
			wantEnts: ents(1, 1),
			wantResp: []uint64{1},
			wantRest: 2,
		},
		{
			name:     "snapshot is a batch alone",
			msgs:     []raftpb.Message{withSnap, app(ents(2, 11), raftpb.HardState{}, nil)},
			wantHS:   raftpb.HardState{Term: 2, Commit: 10},
			wantResp: []uint64{10},
			wantSnap: snap,
			wantRest: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Keep copies: merging must not write into the messages' slices.
			var before [][]raftpb.Entry
			for _, m := range tt.msgs {
				before = append(before, append([]raftpb.Entry(nil), m.Entries...))
			}
			b, rest := nextAppendBatch(tt.msgs)
			if got, want := b.ents, tt.wantEnts; !reflect.DeepEqual(got, want) {
				t.Errorf("entries = %v, want %v", got, want)
			}
			if got, want := b.hs, tt.wantHS; got != want {
				t.Errorf("hard state = %+v, want %+v", got, want)
			}
			var gotResp []uint64
			for _, r := range b.responses {
				gotResp = append(gotResp, r.Index)
			}
			if got, want := gotResp, tt.wantResp; !reflect.DeepEqual(got, want) {
				t.Errorf("responses = %v, want %v", got, want)
			}
			if got, want := b.snap, tt.wantSnap; got != want {
				t.Errorf("snapshot = %v, want %v", got, want)
			}
			if got, want := len(rest), tt.wantRest; got != want {
				t.Errorf("left %d messages, want %d", got, want)
			}
			for i, m := range tt.msgs {
				if got, want := m.Entries, before[i]; !reflect.DeepEqual(got, want) {
					t.Errorf("message %d entries changed to %v, want %v", i, got, want)
				}
			}
		})
	}
}
