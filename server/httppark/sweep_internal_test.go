package httppark

import (
	"net"
	"testing"

	"github.com/lodestone-kv/lodestone/watch"
)

// TestSweepYieldsBetweenChunks: a sweep lets other goroutines run after
// every sweepChunk peeks, so a leader with 10,000 parked connections does
// not hold its processor for the whole sweep; it still peeks at every
// connection, and a closing Lot stops it at the next yield.
func TestSweepYieldsBetweenChunks(t *testing.T) {
	conn := openConn(t)
	const n = 3*sweepChunk + 1
	newLot := func() (*Lot, *int) {
		yields := 0
		l := &Lot{byWatch: map[*watch.Watcher]*parked{}, stop: make(chan struct{}), yield: func() { yields++ }}
		for range n {
			w := new(watch.Watcher)
			l.byWatch[w] = &parked{w: w, conn: conn}
		}
		return l, &yields
	}

	l, yields := newLot()
	l.sweep()
	if *yields != 3 || l.sweeps.Load() != 1 || l.Len() != n {
		t.Fatalf("a sweep of %d open connections: %d yields, %d sweeps, %d left parked; want 3, 1, %d", n, *yields, l.sweeps.Load(), l.Len(), n)
	}

	l, yields = newLot()
	close(l.stop)
	l.sweep()
	if *yields != 1 || l.sweeps.Load() != 0 {
		t.Fatalf("a sweep of a closing Lot: %d yields, %d sweeps counted; want 1, 0", *yields, l.sweeps.Load())
	}
}

// openConn is the server side of a loopback connection whose client stays.
func openConn(t *testing.T) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return server
}
