package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

type watchClient struct {
	t      *testing.T
	stream lodestonepb.Watch_WatchClient
}

func openWatch(t *testing.T, c *testCluster, name string) *watchClient {
	t.Helper()
	stream, err := lodestonepb.NewWatchClient(c.conn(name)).Watch(ctxT(t))
	if err != nil {
		t.Fatalf("open watch stream on %s: %v", name, err)
	}
	return &watchClient{t: t, stream: stream}
}

func (w *watchClient) create(c *lodestonepb.WatchCreate) {
	w.t.Helper()
	if err := w.stream.Send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Create{Create: c}}); err != nil {
		w.t.Fatalf("create watch: %v", err)
	}
	resp := w.recv()
	if !resp.Created || resp.WatchId != c.WatchId {
		w.t.Fatalf("create watch %d: got %+v, want created", c.WatchId, resp)
	}
}

func (w *watchClient) recv() *lodestonepb.WatchResponse {
	w.t.Helper()
	resp, err := w.stream.Recv()
	if err != nil {
		w.t.Fatalf("watch recv: %v", err)
	}
	return resp
}

// collect reads responses until n events arrived; it returns the events
// and the highest index seen.
func (w *watchClient) collect(n int) ([]*lodestonepb.Event, uint64) {
	w.t.Helper()
	var evs []*lodestonepb.Event
	var last uint64
	for len(evs) < n {
		resp := w.recv()
		if resp.Canceled {
			w.t.Fatalf("watch canceled: %s", resp.CancelReason)
		}
		evs = append(evs, resp.Events...)
		last = max(last, resp.Index)
	}
	return evs, last
}

// A watch on a follower sees every matching write in order, and a watch
// resumed on another member from the last index sees the rest with no gap
// and no duplicate (DESIGN: "Resume from an index is served from the event
// log while the index is still retained").
func TestWatchResumesOnAnotherMemberWithoutGap(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	f := c.follower()
	w := openWatch(t, c, f)
	w.create(&lodestonepb.WatchCreate{WatchId: 1, Key: []byte("svc/"), Prefix: true})

	for i := 0; i < 10; i++ {
		put(t, c.kv(lead), fmt.Sprintf("svc/%d", i), fmt.Sprint(i))
		put(t, c.kv(lead), fmt.Sprintf("other/%d", i), "x")
	}
	evs, last := w.collect(10)
	for i, ev := range evs {
		if got, want := string(ev.Kv.Key), fmt.Sprintf("svc/%d", i); got != want {
			t.Fatalf("event %d: key %s, want %s", i, got, want)
		}
		if i > 0 && ev.Kv.ModifyIndex <= evs[i-1].Kv.ModifyIndex {
			t.Fatalf("event %d: index %d after %d", i, ev.Kv.ModifyIndex, evs[i-1].Kv.ModifyIndex)
		}
	}
	w.stream.CloseSend()

	// Writes while nobody watches, then resume elsewhere from `last`.
	for i := 10; i < 15; i++ {
		put(t, c.kv(lead), fmt.Sprintf("svc/%d", i), fmt.Sprint(i))
	}
	var other string
	for _, n := range c.names {
		if n != f {
			other = n
			break
		}
	}
	w2 := openWatch(t, c, other)
	w2.create(&lodestonepb.WatchCreate{WatchId: 7, Key: []byte("svc/"), Prefix: true, StartIndex: last})
	put(t, c.kv(lead), "svc/15", "15")
	evs, _ = w2.collect(6)
	for i, ev := range evs {
		if got, want := string(ev.Kv.Key), fmt.Sprintf("svc/%d", 10+i); got != want {
			t.Fatalf("resumed event %d: key %s, want %s", i, got, want)
		}
	}
}

func TestWatchDeleteAndFilters(t *testing.T) {
	c := newTestCluster(t, 1)
	lead := c.waitLeader()
	w := openWatch(t, c, lead)
	w.create(&lodestonepb.WatchCreate{WatchId: 1, Key: []byte("k"), NoPut: true, PrevKv: true})
	put(t, c.kv(lead), "k", "v1")
	if _, err := c.kv(lead).Delete(ctxT(t), &lodestonepb.DeleteRequest{Key: []byte("k")}); err != nil {
		t.Fatal(err)
	}
	evs, _ := w.collect(1)
	ev := evs[0]
	if ev.Type != lodestonepb.Event_DELETE || string(ev.Kv.Key) != "k" || string(ev.PrevKv.GetValue()) != "v1" {
		t.Fatalf("got %v, want a delete of k with prev value v1", ev)
	}
}

func TestWatchLimitsAndBadRequests(t *testing.T) {
	c := newTestCluster(t, 1, func(cfg *Config) { cfg.MaxWatchesPerStream = 2 })
	lead := c.waitLeader()
	w := openWatch(t, c, lead)
	w.create(&lodestonepb.WatchCreate{WatchId: 1, Key: []byte("a")})
	w.create(&lodestonepb.WatchCreate{WatchId: 2, Key: []byte("b")})
	for _, tc := range []struct {
		name string
		req  *lodestonepb.WatchCreate
		want string
	}{
		{"over the stream limit", &lodestonepb.WatchCreate{WatchId: 3, Key: []byte("c")}, "max-watches-per-stream"},
		{"duplicate id", &lodestonepb.WatchCreate{WatchId: 1, Key: []byte("c")}, "already in use"},
		{"empty key without prefix", &lodestonepb.WatchCreate{WatchId: 4}, "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := w.stream.Send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Create{Create: tc.req}}); err != nil {
				t.Fatal(err)
			}
			resp := w.recv()
			if !resp.Canceled || !strings.Contains(resp.CancelReason, tc.want) {
				t.Fatalf("got %+v, want canceled naming %q", resp, tc.want)
			}
		})
	}
}

// A blocking Get returns as soon as its key changes past the index, and
// only then: a write to another key does not wake it.
func TestBlockingGet(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	kv := c.kv(c.follower())
	first := put(t, c.kv(lead), "cfg", "v1").Header.Index

	type result struct {
		resp *lodestonepb.GetResponse
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		resp, err := kv.Get(context.Background(), &lodestonepb.GetRequest{Key: []byte("cfg"), WaitIndex: first, WaitMs: 20000})
		done <- result{resp, err, time.Since(start)}
	}()
	put(t, c.kv(lead), "unrelated", "x")
	select {
	case r := <-done:
		t.Fatalf("blocking get woke for an unrelated key: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}
	second := put(t, c.kv(lead), "cfg", "v2").Header.Index
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := string(r.resp.Kv.GetValue()); got != "v2" || r.resp.Kv.ModifyIndex != second {
		t.Fatalf("blocking get: value %q at %d, want v2 at %d", got, r.resp.Kv.GetModifyIndex(), second)
	}

	// Without a change it returns after the wait, at the same data.
	start = time.Now()
	resp, err := kv.Get(ctxT(t), &lodestonepb.GetRequest{Key: []byte("cfg"), WaitIndex: second, WaitMs: 200})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Fatalf("blocking get with no change returned after %v, want at least the 200ms wait", took)
	}
	if resp.Kv.ModifyIndex != second {
		t.Fatalf("after the wait: modify index %d, want %d", resp.Kv.ModifyIndex, second)
	}
}

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
