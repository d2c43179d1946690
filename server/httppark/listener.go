package httppark

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/lodestone-kv/lodestone/internal/prefixconn"
)

// Wrap returns inner with the connections the Lot hands back added to
// what Accept returns; serve the http.Server on it. A Lot has one
// listener: Park refuses requests until Wrap was called. Closing the
// returned listener closes inner.
func (l *Lot) Wrap(inner net.Listener) net.Listener {
	ln := &listener{Listener: inner, back: make(chan net.Conn), accepted: make(chan accepted), done: make(chan struct{})}
	l.mu.Lock()
	l.listener = ln
	l.mu.Unlock()
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		ln.pump()
	}()
	return ln
}

type listener struct {
	net.Listener
	back      chan net.Conn
	accepted  chan accepted
	done      chan struct{}
	closeOnce sync.Once
}

type accepted struct {
	c   net.Conn
	err error
}

// pump runs inner's Accept for the listener's Accept, which must also
// take handed-back connections.
func (ln *listener) pump() {
	for {
		c, err := ln.Listener.Accept()
		select {
		case ln.accepted <- accepted{c, err}:
		case <-ln.done:
			if c != nil {
				c.Close()
			}
			return
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

func (ln *listener) Accept() (net.Conn, error) {
	select {
	case c := <-ln.back:
		return c, nil
	case a := <-ln.accepted:
		return a.c, a.err
	case <-ln.done:
		return nil, net.ErrClosed
	}
}

// Close closes inner once; later calls return nil, so the Lot and the
// http.Server may both close it.
func (ln *listener) Close() error {
	var err error
	ln.closeOnce.Do(func() {
		close(ln.done)
		err = ln.Listener.Close()
	})
	return err
}

// handBack gives c, with what its client already sent, to the server's
// Accept; false if the listener is closed (the caller closes c).
func (l *Lot) handBack(c net.Conn, leftover []byte) bool {
	l.mu.Lock()
	ln := l.listener
	l.mu.Unlock()
	if ln == nil {
		return false
	}
	// NB: the Lot's answers leave their write deadline set (answer); the
	// http.Server sets none of its own and would inherit it.
	if err := c.SetWriteDeadline(time.Time{}); err != nil {
		return false
	}
	if len(leftover) > 0 {
		c = &prefixconn.Conn{Conn: c, Prefix: leftover}
	}
	select {
	case ln.back <- c:
		return true
	case <-ln.done:
		return false
	case <-l.stop:
		return false
	}
}
