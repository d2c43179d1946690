package watch_test

import (
	"testing"

	"github.com/lodestone-kv/lodestone/watch"
)

// One goroutine serves many watchers through a Ready list: only the
// watchers with something new are listed, once each, and polling Next on
// them with a done context returns their events.
func TestReadyListsOnlyWatchersWithNews(t *testing.T) {
	h := newHub(t, watch.Config{Shards: 3})
	ready := watch.NewReady()
	ws := map[string]*watch.Watcher{}
	for _, k := range []string{"a", "b", "c"} {
		w, err := h.Watch(testCtx(t), watch.Request{Key: k, FromNow: true, Ready: ready})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		ws[k] = w
	}
	h.Publish(1, []watch.Event{{Type: watch.Put, KV: watch.KeyValue{Key: "a"}}})
	h.Publish(2, []watch.Event{{Type: watch.Put, KV: watch.KeyValue{Key: "c"}}})
	h.Publish(3, []watch.Event{{Type: watch.Put, KV: watch.KeyValue{Key: "a"}}})

	got := map[string][]uint64{}
	for len(got["a"]) < 2 || len(got["c"]) < 1 {
		select {
		case <-ready.C():
		case <-testCtx(t).Done():
			t.Fatalf("ready list never signalled; got %v", got)
		}
		for _, w := range ready.Take() {
			for {
				b, err := w.Next(doneCtx)
				if err != nil {
					break
				}
				for _, ev := range b.Events {
					got[ev.KV.Key] = append(got[ev.KV.Key], ev.Index)
				}
			}
		}
	}
	if len(got["b"]) != 0 {
		t.Fatalf("watcher b received %v, want nothing", got["b"])
	}
	if got, want := got["a"], []uint64{1, 3}; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("a: got %v, want %v", got, want)
	}
}
