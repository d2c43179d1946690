package server

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// connLimit is a listener that holds at most n connections open (the
// client gRPC and HTTP listeners'): Accept waits for a slot, as
// netutil.LimitListener's does, and a connection's Close frees its slot.
// Its connections expose the socket underneath (NetConn), which
// httppark's sweep peeks at; netutil's hide it.
//
// With a per-client cap it also holds at most that many connections from
// one source IP: a connection over that is closed at once, before
// anything is read from it, and counted in refused. A connection a
// parked blocking query holds (httppark) keeps its slot until the
// socket closes, so parked connections count like any other.
type connLimit struct {
	net.Listener
	slots     chan struct{} // NB: a waiting Accept holds one too
	open      atomic.Int64
	done      chan struct{}
	closeOnce sync.Once

	caps    atomic.Pointer[clientCaps] // NB: swapped by Reload, read per accept
	refused prometheus.Counter         // per-client refusals
	// pace, if set, runs before each accept and waits for its turn
	// (admission.paceAccept); false: the listener closed meanwhile.
	pace func(done <-chan struct{}) bool
	// byClient counts the open connections of each source IP not exempt
	// at its accept, cap or no cap, so a cap set later counts from the
	// truth.
	mu       sync.Mutex
	byClient map[netip.Addr]int
}

// clientCaps is a connLimit's per-client cap; immutable once stored.
type clientCaps struct {
	perClient int            // <= 0: no per-client cap
	exempt    []netip.Prefix // sources the per-client cap skips
}

// newConnLimit holds at most n connections; refused counts the ones a
// per-client cap (setPerClient) closes.
func newConnLimit(l net.Listener, n int, refused prometheus.Counter) *connLimit {
	c := &connLimit{Listener: l, slots: make(chan struct{}, n), done: make(chan struct{}),
		refused: refused, byClient: map[netip.Addr]int{}}
	c.caps.Store(&clientCaps{})
	return c
}

// setPerClient caps the connections of one source IP at n (n <= 0: no
// cap) except for sources in exempt, for connections accepted from now
// on; open ones stay.
func (l *connLimit) setPerClient(n int, exempt []netip.Prefix) {
	l.caps.Store(&clientCaps{perClient: n, exempt: slices.Clone(exempt)})
}

func (l *connLimit) Accept() (net.Conn, error) {
	for {
		select {
		case l.slots <- struct{}{}:
		case <-l.done:
			return nil, net.ErrClosed
		}
		if l.pace != nil && !l.pace(l.done) {
			<-l.slots
			return nil, net.ErrClosed
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.slots
			return nil, err
		}
		client, ok := l.admit(c)
		if !ok {
			// Counted before the close, so a client that sees the close
			// also sees the count.
			l.refused.Inc()
			c.Close()
			<-l.slots
			continue
		}
		l.open.Add(1)
		return &limitedConn{Conn: c, l: l, client: client}, nil
	}
}

// admit takes a per-client slot for c; the zero Addr when c's source is
// not counted (exempt, or not an IP).
func (l *connLimit) admit(c net.Conn) (netip.Addr, bool) {
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return netip.Addr{}, true
	}
	caps := l.caps.Load()
	ip := ap.Addr().Unmap()
	for _, p := range caps.exempt {
		if p.Contains(ip) {
			return netip.Addr{}, true
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if caps.perClient > 0 && l.byClient[ip] >= caps.perClient {
		return netip.Addr{}, false
	}
	l.byClient[ip]++
	return ip, true
}

// release gives back a connection's slots.
func (l *connLimit) release(client netip.Addr) {
	if client.IsValid() {
		l.mu.Lock()
		if l.byClient[client]--; l.byClient[client] <= 0 {
			delete(l.byClient, client)
		}
		l.mu.Unlock()
	}
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
	client   netip.Addr // the per-client slot it holds, if valid
	released atomic.Bool
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	if c.released.CompareAndSwap(false, true) {
		c.l.release(c.client)
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
