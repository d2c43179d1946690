package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

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
// and no duplicate (docs/architecture.md invariant 7: a resume from an
// index is served from the event log while the index is still retained).
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

// A watch on a grouped stream that falls a full buffer behind is cut loose
// with a resync index, after a group holding every event up to it; resumed
// from there it gets the rest: together each write exactly once, in order
// (docs/architecture.md invariant 6: cut loose with "resync from index X").
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

// BenchmarkWatchFanout is bench-watch's shape at a tenth of the size, in
// one process: a single-node server, 100 streams over 2 connections,
// 10,000 exact watchers on 1,000 keys (10 per key, on one stream) plus 10
// watchers of the whole prefix; b.N writes from 16 writers. It waits for
// every delivery and reports the process's CPU time (server and client
// side together) per write, and per delivery. Run with -cpuprofile to see
// where it goes.
//
// The sparse case is the other half of bench-watch's load: 1,000 streams
// over 10 connections, 10 exact watchers per stream and no prefix
// watcher, written at 2,000 writes/s, so each stream sees an event about
// every half second and every delivery is a message of its own. The
// prefix case is the half that costs more: 100 watchers of the whole
// prefix, one per stream, at 1,000 writes/s, so each stream is busy.
// key-streams is bench-watch-1m's layout at a tenth of its watchers.
func BenchmarkWatchFanout(b *testing.B) {
	dense := fanoutShape{streams: 100, conns: 2, keys: 1000, exact: 10_000, prefixes: 10}
	sparse := fanoutShape{streams: 1000, conns: 10, keys: 1000, exact: 10_000, rate: 2000}
	prefix := fanoutShape{streams: 100, conns: 10, keys: 10_000, prefixes: 100, rate: 1000}
	// bench-watch-1m's shape at a tenth: each stream carries the 100
	// watchers of one key, so a write makes one 100-group message.
	keyStreams := fanoutShape{streams: 1000, conns: 2, keys: 1000, exact: 100_000, prefixes: 100, rate: 1000}
	for _, tc := range []struct {
		name     string
		shape    fanoutShape
		watchers bool
		interval time.Duration
	}{
		{"none", dense, false, DefaultConfig().WatchDeliveryInterval},
		{"grid=0", dense, true, 0},
		{"grid=2ms", dense, true, 2 * time.Millisecond},
		{"grid=5ms", dense, true, 5 * time.Millisecond},
		{"sparse", sparse, true, DefaultConfig().WatchDeliveryInterval},
		{"prefix", prefix, true, DefaultConfig().WatchDeliveryInterval},
		{"key-streams", keyStreams, true, DefaultConfig().WatchDeliveryInterval},
	} {
		b.Run(tc.name, func(b *testing.B) {
			benchWatchFanout(b, tc.shape, tc.watchers, tc.interval)
		})
	}
}

// fanoutShape is a BenchmarkWatchFanout load: exact watcher j is on key
// j mod keys and stream j mod streams; the prefix watchers are spread
// over the streams; rate is writes/s (0: as fast as 16 writers go).
type fanoutShape struct {
	streams, conns, keys, exact, prefixes, rate int
}

func benchWatchFanout(b *testing.B, shape fanoutShape, watchers bool, interval time.Duration) {
	const writers = 16
	streams, conns, keys, exact, prefixes := shape.streams, shape.conns, shape.keys, shape.exact, shape.prefixes
	c := newTestCluster(b, 1, func(cfg *Config) {
		cfg.MaxWatchesPerConnection = exact + prefixes
		cfg.MaxWatchesPerStream = max(exact, prefixes)
		cfg.WatchDeliveryInterval = interval
	})
	lead := c.waitLeader()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var ccs []*grpc.ClientConn
	for range conns {
		cc, err := grpc.NewClient(c.servers[lead].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer cc.Close()
		ccs = append(ccs, cc)
	}
	var delivered, created atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var ss []lodestonepb.Watch_WatchClient
	for i := range streams {
		s, err := lodestonepb.NewWatchClient(ccs[i%conns]).Watch(ctx)
		if err != nil {
			b.Fatal(err)
		}
		ss = append(ss, s)
		wg.Go(func() {
			for {
				r, err := s.Recv()
				if err != nil {
					return
				}
				if r.Created {
					created.Add(1)
				}
				n := len(r.Events)
				for _, g := range r.Groups {
					n += len(g.Events)
				}
				delivered.Add(int64(n))
			}
		})
	}
	create := func(s lodestonepb.Watch_WatchClient, id int64, key string, prefix bool) {
		if err := s.Send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Create{Create: &lodestonepb.WatchCreate{
			WatchId: id, Key: []byte(key), Prefix: prefix, Grouped: true}}}); err != nil {
			b.Fatal(err)
		}
	}
	if !watchers {
		ss = nil
	}
	for j := range exact * len(ss) / streams {
		create(ss[j%streams], int64(j+1), fmt.Sprintf("disc/svc-%05d", j%keys), false)
	}
	for i := range prefixes * len(ss) / streams {
		create(ss[i*streams/prefixes], int64(exact+i+1), "disc/", true)
	}
	for created.Load() < int64((exact+prefixes)*len(ss)/streams) {
		time.Sleep(time.Millisecond)
	}

	kv := c.kv(lead)
	value := make([]byte, 64)
	cpu0 := processCPU()
	b.ResetTimer()
	var next atomic.Int64
	var wwg sync.WaitGroup
	start := time.Now()
	for range writers {
		wwg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if shape.rate > 0 {
					time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(shape.rate))))
				}
				key := fmt.Sprintf("disc/svc-%05d", i*7919%int64(keys))
				if _, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: []byte(key), Value: value}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wwg.Wait()
	want := int64(b.N) * int64((exact/keys+prefixes)*len(ss)/streams)
	deadline := time.Now().Add(time.Minute)
	for delivered.Load() < want && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	if got := delivered.Load(); got != want {
		b.Fatalf("delivered %d events, want %d", got, want)
	}
	cpu := processCPU() - cpu0
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/write")
	if want > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(want), "cpu-ns/delivery")
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The delivery grid bounds how many messages a busy stream sends, at most
// one per grid point, and with an interval of 0 each batch goes out at
// once; either way every event arrives once and in order.
func TestWatchDeliveryInterval(t *testing.T) {
	for _, interval := range []time.Duration{0, 100 * time.Millisecond} {
		t.Run(interval.String(), func(t *testing.T) {
			c := newTestCluster(t, 1, func(cfg *Config) { cfg.WatchDeliveryInterval = interval })
			lead := c.waitLeader()
			w := openWatch(t, c, lead)
			w.create(&lodestonepb.WatchCreate{WatchId: 1, Key: []byte("grid/"), Prefix: true})
			const n = 30
			start := time.Now()
			for i := range n {
				put(t, c.kv(lead), fmt.Sprintf("grid/%02d", i), "v")
			}
			var evs []*lodestonepb.Event
			msgs := 0
			for len(evs) < n {
				evs = append(evs, w.recv().Events...)
				msgs++
			}
			elapsed := time.Since(start)
			for i, ev := range evs {
				if want := fmt.Sprintf("grid/%02d", i); string(ev.Kv.Key) != want {
					t.Fatalf("event %d is for %s, want %s (each once, in order)", i, ev.Kv.Key, want)
				}
			}
			if len(evs) != n {
				t.Fatalf("got %d events, want %d", len(evs), n)
			}
			if interval > 0 {
				if limit := int(elapsed/interval) + 2; msgs > limit {
					t.Fatalf("%d messages in %v on a %v grid, want at most %d", msgs, elapsed, interval, limit)
				}
			}
		})
	}
}

// A stream fed by every write moves to the busy grid, one message per
// busy interval, while other streams on the same server that have not
// sent lately keep the fine grid's lag; every event still arrives once
// and in order. Each quiet stream is probed once, because a stream that
// just sent is busy by definition; three probes make a quiet stream
// wrongly on the 1s busy grid fail with probability 1-(1/4)^3.
func TestWatchBusyDeliveryInterval(t *testing.T) {
	const busy = time.Second
	c := newTestCluster(t, 1, func(cfg *Config) {
		cfg.WatchDeliveryInterval = 5 * time.Millisecond
		cfg.WatchBusyDeliveryInterval = busy
	})
	lead := c.waitLeader()
	firehose := openWatch(t, c, lead)
	firehose.create(&lodestonepb.WatchCreate{WatchId: 1, Key: []byte("busy/"), Prefix: true})
	quiet := make([]*watchClient, 3)
	for i := range quiet {
		quiet[i] = openWatch(t, c, lead)
		quiet[i].create(&lodestonepb.WatchCreate{WatchId: 1, Key: fmt.Appendf(nil, "quiet/%d", i)})
	}

	const n = 150
	start := time.Now()
	written := make(chan error, 1)
	go func() {
		kv := c.kv(lead)
		for i := range n {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: fmt.Appendf(nil, "busy/%03d", i), Value: []byte("v")})
			cancel()
			if err != nil {
				written <- err
				return
			}
			time.Sleep(10 * time.Millisecond) // pacing: a steady trickle of writes
		}
		written <- nil
	}()
	var evs []*lodestonepb.Event
	msgs := 0
	for len(evs) < n/3 {
		evs = append(evs, firehose.recv().Events...)
		msgs++
	}
	// The firehose stream is busy now; the quiet ones are not.
	for i, q := range quiet {
		key := fmt.Sprintf("quiet/%d", i)
		t0 := time.Now()
		put(t, c.kv(lead), key, "v")
		if ev := q.recv().Events; len(ev) != 1 || string(ev[0].Kv.Key) != key {
			t.Fatalf("quiet stream %d got %v, want the one write to %s", i, ev, key)
		}
		if lag := time.Since(t0); lag >= busy/4 {
			t.Errorf("quiet stream %d: the event took %v while another stream was busy; want the fine grid, well under the %v busy grid", i, lag, busy)
		}
	}
	var lastRecv time.Time
	for len(evs) < n {
		evs = append(evs, firehose.recv().Events...)
		msgs++
		lastRecv = time.Now()
	}
	elapsed := time.Since(start)
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	for i, ev := range evs {
		if want := fmt.Sprintf("busy/%03d", i); string(ev.Kv.Key) != want {
			t.Fatalf("event %d is for %s, want %s (each once, in order)", i, ev.Kv.Key, want)
		}
	}
	if limit := int(elapsed/busy) + 3; msgs > limit {
		t.Errorf("the busy stream sent %d messages in %v, want at most %d on a %v busy grid", msgs, elapsed, limit, busy)
	}

	// A stream is busy while its last message is under a busy interval
	// old, so once the writes stop it is quiet again from lastRecv+busy on
	// (the server sent that message before the client got it): a write
	// then arrives on the fine grid. NB: the wait is the condition itself,
	// time without sends.
	quietFrom := lastRecv.Add(busy)
	time.Sleep(time.Until(quietFrom))
	t0 := time.Now()
	put(t, c.kv(lead), "busy/late", "v")
	if ev := firehose.recv().Events; len(ev) != 1 || string(ev[0].Kv.Key) != "busy/late" {
		t.Fatalf("the quiet firehose got %v, want the one write to busy/late", ev)
	}
	if lag := time.Since(t0); lag >= busy/4 {
		t.Errorf("the firehose, quiet since %v, took %v for an event; want the fine grid", quietFrom.Format(time.StampMilli), lag)
	}
}

func TestConfigWatchBusyDeliveryInterval(t *testing.T) {
	checkDurationField(t, "watch-busy-delivery-interval", func(c *Config, d time.Duration) { c.WatchBusyDeliveryInterval = d },
		[]time.Duration{0, time.Second}, []time.Duration{-time.Millisecond, 2 * time.Second})
}

func TestConfigWatchDeliveryInterval(t *testing.T) {
	checkDurationField(t, "watch-delivery-interval", func(c *Config, d time.Duration) { c.WatchDeliveryInterval = d },
		[]time.Duration{0, time.Second}, []time.Duration{-time.Millisecond, 2 * time.Second})
}

// A watch created "from now" right after a write was acknowledged never
// gets that write. The apply loop used to answer the proposal before the
// entry reached the hub, so for a moment the hub's "now" was the index
// before the acknowledged write, and the watch replayed it.
func TestWatchFromNowAfterAcknowledgedWrite(t *testing.T) {
	c := newTestCluster(t, 1)
	lead := c.waitLeader()
	w := openWatch(t, c, lead)
	for i := range 300 {
		key := fmt.Sprintf("race/%d", i)
		put(t, c.kv(lead), key, "acknowledged before the watch")
		w.create(&lodestonepb.WatchCreate{WatchId: int64(i + 1), Key: []byte(key)})
		put(t, c.kv(lead), key, "after")
		evs, _ := w.collect(1)
		if got := string(evs[0].Kv.Value); got != "after" {
			t.Fatalf("round %d: watch from now got %q first, want the write after its creation", i, got)
		}
	}
}

// TestWatchEventsShareTheKey: the hub's copy of a store event carries
// every field, and its PrevKV uses the same key string as its KV, so a
// retained event is one key object, not two; a PrevKV for another key
// keeps its own.

// A progress request concerns the stream that sent it: its idle watches
// are told the current index, while another stream's idle watch on the
// same hub shard is told nothing. (Before, one request told every watcher
// of the server.) The process-wide delivery grid makes both streams send
// at the same instants, so a notification wrongly given to the other
// stream would reach it with the first stream's answer, before that
// stream asks for itself.
func TestWatchProgressRequestIsPerStream(t *testing.T) {
	c := newTestCluster(t, 1, func(cfg *Config) {
		cfg.Watch.Shards = 1
		cfg.WatchDeliveryInterval = 100 * time.Millisecond
		cfg.WatchBusyDeliveryInterval = 0
	})
	lead := c.waitLeader()
	a, b := openWatch(t, c, lead), openWatch(t, c, lead)
	a.create(&lodestonepb.WatchCreate{WatchId: 1, Key: []byte("quiet/a")})
	b.create(&lodestonepb.WatchCreate{WatchId: 1, Key: []byte("quiet/b")})
	progress := func(w *watchClient) {
		t.Helper()
		if err := w.stream.Send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Progress{Progress: &lodestonepb.WatchProgress{}}}); err != nil {
			t.Fatal(err)
		}
	}
	wantProgress := func(w *watchClient, name string, atLeast uint64) uint64 {
		t.Helper()
		resp := w.recv()
		if resp.WatchId != 1 || resp.Canceled || len(resp.Events) > 0 || resp.Index < atLeast {
			t.Fatalf("%s: got %+v, want a progress response for watch 1 at index >= %d", name, resp, atLeast)
		}
		return resp.Index
	}

	first := put(t, c.kv(lead), "busy", "1").Header.Index
	progress(a)
	wantProgress(a, "stream a", first)
	second := put(t, c.kv(lead), "busy", "2").Header.Index
	progress(b)
	if got := wantProgress(b, "stream b", first); got < second {
		t.Fatalf("stream b was told index %d, from stream a's progress request (its own came after index %d)", got, second)
	}
}

// A grouped stream whose client stops reading keeps at most one response
// in gRPC beyond what the client's window took, and lets the rest wait in
// its watchers' buffers: once the client reads again every event arrives
// exactly once, in order, the waiting ones together.
func TestWatchGroupedSlowReaderGetsEverything(t *testing.T) {
	c := newTestCluster(t, 1, func(cfg *Config) {
		cfg.Watch.WatcherBuffer = 10_000
		cfg.WatchDeliveryInterval = 0
		cfg.WatchBusyDeliveryInterval = 0
	})
	lead := c.waitLeader()
	// A fixed 64 KiB stream window (no bandwidth estimation growing it):
	// about 30 of the responses below fill it.
	cc, err := grpc.NewClient(c.servers[lead].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	stream, err := lodestonepb.NewWatchClient(cc).Watch(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	w := &watchClient{t: t, stream: stream}
	w.create(&lodestonepb.WatchCreate{WatchId: 1, Key: []byte("slow/"), Prefix: true, Grouped: true})
	const writes = 150
	value := strings.Repeat("v", 2048)
	var wrote []uint64
	for i := range writes {
		wrote = append(wrote, put(t, c.kv(lead), fmt.Sprintf("slow/%d", i), value).Header.Index)
	}
	var got []uint64
	responses := 0
	for len(got) < writes {
		resp := w.recv()
		responses++
		if resp.Canceled {
			t.Fatalf("canceled: %s", resp.CancelReason)
		}
		for _, g := range resp.Groups {
			for _, ev := range g.Events {
				got = append(got, ev.Kv.ModifyIndex)
			}
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(wrote) {
		t.Fatalf("events by index:\n got %v\nwant %v", got, wrote)
	}
	// What the window took, one response waiting in gRPC, and the rest
	// together. Before, gRPC queued responses up to its 64 KiB write
	// quota as well: 64-65 of them.
	if responses > 40 {
		t.Fatalf("%d responses for %d writes: want those the client's window took, plus one queued, plus the rest together", responses, writes)
	}
	t.Logf("%d writes in %d responses", writes, responses)
}

// The progress timer tells a stream's quiet watches together: each timer
// round covers whole streams, so a grouped stream gets its watches'
// progress in one response per interval instead of a few watches in each
// of the interval's rounds (a message per round on every stream of the
// server).
func TestWatchTimerProgressComesPerStream(t *testing.T) {
	const interval = 320 * time.Millisecond // a stream's watches share one of the interval's rounds
	c := newTestCluster(t, 1, func(cfg *Config) {
		cfg.Watch.Shards = 1
		cfg.Watch.ProgressInterval = interval
		cfg.WatchBusyDeliveryInterval = 0
	})
	lead := c.waitLeader()
	w := openWatch(t, c, lead)
	const watches = 20
	for i := range watches {
		w.create(&lodestonepb.WatchCreate{WatchId: int64(i + 1), Key: []byte(fmt.Sprintf("quiet/%d", i)), Grouped: true})
	}
	written := put(t, c.kv(lead), "busy", "1").Header.Index

	told := map[int64]bool{}
	responses := 0 // responses carrying progress, until every watch was told
	for len(told) < watches {
		resp := w.recv()
		progress := false
		for _, g := range resp.Groups {
			if len(g.Events) > 0 {
				t.Fatalf("watch %d got events %v; no write matched it", g.WatchId, g.Events)
			}
			if g.Index >= written {
				told[g.WatchId] = true
				progress = true
			}
		}
		if progress {
			responses++
		}
	}
	// One response per stream and interval; a second if an index came
	// between the creates and split them by what they had heard. By
	// watcher, the 20 watches took a response each.
	if responses > 3 {
		t.Fatalf("the stream's %d quiet watches were told the index in %d responses, want them together", watches, responses)
	}
}
