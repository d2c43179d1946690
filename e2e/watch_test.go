package e2e

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
)

// A watch on a prefix survives SIGKILL of the member it streams from: it
// resumes on another member from the last index it saw, and in the end has
// delivered every change under the prefix exactly once, in index order —
// the same changes a linearizable Range shows, and every write the writers
// had acknowledged (docs/architecture.md, "Watches have no gaps, no
// duplicates and no reordering": per key, resume continuity across leader
// changes included). It runs with the
// stream on the leader, which the kill forces into an election, and with
// the client's default placement, on a follower.
//
// NB: stopping the writers cancels the puts they have in flight. Such a put
// may still commit (its outcome is unknown, not failed), and then after the
// reference Range: the watch rightly delivers it at an index above the
// Range's. Comparing those events with the Range made this test fail about
// one run in 15 ("delivered but not in the range", always the writers' last
// keys, canceled puts, at indices above the Range's). So events up to the
// Range's index are compared with it, and each later one must be an
// unacknowledged put that a second Range shows at the same index: an event
// the cluster did not keep still fails.
func TestWatchResumesAcrossLeaderKill(t *testing.T) {
	testWatchResumesAcrossKill(t, client.WatchFromLeader)
}

func TestWatchResumesAcrossFollowerKill(t *testing.T) {
	testWatchResumesAcrossKill(t, client.WatchFromFollowers)
}

func testWatchResumesAcrossKill(t *testing.T, from client.WatchFrom) {
	dir := t.TempDir()
	nodes := startCluster(t, dir, "a", "b", "c")
	conns := map[string]*grpc.ClientConn{}
	for _, nd := range nodes {
		conns[nd.name] = dial(t, nd.grpc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leader := findLeader(t, ctx, nodes, conns, "")

	// The leader is listed first: a stream placed on a follower got there
	// by the placement, not by the list.
	eps := []string{leader.grpc}
	for _, nd := range nodes {
		if nd != leader {
			eps = append(eps, nd.grpc)
		}
	}
	// The reader: every event, in order, checked as it arrives.
	pc, rec := watchWrites(t, ctx, client.Config{Endpoints: eps, WatchProgressInterval: time.Second, WatchFrom: from})

	// Writers: distinct keys, each put once; acknowledged ones recorded
	// with the index the server stamped.
	var amu sync.Mutex
	acked := map[string]uint64{}
	writeCtx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for wi := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; writeCtx.Err() == nil; i++ {
				key := fmt.Sprintf("w/%d/%06d", wi, i)
				cctx, ccancel := context.WithTimeout(writeCtx, 2*time.Second)
				resp, err := pc.Put(cctx, key, []byte("v"))
				ccancel()
				if err == nil {
					amu.Lock()
					acked[key] = resp.GetKv().GetModifyIndex()
					amu.Unlock()
				}
			}
		}()
	}
	waitFor := func(what string, cond func() bool) { t.Helper(); pollUntil(t, 30*time.Second, what, cond) }
	nAcked := func() int { amu.Lock(); defer amu.Unlock(); return len(acked) }
	nSeen := func() int { return rec.count(func(seen) bool { return true }) }
	waitFor("300 acknowledged writes", func() bool { return nAcked() >= 300 })
	waitFor("the watch to deliver events", func() bool { return nSeen() >= 100 })

	// The member holding the watch is the one whose hub has delivered
	// events: nothing else here watches (a leader's own internal watchers
	// wait for session changes, and there are none).
	var serving *node
	for _, nd := range nodes {
		if metricSum(t, nd.http, "lodestone_watch_events_delivered_total") > 0 {
			if serving != nil {
				t.Fatalf("events delivered by %s and %s; the client opened one stream", serving.name, nd.name)
			}
			serving = nd
		}
	}
	switch {
	case serving == nil:
		t.Fatal("no member reports a watcher")
	case from == client.WatchFromLeader && serving != leader:
		t.Fatalf("placement %v: stream on %s, leader is %s", from, serving.name, leader.name)
	case from == client.WatchFromFollowers && serving == leader:
		t.Fatalf("placement %v: stream on the leader %s", from, leader.name)
	}

	seenAtKill := nSeen()
	serving.p.kill()
	t.Logf("SIGKILL of %s (leader %s) after %d acknowledged writes, %d events seen", serving.name, leader.name, nAcked(), seenAtKill)
	findLeader(t, ctx, nodes, conns, serving.name)
	before := nAcked()
	waitFor("300 more acknowledged writes", func() bool { return nAcked() >= before+300 })
	stopWriters()
	wg.Wait()

	// The reference: a linearizable Range after the last write.
	rng, err := pc.Range(ctx, "w/", client.KeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	if rng.GetMore() {
		t.Fatal("range cut short; raise the server's max-range-keys or write less")
	}
	// The Range shows the store at exactly its header's index.
	at := rng.GetHeader().GetIndex()
	want := map[string]uint64{}
	for _, kv := range rng.GetKvs() {
		want[string(kv.GetKey())] = kv.GetModifyIndex()
	}
	nSeenUpTo := func(idx uint64) int { return rec.count(func(ev seen) bool { return ev.index <= idx }) }
	waitFor(fmt.Sprintf("the watch to deliver all %d changes up to index %d", len(want), at), func() bool { return nSeenUpTo(at) >= len(want) })
	events, bad := rec.stop()

	// Puts canceled by stopWriters that committed after the Range: a
	// second Range must show each one the watch delivered.
	later, err := pc.Range(ctx, "w/", client.KeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	if later.GetMore() {
		t.Fatal("range cut short; raise the server's max-range-keys or write less")
	}
	kept := map[string]uint64{}
	for _, kv := range later.GetKvs() {
		kept[string(kv.GetKey())] = kv.GetModifyIndex()
	}

	if bad != nil {
		t.Fatal(bad)
	}
	got := map[string]uint64{}
	for _, ev := range events {
		if prev, dup := got[ev.key]; dup {
			t.Errorf("key %s delivered twice (at %d and %d)", ev.key, prev, ev.index)
		}
		got[ev.key] = ev.index
	}
	var missing, wrong []string
	for k, idx := range want {
		switch g, ok := got[k]; {
		case !ok:
			missing = append(missing, k)
		case g != idx:
			wrong = append(wrong, fmt.Sprintf("%s: watch %d, range %d", k, g, idx))
		}
	}
	late := 0
	for k, idx := range got {
		if _, ok := want[k]; ok {
			continue
		}
		switch k2, ok := kept[k]; {
		case idx <= at:
			wrong = append(wrong, fmt.Sprintf("%s: delivered at %d but not in the range at %d", k, idx, at))
		case !ok:
			wrong = append(wrong, fmt.Sprintf("%s: delivered at %d (after the range at %d) but the cluster does not hold it", k, idx, at))
		case k2 != idx:
			wrong = append(wrong, fmt.Sprintf("%s: delivered at %d (after the range at %d) but the cluster holds it at %d", k, idx, at, k2))
		default:
			late++
		}
	}
	amu.Lock()
	for k, idx := range acked {
		if got[k] != idx {
			wrong = append(wrong, fmt.Sprintf("%s: acknowledged at %d, watch says %d", k, idx, got[k]))
		}
		if _, ok := want[k]; !ok {
			wrong = append(wrong, fmt.Sprintf("%s: acknowledged at %d before the range at %d, but not in it", k, idx, at))
		}
	}
	nack := len(acked)
	amu.Unlock()
	sort.Strings(missing)
	sort.Strings(wrong)
	if len(missing) > 0 {
		t.Errorf("%d changes never delivered (gap), e.g. %v", len(missing), missing[:min(5, len(missing))])
	}
	if len(wrong) > 0 {
		t.Errorf("%d mismatches, e.g. %v", len(wrong), wrong[:min(5, len(wrong))])
	}
	t.Logf("%d changes delivered exactly once across the kill (%d acknowledged writes; %d seen before the kill; %d canceled puts landed after the range)",
		len(events), nack, seenAtKill, late)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("test deadline")
	}
}

// A watch stream placed on a follower leaves that member once it becomes
// the leader (here by a leadership transfer to it), resuming on a
// follower without losing or repeating an acknowledged write. Left there,
// every watch placed before an election can end up on the new leader,
// whose fan-out then delays every commit.
func TestWatchLeavesTheNewLeader(t *testing.T) {
	nodes := startCluster(t, t.TempDir(), "a", "b", "c")
	conns := map[string]*grpc.ClientConn{}
	var eps []string
	for _, nd := range nodes {
		conns[nd.name] = dial(t, nd.grpc)
		eps = append(eps, nd.grpc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	findLeader(t, ctx, nodes, conns, "")

	pc, rec := watchWrites(t, ctx, client.Config{Endpoints: eps, WatchProgressInterval: 300 * time.Millisecond})

	var acked []string
	put := func(n int) {
		t.Helper()
		for range n {
			key := fmt.Sprintf("w/%06d", len(acked))
			if _, err := pc.Put(ctx, key, []byte("v")); err != nil {
				t.Fatalf("put %s: %v", key, err)
			}
			acked = append(acked, key)
		}
	}
	waitFor := func(what string, cond func() bool) { t.Helper(); pollUntil(t, 30*time.Second, what, cond) }
	nSeen := func() int { return rec.count(func(seen) bool { return true }) }
	streamsOn := func(nd *node) float64 { return metricSum(t, nd.http, "lodestone_watch_streams") }

	put(20)
	waitFor("the first events", func() bool { return nSeen() >= 20 })
	var serving *node
	for _, nd := range nodes {
		if streamsOn(nd) > 0 {
			serving = nd
		}
	}
	if serving == nil {
		t.Fatal("no member reports the watch stream")
	}
	if _, err := pc.TransferLeader(ctx, &lodestonepb.MemberRef{Name: serving.name}); err != nil {
		t.Fatalf("transfer leadership to %s: %v", serving.name, err)
	}
	if lead := findLeader(t, ctx, nodes, conns, ""); lead != serving {
		t.Fatalf("leader is %s after the transfer to %s", lead.name, serving.name)
	}
	// A write between polls keeps the stream busy, never silent for a
	// progress interval: the watching client, which makes no other call,
	// learns that its member leads from the probe a busy stream sends
	// every few ticks.
	waitFor("the stream to leave the new leader "+serving.name, func() bool {
		put(1)
		if streamsOn(serving) > 0 {
			return false
		}
		for _, nd := range nodes {
			if nd != serving && streamsOn(nd) > 0 {
				return true
			}
		}
		return false
	})
	put(20)
	waitFor("every acknowledged write", func() bool { return nSeen() >= len(acked) })
	events, bad := rec.stop()
	if bad != nil {
		t.Fatal(bad)
	}
	times := map[string]int{}
	for _, ev := range events {
		times[ev.key]++
	}
	for _, k := range acked {
		if times[k] != 1 {
			t.Errorf("%s delivered %d times, want once", k, times[k])
		}
	}
}

// watchWrites opens a client with cfg watching the prefix w/ from now on,
// and a second client on the same endpoints to write with.
func watchWrites(t *testing.T, ctx context.Context, cfg client.Config) (*client.Client, *recorder) {
	t.Helper()
	wc, err := client.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wc.Close() })
	pc, err := client.New(client.Config{Endpoints: cfg.Endpoints})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	start, err := pc.Put(ctx, "other/start", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	w := wc.Watch(ctx, "w/", client.WatchPrefix(), client.FromIndex(start.GetHeader().GetIndex()))
	t.Cleanup(w.Close)
	return pc, record(ctx, w)
}

// seen is one event a recorder kept.
type seen struct {
	key   string
	index uint64
}

// recorder reads a watch until stopped, keeping every event, and the
// first fault: an index not above the one before it (a duplicate or a
// reordering), or the error that ended the watch.
type recorder struct {
	mu     sync.Mutex
	events []seen
	bad    error
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func record(ctx context.Context, w *client.Watch) *recorder {
	ctx, cancel := context.WithCancel(ctx)
	r := &recorder{cancel: cancel}
	r.wg.Go(func() {
		var last uint64
		for {
			b, err := w.Next(ctx)
			r.mu.Lock()
			if err != nil {
				if ctx.Err() == nil && r.bad == nil {
					r.bad = fmt.Errorf("watch ended: %w", err)
				}
				r.mu.Unlock()
				return
			}
			for _, ev := range b.Events {
				idx := ev.GetKv().GetModifyIndex()
				if idx <= last && r.bad == nil {
					r.bad = fmt.Errorf("event %s at %d after index %d: duplicate or reordering", ev.GetKv().GetKey(), idx, last)
				}
				last = idx
				r.events = append(r.events, seen{string(ev.GetKv().GetKey()), idx})
			}
			r.mu.Unlock()
		}
	})
	return r
}

// count is how many events kept so far match.
func (r *recorder) count(match func(seen) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ev := range r.events {
		if match(ev) {
			n++
		}
	}
	return n
}

// stop ends the reading and returns what it kept.
func (r *recorder) stop() ([]seen, error) {
	r.cancel()
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.events, r.bad
}
