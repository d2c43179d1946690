package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/lodestone-kv/lodestone/internal/peerclosed"
)

// The client side of the proxy listener. One goroutine per client
// connection reads a request, proxies it and writes the response, then
// reads the next: no per-request goroutine, no background read, no
// per-request header map (the connection's request and response headers
// are reused), one write syscall per small response. On Linux the whole
// loop runs inside one RawConn.Read of the connection (serveRaw), so the
// connection is read when the poller says it has bytes, never to find out.
//
// Only plain requests take it: HTTP/1.1, origin-form target, no body
// (no Content-Length other than 0, no Transfer-Encoding), no Upgrade or
// Expect, valid header names and values, a header that fits the read
// buffer. The first request that is anything else hands the connection,
// with the bytes read so far, to the net/http server (front.slow), which
// serves it from then on: bodies, WebSocket upgrades, malformed requests
// and their 400s behave exactly as net/http makes them.
//
// NB: net/http's server cancels a request's context when the client
// closes its connection, with a background read started for every
// request. Here a request that is still running after one to two
// watchDelays gets a look at the connection every watchDelay (watchTick);
// quicker ones cost two atomic stores.

// frontBufSize is the client read and write buffer: a request header
// longer than this goes to net/http.
const frontBufSize = 4 << 10

// front serves the proxy listener.
type front struct {
	g    *Gateway
	ln   net.Listener
	slow *handoffListener // connections handed to g.proxySrv

	ctx    context.Context // ends on hard close: in-flight requests abort
	cancel context.CancelFunc

	shutdown atomic.Bool
	mu       sync.Mutex
	conns    map[*frontConn]struct{}
	wg       sync.WaitGroup // serveConn goroutines
}

func newFront(g *Gateway, ln net.Listener) *front {
	f := &front{g: g, ln: ln, conns: map[*frontConn]struct{}{}}
	f.slow = &handoffListener{addr: ln.Addr(), ch: make(chan net.Conn), done: make(chan struct{})}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	return f
}

// serve accepts until the listener closes.
func (f *front) serve() error {
	var backoff time.Duration
	for {
		c, err := f.ln.Accept()
		if err != nil {
			if f.shutdown.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// As net/http does: back off on EMFILE and the like.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				t := time.NewTimer(backoff)
				select {
				case <-t.C:
				case <-f.ctx.Done():
					t.Stop()
				}
				continue
			}
			return err
		}
		backoff = 0
		fc := f.track(c)
		if fc == nil {
			c.Close()
			continue
		}
		f.wg.Go(func() { f.serveConn(fc) })
	}
}

// frontConn states.
const (
	connIdle    int32 = iota // waiting for a request
	connActive               // a request is being read or served
	connClosing              // shutdown closed it while idle
)

// frontConn is one client connection on the fast path.
type frontConn struct {
	f      *front
	c      net.Conn
	io     *connIO // c as in is filled from it and bw writes it
	in     inBuf
	bw     *bufio.Writer
	state  atomic.Int32
	ctx    context.Context
	cancel context.CancelFunc
	req    *http.Request
	url    url.URL
	w      frontWriter
	hook   clientHook // cuts the running fast-path exchange when ctx ends

	dateSec int64 // unix second of date
	date    []byte

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
func (fc *frontConn) beginWatched(n int64) {
	fc.watchReq.Store(n)
	if fc.watchArmed.CompareAndSwap(false, true) {
		// NB: the request began before the timer was armed: it has run
		// for at least watchDelay when the timer fires.
		fc.watchSeen.Store(n)
		fc.watchT.Reset(watchDelay)
	}
}

// watchTick runs in the timer's goroutine. When a request it also saw
// running at the previous tick finds the client gone (peerclosed.Closed), the
// connection's context ends, which aborts the attempt (h1RoundTrip's
// hook); otherwise it looks again in watchDelay, or disarms when no
// request runs.
func (fc *frontConn) watchTick() {
	for {
		n := fc.watchReq.Load()
		if n > 0 {
			if fc.watchSeen.Swap(n) == n && peerclosed.Closed(fc.c) {
				fc.cancel()
				return // NB: stays armed: the connection is ending
			}
			fc.watchT.Reset(watchDelay)
			return
		}
		// NB: disarm, then look again: a request that began after the
		// load above either sees the timer disarmed and arms it, or is
		// seen here.
		fc.watchArmed.Store(false)
		if fc.watchReq.Load() <= 0 || !fc.watchArmed.CompareAndSwap(false, true) {
			return
		}
	}
}

// deadlineSlack is how late a client read deadline may be, so that a busy
// connection re-arms it only now and then: a timer update per request
// cost more than the request's parsing. nginx lets its timers drift up to
// 300 ms for the same reason (NGX_TIMER_LAZY_DELAY).
func deadlineSlack(d time.Duration) time.Duration { return min(d/64, 250*time.Millisecond) }

// readDeadline makes sure reads on c end between d and d plus its slack
// from now (zero: read the clock).
func (fc *frontConn) readDeadline(d time.Duration, now time.Time) {
	if now.IsZero() {
		now = time.Now()
	}
	want := now.Add(d)
	if fc.rdl.Before(want) || fc.rdl.After(want.Add(deadlineSlack(d))) {
		fc.rdl = want.Add(deadlineSlack(d))
		fc.c.SetReadDeadline(fc.rdl)
	}
}

func (f *front) track(c net.Conn) *frontConn {
	ctx, cancel := context.WithCancel(f.ctx)
	fc := &frontConn{f: f, c: c, ctx: ctx, cancel: cancel}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.shutdown.Load() {
		cancel()
		return nil
	}
	f.conns[fc] = struct{}{}
	return fc
}

func (f *front) untrack(fc *frontConn) {
	f.mu.Lock()
	delete(f.conns, fc)
	f.mu.Unlock()
	fc.cancel()
}

// beginShutdown stops accepting and closes the idle connections; busy
// ones close after their response.
func (f *front) beginShutdown() {
	f.shutdown.Store(true)
	f.ln.Close()
	f.mu.Lock()
	for fc := range f.conns {
		if fc.state.CompareAndSwap(connIdle, connClosing) {
			fc.c.Close()
		}
	}
	f.mu.Unlock()
}

// wait waits for every connection goroutine, or until ctx ends.
func (f *front) wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		f.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// closeAll aborts every connection and its request, and waits for them.
func (f *front) closeAll() {
	f.cancel()
	f.mu.Lock()
	for fc := range f.conns {
		fc.c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *front) serveConn(fc *frontConn) {
	handedOff := false
	stopHook := context.AfterFunc(fc.ctx, fc.hook.fire)
	defer func() {
		stopHook()
		if fc.watchT != nil {
			fc.watchT.Stop()
		}
		// As net/http does: a panicking request closes its connection,
		// not the gateway.
		if err := recover(); err != nil && err != http.ErrAbortHandler {
			buf := make([]byte, 64<<10)
			buf = buf[:runtime.Stack(buf, false)]
			f.g.log.Error("gateway: panic serving a request", "remote", fc.c.RemoteAddr().String(), "err", err, "stack", string(buf))
		}
		if !handedOff {
			fc.c.Close()
		}
		f.untrack(fc)
	}()
	fc.io = newConnIO(fc.c, fc.c)
	fc.in.b = make([]byte, frontBufSize)
	fc.watchT = time.AfterFunc(time.Hour, fc.watchTick)
	fc.watchT.Stop()
	fc.bw = bufio.NewWriterSize(fc.io, frontBufSize)
	fc.req = (&http.Request{}).WithContext(fc.ctx)
	fc.req.Header = make(http.Header, 8)
	fc.req.RemoteAddr = fc.c.RemoteAddr().String()
	fc.w.fc = fc
	fc.w.h = make(http.Header, 8)
	var step frontStep
	if fc.io.rc != nil {
		step = fc.serveRaw(fc.io.rc)
	} else {
		step = fc.serveReads()
	}
	if step == stepHandoff {
		handedOff = f.handoff(fc)
	}
}

// frontStep is what advance leaves the connection to do.
type frontStep int

const (
	stepWait    frontStep = iota // read more: the deadline for it is set
	stepStop                     // close the connection
	stepHandoff                  // hand it, with what is buffered, to net/http
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
func (fc *frontConn) serveRaw(rc syscall.RawConn) frontStep {
	step := fc.advance() // the first request's deadline
	if step != stepWait {
		return step
	}
	err := rc.Read(func(fd uintptr) bool {
		fc.io.fd = int(fd) // held open by this Read
		for {
			p := fc.in.space()
			n, errno := readFD(fd, p)
			switch {
			case errno == syscall.EAGAIN:
				return false
			case errno == syscall.EINTR:
				continue
			case errno != 0 || n == 0:
				step = stepStop // EOF or a reset
				return true
			}
			fc.in.w += n
			if step = fc.advance(); step != stepWait {
				return true
			}
			if n < len(p) {
				return false // the socket is empty
			}
		}
	})
	fc.io.fd = -1
	if err != nil {
		return stepStop // a deadline, or Close by shutdown
	}
	return step
}

// serveReads is serveRaw for a connection without raw access: blocking
// reads through connIO.
func (fc *frontConn) serveReads() frontStep {
	for {
		if step := fc.advance(); step != stepWait {
			return step
		}
		n, err := fc.io.Read(fc.in.space())
		fc.in.w += n
		if err != nil {
			return stepStop // idle timeout, EOF, or closed by shutdown
		}
	}
}

// advance serves the whole requests in fc.in, in order, and sets the
// read deadline for what it waits for next. Plain requests are proxied
// here; the first one that is not goes to net/http (stepHandoff).
func (fc *frontConn) advance() frontStep {
	cfg := &fc.f.g.cfg
	for {
		buf := fc.in.buffered()
		if !fc.inHeader {
			if len(buf) == 0 {
				d := cfg.ClientIdleTimeout
				if !fc.served {
					d = cfg.ReadHeaderTimeout
				}
				fc.readDeadline(d, fc.now)
				return stepWait
			}
			if !fc.state.CompareAndSwap(connIdle, connActive) {
				return stepStop
			}
			fc.inHeader, fc.hdrDeadline = true, false
		}
		end, bare := headerEnd(buf)
		if bare {
			return stepHandoff
		}
		if end < 0 {
			if len(buf) == len(fc.in.b) {
				return stepHandoff // too long for the fast path
			}
			if !fc.hdrDeadline {
				fc.hdrDeadline = true
				fc.readDeadline(cfg.ReadHeaderTimeout, time.Time{})
			}
			return stepWait
		}
		if !fc.parse(buf[:end]) {
			return stepHandoff
		}
		fc.in.r += end
		fc.inHeader = false
		if !fc.serve() {
			return stepStop
		}
	}
}

// serve proxies the request parsed into fc.req and writes its response;
// false ends the connection.
func (fc *frontConn) serve() bool {
	fc.w.reset(fc.req)
	// NB: a connection with a pipelined request buffered is not
	// watched: the client is there.
	fc.reqs++
	fc.io.writeWaited = false
	watched := len(fc.in.buffered()) == 0
	if watched {
		fc.beginWatched(fc.reqs)
	}
	abort := fc.f.g.handle(&fc.w, fc.req)
	if watched {
		fc.watchReq.Store(0)
	}
	if abort || !fc.w.wroteHeader && fc.ctx.Err() != nil {
		return false
	}
	if err := fc.w.finish(); err != nil || fc.w.close {
		return false
	}
	fc.served = true
	fc.now = fc.w.now
	if fc.io.writeWaited {
		fc.now = time.Time{}
	}
	fc.state.Store(connIdle)
	return !fc.f.shutdown.Load()
}

// handoff gives fc, with what it has buffered, to the net/http server.
func (f *front) handoff(fc *frontConn) bool {
	c := net.Conn(fc.c)
	if b := fc.in.buffered(); len(b) > 0 {
		c = &prefixConn{Conn: fc.c, prefix: bytes.Clone(b)}
	}
	return f.slow.hand(c)
}

// headerEnd returns the length of the header in b up to and including its
// empty line (-1: not all there yet), and whether a line ends in a bare LF.
func headerEnd(b []byte) (int, bool) {
	for pos := 0; ; {
		i := bytes.IndexByte(b[pos:], '\n')
		if i < 0 {
			return -1, false
		}
		if i == 0 || b[pos+i-1] != '\r' {
			return -1, true
		}
		if i == 1 {
			return pos + 2, false
		}
		pos += i + 1
	}
}

// parse fills fc.req from a whole header block (request line, header
// lines, empty line; CRLF line ends). It reports false for anything the
// fast path leaves to net/http.
func (fc *frontConn) parse(b []byte) bool {
	if len(b) < 16 || b[0] == '\r' {
		return false
	}
	s := string(b) // NB: the one allocation; every string below is a substring
	line, rest, _ := strings.Cut(s, "\r\n")
	method, line, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(line, " ")
	if !ok1 || !ok2 || proto != "HTTP/1.1" || !validMethod(method) || len(target) == 0 || target[0] != '/' {
		return false
	}
	r := fc.req
	h := r.Header
	if len(h) > 0 {
		clear(h) // NB: clear costs even on an empty map once it had entries
	}
	var vals []string // made at the first field kept in h (Host is not)
	nv := 0
	host, hosts := "", 0
	r.Close = false
	for {
		var k, value string
		var end, ok bool
		if k, value, rest, end, ok = nextHeaderLine(rest); end {
			break
		} else if !ok {
			return false // also obs-fold: a line starting with a space
		}
		switch k {
		case "Host":
			host, hosts = value, hosts+1
			continue
		case "Content-Length":
			if value != "0" || h["Content-Length"] != nil {
				return false
			}
		case "Transfer-Encoding", "Upgrade", "Expect":
			return false
		case "Connection":
			if hasToken(value, "close") {
				r.Close = true
			}
		}
		if vals == nil {
			vals = make([]string, strings.Count(rest, "\n")+1)
		}
		if nv == len(vals) {
			return false // cannot happen: one value per line
		}
		vals[nv] = value
		if vv := h[k]; vv != nil {
			h[k] = append(vv, value)
		} else {
			h[k] = vals[nv : nv+1 : nv+1]
		}
		nv++
	}
	if hosts != 1 || !httpguts.ValidHostHeader(host) {
		return false
	}
	// As net/http does for HTTP/1.0 caches.
	if pragma := h["Pragma"]; len(pragma) > 0 && pragma[0] == "no-cache" && h["Cache-Control"] == nil {
		h["Cache-Control"] = []string{"no-cache"}
	}
	if !fc.setURL(target) {
		return false
	}
	r.Method = method
	r.RequestURI = target
	r.Host = host
	r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.1", 1, 1
	r.ContentLength = 0
	r.Body = http.NoBody
	return true
}

// setURL sets fc.req.URL for an origin-form target, as url.ParseRequestURI
// would, without allocating for the plain ones.
func (fc *frontConn) setURL(target string) bool {
	path, query, _ := strings.Cut(target, "?")
	plain := true
	for i := 0; i < len(path); i++ {
		if !plainPathByte(path[i]) {
			plain = false
			break
		}
	}
	for i := 0; i < len(query); i++ {
		if c := query[i]; c <= ' ' || c == 0x7f || c == '#' {
			plain = false
			break
		}
	}
	if plain {
		fc.url = url.URL{Path: path, RawQuery: query}
		fc.req.URL = &fc.url
		return true
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return false
	}
	fc.req.URL = u
	return true
}

// plainPathByte reports bytes url.URL keeps as they are in a path
// (unreserved, sub-delims, ':', '@', '/').
func plainPathByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '-', '.', '_', '~', '!', '$', '&', '\'', '(', ')', '*', '+', ',', ';', '=', ':', '@', '/':
		return true
	}
	return false
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		if !httpguts.IsTokenRune(rune(m[i])) {
			return false
		}
	}
	return true
}

// hasToken reports whether the comma-separated list v holds token
// (case-insensitive).
func hasToken(v, token string) bool {
	for f := range strings.SplitSeq(v, ",") {
		if strings.EqualFold(strings.TrimSpace(f), token) {
			return true
		}
	}
	return false
}

// frontWriter is the http.ResponseWriter (and http.Flusher) of the fast
// path. It renders what net/http's server would: Date, sniffed
// Content-Type, Content-Length when the handler set it or the whole body
// fit before the handler returned, chunked otherwise (with trailers), and
// no body for HEAD, 1xx, 204 and 304.
type frontWriter struct {
	fc          *frontConn
	h           http.Header
	head        bool // HEAD request
	close       bool // Connection: close after this response
	status      int
	wroteHeader bool
	committed   bool // the header is in bw
	chunked     bool
	noBody      bool
	hasCL       bool
	hasType     bool
	hasDate     bool
	trailers    []string // declared trailer keys
	hdr         []byte   // rendered status line and header fields
	pending     []byte   // body held back while the length is unknown
	err         error
	now         time.Time // a recent clock reading for Date (zero: read the clock); handle sets it
}

// pendingMax is how much body of unknown length is held back to be sent
// with a Content-Length instead of chunked (net/http holds 2 KiB).
const pendingMax = 2 << 10

func (w *frontWriter) reset(r *http.Request) {
	clear(w.h)
	w.head = r.Method == http.MethodHead
	w.close = r.Close
	w.status = 0
	w.wroteHeader, w.committed, w.chunked, w.noBody = false, false, false, false
	w.hasCL, w.hasType, w.hasDate = false, false, false
	w.trailers = w.trailers[:0]
	w.hdr = w.hdr[:0]
	w.pending = w.pending[:0]
	w.err = nil
	w.now = time.Time{}
}

func (w *frontWriter) Header() http.Header { return w.h }

func (w *frontWriter) WriteHeader(code int) {
	if !w.begin(code) {
		return
	}
	b := w.hdr
	for k, vv := range w.h {
		if !w.note(k, vv) || strings.HasPrefix(k, http.TrailerPrefix) || !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range vv {
			b = append(b, k...)
			b = append(b, ": "...)
			b = appendHeaderValue(b, v)
			b = append(b, "\r\n"...)
		}
	}
	w.hdr = b
}

// writeFields is WriteHeader for a header given as the end-to-end fields
// of a response parsed by the fast path (hfield: valid names and values),
// without a header map to fill and then walk.
func (w *frontWriter) writeFields(code int, fields []hfield) {
	if !w.begin(code) {
		return
	}
	b := w.hdr
	for _, f := range fields {
		vv := [1]string{f.v}
		if isHop(f.k) || !w.note(f.k, vv[:]) {
			continue
		}
		b = append(b, f.k...)
		b = append(b, ": "...)
		b = append(b, f.v...)
		b = append(b, "\r\n"...)
	}
	w.hdr = b
}

// begin starts the response's header with its status line; false if the
// header is written already or code is invalid.
func (w *frontWriter) begin(code int) bool {
	if w.wroteHeader || code < 100 || code > 999 {
		return false
	}
	w.wroteHeader = true
	w.status = code
	w.noBody = w.head || !bodyAllowed(code)
	b := append(w.hdr[:0], "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(code)...)
	w.hdr = append(b, "\r\n"...)
	return true
}

func bodyAllowed(code int) bool {
	return code >= 200 && code != http.StatusNoContent && code != http.StatusNotModified
}

// note records what header field k (values vv) means for the framing
// and reports whether it is written as it is.
func (w *frontWriter) note(k string, vv []string) bool {
	switch k {
	case "Transfer-Encoding":
		return false // the framing is ours
	case "Trailer":
		for _, v := range vv {
			for f := range strings.SplitSeq(v, ",") {
				if f = textproto.TrimString(f); f != "" {
					w.trailers = append(w.trailers, http.CanonicalHeaderKey(f))
				}
			}
		}
		return !w.noBody
	case "Content-Length":
		if !bodyAllowed(w.status) {
			return false
		}
		w.hasCL = true
	case "Content-Type":
		if w.status == http.StatusNotModified {
			return false
		}
		w.hasType = true
	case "Content-Encoding":
		w.hasType = w.hasType || len(vv) > 0 && vv[0] != "" // NB: never sniff encoded bodies
	case "Date":
		w.hasDate = true
	case "Connection":
		for _, v := range vv {
			if hasToken(v, "close") {
				w.close = true
			}
		}
		return false
	}
	return true
}

// appendHeaderValue appends v with CR and LF replaced by spaces and
// surrounding space trimmed, as net/http writes header values.
func appendHeaderValue(b []byte, v string) []byte {
	v = textproto.TrimString(v)
	if strings.ContainsAny(v, "\r\n") {
		v = strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
	}
	return append(b, v...)
}

func (w *frontWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.noBody {
		if !w.head {
			return 0, http.ErrBodyNotAllowed
		}
		return len(p), nil
	}
	if !w.committed {
		if !w.hasCL && len(w.pending)+len(p) <= pendingMax && len(w.trailers) == 0 {
			w.pending = append(w.pending, p...)
			return len(p), nil
		}
		w.chunked = !w.hasCL
		sniff := p
		if len(w.pending) > 0 {
			sniff = w.pending
		}
		w.commit(sniff, -1)
		if len(w.pending) > 0 {
			w.writeChunk(w.pending)
			w.pending = w.pending[:0]
		}
	}
	if err := w.writeChunk(p); err != nil {
		w.err = err
		return 0, err
	}
	return len(p), nil
}

// writeChunk writes p as body bytes (a chunk when chunked; nothing for
// an empty p); the error is the connection's.
func (w *frontWriter) writeChunk(p []byte) error {
	bw := w.fc.bw
	if len(p) == 0 {
		return nil
	}
	if !w.chunked {
		_, err := bw.Write(p)
		return err
	}
	var n [16]byte
	bw.Write(strconv.AppendInt(n[:0], int64(len(p)), 16))
	bw.WriteString("\r\n")
	bw.Write(p)
	_, err := bw.WriteString("\r\n")
	return err
}

// Flush sends what is written so far; an unknown length becomes chunked.
func (w *frontWriter) Flush() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return
	}
	if !w.committed {
		w.chunked = !w.hasCL && !w.noBody
		w.commit(w.pending, -1)
		if !w.noBody {
			w.writeChunk(w.pending)
		}
		w.pending = w.pending[:0]
	}
	if err := w.fc.bw.Flush(); err != nil {
		w.err = err
	}
}

// commit writes the header with its framing; sniff is the first body
// bytes (for Content-Type), cl a Content-Length to add (-1: none).
func (w *frontWriter) commit(sniff []byte, cl int) {
	w.committed = true
	bw := w.fc.bw
	bw.Write(w.hdr)
	if !w.noBody && !w.hasType && len(sniff) > 0 {
		bw.WriteString("Content-Type: ")
		bw.WriteString(http.DetectContentType(sniff))
		bw.WriteString("\r\n")
	}
	if !w.hasDate {
		bw.WriteString("Date: ")
		bw.Write(w.fc.httpDate(w.now))
		bw.WriteString("\r\n")
	}
	if cl >= 0 {
		var n [20]byte
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(n[:0], int64(cl), 10))
		bw.WriteString("\r\n")
	}
	if w.chunked {
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	if w.close {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
}

// finish completes the response (header if not out yet, held-back body,
// the last chunk and trailers) and flushes it in one write when it fits.
func (w *frontWriter) finish() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return w.err
	}
	bw := w.fc.bw
	if !w.committed {
		// NB: a body that fit in pending goes out with its length, as
		// net/http does; declared trailers need chunked.
		cl := -1
		if !w.hasCL && !w.noBody && len(w.trailers) == 0 {
			cl = len(w.pending)
		}
		w.chunked = cl < 0 && !w.hasCL && !w.noBody
		w.commit(w.pending, cl)
		if !w.noBody {
			w.writeChunk(w.pending)
		}
	}
	if w.chunked {
		bw.WriteString("0\r\n")
		for _, k := range w.trailers {
			for _, v := range w.h[k] {
				bw.WriteString(k)
				bw.WriteString(": ")
				bw.Write(appendHeaderValue(nil, v))
				bw.WriteString("\r\n")
			}
		}
		for k, vv := range w.h {
			if tk, ok := strings.CutPrefix(k, http.TrailerPrefix); ok {
				for _, v := range vv {
					bw.WriteString(tk)
					bw.WriteString(": ")
					bw.Write(appendHeaderValue(nil, v))
					bw.WriteString("\r\n")
				}
			}
		}
		bw.WriteString("\r\n")
	}
	return bw.Flush()
}

// httpDate returns the Date header value, formatted once a second, for
// now (the zero time: read the clock).
func (fc *frontConn) httpDate(now time.Time) []byte {
	if now.IsZero() {
		now = time.Now()
	}
	if s := now.Unix(); s != fc.dateSec || fc.date == nil {
		fc.dateSec = s
		fc.date = now.UTC().AppendFormat(fc.date[:0], http.TimeFormat)
	}
	return fc.date
}

// handoffListener is the net/http server's listener: it yields the
// connections the fast path hands over.
type handoffListener struct {
	addr net.Addr
	ch   chan net.Conn
	once sync.Once
	done chan struct{}
}

// hand gives c to the server; false (and c closed) when it has stopped.
func (l *handoffListener) hand(c net.Conn) bool {
	select {
	case l.ch <- c:
		return true
	case <-l.done:
		c.Close()
		return true // closed: nothing left for the caller to close
	}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return l.addr }

// prefixConn is a connection whose first reads return bytes already read
// from it.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(p, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// CloseWrite half-closes, as net/http does before closing after an error.
func (c *prefixConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

var _ io.Reader = (*prefixConn)(nil)
