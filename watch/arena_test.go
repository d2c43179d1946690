package watch_test

import (
	"bytes"
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lodestone-kv/lodestone/watch"
)

// richEvents are one index's events with every field the encoding keeps:
// nil and empty values, a session, a PrevKV, a value bigger than an arena
// chunk, varints of every length.
func richEvents(i int) []watch.Event {
	prev := &watch.KeyValue{Key: fmt.Sprintf("k/%d", i), Value: []byte{}, CreateIndex: 1, ModifyIndex: 1 << 40, LockIndex: 3, Flags: 1<<64 - 1, Session: "s-1"}
	evs := []watch.Event{
		{Type: watch.Put, KV: watch.KeyValue{Key: fmt.Sprintf("k/%d", i), Value: []byte(fmt.Sprint(i)), CreateIndex: 1, ModifyIndex: uint64(i), Flags: 42}, PrevKV: prev},
		{Type: watch.Delete, KV: watch.KeyValue{Key: fmt.Sprintf("d/%d", i), ModifyIndex: uint64(i)}},
		{Type: watch.Put, KV: watch.KeyValue{Key: "", Value: []byte{}, Session: strings.Repeat("x", 200)}},
	}
	if i%7 == 0 {
		evs = append(evs, watch.Event{Type: watch.Put, KV: watch.KeyValue{Key: "big", Value: bytes.Repeat([]byte{byte(i)}, 300<<10)}})
	}
	return evs
}

// TestColdEventsRoundTrip publishes more entries than stay decoded and
// replays them all: every field of every event comes back as published,
// nil values nil and empty ones empty, from entries read back from their
// encoding as from the newest, still decoded, ones.
func TestColdEventsRoundTrip(t *testing.T) {
	for _, hot := range []int{0, 4, 5} {
		t.Run(fmt.Sprintf("hot=%d", hot), func(t *testing.T) {
			h := newManualHub(t, watch.Config{Shards: 1, WatcherBuffer: 100_000})
			h.SetHotEntries(hot)
			var want []watch.Event
			for i := 1; i <= 40; i++ {
				evs := richEvents(i)
				h.Publish(uint64(i), evs)
				for _, ev := range evs {
					ev.Index = uint64(i)
					want = append(want, ev)
				}
			}
			w, err := h.Watch(testCtx(t), watch.Request{Prefix: true, PrevKV: true, StartIndex: 0})
			if err != nil {
				t.Fatal(err)
			}
			h.Sync()
			var got []watch.Event
			for len(got) < len(want) {
				b, err := w.Next(doneCtx)
				if err != nil {
					t.Fatalf("after %d of %d events: %v", len(got), len(want), err)
				}
				got = append(got, b.Events...)
			}
			for i := range want {
				if !reflect.DeepEqual(got[i], want[i]) {
					t.Fatalf("event %d:\n got %+v\nwant %+v", i, got[i], want[i])
				}
				if (got[i].KV.Value == nil) != (want[i].KV.Value == nil) {
					t.Fatalf("event %d: value nil %v, want nil %v", i, got[i].KV.Value == nil, want[i].KV.Value == nil)
				}
			}
		})
	}
}

// TestArenaChunksAreFreed: as entries are evicted, the arena chunks they
// were encoded in go too; the arena holds what the retained entries need,
// not everything ever published.
func TestArenaChunksAreFreed(t *testing.T) {
	h := newManualHub(t, watch.Config{Shards: 1, RetainEvents: 1000})
	h.SetHotEntries(0)
	value := make([]byte, 1000) // ~256 events per 256 KiB chunk
	most := 0
	for i := 1; i <= 20_000; i++ {
		h.Publish(uint64(i), []watch.Event{{Type: watch.Put, KV: watch.KeyValue{Key: "k", Value: value}}})
		most = max(most, h.ArenaChunks())
	}
	// 1,000 retained events of ~1 KB are 4 chunks, and one more that is
	// partly evicted.
	if most > 6 {
		t.Fatalf("the arena grew to %d chunks for 1,000 retained 1 KB events, want at most 6", most)
	}
	if n, _, _, _ := h.Retained(); n != 1000 {
		t.Fatalf("retained %d entries, want 1000", n)
	}
}

// TestEncodedLogMetrics: the chunks the encoded events take and the
// events decoded from them are exported, so an operator sees shards and
// replays reading past the hot window.
func TestEncodedLogMetrics(t *testing.T) {
	h := newManualHub(t, watch.Config{Shards: 1})
	h.SetHotEntries(0)
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	gauge := func(name string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				m := mf.GetMetric()[0]
				return m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
		t.Fatalf("no metric %s", name)
		return 0
	}
	if got := gauge("lodestone_watch_encoded_bytes"); got != 0 {
		t.Fatalf("encoded bytes %v before any publish, want 0", got)
	}
	for i := 1; i <= 3; i++ {
		h.Publish(uint64(i), []watch.Event{put("k", fmt.Sprint(i))})
	}
	if got := gauge("lodestone_watch_encoded_bytes"); got != 256<<10 {
		t.Fatalf("encoded bytes %v with three encoded entries, want one 256 KiB chunk", got)
	}
	before := gauge("lodestone_watch_events_decoded_total")
	if _, err := h.Watch(testCtx(t), watch.Request{Key: "k", StartIndex: 0}); err != nil {
		t.Fatal(err)
	}
	if got := gauge("lodestone_watch_events_decoded_total") - before; got != 3 {
		t.Fatalf("a replay of three encoded events decoded %v, want 3", got)
	}
}

// retainedLog returns a manual hub holding 100,000 published events, all
// but the newest hot of them encoded.
func retainedLog(tb testing.TB, hot int) *watch.Hub {
	h, err := watch.NewManual(watch.Config{Shards: 1})
	if err != nil {
		tb.Fatal(err)
	}
	h.SetHotEntries(hot)
	value := make([]byte, 16)
	for i := 1; i <= 100_000; i++ {
		h.Publish(uint64(i), []watch.Event{{Type: watch.Put, KV: watch.KeyValue{Key: fmt.Sprintf("bench/key-%05d", i), Value: value, ModifyIndex: uint64(i)}}})
	}
	return h
}

// heapObjects returns the live heap objects after a full collection.
func heapObjects() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapObjects
}

// TestColdEventsAreNotScanned: once encoded, the retained log is a few
// objects for the garbage collector to mark, not several per event. With
// 100,000 retained events, every one decoded, the log is ~200,000 objects
// (each index's event slice and key string); with all but the newest 4,096
// encoded it must be under a tenth of that. BenchmarkGCRetainedLog times
// the collections.
func TestColdEventsAreNotScanned(t *testing.T) {
	objects := func(hot int) uint64 {
		before := heapObjects()
		h := retainedLog(t, hot)
		defer h.Close()
		after := heapObjects()
		runtime.KeepAlive(h)
		return after - min(before, after)
	}
	decoded, encoded := objects(100_000), objects(4096)
	t.Logf("heap objects for 100,000 retained events: %d all decoded, %d all but 4,096 encoded", decoded, encoded)
	if decoded < 200_000 {
		t.Fatalf("the decoded log is %d objects, want at least 200,000 (two per event): the check measures nothing", decoded)
	}
	if encoded*10 > decoded {
		t.Fatalf("the encoded log is %d objects, the decoded one %d: want under a tenth", encoded, decoded)
	}
}

// BenchmarkGCRetainedLog times a full collection (one processor) with
// 100,000 retained events, all decoded or all but the newest 4,096
// encoded, in one run: the ratio of the two is the figure.
func BenchmarkGCRetainedLog(b *testing.B) {
	for _, hot := range []int{100_000, 4096} {
		b.Run(fmt.Sprintf("hot=%d", hot), func(b *testing.B) {
			h := retainedLog(b, hot)
			defer h.Close()
			prev := runtime.GOMAXPROCS(1) // NB: one marker, as on a server pinned to one core
			defer runtime.GOMAXPROCS(prev)
			runtime.GC()
			b.ResetTimer()
			for b.Loop() {
				runtime.GC()
			}
			runtime.KeepAlive(h)
		})
	}
}

// TestHotEventsAreBounded: the decoded window is bounded by events as well
// as entries, so big transactions do not keep the whole history decoded;
// the newest entry stays decoded however big, and evictions keep the
// count exact.
func TestHotEventsAreBounded(t *testing.T) {
	h := newManualHub(t, watch.Config{Shards: 1, RetainEvents: 60})
	h.SetHotEntries(8) // at most 16 events
	index := uint64(0)
	publish := func(n int) {
		index++
		evs := make([]watch.Event, n)
		for i := range evs {
			evs[i] = put(fmt.Sprintf("k/%d/%d", index, i), "v")
		}
		h.Publish(index, evs)
	}
	check := func(what string, entries, events int) {
		t.Helper()
		e, n, counted := h.Hot()
		if e != entries || n != events || counted != events {
			t.Fatalf("%s: %d hot entries with %d events (counted %d), want %d with %d", what, e, n, counted, entries, events)
		}
	}
	for range 10 {
		publish(5)
	}
	check("ten entries of 5", 3, 15)
	publish(40)
	check("one entry of 40 after them", 1, 40)
	for range 3 {
		publish(1)
	}
	check("three of 1 after it", 3, 3)
	for range 30 {
		publish(3) // NB: evicts, 60 events retained at most
	}
	check("thirty of 3, with evictions", 5, 15)

	// Evicted while still hot: retention below the decoded window.
	h = newManualHub(t, watch.Config{Shards: 1, RetainEvents: 10})
	h.SetHotEntries(8)
	index = 0
	for range 6 {
		publish(3)
	}
	check("six of 3, ten events retained", 3, 9)
}
