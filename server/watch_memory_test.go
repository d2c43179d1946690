package server

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// A stream keeps no wire buffer between delivery rounds: at 10,000
// streams with 100 watches of one key each (make bench-watch-1m), a
// buffer kept per stream at its largest round (~16 KB) was more heap than
// the million watchers. Here 200 such streams each get one round of
// ~15 KB; afterwards the process's live heap may have grown by far less
// than those rounds' buffers.
func TestIdleWatchStreamsHoldNoWireBuffers(t *testing.T) {
	const streams, perStream = 200, 100
	c := newTestCluster(t, 1)
	lead := c.waitLeader()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cc, err := grpc.NewClient(c.servers[lead].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()

	var created, delivered atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	key := func(s int) string { return fmt.Sprintf("disc/svc-%05d", s) }
	for s := range streams {
		st, err := lodestonepb.NewWatchClient(cc).Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for {
				r, err := st.Recv()
				if err != nil {
					return
				}
				if r.Created {
					created.Add(1)
				}
				for _, g := range r.Groups {
					delivered.Add(int64(len(g.Events)))
				}
			}
		})
		for j := range perStream {
			if err := st.Send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Create{Create: &lodestonepb.WatchCreate{
				WatchId: int64(j + 1), Key: []byte(key(s)), Grouped: true}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitCount(t, &created, streams*perStream, "watches created")

	before := liveHeapNow()
	value := string(make([]byte, 100))
	for s := range streams {
		put(t, c.kv(lead), key(s), value)
	}
	waitCount(t, &delivered, streams*perStream, "events delivered")
	grown := float64(int64(liveHeapNow())-int64(before)) / streams
	// One round's buffer is ~15 KB per stream (kept per stream, the
	// heap grew ~22 KB per stream); the rest (the write's store, Raft log
	// and hub entries, gRPC's state on both ends) is ~6 KB.
	const budget = 10 << 10
	t.Logf("live heap grew %.0f B per stream after one ~15 KB round each", grown)
	if grown > budget {
		t.Fatalf("live heap grew %.0f B per stream after one delivery round, want <= %d: do streams keep their round's buffers?", grown, budget)
	}
}

func waitCount(t *testing.T, n *atomic.Int64, want int, what string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for n.Load() < int64(want) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d %s after 1m", n.Load(), want, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// liveHeapNow returns the live heap after full collections (two, so
// sync.Pool's victim cache is dropped too).
func liveHeapNow() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
