package server

import (
	"net"
	"sync"
	"sync/atomic"
)

// connLimit is a listener that holds at most n connections open (the
// client gRPC and HTTP listeners'): Accept waits for a slot, as
// netutil.LimitListener's does, and a connection's Close frees its slot.
// Its connections expose the socket underneath (NetConn), which
// httppark's sweep peeks at; netutil's hide it.
type connLimit struct {
	net.Listener
	slots     chan struct{} // NB: a waiting Accept holds one too
	open      atomic.Int64
	done      chan struct{}
	closeOnce sync.Once
}

func newConnLimit(l net.Listener, n int) *connLimit {
	return &connLimit{Listener: l, slots: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *connLimit) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	l.open.Add(1)
	return &limitedConn{Conn: c, l: l}, nil
}

// release gives back a connection's slot.
func (l *connLimit) release() {
	l.open.Add(-1)
	<-l.slots
}

func (l *connLimit) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

// Open is how many accepted connections are open.
func (l *connLimit) Open() int { return int(l.open.Load()) }

// limitedConn is one object per connection (a closure for its release was
// a second, for every GC cycle to mark, 10,000 times with 10,000 parked
// blocking queries).
type limitedConn struct {
	net.Conn
	l        *connLimit
	released atomic.Bool
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	if c.released.CompareAndSwap(false, true) {
		c.l.release()
	}
	return err
}

// NetConn returns the connection underneath (as tls.Conn's does).
func (c *limitedConn) NetConn() net.Conn { return c.Conn }

// positiveOr is v, or def when v is not positive (a limit left unset).
func positiveOr(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}
