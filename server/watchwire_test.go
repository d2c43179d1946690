package server

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/watch"
)

// TestWireResponsesMatchMessages decodes the hand-encoded responses as
// the generated messages a client uses and compares them with the same
// responses built as messages: every field, zero values omitted, negative
// ids, multi-byte lengths, deletes and prev_kv.
func TestWireResponsesMatchMessages(t *testing.T) {
	big := []byte(strings.Repeat("v", 300)) // a two-byte length
	prev := watch.KeyValue{Key: "a/1", Value: []byte("old"), CreateIndex: 3, ModifyIndex: 4}
	evs := []*watch.Event{
		{Type: watch.Put, KV: watch.KeyValue{Key: "a/1", Value: []byte("x"), CreateIndex: 3, ModifyIndex: 9, LockIndex: 1, Flags: 42, Session: "s-1"}, PrevKV: &prev},
		{Type: watch.Delete, KV: watch.KeyValue{Key: "a/2", ModifyIndex: 10}},
		{Type: watch.Put, KV: watch.KeyValue{Key: "a/3", Value: big, CreateIndex: 11, ModifyIndex: 11}},
		{Type: watch.Put, KV: watch.KeyValue{Key: "a/4"}}, // every field but the key zero
	}
	var c wireCache
	pbEvents := func(prev bool) []*lodestonepb.Event {
		var out []*lodestonepb.Event
		for _, ev := range evs {
			out = append(out, newPBEvent(ev, prev))
		}
		return out
	}
	for _, prevKV := range []bool{false, true} {
		// Grouped: two groups in one response, one with a zero index and
		// a negative id.
		var out, scratch []byte
		out, scratch = c.appendGroup(out, scratch, 7, 11, evs, prevKV)
		out, _ = c.appendGroup(out, scratch, -3, 0, evs[:1], prevKV)
		want := &lodestonepb.WatchResponse{Groups: []*lodestonepb.WatchGroup{
			{WatchId: 7, Index: 11, Events: pbEvents(prevKV)},
			{WatchId: -3, Events: pbEvents(prevKV)[:1]},
		}}
		checkWire(t, out, want)

		// Ungrouped, with a header.
		hdr := &lodestonepb.ResponseHeader{Index: 11, Term: 2, LeaderId: 5, NodeId: 5, KnownLeader: true}
		one := c.appendResponse(nil, hdr, 7, 11, evs, prevKV)
		checkWire(t, one, &lodestonepb.WatchResponse{Header: hdr, WatchId: 7, Index: 11, Events: pbEvents(prevKV)})
	}
	// The cache serves the second use of an event from its first encoding.
	if a, b := c.event(evs[2]), c.event(evs[2]); &a[0] != &b[0] {
		t.Fatal("the same event was encoded twice")
	}
}

func checkWire(t *testing.T, b []byte, want *lodestonepb.WatchResponse) {
	t.Helper()
	var got lodestonepb.WatchResponse
	if err := proto.Unmarshal(b, &got); err != nil {
		t.Fatalf("wire response does not decode: %v", err)
	}
	if !proto.Equal(&got, want) {
		t.Fatalf("wire response decodes as\n%v\nwant\n%v", &got, want)
	}
	// Byte for byte what the generated code writes (deterministic order).
	if wb, err := (proto.MarshalOptions{Deterministic: true}).Marshal(want); err != nil || string(wb) != string(b) {
		t.Fatalf("wire bytes differ from the message's encoding (err %v)", err)
	}
}

// watchSet finds, adds and removes a stream's watches by id whatever the
// order the client numbered them in.
func TestWatchSetAnyOrder(t *testing.T) {
	h, err := watch.New(watch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	var set watchSet
	ids := []int64{5, 9, 1, 7, 3, 10, 2}
	for _, id := range ids {
		w, err := h.Watch(context.Background(), watch.Request{Key: "k", Tag: id})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		set.add(w)
	}
	check := func(want ...int64) {
		t.Helper()
		var got []int64
		for _, w := range set.all() {
			got = append(got, w.Tag())
		}
		if fmt.Sprint(got) != fmt.Sprint(want) || set.len() != len(want) {
			t.Fatalf("set holds %v (len %d), want %v", got, set.len(), want)
		}
		for _, id := range want {
			if w, ok := set.get(id); !ok || w.Tag() != id {
				t.Fatalf("get(%d): %v, %v", id, w, ok)
			}
		}
	}
	check(1, 2, 3, 5, 7, 9, 10)
	set.remove(5)
	set.remove(1)
	set.remove(10)
	set.remove(4) // absent: no change
	check(2, 3, 7, 9)
	if _, ok := set.get(5); ok {
		t.Fatal("get(5) after its removal: found")
	}
}
