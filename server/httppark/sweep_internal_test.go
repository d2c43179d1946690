package httppark

import (
	"context"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/peerclosed"
	"github.com/lodestone-kv/lodestone/internal/testnet"
	"github.com/lodestone-kv/lodestone/watch"
)

// TestSweepSpreadsARoundOverTheInterval: a round peeks at every parked
// connection once, sweepChunk at a time, pausing SweepInterval over the
// number of chunks before each, so 10,000 parked queries cost no burst;
// it lets go of the clients that hung up and keeps the others; a closing
// Lot stops it at the next pause.
func TestSweepSpreadsARoundOverTheInterval(t *testing.T) {
	const n = 3*sweepChunk + 1 // four chunks
	l := sweepLot(t, n, 2*sweepChunk+5)
	var gaps []time.Duration
	l.pause = func(d time.Duration) bool {
		gaps = append(gaps, d)
		return len(gaps) <= 4
	}
	l.wg.Add(1)
	l.sweepLoop()

	want := l.cfg.SweepInterval / 4
	if len(gaps) != 5 || gaps[0] != want {
		t.Fatalf("pauses %v; want five, the first %v", gaps, want)
	}
	if st := l.Stats(); st.Sweeps != 1 || st.Gone != 1 || l.Len() != n-1 {
		t.Fatalf("after a round: %d sweeps, %d gone, %d parked; want 1, 1, %d", st.Sweeps, st.Gone, l.Len(), n-1)
	}
	checkOrder(t, l)

	l.pause = func(time.Duration) bool { return false }
	l.wg.Add(1)
	l.sweepLoop()
	if st := l.Stats(); st.Sweeps != 1 {
		t.Fatalf("a closing Lot's sweep counted a round: %d sweeps, want 1", st.Sweeps)
	}
}

// TestUnparkKeepsTheSweepOrder: requests leave the Lot in any order and
// every slot still holds the request that records it.
func TestUnparkKeepsTheSweepOrder(t *testing.T) {
	l := sweepLot(t, 10, -1)
	for _, i := range []int{9, 0, 4, 4, 1} {
		ps := l.parkedNow()
		l.unpark(ps[min(i, len(ps)-1)])
		checkOrder(t, l)
	}
	if l.Len() != 5 {
		t.Fatalf("%d parked after five unparks of ten, want 5", l.Len())
	}
}

// sweepLot is a Lot holding n parked requests, each with a watcher of a
// real hub and an open loopback connection, except request hungUp, whose
// client has closed its end (-1: none).
func sweepLot(t *testing.T, n, hungUp int) *Lot {
	t.Helper()
	hub, err := watch.New(watch.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hub.Close() })
	l := &Lot{cfg: Config{SweepInterval: 8 * time.Second}, byWatch: map[*watch.Watcher]*parked{}, stop: make(chan struct{})}
	for i := range n {
		w, err := hub.Watch(context.Background(), watch.Request{Key: "k", NoProgress: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Close)
		client, server := testnet.Pair(t)
		if i == hungUp {
			client.Close()
			for deadline := time.Now().Add(5 * time.Second); !peerclosed.Closed(server); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the server end never saw its client close")
				}
			}
		}
		l.addLocked(&parked{w: w, conn: server, wait: Wait{Deadline: time.Now().Add(time.Hour)}})
	}
	return l
}

// checkOrder fails t unless order and byWatch hold the same requests and
// each knows its slot.
func checkOrder(t *testing.T, l *Lot) {
	t.Helper()
	if len(l.order) != len(l.byWatch) {
		t.Fatalf("order holds %d, byWatch %d", len(l.order), len(l.byWatch))
	}
	for i, p := range l.order {
		if p.slot != i || l.byWatch[p.w] != p {
			t.Fatalf("order[%d] records slot %d (registered: %v)", i, p.slot, l.byWatch[p.w] == p)
		}
	}
}

// TestDeadlineHeap: requests leave the heap earliest first, a removed one
// never comes out, and each knows its position throughout.
func TestDeadlineHeap(t *testing.T) {
	var h deadlineHeap
	base := time.Unix(1000, 0)
	var all []*parked
	for i := range 200 {
		p := &parked{wait: Wait{Deadline: base.Add(time.Duration((i*7919)%200) * time.Millisecond)}}
		h.push(p)
		all = append(all, p)
	}
	removed := map[*parked]bool{}
	for i := 0; i < len(all); i += 3 {
		h.remove(all[i])
		h.remove(all[i]) // NB: twice is a no-op
		removed[all[i]] = true
	}
	for i, p := range h {
		if p.due != i {
			t.Fatalf("heap[%d] records position %d", i, p.due)
		}
	}
	if _, ok := h.popDue(base.Add(-time.Millisecond)); ok {
		t.Fatal("popDue took a request before its deadline")
	}
	var last time.Time
	n := 0
	for {
		p, ok := h.popDue(base.Add(time.Hour))
		if !ok {
			break
		}
		if removed[p] || p.due != -1 || p.wait.Deadline.Before(last) {
			t.Fatalf("popped %v after %v (removed %v, position %d)", p.wait.Deadline, last, removed[p], p.due)
		}
		last = p.wait.Deadline
		n++
	}
	if want := len(all) - len(removed); n != want {
		t.Fatalf("popped %d, want %d", n, want)
	}
}
