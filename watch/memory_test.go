package watch_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/lodestone-kv/lodestone/watch"
)

// A million watchers must fit issue 41's 300 B each beyond their stream,
// and the Watcher struct is most of that: it must stay in the 160 B size
// class (the rare fields live in watcherExtra).
func TestWatcherSize(t *testing.T) {
	if watch.WatcherSize > 160 {
		t.Fatalf("Watcher is %d B; at most 160 B (the 160 B size class), move rare fields to watcherExtra", watch.WatcherSize)
	}
}

// liveHeap returns the live heap after a full collection.
func liveHeap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// heapPerWatcherBudget is what a gRPC-stream-shaped watcher (a Ready
// list, an uncancellable context, no terminal error) may cost the hub,
// idle, in bytes: the 160 B struct plus slack for the shard's maps.
const heapPerWatcherBudget = 168

// An idle stream watcher costs its struct and nothing else, before and
// after it delivered events: Next drops the buffer, and a watcher read
// through a Ready list never makes a wake-up channel.
func TestIdleWatcherHeap(t *testing.T) {
	const n, keys = 50_000, 5_000
	h, err := watch.NewManual(watch.Config{Shards: 4, ProgressInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ready := watch.NewReady()
	ws := make([]*watch.Watcher, 0, n)
	keyOf := make([]string, keys)
	for k := range keyOf {
		keyOf[k] = fmt.Sprintf("disc/svc-%05d", k)
	}
	// Warm the shards' maps with one watcher per key first, so the figure
	// is what a further watcher on a watched key costs.
	for k := range keys {
		w, err := h.Watch(context.Background(), watch.Request{Key: keyOf[k], FromNow: true, Ready: ready})
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	before := liveHeap()
	for j := keys; j < n; j++ {
		w, err := h.Watch(context.Background(), watch.Request{Key: keyOf[j%keys], FromNow: true, Ready: ready})
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	per := func() float64 { return float64(int64(liveHeap())-int64(before)) / float64(n-keys) }
	got := per()
	t.Logf("attached: %.1f B per watcher", got)
	if got > heapPerWatcherBudget {
		t.Errorf("attached: %.0f B per idle watcher, want <= %d", got, heapPerWatcherBudget)
	}

	// Every key changes once; every watcher gets its event and drains.
	for k := range keys {
		h.Publish(uint64(k+1), []watch.Event{{Type: watch.Put, KV: watch.KeyValue{Key: keyOf[k], Value: []byte("v")}}})
	}
	h.Sync()
	delivered := 0
	for _, w := range ready.Take() {
		for {
			b, err := w.NextShared(doneCtx)
			if err != nil {
				break
			}
			delivered += len(b.Events)
		}
	}
	if delivered != n {
		t.Fatalf("delivered %d events, want %d", delivered, n)
	}
	// The log now retains the published events; count only the watchers.
	logBytes := liveHeapOfLog(t, keyOf)
	got = per() - logBytes/float64(n-keys)
	t.Logf("after a delivery: %.1f B per watcher", got)
	if got > heapPerWatcherBudget {
		t.Errorf("after a delivery: %.0f B per idle watcher, want <= %d", got, heapPerWatcherBudget)
	}
	runtime.KeepAlive(ws)
}

// liveHeapOfLog measures what a hub with no watchers retains for the same
// published events.
func liveHeapOfLog(t *testing.T, keys []string) float64 {
	t.Helper()
	before := liveHeap()
	h, err := watch.NewManual(watch.Config{Shards: 4, ProgressInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for k, key := range keys {
		h.Publish(uint64(k+1), []watch.Event{{Type: watch.Put, KV: watch.KeyValue{Key: key, Value: []byte("v")}}})
	}
	h.Sync()
	grown := float64(int64(liveHeap()) - int64(before))
	runtime.KeepAlive(h)
	return grown
}
