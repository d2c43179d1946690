package watch_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/watch"
)

var benchCounts = []int{0, 10_000, 100_000}

// benchWatchers subscribes n watchers: 90% on distinct exact keys svc/<i>,
// 10% on prefixes svc/<i>/ (so prefix probing is exercised too).
func benchWatchers(b *testing.B, h *watch.Hub, n int) []*watch.Watcher {
	ws := make([]*watch.Watcher, 0, n)
	for i := range n {
		req := watch.Request{Key: fmt.Sprintf("svc/%d", i)}
		if i%10 == 0 {
			req = watch.Request{Key: fmt.Sprintf("svc/%d/", i), Prefix: true}
		}
		w, err := h.Watch(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		ws = append(ws, w)
	}
	return ws
}

// benchEvents returns a generator of one-event batches on random keys in
// the watchers' key space (each matches about one watcher). Keys are built
// up front; each call allocates its slice, as the apply loop would.
func benchEvents(keys int) func() []watch.Event {
	rng := rand.New(rand.NewPCG(1, 1))
	val := []byte("0123456789abcdef0123456789abcdef")
	pool := make([]string, 4096)
	for i := range pool {
		pool[i] = fmt.Sprintf("svc/%d", rng.IntN(max(keys, 1)))
	}
	i := 0
	return func() []watch.Event {
		i++
		return []watch.Event{{Type: watch.Put, KV: watch.KeyValue{Key: pool[i%len(pool)], Value: val}}}
	}
}

// BenchmarkPublish measures the apply loop's cost per Publish (one event)
// with 0, 10k and 100k watchers subscribed, while the shard goroutines
// match and copy in the background. docs/architecture.md, "The apply loop
// never waits on a watcher": write latency stays flat as watchers grow to
// 100k. Reports p50 and p99 of single Publish calls
// (timed with two clock reads each, so ~50 ns of the figure is the timer).
func BenchmarkPublish(b *testing.B) {
	for _, n := range benchCounts {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) {
			h, err := watch.New(watch.Config{ProgressInterval: -1, WatcherBuffer: 1 << 20})
			if err != nil {
				b.Fatal(err)
			}
			defer h.Close()
			ws := benchWatchers(b, h, n)
			next := benchEvents(n)
			lat := make([]time.Duration, b.N)
			runtime.GC()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				evs := next()
				t0 := time.Now()
				h.Publish(uint64(i+1), evs)
				lat[i] = time.Since(t0)
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
			runtime.KeepAlive(ws)
		})
	}
}

// BenchmarkPublishOnly is Publish's own cost with nobody else running: a
// manual hub whose shards never step (the log just evicts past its
// bound). It is the apply loop's price per index, and it cannot depend on
// the watchers because Publish never touches them.
func BenchmarkPublishOnly(b *testing.B) {
	for _, n := range benchCounts {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) {
			h := newManualHub(b, watch.Config{ProgressInterval: -1, RetainEvents: 1 << 16})
			ws := benchWatchers(b, h, n)
			next := benchEvents(n)
			runtime.GC()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				h.Publish(uint64(i+1), next())
			}
			b.StopTimer()
			runtime.KeepAlive(ws)
		})
	}
}

// BenchmarkDeliver measures the shards' work per published event (match +
// copy into buffers) with 0, 10k and 100k watchers: one goroutine drives a
// manual hub's shards, so ns/op is the CPU cost of fan-out per event. It
// must not grow with the number of watchers that do not match.
func BenchmarkDeliver(b *testing.B) {
	for _, n := range benchCounts {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) {
			h := newManualHub(b, watch.Config{ProgressInterval: -1, WatcherBuffer: 1 << 20, RetainEvents: 1 << 16})
			ws := benchWatchers(b, h, n)
			next := benchEvents(n)
			runtime.GC()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				h.Publish(uint64(i+1), next())
				if i%256 == 255 {
					h.Sync()
				}
			}
			h.Sync()
			b.StopTimer()
			runtime.KeepAlive(ws)
		})
	}
}

// BenchmarkWatcherMemory reports the heap a watcher costs the hub (its
// struct, index entries and shard bookkeeping), excluding the key string
// and the caller's own stream. Target: ≤ 300 B per watcher (issue 41).
//
//   - exact: 100k watchers on distinct keys
//   - samekey: 100k watchers on one key
//   - prefix: 100k watchers on distinct prefixes
//   - ctx: exact, each Watch given a cancellable stream context
//   - stream: ctx, after each consumer called Next once (its wake channel
//     exists): what a gRPC watch stream blocked in Next costs the hub
func BenchmarkWatcherMemory(b *testing.B) {
	const n = 100_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("svc/web/instance-%06d", i)
	}
	for _, variant := range []string{"exact", "samekey", "prefix", "ctx", "stream"} {
		b.Run(variant, func(b *testing.B) {
			done, cancel := context.WithCancel(context.Background())
			cancel()
			var perWatcher float64
			for range b.N {
				h, err := watch.New(watch.Config{ProgressInterval: -1})
				if err != nil {
					b.Fatal(err)
				}
				stream, stop := context.WithCancel(context.Background())
				ws := make([]*watch.Watcher, 0, n)
				ctx := context.Background()
				if variant == "ctx" || variant == "stream" {
					ctx = stream
				}
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				for i := range n {
					req := watch.Request{Key: keys[i]}
					switch variant {
					case "samekey":
						req.Key = keys[0]
					case "prefix":
						req.Prefix = true
					}
					w, err := h.Watch(ctx, req)
					if err != nil {
						b.Fatal(err)
					}
					if variant == "stream" {
						w.Next(done)
					}
					ws = append(ws, w)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perWatcher = float64(after.HeapAlloc-before.HeapAlloc) / n
				runtime.KeepAlive(ws)
				stop()
				for _, w := range ws {
					w.Close()
				}
				h.Close()
			}
			b.ReportMetric(perWatcher, "B/watcher")
		})
	}
}

// BenchmarkProgressTimerRound measures one firing of the progress timer
// (one slice of a round, see watch.ProgressSlices) on a manual hub with
// 100k quiet watchers over 2 shards, the shape of a fleet whose keys change
// rarely. A firing holds its shard's lock, so its length is a pause in that
// shard's deliveries.
func BenchmarkProgressTimerRound(b *testing.B) {
	h := newManualHub(b, watch.Config{Shards: 2, ProgressInterval: time.Hour})
	ws := benchWatchers(b, h, 100_000)
	next := benchEvents(1 << 30) // keys nobody watches
	h.Publish(1, next())
	h.Sync()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	b.ResetTimer()
	for range b.N {
		h.TimerRounds(1)
		b.StopTimer()
		for _, w := range ws {
			w.Next(done) // take the notification, if this firing gave one
		}
		b.StartTimer()
	}
	b.StopTimer()
	for _, w := range ws {
		w.Close()
	}
}

// BenchmarkDeliverStreams is make bench-watch-1m's shape on the hub alone:
// n exact watchers over 10,000 keys, each key's watchers on one Ready (a
// gRPC stream), plus 100 prefix watchers on 100 more Readies. One op is a
// write to one key, matched, copied and drained by the consumers as a
// stream's delivery round does (Take, then NextShared until empty): the
// CPU of one write's fan-out to n/10,000 + 100 watchers. Its ns/op must
// not grow from 10k to 1M watchers except by the watchers a write wakes.
func BenchmarkDeliverStreams(b *testing.B) {
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) {
			const keys, prefixes = 10_000, 100
			h := newManualHub(b, watch.Config{Shards: 2, ProgressInterval: -1})
			keyOf := make([]string, keys)
			readies := make([]*watch.Ready, keys)
			for k := range keys {
				keyOf[k] = fmt.Sprintf("disc/svc-%05d", k)
				readies[k] = watch.NewReady()
			}
			ws := make([]*watch.Watcher, 0, n+prefixes)
			for j := range n {
				w, err := h.Watch(context.Background(), watch.Request{Key: keyOf[j%keys], FromNow: true, Ready: readies[j%keys]})
				if err != nil {
					b.Fatal(err)
				}
				ws = append(ws, w)
			}
			prefixReadies := make([]*watch.Ready, prefixes)
			for i := range prefixes {
				prefixReadies[i] = watch.NewReady()
				w, err := h.Watch(context.Background(), watch.Request{Key: "disc/", Prefix: true, FromNow: true, Ready: prefixReadies[i]})
				if err != nil {
					b.Fatal(err)
				}
				ws = append(ws, w)
			}
			done, cancel := context.WithCancel(context.Background())
			cancel()
			drain := func(r *watch.Ready) int {
				got := 0
				for _, w := range r.Take() {
					for {
						sb, err := w.NextShared(done)
						if err != nil {
							break
						}
						got += len(sb.Events)
					}
				}
				return got
			}
			val := make([]byte, 64)
			base := h.Index()
			runtime.GC()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			for i := range b.N {
				k := i * 7919 % keys
				h.Publish(base+uint64(i)+1, []watch.Event{{Type: watch.Put, KV: watch.KeyValue{Key: keyOf[k], Value: val}}})
				h.Sync()
				got := drain(readies[k])
				for _, r := range prefixReadies {
					got += drain(r)
				}
				if want := (n+keys-1-k)/keys + prefixes; got != want {
					b.Fatalf("write %d to key %d: %d deliveries, want %d", i, k, got, want)
				}
			}
			// NB: CPU time, not wall time: on a shared machine the wall
			// time of one goroutine is whatever the others leave it.
			b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
			b.StopTimer()
			runtime.KeepAlive(ws)
		})
	}
}

// processCPU is the process's CPU time, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkBusyWatcherRound is one delivery round of a busy prefix
// watcher, as a grouped gRPC stream serves it: 20 writes, then the
// watcher's batch taken with NextShared, with and without giving its
// slice back (Recycle). B/op is what the watcher's buffer costs beside
// the writes' own events.
func BenchmarkBusyWatcherRound(b *testing.B) {
	for _, recycle := range []bool{false, true} {
		b.Run(fmt.Sprintf("recycle=%v", recycle), func(b *testing.B) {
			h := newManualHub(b, watch.Config{Shards: 1, ProgressInterval: -1})
			w, err := h.Watch(context.Background(), watch.Request{Key: "disc/", Prefix: true, FromNow: true})
			if err != nil {
				b.Fatal(err)
			}
			done, cancel := context.WithCancel(context.Background())
			cancel()
			const perRound = 20
			evs := make([][]watch.Event, perRound)
			idx := h.Index()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				for i := range evs {
					evs[i] = []watch.Event{{Type: watch.Put, KV: watch.KeyValue{Key: "disc/svc-00001"}}}
				}
				b.StartTimer()
				for i := range evs {
					idx++
					h.Publish(idx, evs[i])
				}
				h.Sync()
				sb, err := w.NextShared(done)
				if err != nil || len(sb.Events) != perRound {
					b.Fatalf("%d events, %v", len(sb.Events), err)
				}
				if recycle {
					w.Recycle(sb.Events)
				}
			}
		})
	}
}

// BenchmarkProgressInterval is one progress interval (its 16 timer
// rounds) over 100,000 quiet watchers, 100 to a Ready list as a gRPC
// stream carries them (made one after another, so their ids are too),
// every one behind and so told: wakes/op is how many
// times a Ready list was woken (a stream's delivery round, a message on
// the wire), cpu-ns/op the hub's CPU for the rounds and the drains.
func BenchmarkProgressInterval(b *testing.B) {
	const watchers, perReady = 100_000, 100
	h := newManualHub(b, watch.Config{Shards: 2, ProgressInterval: -1})
	readies := make([]*watch.Ready, watchers/perReady)
	for i := range readies {
		readies[i] = watch.NewReady()
	}
	ws := make([]*watch.Watcher, 0, watchers)
	for j := range watchers {
		w, err := h.Watch(context.Background(), watch.Request{Key: fmt.Sprintf("quiet/%06d", j), FromNow: true, Ready: readies[j/perReady]})
		if err != nil {
			b.Fatal(err)
		}
		ws = append(ws, w)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	idx := h.Index()
	wakes, told := 0, 0
	runtime.GC()
	b.ResetTimer()
	cpu0 := processCPU()
	for range b.N {
		idx++
		h.Publish(idx, []watch.Event{{Type: watch.Put, KV: watch.KeyValue{Key: "busy"}}})
		for range watch.ProgressSlices {
			h.TimerRounds(1)
			for _, r := range readies {
				taken := r.Take()
				if len(taken) > 0 {
					wakes++
				}
				for _, w := range taken {
					if _, err := w.NextShared(done); err == nil {
						told++
					}
				}
			}
		}
	}
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(wakes)/float64(b.N), "wakes/op")
	if told != watchers*b.N {
		b.Fatalf("%d notifications over %d intervals, want every watcher told once per interval (%d)", told, b.N, watchers*b.N)
	}
	b.StopTimer()
	runtime.KeepAlive(ws)
}
