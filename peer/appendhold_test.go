package peer

import (
	"bytes"
	"reflect"
	"slices"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// appendAt is an append from leader 1 to learner 4 in term 2 carrying the
// entries first..last (none if last < first) after index first-1, with
// commit c.
func appendAt(first, last, c uint64) raftpb.Message {
	m := raftpb.Message{Type: raftpb.MsgApp, From: 1, To: 4, Term: 2, LogTerm: 2, Index: first - 1, Commit: c}
	for i := first; i <= last; i++ {
		m.Entries = append(m.Entries, raftpb.Entry{Term: 2, Index: i, Data: []byte{byte(i)}})
	}
	return m
}

func TestAppendHoldNext(t *testing.T) {
	heartbeat := raftpb.Message{Type: raftpb.MsgHeartbeat, From: 1, To: 4, Term: 2, Commit: 5}
	otherTerm := appendAt(8, 8, 7)
	otherTerm.Term = 3
	type step struct {
		in      []raftpb.Message
		expired bool
		send    []raftpb.Message
		merged  int
		holding bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{name: "appends that continue each other go as one when the hold ends", steps: []step{
			{in: []raftpb.Message{appendAt(5, 5, 4)}, holding: true},
			{in: []raftpb.Message{appendAt(6, 6, 5), appendAt(7, 8, 6)}, merged: 2, holding: true},
			{expired: true, send: []raftpb.Message{appendAt(5, 8, 6)}},
			{expired: true},
		}},
		{name: "a commit notice folds into the held append", steps: []step{
			{in: []raftpb.Message{appendAt(5, 6, 4), appendAt(7, 6, 6)}, merged: 1, holding: true},
			{expired: true, send: []raftpb.Message{appendAt(5, 6, 6)}},
		}},
		{name: "anything but an append sends what is held, in order", steps: []step{
			{in: []raftpb.Message{appendAt(5, 5, 4)}, holding: true},
			{in: []raftpb.Message{appendAt(6, 6, 5), heartbeat}, merged: 1, send: []raftpb.Message{appendAt(5, 6, 5), heartbeat}},
		}},
		{name: "an append that does not continue the run is kept behind it", steps: []step{
			{in: []raftpb.Message{appendAt(5, 6, 4), appendAt(3, 4, 4), otherTerm}, holding: true},
			{expired: true, send: []raftpb.Message{appendAt(5, 6, 4), appendAt(3, 4, 4), otherTerm}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h appendHold
			for i, s := range tc.steps {
				got, merged := h.next(slices.Clone(s.in), s.expired)
				if !slices.EqualFunc(got, s.send, func(a, b raftpb.Message) bool { return reflect.DeepEqual(a, b) }) {
					t.Fatalf("step %d: sent %v, want %v", i, got, s.send)
				}
				if merged != s.merged || h.holding() != s.holding {
					t.Fatalf("step %d: merged %d holding %v, want %d and %v", i, merged, h.holding(), s.merged, s.holding)
				}
			}
		})
	}
}

// A run goes out once it holds appendHoldBytes of entry data, hold or not.
func TestAppendHoldSendsAFullRun(t *testing.T) {
	var h appendHold
	big := func(i uint64) raftpb.Message {
		m := appendAt(i, i, i-1)
		m.Entries[0].Data = bytes.Repeat([]byte{1}, appendHoldBytes/4)
		return m
	}
	merged := 0
	for i := uint64(1); i <= 3; i++ {
		got, n := h.next([]raftpb.Message{big(i)}, false)
		if got != nil {
			t.Fatalf("append %d of a quarter of the bound: sent %d messages, want a hold", i, len(got))
		}
		merged += n
	}
	got, n := h.next([]raftpb.Message{big(4)}, false)
	merged += n
	entries := 0
	if len(got) > 0 {
		entries = len(got[0].Entries)
	}
	if len(got) != 1 || entries != 4 || merged != 3 || h.holding() {
		t.Fatalf("the fourth: sent %d messages, the first of %d entries, merged %d, holding %v; want one of 4 entries, 3 merged, none held",
			len(got), entries, merged, h.holding())
	}
}

// Folding never writes into a held append's entry slice: raft hands the
// transport slices of its own log.
func TestAppendHoldLeavesRaftsSlicesAlone(t *testing.T) {
	backing := make([]raftpb.Entry, 1, 8)
	backing[0] = raftpb.Entry{Term: 2, Index: 5}
	first := raftpb.Message{Type: raftpb.MsgApp, To: 4, Term: 2, LogTerm: 2, Index: 4, Entries: backing[:1]}
	second := appendAt(6, 6, 5)
	secondBacking := second.Entries[:1:1]
	var h appendHold
	if _, merged := h.next([]raftpb.Message{first, second, appendAt(7, 7, 6)}, false); merged != 2 {
		t.Fatalf("folded %d appends, want 2", merged)
	}
	if spare := backing[:2][1]; spare.Index != 0 {
		t.Fatalf("raft's slice was written past its length: %v", spare)
	}
	if secondBacking[0].Index != 6 {
		t.Fatalf("the second append's entries changed: %v", secondBacking)
	}
	got, _ := h.next(nil, true)
	if len(got) != 1 || len(got[0].Entries) != 3 || got[0].Entries[2].Index != 7 || got[0].Commit != 6 {
		t.Fatalf("sent %v, want one append of entries 5 to 7 with commit 6", got)
	}
}
