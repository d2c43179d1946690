// Package handback gives an http.Server the connections another server
// took first: a server that read a client's first bytes itself (to serve
// the requests it can serve more cheaply, or to hold a request while it
// waits) hands the connection on, with those bytes still to be read, to
// the http.Server that serves everything else.
//
// A Listener is the http.Server's net.Listener. Its Accept yields the
// connections handed to it and, for a Listener made by Wrap, those of the
// listener it wraps. It knows nothing of HTTP: what the bytes mean, and
// which connections to hand over, is the caller's business.
//
// Caller's duties:
//
//  1. Serve the http.Server on the Listener (New or Wrap).
//  2. Hand connections to it with Hand; a connection Hand refuses is
//     still the caller's to close.
//  3. Close it, or let the http.Server's Shutdown or Close do so; Close
//     may be called more than once.
package handback

import (
	"errors"
	"net"
	"sync"

	"github.com/lodestone-kv/lodestone/internal/prefixconn"
)

// Listener is a net.Listener whose Accept yields handed connections (and,
// from Wrap, the wrapped listener's). Its methods may run concurrently.
type Listener struct {
	inner    net.Listener // nil: handed connections only
	addr     net.Addr
	back     chan net.Conn
	accepted chan accepted
	done     chan struct{}
	once     sync.Once
	pumpDone chan struct{} // closed when pump returns; nil without inner
}

type accepted struct {
	c   net.Conn
	err error
}

var _ net.Listener = (*Listener)(nil)

// New returns a Listener that yields only the connections handed to it;
// addr is what its Addr reports.
func New(addr net.Addr) *Listener {
	return &Listener{addr: addr, back: make(chan net.Conn), done: make(chan struct{})}
}

// Wrap returns a Listener that yields inner's connections as well as the
// handed ones. It starts one goroutine that runs inner's Accept; Close
// closes inner and waits for that goroutine.
func Wrap(inner net.Listener) *Listener {
	l := &Listener{inner: inner, addr: inner.Addr(), back: make(chan net.Conn),
		accepted: make(chan accepted), done: make(chan struct{}), pumpDone: make(chan struct{})}
	go l.pump()
	return l
}

// pump runs inner's Accept for Accept, which must also take handed
// connections.
func (l *Listener) pump() {
	defer close(l.pumpDone)
	for {
		c, err := l.inner.Accept()
		select {
		case l.accepted <- accepted{c, err}:
		case <-l.done:
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

// Hand gives c to Accept's caller. buffered is what was read from c and
// not consumed: the http.Server reads it first (Hand keeps the slice; the
// caller must not change it). Hand blocks until the connection is taken,
// the Listener closes, or cancel (which may be nil) is closed; it reports
// whether the connection was taken. When it was not, c is still the
// caller's to close.
func (l *Listener) Hand(c net.Conn, buffered []byte, cancel <-chan struct{}) bool {
	if len(buffered) > 0 {
		c = &prefixconn.Conn{Conn: c, Prefix: buffered}
	}
	select {
	case l.back <- c:
		return true
	case <-l.done:
		return false
	case <-cancel:
		return false
	}
}

// Accept returns the next handed or accepted connection, or net.ErrClosed
// once the Listener is closed.
func (l *Listener) Accept() (net.Conn, error) {
	// NB: a nil channel (no inner) is never ready.
	select {
	case c := <-l.back:
		return c, nil
	case a := <-l.accepted:
		return a.c, a.err
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops Accept and Hand and closes the wrapped listener, once;
// later calls return nil, so both the http.Server and the Listener's
// owner may close it.
func (l *Listener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		if l.inner != nil {
			err = l.inner.Close()
			<-l.pumpDone
		}
	})
	return err
}

// Addr returns the wrapped listener's address, or New's addr.
func (l *Listener) Addr() net.Addr { return l.addr }
