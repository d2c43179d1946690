package server

import (
	"fmt"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// On a grouped stream (WatchCreate.grouped) every watch gets exactly its
// events, in index order, carried in groups; a cancel comes after the
// watch's last group; a stream that did not ask for groups on the same
// server still gets one response per watch (old clients keep working).
func TestWatchGroupedStream(t *testing.T) {
	c := newTestCluster(t, 1)
	lead := c.waitLeader()
	g := openWatch(t, c, lead)
	plain := openWatch(t, c, lead)
	keys := []string{"svc/a", "svc/b", "svc/a", "svc/c"} // watch id i+1 on keys[i]; 5: prefix svc/
	for i, k := range keys {
		g.create(&lodestonepb.WatchCreate{WatchId: int64(i + 1), Key: []byte(k), Grouped: true})
	}
	g.create(&lodestonepb.WatchCreate{WatchId: 5, Key: []byte("svc/"), Prefix: true, Grouped: true})
	plain.create(&lodestonepb.WatchCreate{WatchId: 1, Key: []byte("svc/"), Prefix: true})

	want := map[int64][]string{} // watch id -> values, in order
	const writes = 30
	for i := range writes {
		k := []string{"svc/a", "svc/b", "svc/c", "other"}[i%4]
		v := fmt.Sprint(i)
		put(t, c.kv(lead), k, v)
		for j, wk := range keys {
			if wk == k {
				want[int64(j+1)] = append(want[int64(j+1)], v)
			}
		}
		if k != "other" {
			want[5] = append(want[5], v)
		}
	}

	due := 0
	for _, vs := range want {
		due += len(vs)
	}
	got := map[int64][]string{}
	last := map[int64]uint64{}
	for n := 0; n < due; {
		resp := g.recv()
		if len(resp.Groups) == 0 {
			t.Fatalf("grouped stream: got %+v, want a response with groups", resp)
		}
		if resp.Header != nil || resp.WatchId != 0 || len(resp.Events) > 0 {
			t.Fatalf("grouped response has fields besides groups: %+v", resp)
		}
		for _, gr := range resp.Groups {
			for _, ev := range gr.Events {
				if ev.Kv.ModifyIndex <= last[gr.WatchId] {
					t.Fatalf("watch %d: event at %d after %d", gr.WatchId, ev.Kv.ModifyIndex, last[gr.WatchId])
				}
				last[gr.WatchId] = ev.Kv.ModifyIndex
				got[gr.WatchId] = append(got[gr.WatchId], string(ev.Kv.Value))
				n++
			}
			if gr.Index < last[gr.WatchId] {
				t.Fatalf("watch %d: group index %d below its last event %d", gr.WatchId, gr.Index, last[gr.WatchId])
			}
		}
	}
	for id, vs := range want {
		if fmt.Sprint(got[id]) != fmt.Sprint(vs) {
			t.Errorf("watch %d: got %v, want %v", id, got[id], vs)
		}
	}

	// The plain stream: one response per batch, with watch_id and header.
	var plainVals []string
	for len(plainVals) < len(want[5]) {
		resp := plain.recv()
		if len(resp.Groups) > 0 || resp.WatchId != 1 || resp.Header == nil {
			t.Fatalf("plain stream: got %+v, want a response of watch 1 with a header", resp)
		}
		for _, ev := range resp.Events {
			plainVals = append(plainVals, string(ev.Kv.Value))
		}
	}
	if got, want := fmt.Sprint(plainVals), fmt.Sprint(want[5]); got != want {
		t.Fatalf("plain stream: got %v, want %v", got, want)
	}

	// A cancel on the grouped stream is acknowledged after any group.
	put(t, c.kv(lead), "svc/a", "last")
	if err := g.stream.Send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Cancel{Cancel: &lodestonepb.WatchCancel{WatchId: 1}}}); err != nil {
		t.Fatal(err)
	}
	for {
		resp := g.recv()
		if resp.Canceled {
			if resp.WatchId != 1 {
				t.Fatalf("cancel: got %+v, want watch 1 canceled", resp)
			}
			break
		}
		if len(resp.Groups) == 0 {
			t.Fatalf("before the cancel: got %+v, want groups", resp)
		}
	}
}
