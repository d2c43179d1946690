package watch_test

import (
	"errors"
	"fmt"
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

// A watcher cut loose behind a full buffer is listed again once the
// buffer is taken: its end is news, and no new event would list it, so a
// consumer that polls each taken watcher once still reads it.
func TestReadyListsCutWatcherAgainForItsEnd(t *testing.T) {
	h := newHub(t, watch.Config{Shards: 1, WatcherBuffer: 1})
	ready := watch.NewReady()
	w, err := h.Watch(testCtx(t), watch.Request{Key: "k", FromNow: true, Ready: ready})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	h.Publish(1, []watch.Event{put("k", "1")})
	h.Publish(2, []watch.Event{put("k", "2")}) // over the buffer of one: cut
	take := func() []*watch.Watcher {
		t.Helper()
		select {
		case <-ready.C():
		case <-testCtx(t).Done():
			t.Fatal("ready list never signalled")
		}
		return ready.Take()
	}
	var polled []string
	for len(polled) < 2 {
		for _, tw := range take() {
			b, err := tw.Next(doneCtx) // once a round
			switch {
			case errors.Is(err, watch.ErrOverflow):
				polled = append(polled, "overflow")
			case err == nil && len(b.Events) > 0:
				polled = append(polled, fmt.Sprint(b.Events[0].Index))
			}
		}
	}
	if got := fmt.Sprint(polled); got != "[1 overflow]" {
		t.Fatalf("polling once a round read %s, want the buffered event, then the end", got)
	}
}
