package watch_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lodestone-kv/lodestone/watch"
	"github.com/lodestone-kv/lodestone/watch/watchtest"
)

// TestHubClose: Close stops everything; blocked and later Next calls see
// ErrClosed; Watch and Publish after Close are harmless.
func TestHubClose(t *testing.T) {
	ctx := testCtx(t)
	h, err := watch.New(watch.Config{Shards: 3, Clock: watchtest.NewClock(time.Unix(0, 0)), ProgressInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := h.Watch(cctx, watch.Request{Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	blocked := make(chan error)
	go func() {
		_, err := w.Next(context.Background())
		blocked <- err
	}()
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-blocked; !errors.Is(err, watch.ErrClosed) {
		t.Fatalf("blocked Next: got %v, want ErrClosed", err)
	}
	if _, err := h.Watch(ctx, watch.Request{Key: "k"}); !errors.Is(err, watch.ErrClosed) {
		t.Fatalf("Watch after Close: got %v, want ErrClosed", err)
	}
	h.Publish(1, []watch.Event{put("k", "v")})
	h.Close()
	w.Close()
}

// TestPublishOutOfOrderPanics: a non-increasing index is an apply-loop bug.
func TestPublishOutOfOrderPanics(t *testing.T) {
	h := newHub(t, watch.Config{Shards: 1})
	h.Publish(5, nil)
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "strictly increase") {
			t.Fatalf("got %v, want an invariant panic", r)
		}
	}()
	h.Publish(5, []watch.Event{put("k", "v")})
}

// TestConcurrentChurn: watchers come and go at random start indices while
// the apply loop publishes; every batch any of them gets is exactly the
// reference's events between its previous Index and its Index.
func TestConcurrentChurn(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	ctx := testCtx(t)
	h := newHub(t, watch.Config{Shards: 4, WatcherBuffer: 16, RetainEvents: 500})
	var m model
	const n = 3000
	keys := []string{"a", "a/1", "a/2", "b", "b/1"}
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	stop := make(chan struct{})
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				req := watch.Request{Key: keys[rng.IntN(len(keys))], Prefix: rng.IntN(2) == 0,
					NoDelete: rng.IntN(4) == 0, PrevKV: rng.IntN(2) == 0}
				cur := h.Index()
				if rng.IntN(3) == 0 {
					req.FromNow = true
				} else {
					req.StartIndex = cur - min(cur, uint64(rng.IntN(400)))
				}
				w, err := h.Watch(ctx, req)
				if errors.Is(err, watch.ErrCompacted) {
					continue
				}
				if err != nil {
					errc <- err
					return
				}
				prev := req.StartIndex
				for range rng.IntN(5) + 1 {
					b, err := w.Next(ctx)
					if errors.Is(err, watch.ErrOverflow) {
						break
					}
					if err != nil {
						errc <- err
						return
					}
					if req.FromNow && prev == 0 {
						// From now: the effective start is unknown but ≥ cur. Nothing
						// before cur may arrive; the first Index is the baseline.
						if len(b.Events) > 0 && b.Events[0].Index <= cur {
							errc <- fmt.Errorf("from-now watcher at %d got old event %d", cur, b.Events[0].Index)
							return
						}
						prev = b.Index
						continue
					}
					if got, want := eventsString(b.Events), eventsString(m.want(req, prev, b.Index)); got != want {
						errc <- fmt.Errorf("req %+v (%d, %d]: got %.300s want %.300s", req, prev, b.Index, got, want)
						return
					}
					prev = b.Index
				}
				w.Close()
			}
		}()
	}
	rng := rand.New(rand.NewPCG(seed, 99))
	for i := uint64(1); i <= n; i++ {
		var evs []watch.Event
		for range rng.IntN(3) {
			k := keys[rng.IntN(len(keys))]
			if rng.IntN(3) == 0 {
				evs = append(evs, watch.Event{Type: watch.Delete, KV: watch.KeyValue{Key: k}, PrevKV: &watch.KeyValue{Key: k, Value: []byte("p")}})
			} else {
				evs = append(evs, put(k, fmt.Sprint(i)))
			}
		}
		m.publish(h, i, evs)
		if i%100 == 0 {
			h.Progress()
		}
	}
	// Keep events flowing (to every key) until every reader has stopped.
	close(stop)
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	for i := uint64(n + 1); ; i++ {
		select {
		case <-finished:
			select {
			case err := <-errc:
				t.Fatalf("seed %d: %v", seed, err)
			default:
			}
			return
		default:
		}
		m.publish(h, i, []watch.Event{put(keys[int(i)%len(keys)], "tail")})
		runtime.Gosched()
	}
}

// TestMetrics: the hub is a Collector the server registers; its numbers
// move.
func TestMetrics(t *testing.T) {
	ctx := testCtx(t)
	h := newManualHub(t, watch.Config{Shards: 2, WatcherBuffer: 1, ProgressInterval: -1})
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	fast, _ := h.Watch(ctx, watch.Request{Key: "k"})                 // shard 0
	if _, err := h.Watch(ctx, watch.Request{Key: "k"}); err != nil { // shard 1, never reads: cut loose
		t.Fatal(err)
	}
	h.Publish(1, []watch.Event{put("k", "1")})
	h.Sync()
	readUntil(t, ctx, fast, 1)
	h.Publish(2, []watch.Event{put("k", "2")})
	h.Sync()
	readUntil(t, ctx, fast, 2)
	h.Progress()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			name := mf.GetName()
			for _, lp := range mt.GetLabel() {
				name += "{" + lp.GetName() + "=" + lp.GetValue() + "}"
			}
			switch {
			case mt.Counter != nil:
				got[name] = mt.GetCounter().GetValue()
			case mt.Gauge != nil:
				got[name] = mt.GetGauge().GetValue()
			case mt.Histogram != nil:
				got[name] = float64(mt.GetHistogram().GetSampleCount())
			}
		}
	}
	for name, want := range map[string]float64{
		"lodestone_watch_events_published_total":              2,
		"lodestone_watch_events_delivered_total":              3, // fast: 2, slow: 1
		"lodestone_watch_watchers_cut_total{reason=overflow}": 1,
		"lodestone_watch_index":                               2,
		"lodestone_watch_retained_events":                     2,
		"lodestone_watch_watchers{shard=0}":                   1,
		"lodestone_watch_watchers{shard=1}":                   0,
		"lodestone_watch_shard_lag_entries{shard=0}":          0,
		"lodestone_watch_delivery_lag_seconds":                3,
		"lodestone_watch_oldest_index":                        0,
		"lodestone_watch_watchers_cut_total{reason=lag}":      0,
		"lodestone_watch_retained_bytes":                      2 * float64(len("k")+len("1")+128),
		"lodestone_watch_encoded_bytes":                       0, // both entries still hot
		"lodestone_watch_events_decoded_total":                0,
		"lodestone_watch_watchers_cut_total{reason=replay}":   0,
		"lodestone_watch_watchers_cut_total{reason=restore}":  0,
		"lodestone_watch_shard_lag_entries{shard=1}":          0,
		"lodestone_watch_buffer_occupancy_ratio":              1, // one live watcher sampled
	} {
		if g, ok := got[name]; !ok || g != want {
			t.Errorf("%s: got %v (present %v), want %v", name, g, ok, want)
		}
	}
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	t.Logf("metrics: %v", keys)
}

// TestConfigValidate names the bad field.
func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   watch.Config
		field string
	}{
		{"zero is fine", watch.Config{}, ""},
		{"default is fine", watch.DefaultConfig(), ""},
		{"negative shards", watch.Config{Shards: -1}, "Shards"},
		{"negative retain", watch.Config{RetainEvents: -1}, "RetainEvents"},
		{"negative bytes", watch.Config{RetainBytes: -1}, "RetainBytes"},
		{"negative buffer", watch.Config{WatcherBuffer: -1}, "WatcherBuffer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			var ce *watch.ConfigError
			if tc.field == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Fatalf("got %v, want a ConfigError for %s", err, tc.field)
			}
			if _, err := watch.New(tc.cfg); !errors.As(err, &ce) {
				t.Fatalf("New: got %v, want a ConfigError", err)
			}
		})
	}
}
