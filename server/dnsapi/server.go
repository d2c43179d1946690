package dnsapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/store"
)

// Backend is what the DNS interface needs from the server it runs in.
type Backend interface {
	// Store is the state machine, read-only.
	Store() *store.Store
	// Authorize resolves a token's secret ("" is the anonymous token);
	// with ACLs off every secret resolves to an Authorizer that allows
	// everything.
	Authorize(ctx context.Context, secret string) (*acl.Authorizer, error)
}

// Listeners are the UDP socket and TCP listener of one address.
type Listeners struct {
	UDP net.PacketConn
	TCP net.Listener
}

// Listen binds addr for UDP and TCP. Port 0 picks one port free for both.
func Listen(addr string) (*Listeners, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dns address %q is not host:port: %v", addr, err)
	}
	if port != "0" {
		return listenBoth(addr)
	}
	var last error
	for range 20 {
		u, err := net.ListenPacket("udp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("listen for DNS on %s/udp: %w", addr, err)
		}
		_, p, _ := net.SplitHostPort(u.LocalAddr().String())
		t, err := net.Listen("tcp", net.JoinHostPort(host, p))
		if err == nil {
			return &Listeners{UDP: u, TCP: t}, nil
		}
		u.Close()
		last = err
	}
	return nil, fmt.Errorf("listen for DNS on %s: no port free for both UDP and TCP: %w", addr, last)
}

func listenBoth(addr string) (*Listeners, error) {
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for DNS on %s/udp: %w", addr, err)
	}
	t, err := net.Listen("tcp", addr)
	if err != nil {
		u.Close()
		return nil, fmt.Errorf("listen for DNS on %s/tcp: %w", addr, err)
	}
	return &Listeners{UDP: u, TCP: t}, nil
}

// Addr is the address both listen on.
func (l *Listeners) Addr() string { return l.UDP.LocalAddr().String() }

// Close closes both; for listeners never handed to a Server.
func (l *Listeners) Close() error { return errors.Join(l.UDP.Close(), l.TCP.Close()) }

// Server answers DNS questions on its listeners (doc.go says what).
type Server struct {
	cfg       Config
	b         Backend
	logger    *slog.Logger
	domain    string // lowercase, fully qualified: "consul."
	dotDomain string // ".consul."
	names     naming
	views     *views
	nodes     *nodeNames
	recursors []string
	// recursions holds a slot per question being forwarded.
	recursions chan struct{}
	authz      atomic.Pointer[resolved]
	cache      answerCache
	metrics    *metrics

	addr     string
	udp, tcp *runner
	tcpLis   *tcpLimit
	// fast is the UDP fast path (fastpath.go), nil on a socket bound to
	// a wildcard address.
	fast *fastPath
}

// resolved is the DNS token's Authorizer (or the error resolving it gave)
// at one ACL index.
type resolved struct {
	aclIndex uint64
	authz    *acl.Authorizer
	err      error
}

// New returns a Server over b on l; Serve starts it. It owns l from
// here on, also when it fails.
func New(b Backend, l *Listeners, cfg Config, logger *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		l.Close()
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	domain := strings.ToLower(dns.Fqdn(strings.Trim(cfg.Domain, ".")))
	s := &Server{cfg: cfg, b: b, logger: logger, domain: domain, dotDomain: "." + domain,
		names: naming{domain: domain, dc: strings.ToLower(cfg.Datacenter)},
		views: newViews(b.Store(), cfg.OnlyPassing, cfg.ServiceTTL), nodes: &nodeNames{st: b.Store()},
		recursions: make(chan struct{}, max(1, cfg.MaxRecursions)), addr: l.Addr()}
	for _, r := range cfg.Recursors {
		a, _ := RecursorAddr(r) // NB: Validate checked it
		s.recursors = append(s.recursors, a)
	}
	s.tcpLis = &tcpLimit{Listener: l.TCP, max: int64(cfg.MaxTCPConnections)}
	s.metrics = newMetrics(func() float64 { return float64(s.tcpLis.open.Load()) }, func() float64 { return float64(s.cache.size()) })
	s.tcpLis.refused = s.metrics.refused.WithLabelValues(reasonTCP)
	s.cache.max, s.cache.flushed = cfg.AnswerCacheBytes, s.metrics.flushes
	if reg != nil {
		if err := s.metrics.register(reg); err != nil {
			l.Close()
			return nil, fmt.Errorf("register DNS metrics: %w", err)
		}
	}
	idle := cfg.IdleTimeout
	udp := l.UDP
	if conn, ok := boundAddress(l.UDP); ok {
		readers := cfg.UDPReaders
		if readers == 0 {
			readers = runtime.GOMAXPROCS(0)
		}
		s.fast = newFastPath(s, conn, readers, cfg.UDPHandoffQueue)
		udp = s.fast.handoff
	}
	s.udp = newRunner(&dns.Server{PacketConn: udp, Handler: s, UDPSize: maxDatagram,
		ReadTimeout: cfg.ReadTimeout, WriteTimeout: cfg.ReadTimeout})
	s.tcp = newRunner(&dns.Server{Listener: s.tcpLis, Handler: s, ReadTimeout: cfg.ReadTimeout,
		WriteTimeout: cfg.ReadTimeout, IdleTimeout: func() time.Duration { return idle }})
	return s, nil
}

// Addr is the address the server answers on (UDP and TCP).
func (s *Server) Addr() string { return s.addr }

// ServeUDP and ServeTCP answer until Close; each returns nil then.
func (s *Server) ServeUDP() error {
	if s.fast != nil {
		if ok, err := s.fast.start(); !ok {
			return err
		}
	}
	return s.udp.serve()
}

func (s *Server) ServeTCP() error { return s.tcp.serve() }

// Close stops answering, waiting (at most 5 s) for answers in progress.
// The full handler stops first, so that answers it is writing still go
// out on the socket the fast path then closes.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	errs := []error{s.udp.close(ctx), s.tcp.close(ctx)}
	if s.fast != nil {
		errs = append(errs, s.fast.close())
	}
	return errors.Join(errs...)
}

// runner runs one dns.Server, so that Close works whether or not Serve
// ran or is still starting (dns.Server.Shutdown refuses a server not yet
// started, and its Serve would then run on).
type runner struct {
	srv     *dns.Server
	mu      sync.Mutex
	state   int // runnerIdle, runnerServing, runnerClosed
	started chan struct{}
	once    sync.Once
}

const (
	runnerIdle = iota
	runnerServing
	runnerClosed
)

func newRunner(srv *dns.Server) *runner {
	r := &runner{srv: srv, started: make(chan struct{})}
	srv.NotifyStartedFunc = r.markStarted
	return r
}

func (r *runner) markStarted() { r.once.Do(func() { close(r.started) }) }

func (r *runner) serve() error {
	r.mu.Lock()
	if r.state != runnerIdle {
		r.mu.Unlock()
		return nil
	}
	r.state = runnerServing
	r.mu.Unlock()
	err := r.srv.ActivateAndServe()
	r.markStarted()
	r.mu.Lock()
	closed := r.state == runnerClosed
	r.mu.Unlock()
	if closed {
		return nil
	}
	return err
}

func (r *runner) close(ctx context.Context) error {
	r.mu.Lock()
	prev := r.state
	r.state = runnerClosed
	r.mu.Unlock()
	switch prev {
	case runnerClosed:
		return nil
	case runnerIdle:
		return closeListener(r.srv)
	}
	select {
	case <-r.started:
	case <-ctx.Done():
		return closeListener(r.srv)
	}
	if err := r.srv.ShutdownContext(ctx); err != nil && !strings.Contains(err.Error(), "server not started") {
		return fmt.Errorf("stop DNS: %w", err)
	}
	return nil
}

func closeListener(srv *dns.Server) error {
	if srv.PacketConn != nil {
		return srv.PacketConn.Close()
	}
	return srv.Listener.Close()
}

// tcpLimit closes connections past max at accept, counting them.
type tcpLimit struct {
	net.Listener
	max     int64
	open    atomic.Int64
	refused prometheus.Counter
}

func (l *tcpLimit) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			l.refused.Inc() // before the close a client can observe
			c.Close()
			continue
		}
		return &limitedConn{Conn: c, l: l}, nil
	}
}

type limitedConn struct {
	net.Conn
	l    *tcpLimit
	done atomic.Bool
}

func (c *limitedConn) Close() error {
	if c.done.CompareAndSwap(false, true) {
		c.l.open.Add(-1)
	}
	return c.Conn.Close()
}

// authorizer is the DNS token's Authorizer, resolved again only when the
// ACLs change. A failure is kept too, so a token nobody issued costs each
// question one index load, not a catch-up with the leader.
func (s *Server) authorizer() (*acl.Authorizer, error) {
	idx := s.b.Store().ACLIndex()
	if r := s.authz.Load(); r != nil && r.aclIndex == idx {
		return r.authz, r.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), acl.RecheckTimeout)
	defer cancel()
	a, err := s.b.Authorize(ctx, s.cfg.Token)
	if err != nil && !errors.Is(err, acl.ErrNotFound) {
		s.logger.Debug("could not resolve the DNS token", "err", err)
		return nil, err // NB: not kept: it may pass (no leader to catch up with)
	}
	if err != nil {
		s.logger.Warn("the DNS token was not found: questions are answered SERVFAIL until it exists", "err", err)
	}
	s.authz.Store(&resolved{aclIndex: idx, authz: a, err: err})
	return a, err
}
