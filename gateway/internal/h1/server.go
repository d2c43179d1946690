package h1

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lodestone-kv/lodestone/internal/handback"
	"github.com/lodestone-kv/lodestone/internal/peerclosed"
)

// The client side. One goroutine per client connection reads a request,
// serves it and writes the response, then reads the next: no per-request
// goroutine, no background read, no per-request header map (the
// connection's request and response headers are reused), one write
// syscall per small response. On Linux the whole loop runs inside one
// RawConn.Read of the connection (serveRaw), so the connection is read
// when the poller says it has bytes, never to find out.
//
// Only plain requests take it (see parse). The first request that is
// anything else hands the connection, with the bytes read so far, to the
// net/http server serving HandedOff, which serves it from then on:
// bodies, WebSocket upgrades, malformed requests and their 400s behave
// exactly as net/http makes them.
//
// NB: net/http's server cancels a request's context when the client
// closes its connection, with a background read started for every
// request. Here a request that is still running after one to two
// watchDelays gets a look at the connection every watchDelay (watchTick);
// quicker ones cost two atomic stores.

// bufSize is the client read and write buffer: a request header longer
// than this goes to net/http.
const bufSize = 4 << 10

// ServerConfig is what a Server needs from its owner.
type ServerConfig struct {
	// Handler serves a parsed request. w is a *ResponseWriter; r, its
	// header and URL are reused by the connection's next request, so the
	// handler keeps nothing of them after it returns. r's context ends
	// when the client goes away or the Server is closed. abort reports a
	// response cut short: the connection is then closed, so that the
	// client cannot take it for a whole one. A panic closes only its
	// connection (http.ErrAbortHandler silently).
	Handler func(w http.ResponseWriter, r *http.Request) (abort bool)
	// ReadHeaderTimeout bounds the wait for a connection's first request
	// header, and for the rest of any header once its first bytes came.
	// Zero: no timeout.
	ReadHeaderTimeout time.Duration
	// IdleTimeout bounds the wait for the next request after a response.
	// Zero: no timeout.
	IdleTimeout time.Duration
	// Logger gets the panics of handlers; nil discards them.
	Logger *slog.Logger
	// WorkerIdle is how long a goroutine that served a connection waits
	// for another before it ends (see work). Zero: DefaultWorkerIdle.
	WorkerIdle time.Duration
}

// DefaultWorkerIdle is ServerConfig.WorkerIdle's default.
const DefaultWorkerIdle = 2 * time.Second

// Server serves HTTP/1.1 client connections from a listener, handing
// those it does not serve to the net/http server on HandedOff.
type Server struct {
	cfg  ServerConfig
	log  *slog.Logger
	ln   net.Listener
	slow *handback.Listener // connections handed to net/http

	ctx    context.Context // ends on Close: in-flight requests abort
	cancel context.CancelFunc

	shutdown atomic.Bool
	quit     chan struct{} // closed by the first beginShutdown: idle workers end
	idle     chan *conn    // idle workers wait here for a connection (work)
	mu       sync.Mutex
	conns    map[*conn]struct{}
	wg       sync.WaitGroup // workers

	date atomic.Pointer[dateValue] // see httpDate
}

// NewServer returns a Server for ln; it starts no goroutine.
func NewServer(ln net.Listener, cfg ServerConfig) *Server {
	s := &Server{cfg: cfg, log: cfg.Logger, ln: ln, conns: map[*conn]struct{}{}, quit: make(chan struct{}), idle: make(chan *conn)}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.cfg.WorkerIdle <= 0 {
		s.cfg.WorkerIdle = DefaultWorkerIdle
	}
	s.slow = handback.New(ln.Addr())
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// HandedOff returns the listener whose Accept yields the connections the
// Server leaves to net/http; serve an http.Server with the same timeouts
// and the same handler on it. That server's Shutdown or Close closes it.
func (s *Server) HandedOff() net.Listener { return s.slow }

// Serve accepts connections until the listener closes; after Shutdown or
// Close it returns http.ErrServerClosed. Temporary accept errors (EMFILE
// and the like) back off, as net/http's do.
func (s *Server) Serve() error {
	var backoff time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if s.shutdown.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				t := time.NewTimer(backoff)
				select {
				case <-t.C:
				case <-s.ctx.Done():
					t.Stop()
				}
				continue
			}
			return err
		}
		backoff = 0
		sc := s.track(c)
		if sc == nil {
			c.Close()
			continue
		}
		select {
		case s.idle <- sc:
		default:
			s.wg.Go(func() { s.work(sc) })
		}
	}
}

// work serves c, then each connection Serve hands it while it waits idle,
// until it waited WorkerIdle or the server shuts down.
//
// NB: a new goroutine per connection grew its stack in the middle of its
// first request (the proxy's call chain is deep), and for clients that
// open a connection per request copying it was a large share of the
// gateway's CPU. A worker that served a connection already has the stack
// the next one needs.
func (s *Server) work(c *conn) {
	t := time.NewTimer(s.cfg.WorkerIdle)
	defer t.Stop()
	for {
		s.serveConn(c)
		t.Reset(s.cfg.WorkerIdle)
		select {
		case c = <-s.idle:
		case <-t.C:
			return
		case <-s.quit:
			return
		}
	}
}

// Shutdown stops accepting, closes the idle connections and each busy one
// after its response, and waits for them or for ctx to end (its error).
// Connections handed off are the http.Server's to shut down.
func (s *Server) Shutdown(ctx context.Context) error {
	s.beginShutdown()
	done := make(chan struct{})
	go func() {
		s.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops accepting, aborts every connection and its request (their
// contexts end), and waits for them.
func (s *Server) Close() {
	s.beginShutdown()
	s.cancel()
	s.mu.Lock()
	for c := range s.conns {
		c.abandon()
		c.c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// beginShutdown stops accepting and closes the idle connections; busy
// ones close after their response.
func (s *Server) beginShutdown() {
	if !s.shutdown.Swap(true) {
		close(s.quit)
	}
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		if c.state.CompareAndSwap(connIdle, connClosing) {
			c.c.Close()
		}
	}
	s.mu.Unlock()
}

// conn states.
const (
	connIdle    int32 = iota // waiting for a request
	connActive               // a request is being read or served
	connClosing              // shutdown closed it while idle
)

// conn is one client connection.
type conn struct {
	s      *Server
	c      net.Conn
	io     *connIO // c as in is filled from it and bw writes it
	in     inBuf
	bw     *bufio.Writer
	state  atomic.Int32
	ctx    context.Context
	cancel context.CancelFunc
	req    *http.Request
	url    url.URL
	w      ResponseWriter
	hook   ClientHook // aborts the running exchange when c is abandoned

	// rdl is the read deadline set on c (zero: none known), kept while it
	// is within deadlineSlack after the one wanted (see readDeadline).
	rdl time.Time

	// Where advance is between calls.
	inHeader    bool      // bytes of a request arrived; its header is not whole yet
	hdrDeadline bool      // the header's ReadHeaderTimeout is set
	served      bool      // a request was answered (the next wait is idle)
	now         time.Time // the end of the last response, if no write waited since the request began

	// The client-gone watch (see watchTick).
	watchT     *time.Timer
	watchArmed atomic.Bool  // watchT will fire (or its tick is running)
	watchReq   atomic.Int64 // number of the running watched request; 0: none
	watchSeen  atomic.Int64 // the request the last tick saw running
	reqs       int64        // requests begun on the connection
}

// inBuf is the client connection's read buffer: bytes b[r:w] are read
// and not consumed.
type inBuf struct {
	b    []byte
	r, w int
}

func (b *inBuf) buffered() []byte { return b.b[b.r:b.w] }

// space returns the room left for reading, moving what is buffered to
// the front first when that makes room.
func (b *inBuf) space() []byte {
	if b.r == b.w {
		b.r, b.w = 0, 0
	} else if b.w == len(b.b) && b.r > 0 {
		b.w = copy(b.b, b.b[b.r:b.w])
		b.r = 0
	}
	return b.b[b.w:]
}

// watchDelay is the period of a busy connection's watch timer: a request
// running at two ticks in a row (so for at least watchDelay) gets its
// client connection looked at for the client going away, at that tick and
// every one after. NB: most requests end well before, and cost two atomic
// stores (a timer Reset and Stop per request cost more); the timer keeps
// ticking while requests follow one another and stops at the first tick
// that finds the connection idle; a look costs one non-blocking peek.
const watchDelay = 100 * time.Millisecond

// beginWatched marks request n running and watchable.
func (c *conn) beginWatched(n int64) {
	c.watchReq.Store(n)
	if c.watchArmed.CompareAndSwap(false, true) {
		// NB: the request began before the timer was armed: it has run
		// for at least watchDelay when the timer fires.
		c.watchSeen.Store(n)
		c.watchT.Reset(watchDelay)
	}
}

// watchTick runs in the timer's goroutine. When a request it also saw
// running at the previous tick finds the client gone (peerclosed.Closed),
// the connection's context ends, which aborts the exchange attached to
// its hook; otherwise it looks again in watchDelay, or disarms when no
// request runs.
func (c *conn) watchTick() {
	for {
		n := c.watchReq.Load()
		if n > 0 {
			if c.watchSeen.Swap(n) == n && peerclosed.Closed(c.c) {
				c.abandon()
				return // NB: stays armed: the connection is ending
			}
			c.watchT.Reset(watchDelay)
			return
		}
		// NB: disarm, then look again: a request that began after the
		// load above either sees the timer disarmed and arms it, or is
		// seen here.
		c.watchArmed.Store(false)
		if c.watchReq.Load() <= 0 || !c.watchArmed.CompareAndSwap(false, true) {
			return
		}
	}
}

// readDeadline makes sure reads on c end between d and d plus its slack
// from now (zero: read the clock); d zero means no deadline.
func (c *conn) readDeadline(d time.Duration, now time.Time) {
	if d <= 0 {
		if !c.rdl.IsZero() {
			c.rdl = time.Time{}
			c.c.SetReadDeadline(c.rdl)
		}
		return
	}
	if now.IsZero() {
		now = time.Now()
	}
	want := now.Add(d)
	if c.rdl.Before(want) || c.rdl.After(want.Add(deadlineSlack(d))) {
		c.rdl = want.Add(deadlineSlack(d))
		c.c.SetReadDeadline(c.rdl)
	}
}

func (s *Server) track(nc net.Conn) *conn {
	// NB: not derived from s.ctx: Close ends each tracked connection's
	// context itself (abandon), and a child of s.ctx cost a registration
	// in its map and a removal for every connection.
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{s: s, c: nc, ctx: ctx, cancel: cancel}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown.Load() {
		cancel()
		return nil
	}
	s.conns[c] = struct{}{}
	return c
}

func (s *Server) untrack(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	c.cancel()
}

// abandon ends c's context and aborts the exchange its request is
// running, if any: the client has gone, or the server is closing. NB: the
// two are one call, not an AfterFunc on the context, which cost three
// allocations and a registration for every connection.
func (c *conn) abandon() {
	c.cancel()
	c.hook.fire()
}

func (s *Server) serveConn(c *conn) {
	handedOff, reuse := false, false
	defer func() {
		if c.watchT != nil {
			c.watchT.Stop()
		}
		// As net/http does: a panicking request closes its connection,
		// not the server.
		if err := recover(); err != nil {
			reuse = false
			if err != http.ErrAbortHandler {
				buf := make([]byte, 64<<10)
				buf = buf[:runtime.Stack(buf, false)]
				s.log.Error("h1: panic serving a request", "remote", c.c.RemoteAddr().String(), "err", err, "stack", string(buf))
			}
		}
		if !handedOff {
			c.c.Close()
		}
		if reuse {
			putConnBufs(c)
		}
		s.untrack(c)
	}()
	c.io = newConnIO(c.c, c.c)
	c.in.b, c.bw = getConnBufs(c.io)
	c.watchT = time.AfterFunc(time.Hour, c.watchTick)
	c.watchT.Stop()
	c.req = (&http.Request{}).WithContext(c.ctx)
	c.req.Header = make(http.Header, 8)
	c.req.RemoteAddr = remoteAddr(c.c)
	if tc, ok := c.c.(*tls.Conn); ok {
		// NB: handshake before the first read, so every request carries
		// its state (r.TLS: X-Forwarded-Proto), within the header timeout.
		if !s.handshake(tc) {
			return
		}
		st := tc.ConnectionState()
		c.req.TLS = &st
	}
	c.w.c = c
	c.w.h = make(http.Header, 8)
	var st step
	if c.io.rc != nil {
		st = c.serveRaw(c.io.rc)
	} else {
		st = c.serveReads()
	}
	if st == stepHandoff {
		handedOff = s.handoff(c)
		return // NB: net/http may hold the read bytes
	}
	reuse = true
}

// A connection's read buffer and writer, reused once it is closed. NB: a
// client that opens a connection per request otherwise costs the
// allocation of both and their collection on every request.
var (
	connReadBufs = sync.Pool{New: func() any { return new([bufSize]byte) }}
	connWriters  = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, bufSize) }}
)

func getConnBufs(x *connIO) ([]byte, *bufio.Writer) {
	bw := connWriters.Get().(*bufio.Writer)
	bw.Reset(x)
	return connReadBufs.Get().(*[bufSize]byte)[:], bw
}

// putConnBufs gives c's buffers back; c must not use them again.
func putConnBufs(c *conn) {
	if len(c.in.b) == bufSize {
		connReadBufs.Put((*[bufSize]byte)(c.in.b))
	}
	c.in.b = nil
	c.bw.Reset(nil)
	connWriters.Put(c.bw)
	c.bw = nil
}

// handshake runs a TLS connection's handshake within ReadHeaderTimeout.
func (s *Server) handshake(tc *tls.Conn) bool {
	ctx := s.ctx
	if d := s.cfg.ReadHeaderTimeout; d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	if err := tc.HandshakeContext(ctx); err != nil {
		s.log.Debug("h1: TLS handshake failed", "remote", tc.RemoteAddr().String(), "err", err)
		return false
	}
	return true
}

// step is what advance leaves the connection to do.
type step int

const (
	stepWait    step = iota // read more: the deadline for it is set
	stepStop                // close the connection
	stepHandoff             // hand it, with what is buffered, to net/http
)

// serveRaw serves the connection inside one RawConn.Read: the callback
// reads what arrived, serves every whole request (advance), and waits
// for the poller (false) once a read left the socket empty.
//
// NB: RawConn.Read forgets the poller's readiness only when it begins.
// Readiness that comes while a request is served (the next request, the
// client's close) is kept, and the wait that follows ends at once. So the
// connection is never read to find out whether the client sent anything:
// such a read, right after the response went out, failed with EAGAIN for
// most requests and cost a syscall and a park. Nothing else reads the
// connection meanwhile: the client-gone watch only peeks (peerclosed.Closed).
func (c *conn) serveRaw(rc syscall.RawConn) step {
	st := c.advance() // the first request's deadline
	if st != stepWait {
		return st
	}
	err := rc.Read(func(fd uintptr) bool {
		c.io.fd = int(fd) // held open by this Read
		for {
			p := c.in.space()
			n, errno := readFD(fd, p)
			switch {
			case errno == syscall.EAGAIN:
				return false
			case errno == syscall.EINTR:
				continue
			case errno != 0 || n == 0:
				st = stepStop // EOF or a reset
				return true
			}
			c.in.w += n
			if st = c.advance(); st != stepWait {
				return true
			}
			if n < len(p) {
				return false // the socket is empty
			}
		}
	})
	c.io.fd = -1
	if err != nil {
		return stepStop // a deadline, or Close by shutdown
	}
	return st
}

// serveReads is serveRaw for a connection without raw access: blocking
// reads through connIO.
func (c *conn) serveReads() step {
	for {
		if st := c.advance(); st != stepWait {
			return st
		}
		n, err := c.io.Read(c.in.space())
		c.in.w += n
		if err != nil {
			return stepStop // idle timeout, EOF, or closed by shutdown
		}
	}
}

// advance serves the whole requests in c.in, in order, and sets the read
// deadline for what it waits for next. Plain requests are served here;
// the first one that is not goes to net/http (stepHandoff).
func (c *conn) advance() step {
	cfg := &c.s.cfg
	for {
		buf := c.in.buffered()
		if !c.inHeader {
			if len(buf) == 0 {
				d := cfg.IdleTimeout
				if !c.served {
					d = cfg.ReadHeaderTimeout
				}
				c.readDeadline(d, c.now)
				return stepWait
			}
			if !c.state.CompareAndSwap(connIdle, connActive) {
				return stepStop
			}
			c.inHeader, c.hdrDeadline = true, false
		}
		end, bare := headerEnd(buf)
		if bare {
			return stepHandoff
		}
		if end < 0 {
			if len(buf) == len(c.in.b) {
				return stepHandoff // too long for this buffer
			}
			if !c.hdrDeadline {
				c.hdrDeadline = true
				c.readDeadline(cfg.ReadHeaderTimeout, time.Time{})
			}
			return stepWait
		}
		if !c.parse(buf[:end]) {
			return stepHandoff
		}
		c.in.r += end
		c.inHeader = false
		if !c.serve() {
			return stepStop
		}
	}
}

// serve runs the handler on the request parsed into c.req and writes its
// response; false ends the connection.
func (c *conn) serve() bool {
	c.w.reset(c.req)
	// NB: a connection with a pipelined request buffered is not
	// watched: the client is there.
	c.reqs++
	c.io.writeWaited = false
	watched := len(c.in.buffered()) == 0
	if watched {
		c.beginWatched(c.reqs)
	}
	abort := c.s.cfg.Handler(&c.w, c.req)
	if watched {
		c.watchReq.Store(0)
	}
	if abort || !c.w.wroteHeader && c.ctx.Err() != nil {
		return false
	}
	if err := c.w.finish(); err != nil || c.w.close {
		return false
	}
	c.served = true
	c.now = c.w.now
	if c.io.writeWaited {
		c.now = time.Time{}
	}
	c.state.Store(connIdle)
	return !c.s.shutdown.Load()
}

// handoff gives c, with what it has buffered, to the net/http server;
// false if it was not taken (closed meanwhile).
func (s *Server) handoff(c *conn) bool {
	// NB: net/http sets the read deadline of every request it reads,
	// replacing the one left here.
	return s.slow.Hand(c.c, bytes.Clone(c.in.buffered()), s.ctx.Done())
}

// dateValue is a Date header value and the unix second it names.
type dateValue struct {
	sec int64
	b   []byte
}

// httpDate returns the Date header value for now (the zero time: read the
// clock), formatted once a second for the whole server: a client that
// opens a connection per request would otherwise cost a formatting and
// its allocations on every request. The value is never modified once
// stored, so it may be written to a connection as is.
func (c *conn) httpDate(now time.Time) []byte {
	if now.IsZero() {
		now = time.Now()
	}
	sec := now.Unix()
	if d := c.s.date.Load(); d != nil && d.sec == sec {
		return d.b
	}
	d := &dateValue{sec: sec, b: now.UTC().AppendFormat(nil, http.TimeFormat)}
	c.s.date.Store(d)
	return d.b
}

// remoteAddr is nc's remote address as net.TCPAddr.String spells it, in
// one allocation instead of its four.
func remoteAddr(nc net.Conn) string {
	ta, ok := nc.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return nc.RemoteAddr().String()
	}
	ap := ta.AddrPort()
	if !ap.Addr().IsValid() {
		return ta.String()
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String()
}
