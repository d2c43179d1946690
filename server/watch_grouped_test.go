package server

import (
	"fmt"
	"slices"
	"sync"
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

// A watch on a grouped stream that falls a full buffer behind is cut loose
// with a resync index, after a group holding every event up to it; resumed
// from there it gets the rest: together each write exactly once, in order
// (DESIGN "Watch fan-out": cut loose with "resync from index X").
func TestWatchGroupedResync(t *testing.T) {
	c := newTestCluster(t, 1, func(cfg *Config) { cfg.Watch.WatcherBuffer = 1 })
	lead := c.waitLeader()
	w := openWatch(t, c, lead)
	w.create(&lodestonepb.WatchCreate{WatchId: 1, Key: []byte("svc/"), Prefix: true, Grouped: true})

	// Bursts of concurrent writes land several indexes in one delivery
	// interval, more than a buffer of one holds.
	var wrote []uint64
	var mu sync.Mutex
	burst := func() {
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Go(func() {
				resp := put(t, c.kv(lead), fmt.Sprintf("svc/%d", i), "v")
				mu.Lock()
				wrote = append(wrote, resp.Header.Index)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	var got []uint64
	var resync uint64
	for b := 0; resync == 0; b++ {
		if b == 50 {
			t.Fatal("no resync after 50 bursts of 16 concurrent writes into a buffer of 1")
		}
		burst()
		mu.Lock()
		due := len(wrote)
		mu.Unlock()
		for len(got) < due && resync == 0 {
			resp := w.recv()
			switch {
			case resp.Canceled:
				if resp.WatchId != 1 || resp.ResyncIndex == 0 {
					t.Fatalf("got %+v, want watch 1 canceled with a resync index", resp)
				}
				resync = resp.ResyncIndex
			default:
				for _, g := range resp.Groups {
					for _, ev := range g.Events {
						got = append(got, ev.Kv.ModifyIndex)
					}
				}
			}
		}
	}
	// Resume from each resync index (a replay into a buffer of one may be
	// cut again) until every write arrived.
	mu.Lock()
	due := len(wrote)
	mu.Unlock()
	for from := resync; len(got) < due; {
		w.create(&lodestonepb.WatchCreate{WatchId: 1, Key: []byte("svc/"), Prefix: true, Grouped: true, StartIndex: from})
		for from != 0 && len(got) < due {
			resp := w.recv()
			if resp.Canceled {
				if resp.ResyncIndex == 0 {
					t.Fatalf("resumed watch: got %+v, want events or a resync", resp)
				}
				from = resp.ResyncIndex
				break
			}
			for _, g := range resp.Groups {
				for _, ev := range g.Events {
					got = append(got, ev.Kv.ModifyIndex)
				}
			}
		}
	}
	slices.Sort(wrote)
	if fmt.Sprint(got) != fmt.Sprint(wrote) {
		t.Fatalf("events by index:\n got %v\nwant %v (resync at %d)", got, wrote, resync)
	}
}
