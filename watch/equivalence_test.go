package watch_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/watch"
)

// testSeed returns WATCH_SEED if set (to replay a failure), else a fresh
// seed. Either way it is logged.
func testSeed(t *testing.T) uint64 {
	if s := os.Getenv("WATCH_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("WATCH_SEED: %v", err)
		}
		return v
	}
	return uint64(time.Now().UnixNano())
}

var (
	eqKeys     = []string{"a", "a/b", "a/c", "a/b/d", "b", "b/x", "c/d/e", "cc"}
	eqPrefixes = []string{"", "a", "a/", "a/b", "b", "c/d", "c"}
)

// runWorkload drives a manual hub with the random workload seed describes
// and returns the transcript of everything the watchers saw. hot is the
// hub's count of decoded log entries (-1: the default, which this workload
// never exceeds; 0: every entry is read back from its encoding). Every batch is
// also checked against a brute-force model: the events between the
// watcher's previous Index and this one, no more, no fewer.
func runWorkload(t *testing.T, seed uint64, shards, hot int) string {
	t.Helper()
	h := newManualHub(t, watch.Config{Shards: shards, WatcherBuffer: 4, RetainEvents: 40, ProgressInterval: -1})
	if hot >= 0 {
		h.SetHotEntries(hot)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	var m model
	type sub struct {
		w    *watch.Watcher
		req  watch.Request
		prev uint64 // last Index seen (or the start)
		done bool
	}
	var subs []*sub
	var out strings.Builder
	var index uint64
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d, %d shards: %s\ntranscript so far:\n%s", seed, shards, fmt.Sprintf(format, args...), out.String())
	}
	for op := range 400 {
		switch r := rng.IntN(100); {
		case r < 35: // publish; now and then a burst the shards do not see
			burst := 1
			if rng.IntN(25) == 0 {
				burst = 10 + rng.IntN(20)
			}
			for range burst {
				index += uint64(rng.IntN(3) + 1)
				var evs []watch.Event
				for range rng.IntN(5) {
					k := eqKeys[rng.IntN(len(eqKeys))]
					ev := put(k, fmt.Sprint(op))
					if rng.IntN(3) == 0 {
						ev = del(k)
					}
					if rng.IntN(2) == 0 {
						ev.PrevKV = &watch.KeyValue{Key: k, Value: []byte("p" + fmt.Sprint(op))}
					}
					evs = append(evs, ev)
				}
				m.publish(h, index, evs)
				fmt.Fprintf(&out, "publish %d: %d events\n", index, len(evs))
			}
			if burst == 1 && rng.IntN(5) != 0 {
				h.Sync()
			}
		case r < 52: // watch
			req := watch.Request{Prefix: rng.IntN(2) == 0, NoPut: rng.IntN(6) == 0, NoDelete: rng.IntN(6) == 0,
				PrevKV: rng.IntN(2) == 0, BufferSize: rng.IntN(8)}
			if req.Prefix {
				req.Key = eqPrefixes[rng.IntN(len(eqPrefixes))]
			} else {
				req.Key = eqKeys[rng.IntN(len(eqKeys))]
			}
			prev := index
			switch rng.IntN(4) {
			case 0:
				req.FromNow = true
			case 1:
				req.StartIndex = index + uint64(rng.IntN(4))
				prev = req.StartIndex
			default:
				req.StartIndex = index - min(index, uint64(rng.IntN(40)))
				prev = req.StartIndex
			}
			w, err := h.Watch(context.Background(), req)
			fmt.Fprintf(&out, "watch %d %+v: %v\n", len(subs), req, err)
			if err == nil {
				subs = append(subs, &sub{w: w, req: req, prev: prev})
			} else if !errors.Is(err, watch.ErrCompacted) {
				fail("Watch: %v", err)
			}
		case r < 82: // read everything ready from one watcher
			if len(subs) == 0 {
				continue
			}
			i := rng.IntN(len(subs))
			s := subs[i]
			for !s.done {
				b, err := s.w.Next(doneCtx)
				if errors.Is(err, context.Canceled) {
					break
				}
				if err != nil {
					fmt.Fprintf(&out, "next %d: %v\n", i, err)
					s.done = true
					var oe *watch.OverflowError
					if errors.As(err, &oe) {
						if oe.ResumeIndex < s.prev {
							fail("watcher %d: resume index %d below its last Index %d", i, oe.ResumeIndex, s.prev)
						}
						if miss := m.want(s.req, s.prev, oe.ResumeIndex); len(miss) > 0 {
							fail("watcher %d: cut with resume %d but never got %s", i, oe.ResumeIndex, eventsString(miss))
						}
					}
					break
				}
				fmt.Fprintf(&out, "next %d: %s\n", i, formatBatch(b))
				if b.Index < s.prev {
					fail("watcher %d: Index went back from %d to %d", i, s.prev, b.Index)
				}
				if got, want := eventsString(b.Events), eventsString(m.want(s.req, s.prev, b.Index)); got != want {
					fail("watcher %d %+v: (%d, %d]: got %s, want %s", i, s.req, s.prev, b.Index, got, want)
				}
				s.prev = b.Index
			}
		case r < 88: // close
			if len(subs) == 0 {
				continue
			}
			i := rng.IntN(len(subs))
			subs[i].w.Close()
			subs[i].done = true
			fmt.Fprintf(&out, "close %d\n", i)
		case r < 93:
			h.Progress()
			out.WriteString("progress\n")
		case r < 98:
			h.Sync()
			out.WriteString("sync\n")
		default:
			index += uint64(rng.IntN(3) + 1)
			h.Restore(index)
			h.Sync()
			fmt.Fprintf(&out, "restore %d\n", index)
		}
	}
	return out.String()
}

// TestShardsAgree checks the same answer two ways (STYLE 22): a random
// workload — publishes, watches from random start indices, polls,
// closes, progress rounds, restores, evictions and lagging shards — gives
// exactly the same transcript with 1 shard as with 2 or 5, and with the
// events read back from the log's encoding as with the published ones; and
// every batch agrees with the brute-force model.
func TestShardsAgree(t *testing.T) {
	seed := testSeed(t)
	t.Logf("seed %d (rerun with WATCH_SEED=%d)", seed, seed)
	var all strings.Builder
	for i := range uint64(30) {
		one := runWorkload(t, seed+i, 1, -1)
		all.WriteString(one)
		for _, n := range []int{2, 5} {
			if many := runWorkload(t, seed+i, n, -1); many != one {
				t.Fatalf("seed %d: 1 shard and %d shards disagree:\n%s", seed+i, n, firstDiff(one, many))
			}
		}
		for _, hot := range []int{0, 3} {
			if cold := runWorkload(t, seed+i, 2, hot); cold != one {
				t.Fatalf("seed %d: %d hot entries and all hot disagree:\n%s", seed+i, hot, firstDiff(one, cold))
			}
		}
	}
	// The workload must reach the hard cases, or agreeing proves little.
	for _, want := range []string{"(overflow)", "(replay)", "(lag)", "compacted", "progress index", "restore"} {
		if c := strings.Count(all.String(), want); c == 0 {
			t.Errorf("seed %d: workload never produced %q", seed, want)
		} else {
			t.Logf("%q: %d", want, c)
		}
	}
}

func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d:\n 1 shard: %s\n n shards: %s", i+1, al[i], bl[i])
		}
	}
	return fmt.Sprintf("lengths differ: %d vs %d lines", len(al), len(bl))
}

// TestShardsAgreeLive is the same check with the real shard goroutines
// running concurrently with Publish and Watch: watchers join at random
// points (some replaying history, some from now), and at the end each has
// exactly the model's events, with 1 shard and every log entry decoded as
// with 7 shards and all but the newest 16 read back from their encoding.
func TestShardsAgreeLive(t *testing.T) {
	seed := testSeed(t)
	t.Logf("seed %d (rerun with WATCH_SEED=%d)", seed, seed)
	run := func(shards, hot int) []string {
		ctx := testCtx(t)
		h := newHub(t, watch.Config{Shards: shards, WatcherBuffer: 100_000, RetainEvents: 100_000})
		h.SetHotEntries(hot)
		var m model
		rng := rand.New(rand.NewPCG(seed, 11))
		type sub struct {
			w     *watch.Watcher
			req   watch.Request
			start uint64
		}
		var subs []sub
		var index uint64
		for range 2000 {
			if rng.IntN(20) == 0 {
				req := watch.Request{Prefix: rng.IntN(2) == 0, NoDelete: rng.IntN(5) == 0}
				if req.Prefix {
					req.Key = eqPrefixes[rng.IntN(len(eqPrefixes))]
				} else {
					req.Key = eqKeys[rng.IntN(len(eqKeys))]
				}
				start := index
				if rng.IntN(2) == 0 {
					start = index - min(index, uint64(rng.IntN(100)))
				}
				req.StartIndex = start
				w, err := h.Watch(ctx, req)
				if err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				subs = append(subs, sub{w, req, start})
			}
			index += uint64(rng.IntN(2) + 1)
			var evs []watch.Event
			for range rng.IntN(4) {
				k := eqKeys[rng.IntN(len(eqKeys))]
				if rng.IntN(4) == 0 {
					evs = append(evs, del(k))
				} else {
					evs = append(evs, put(k, fmt.Sprint(index)))
				}
			}
			m.publish(h, index, evs)
		}
		h.Progress()
		var outs []string
		for i, s := range subs {
			got := eventsString(readUntil(t, ctx, s.w, index))
			if want := eventsString(m.want(s.req, s.start, index)); got != want {
				t.Fatalf("seed %d, %d shards, watcher %d %+v:\n got %.300s\nwant %.300s", seed, shards, i, s.req, got, want)
			}
			outs = append(outs, got)
		}
		return outs
	}
	one, many := run(1, 4096), run(7, 16)
	if len(one) != len(many) {
		t.Fatalf("seed %d: %d vs %d watchers", seed, len(one), len(many))
	}
	for i := range one {
		if one[i] != many[i] {
			t.Fatalf("seed %d: watcher %d differs between 1 and 7 shards", seed, i)
		}
	}
}
