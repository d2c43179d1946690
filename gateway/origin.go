package gateway

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// serviceState is what a service keeps across table versions.
type serviceState struct {
	name string
	// ejectMu serializes ejection decisions so two failing requests cannot
	// both squeeze under MaxEjectedPercent. Only requests that are about
	// to eject take it; the updater never does.
	ejectMu sync.Mutex
	m       *serviceMetrics // nil in table-only tests
}

// origin is one instance as the gateway balances over it. Its identity
// fields never change; an instance whose address or meta changes gets a
// new origin. Its counters are shared by every table version and shard.
type origin struct {
	state  *serviceState
	inst   Instance
	seq    uint32 // ring slot (fixed for the origin's life)
	scheme string // "http" or "https" in the outgoing URL
	proto  string // Instance.Meta["protocol"], defaulted
	host   string // host:port
	limit  int64  // OriginConcurrency

	inflight     atomic.Int64
	failing      atomic.Bool  // a failure run is in progress (fast path for successes)
	ejectedUntil atomic.Int64 // unix nanos on the gateway's Clock; 0: never ejected

	mu  sync.Mutex // guards out; taken by requests on the failure path only
	out outlierState

	// pools is every open pool to the origin (one per shard that holds
	// it), for a pool with no idle fast-path connection to borrow one
	// from (getH1). Copied on write under poolsMu: pools open and close
	// with table updates, requests only Load.
	poolsMu sync.Mutex
	pools   atomic.Pointer[[]*pool]

	m *originMetrics // nil in table-only tests
}

// newBareOrigin builds an origin without metrics (tests, and the base of
// the gateway's constructor).
func newBareOrigin(st *serviceState, in Instance, seq uint32, limit int) *origin {
	o := &origin{state: st, inst: in, seq: seq, scheme: "http", proto: in.protocol(), host: in.HostPort(), limit: int64(limit)}
	if o.proto == ProtocolHTTPS {
		o.scheme = "https"
	}
	if o.limit <= 0 {
		o.limit = 1 << 62
	}
	return o
}

func (o *origin) String() string { return o.state.name + "/" + o.inst.ID }

// addPool records p, a new pool to o.
func (o *origin) addPool(p *pool) {
	o.poolsMu.Lock()
	var next []*pool
	if old := o.pools.Load(); old != nil {
		next = append(next, *old...)
	}
	next = append(next, p)
	o.pools.Store(&next)
	o.poolsMu.Unlock()
}

// removePool forgets p (if recorded).
func (o *origin) removePool(p *pool) {
	o.poolsMu.Lock()
	if old := o.pools.Load(); old != nil && slices.Contains(*old, p) {
		next := slices.DeleteFunc(slices.Clone(*old), func(q *pool) bool { return q == p })
		o.pools.Store(&next)
	}
	o.poolsMu.Unlock()
}

// acquire takes an in-flight slot if the origin is under its limit.
func (o *origin) acquire() bool {
	if o.inflight.Add(1) > o.limit {
		o.inflight.Add(-1)
		return false
	}
	return true
}

func (o *origin) release() { o.inflight.Add(-1) }

// available reports whether the balancer may pick o at now (unix nanos).
func (o *origin) available(now int64) bool {
	if u := o.ejectedUntil.Load(); u != 0 && now < u {
		return false
	}
	return o.inflight.Load() < o.limit
}

// pool is one shard's connections to one origin: an http.Transport made on
// first use, so a pool that never carries a request costs no transport.
type pool struct {
	shard  int
	origin *origin
	f      *transportFactory // nil in table-only tests

	mu     sync.Mutex // serializes making tr; requests take it only until tr exists
	tr     atomic.Pointer[http.Transport]
	spare  atomic.Pointer[tls.Conn] // the ALPN probe connection, handed to tr's first dial
	h1     h1idle                   // the HTTP/1.1 fast path's idle connections (fastpath.go)
	closed atomic.Bool
}

// transport returns the pool's transport, making it on first use. For a
// TLS origin, making it dials one connection to learn what ALPN picks
// (ctx bounds that dial).
func (p *pool) transport(ctx context.Context) (*http.Transport, error) {
	if tr := p.tr.Load(); tr != nil {
		return tr, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if tr := p.tr.Load(); tr != nil {
		return tr, nil
	}
	tr, err := p.f.newTransport(ctx, p)
	if err != nil {
		return nil, err
	}
	p.tr.Store(tr)
	if p.closed.Load() {
		p.close()
	}
	return tr, nil
}

// close marks the pool gone (its origin left the shard's subset) and
// closes its idle connections. Requests still running on it finish; the
// last one to finish closes what it leaves idle (see done).
func (p *pool) close() {
	p.closed.Store(true)
	p.origin.removePool(p)
	p.closeH1(0)
	if tr := p.tr.Load(); tr != nil {
		tr.CloseIdleConnections()
	}
	if c := p.spare.Swap(nil); c != nil {
		c.Close()
	}
}

// done is called after a request on p finished.
func (p *pool) done() {
	if p.closed.Load() {
		if tr := p.tr.Load(); tr != nil {
			tr.CloseIdleConnections()
		}
	}
}

// transportFactory builds the per-pool transports: HTTP/1.1 keep-alive,
// h2c (HTTP/2 with prior knowledge) or TLS with ALPN, per the origin's
// protocol.
type transportFactory struct {
	connectTimeout time.Duration
	poolIdle       time.Duration
	maxIdle        int
	tls            *tls.Config
	stats          *connStats
}

// connStats counts origin connections over the whole gateway.
type connStats struct {
	opened atomic.Int64
	open   atomic.Int64
}

func (f *transportFactory) newTransport(ctx context.Context, p *pool) (*http.Transport, error) {
	o := p.origin
	tr := &http.Transport{
		DialContext:         p.dial,
		MaxIdleConnsPerHost: f.maxIdle,
		IdleConnTimeout:     f.poolIdle,
		TLSHandshakeTimeout: f.connectTimeout,
		// NB: a proxy must pass Accept-Encoding through untouched; the
		// default would add gzip and decompress behind the client's back.
		DisableCompression:    true,
		ExpectContinueTimeout: time.Second,
	}
	var protos http.Protocols
	switch o.proto {
	case ProtocolH2C:
		protos.SetUnencryptedHTTP2(true)
		// NB: for HTTP/2 this bounds connections being *dialed* at once:
		// concurrent first requests wait for one connection and multiplex
		// on it instead of each dialing its own (Zuul's multiplexing that
		// never happened).
		tr.MaxConnsPerHost = 1
	case ProtocolHTTPS:
		protos.SetHTTP1(true)
		protos.SetHTTP2(true)
		tr.DialTLSContext = p.dialTLS
		// Learn what ALPN picks with one connection, handed to the
		// transport as its first; an h2 origin then gets the same
		// one-dial-at-a-time rule as h2c, an HTTP/1.1 one a normal pool.
		c, err := p.dialTLS(ctx, "tcp", o.host)
		if err != nil {
			return nil, err
		}
		if c.(*tls.Conn).ConnectionState().NegotiatedProtocol == "h2" {
			tr.MaxConnsPerHost = 1
		}
		p.spare.Store(c.(*tls.Conn))
	default:
		protos.SetHTTP1(true)
	}
	tr.Protocols = &protos
	return tr, nil
}

// tlsConfig returns the client TLS config for o.
func (f *transportFactory) tlsConfig(o *origin) *tls.Config {
	var cfg *tls.Config
	if f.tls != nil {
		cfg = f.tls.Clone()
	} else {
		cfg = &tls.Config{}
	}
	cfg.ServerName = o.inst.Meta["tls_server_name"]
	if cfg.ServerName == "" {
		cfg.ServerName = o.inst.Address
	}
	cfg.NextProtos = []string{"h2", "http/1.1"}
	return cfg
}

// dialTLS opens one counted TLS connection (TCP connect and handshake
// both within ConnectTimeout), or hands out the ALPN probe's.
func (p *pool) dialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	if c := p.spare.Swap(nil); c != nil {
		return c, nil
	}
	ctx, cancel := context.WithTimeout(ctx, p.f.connectTimeout)
	defer cancel()
	raw, err := p.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	c := tls.Client(raw, p.f.tlsConfig(p.origin))
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, &connectError{addr: addr, err: fmt.Errorf("tls handshake: %w", err)}
	}
	return c, nil
}

// connectError marks a failure to open a connection to an origin.
type connectError struct {
	addr string
	err  error
}

func (e *connectError) Error() string { return fmt.Sprintf("connect to %s: %v", e.addr, e.err) }
func (e *connectError) Unwrap() error { return e.err }
func (e *connectError) Is(target error) bool {
	return target == ErrConnect
}

// dial opens one connection for p's transport, bounded by ConnectTimeout,
// and counts it.
func (p *pool) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: p.f.connectTimeout, KeepAlive: 30 * time.Second}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, &connectError{addr: addr, err: err}
	}
	p.f.stats.opened.Add(1)
	p.f.stats.open.Add(1)
	if m := p.origin.state.m; m != nil {
		m.connsOpened.Inc()
		m.connsOpen.Inc()
	}
	return &countedConn{Conn: c, p: p}, nil
}

// countedConn decrements the open-connection counts once, on Close.
type countedConn struct {
	net.Conn
	p      *pool
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.p.f.stats.open.Add(-1)
		if m := c.p.origin.state.m; m != nil {
			m.connsOpen.Dec()
		}
	}
	return c.Conn.Close()
}
