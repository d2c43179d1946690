package peer

import (
	"reflect"
	"slices"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

func TestNoticeHoldNext(t *testing.T) {
	notice := func(term, commit uint64) raftpb.Message {
		return raftpb.Message{Type: raftpb.MsgApp, Term: term, Index: 9, Commit: commit}
	}
	appendOf := func(term, commit uint64) raftpb.Message {
		m := notice(term, commit)
		m.Entries = []raftpb.Entry{{Term: term, Index: 10}}
		return m
	}
	heartbeat := raftpb.Message{Type: raftpb.MsgHeartbeat, Term: 2, Commit: 5}

	type step struct {
		in      []raftpb.Message
		expired bool
		send    []raftpb.Message // what goes out now
		merged  int
		holding bool
	}
	for _, tc := range []struct {
		name     string
		disabled bool
		steps    []step
	}{
		{name: "a notice waits, the next append carries its news", steps: []step{
			{in: []raftpb.Message{appendOf(2, 4), notice(2, 5)}, send: []raftpb.Message{appendOf(2, 4)}, holding: true},
			{in: []raftpb.Message{appendOf(2, 5)}, send: []raftpb.Message{appendOf(2, 5)}, merged: 1},
		}},
		{name: "a notice alone goes out when the hold ends, and only once", steps: []step{
			{in: []raftpb.Message{notice(2, 5)}, holding: true},
			{expired: true, send: []raftpb.Message{notice(2, 5)}},
			{expired: true},
		}},
		{name: "anything but an append goes out behind the notice", steps: []step{
			{in: []raftpb.Message{notice(2, 5)}, holding: true},
			{in: []raftpb.Message{heartbeat}, send: []raftpb.Message{notice(2, 5), heartbeat}},
		}},
		{name: "an append of another term does not replace it", steps: []step{
			{in: []raftpb.Message{notice(2, 5)}, holding: true},
			{in: []raftpb.Message{appendOf(3, 5)}, send: []raftpb.Message{notice(2, 5), appendOf(3, 5)}},
		}},
		{name: "an append with a lower commit does not replace it", steps: []step{
			{in: []raftpb.Message{notice(2, 5)}, holding: true},
			{in: []raftpb.Message{appendOf(2, 4)}, send: []raftpb.Message{notice(2, 5), appendOf(2, 4)}},
		}},
		{name: "a newer notice replaces the held one and is held in turn", steps: []step{
			{in: []raftpb.Message{notice(2, 5)}, holding: true},
			{in: []raftpb.Message{notice(2, 6)}, merged: 1, holding: true},
			{in: []raftpb.Message{appendOf(2, 6), notice(2, 7)}, send: []raftpb.Message{appendOf(2, 6)}, merged: 1, holding: true},
			{expired: true, send: []raftpb.Message{notice(2, 7)}},
		}},
		{name: "disabled: every notice goes out at once", disabled: true, steps: []step{
			{in: []raftpb.Message{appendOf(2, 4), notice(2, 5)}, send: []raftpb.Message{appendOf(2, 4), notice(2, 5)}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h noticeHold
			for i, s := range tc.steps {
				got, merged := h.next(slices.Clone(s.in), s.expired, !tc.disabled)
				if !slices.EqualFunc(got, s.send, func(a, b raftpb.Message) bool { return reflect.DeepEqual(a, b) }) {
					t.Fatalf("step %d: sent %v, want %v", i, got, s.send)
				}
				if merged != s.merged || h.holding != s.holding {
					t.Fatalf("step %d: merged %d holding %v, want %d and %v", i, merged, h.holding, s.merged, s.holding)
				}
			}
		})
	}
}

// A batch that a ReadIndex round waits on is written without the yield
// that lets a small batch grow; a batch of appends alone still yields.
func TestWaitsRead(t *testing.T) {
	app := raftpb.Message{Type: raftpb.MsgApp, Entries: []raftpb.Entry{{Index: 3}}}
	for _, tc := range []struct {
		msgs []raftpb.Message
		want bool
	}{
		{nil, false},
		{[]raftpb.Message{app, {Type: raftpb.MsgAppResp}}, false},
		{[]raftpb.Message{app, {Type: raftpb.MsgHeartbeat, Context: []byte("round")}}, true},
		{[]raftpb.Message{{Type: raftpb.MsgHeartbeatResp}}, true},
		{[]raftpb.Message{{Type: raftpb.MsgReadIndex}}, true},
		{[]raftpb.Message{{Type: raftpb.MsgReadIndexResp}}, true},
	} {
		if got := waitsRead(tc.msgs); got != tc.want {
			t.Errorf("waitsRead(%v) = %v, want %v", tc.msgs, got, tc.want)
		}
	}
}
