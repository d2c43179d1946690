package gateway

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/net/http/httpguts"
)

// The HTTP/1.1 fast path. Requests without a body to plain-HTTP origins
// (nearly all proxied traffic) skip http.Transport: the request goroutine
// takes a keep-alive connection from its pool, writes the request straight
// from the inbound one (no header map is built), and reads the response on
// the same goroutine. http.Transport costs two goroutines per connection
// and two channel hand-offs per request; on one core that was a third of
// the gateway's CPU per request. Timeouts are connection deadlines: the
// write and the response header share ResponseHeaderTimeout, every body
// read gets IdleTimeout. Everything else (bodies, upgrades, h2c, TLS)
// goes through the pool's http.Transport.

// h1conn is one keep-alive connection of a pool's fast path.
type h1conn struct {
	c      net.Conn
	io     *connIO // c as br and bw read and write it
	br     *bufio.Reader
	bw     *bufio.Writer
	idleAt int64     // mono() when it went idle
	dl     time.Time // the deadline set on c (zero: none known), see h1Exchange
	ra     string    // the last request's RemoteAddr, and its host (clientIP)
	raIP   string

	// Reused by every exchange on the connection (one at a time): valid
	// until the connection goes back to its pool.
	resp   http.Response
	fields []hfield // the response's header fields, in order
	hdr    http.Header
	vals   []string // hdr's values; NB: whoever keeps a value past the exchange copies it (frontWriter renders the header, net/http clones it)
	body   clBody
	hb     h1Body
}

// hfield is one header field: canonical name, trimmed and valid value.
type hfield struct{ k, v string }

// h1idle is a pool's idle fast-path connections, most recently used last.
type h1idle struct {
	mu    sync.Mutex
	conns []*h1conn
}

// fastPath reports whether r to o can use the fast path.
func fastPath(o *origin, r *http.Request) bool {
	return o.proto == ProtocolHTTP && noBody(r) && !isUpgrade(r) &&
		len(r.TransferEncoding) == 0 && r.ProtoMajor == 1
}

// getH1 returns an idle connection (reused true) or dials a new one.
// now is mono().
//
// NB: with no idle connection of its own, the pool borrows one from
// another shard's pool to the same origin before it dials (the
// connection then goes back to this pool). A request picks its shard at
// random, so each shard's pool grew to the most requests its shard ever
// had in flight at once: 64 requests in flight to one origin over the
// 16 default shards kept 189 connections open to it (nginx: 64).
func (p *pool) getH1(ctx context.Context, now int64) (*h1conn, bool, error) {
	if hc := p.idleH1(now); hc != nil {
		return hc, true, nil
	}
	if ps := p.origin.pools.Load(); ps != nil {
		for _, q := range *ps {
			if q == p {
				continue
			}
			if hc := q.idleH1(now); hc != nil {
				return hc, true, nil
			}
		}
	}
	c, err := p.dial(ctx, "tcp", p.origin.host)
	if err != nil {
		return nil, false, err
	}
	raw := c
	if cc, ok := c.(*countedConn); ok {
		raw = cc.Conn
	}
	x := newConnIO(c, raw)
	x.own() // NB: a connection in use is closed only by its user
	return &h1conn{c: c, io: x, br: bufio.NewReaderSize(x, 4<<10), bw: bufio.NewWriterSize(x, 4<<10)}, false, nil
}

// idleH1 takes p's most recently used idle connection, closing those
// idle longer than the pool's idle timeout; nil if none is left. now is
// mono().
func (p *pool) idleH1(now int64) *h1conn {
	p.h1.mu.Lock()
	for n := len(p.h1.conns); n > 0; n = len(p.h1.conns) {
		hc := p.h1.conns[n-1]
		p.h1.conns[n-1] = nil
		p.h1.conns = p.h1.conns[:n-1]
		if now-hc.idleAt < int64(p.f.poolIdle) {
			p.h1.mu.Unlock()
			return hc
		}
		// The newest is too old: so are all the others.
		stale := append(p.h1.conns, hc)
		p.h1.conns = nil
		p.h1.mu.Unlock()
		for _, s := range stale {
			s.c.Close()
		}
		p.h1.mu.Lock()
	}
	p.h1.mu.Unlock()
	return nil
}

// putH1 returns hc to the idle list, or closes it when the pool is closed
// or already keeps as many idle connections as the origin's limit. now is
// mono().
func (p *pool) putH1(hc *h1conn, now int64) {
	hc.idleAt = now
	p.h1.mu.Lock()
	if p.closed.Load() || len(p.h1.conns) >= p.f.maxIdle {
		p.h1.mu.Unlock()
		hc.c.Close()
		return
	}
	p.h1.conns = append(p.h1.conns, hc)
	p.h1.mu.Unlock()
}

// closeH1 closes the idle fast-path connections (older than minAge nanos
// when minAge > 0, else all).
func (p *pool) closeH1(minAge int64) {
	now := mono()
	p.h1.mu.Lock()
	var drop []*h1conn
	keep := p.h1.conns[:0]
	for _, hc := range p.h1.conns {
		if minAge > 0 && now-hc.idleAt < minAge {
			keep = append(keep, hc)
		} else {
			drop = append(drop, hc)
		}
	}
	clear(p.h1.conns[len(keep):])
	p.h1.conns = keep
	p.h1.mu.Unlock()
	for _, hc := range drop {
		hc.c.Close()
	}
}

// errStaleConn marks a reused keep-alive connection the origin had closed
// before our request reached it: safe to send the request again.
var errStaleConn = errors.New("gateway: origin closed an idle connection")

// clientHook aborts the fast-path exchange running for a client
// connection when the client goes away (its context ends): one
// context.AfterFunc for the connection's life, where a hook per request
// cost an allocation and a registration on the context each time.
type clientHook struct {
	mu    sync.Mutex
	c     net.Conn // the running exchange's origin connection; nil between exchanges
	fired bool     // the client is gone (for good)
}

// fire runs once, when the client's context ends.
func (h *clientHook) fire() {
	h.mu.Lock()
	h.fired = true
	if h.c != nil {
		h.c.SetDeadline(aLongTimeAgo)
	}
	h.mu.Unlock()
}

// attach makes c the connection fire cuts (at once if it has fired).
func (h *clientHook) attach(c net.Conn) {
	h.mu.Lock()
	h.c = c
	if h.fired {
		c.SetDeadline(aLongTimeAgo)
	}
	h.mu.Unlock()
}

// detach ends the exchange's hook; false if the hook may have cut its
// connection.
func (h *clientHook) detach() bool {
	h.mu.Lock()
	h.c = nil
	fired := h.fired
	h.mu.Unlock()
	return !fired
}

// h1RoundTrip sends r (no body) on a fast-path connection of p and reads
// the response header. On success the returned body owns the connection
// until finishH1. path is the request-target to send. hook, when not nil,
// is r's client connection's (front.go); otherwise the exchange gets a
// hook of its own on r's context. now is the attempt's start.
func (g *Gateway) h1RoundTrip(p *pool, r *http.Request, path string, hook *clientHook, now time.Time) (*http.Response, *h1Body, error) {
	ctx := r.Context()
	for try := 0; ; try++ {
		if try > 0 {
			now = time.Now()
		}
		hc, reused, err := p.getH1(ctx, int64(now.Sub(epoch)))
		if err != nil {
			return nil, nil, err
		}
		// The client going away aborts the wait for the origin, and later
		// the body copy.
		var stop func() bool
		if hook != nil {
			hook.attach(hc.c)
		} else {
			stop = context.AfterFunc(ctx, func() { hc.c.SetDeadline(aLongTimeAgo) })
		}
		// NB: a client connection of front.go renders the response
		// header straight from its fields (frontWriter.writeFields).
		resp, err := g.h1Exchange(hc, r, path, now, hook != nil)
		if err == nil {
			b := &hc.hb
			*b = h1Body{body: resp.Body, hc: hc, idle: g.cfg.IdleTimeout, ctx: ctx, hook: hook, stop: stop, at: time.Now()}
			resp.Body = b
			return resp, b, nil
		}
		if hook != nil {
			hook.detach()
		} else {
			stop()
		}
		hc.c.Close()
		// NB: a keep-alive connection the origin closed while it sat idle
		// fails at once with EOF or a reset before any byte of a response:
		// send again on a fresh connection (Transport does the same).
		if reused && try == 0 && errors.Is(err, errStaleConn) && idempotent(r.Method) && ctx.Err() == nil {
			continue
		}
		return nil, nil, err
	}
}

// h1Exchange writes the request and reads the response header on hc;
// now is the attempt's start; fieldsOnly is readResponse's.
func (g *Gateway) h1Exchange(hc *h1conn, r *http.Request, path string, now time.Time, fieldsOnly bool) (*http.Response, error) {
	ctx := r.Context()
	// NB: the write and the response header share ResponseHeaderTimeout,
	// late by at most its slack: a connection busy with one request after
	// another re-arms its deadline only now and then.
	d := g.cfg.ResponseHeaderTimeout
	if want := now.Add(d); hc.dl.Before(want) || hc.dl.After(want.Add(deadlineSlack(d))) {
		hc.dl = want.Add(deadlineSlack(d))
		if err := hc.c.SetDeadline(hc.dl); err != nil {
			return nil, err
		}
	}
	writeH1Request(hc.bw, r, path, hc.clientIP(r.RemoteAddr))
	if err := hc.io.flushAwait(hc.bw); err != nil {
		return nil, classify(ctx, err, true)
	}
	for {
		resp, err := hc.readResponse(r, fieldsOnly)
		if err != nil {
			return nil, classify(ctx, err, hc.br.Buffered() == 0)
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 {
			continue // informational (103 Early Hints): wait for the real one
		}
		return resp, nil
	}
}

var aLongTimeAgo = time.Unix(1, 0)

// readResponse reads a response header on hc. A plain one (HTTP/1.1, a
// final status with a body framed by one Content-Length, not to HEAD) is
// parsed into hc's reused Response and fields; anything else is left to
// http.ReadResponse. fieldsOnly is for a caller that renders the header
// before it reads the body (frontWriter): a plain response's Header is
// then nil when its fields can be sent on as they are (no Connection
// field, the caller renders hc.fields), and the strings of the header
// are views of hc.br's buffer, valid until the next read from it.
func (hc *h1conn) readResponse(r *http.Request, fieldsOnly bool) (*http.Response, error) {
	for {
		buf, _ := hc.br.Peek(hc.br.Buffered())
		end, bare := headerEnd(buf)
		if end >= 0 {
			if resp := hc.parseResponse(buf[:end], r, fieldsOnly); resp != nil {
				hc.br.Discard(end)
				return resp, nil
			}
			break
		}
		if bare || len(buf) == hc.br.Size() {
			break
		}
		if _, err := hc.br.Peek(len(buf) + 1); err != nil {
			if len(buf) == 0 {
				return nil, err
			}
			break // http.ReadResponse reports what it makes of it
		}
	}
	return http.ReadResponse(hc.br, r)
}

// parseResponse parses a whole plain response header (see readResponse)
// into hc.resp, or returns nil.
func (hc *h1conn) parseResponse(b []byte, r *http.Request, fieldsOnly bool) *http.Response {
	if r.Method == http.MethodHead || len(b) < 16 || string(b[:9]) != "HTTP/1.1 " {
		return nil
	}
	var s string // NB: the rest are substrings
	if fieldsOnly {
		s = unsafe.String(&b[0], len(b))
	} else {
		s = string(b)
	}
	line, rest, _ := strings.Cut(s, "\r\n")
	status := line[9:]
	if len(status) < 3 || len(status) > 3 && status[3] != ' ' {
		return nil
	}
	code := 0
	for i := range 3 {
		c := status[i]
		if c < '0' || c > '9' {
			return nil
		}
		code = code*10 + int(c-'0')
	}
	if code < 200 || code == http.StatusNoContent || code == http.StatusNotModified {
		return nil
	}
	clear(hc.fields)
	fields := hc.fields[:0]
	cl := int64(-1)
	closing, conn := false, false
	for {
		var k, value string
		var end, ok bool
		if k, value, rest, end, ok = nextHeaderLine(rest); end {
			break
		} else if !ok {
			return nil
		}
		switch k {
		case "Content-Length":
			n, err := strconv.ParseInt(value, 10, 64)
			if err != nil || n < 0 || cl >= 0 {
				return nil
			}
			cl = n
		case "Transfer-Encoding", "Trailer":
			return nil
		case "Connection":
			closing = closing || hasToken(value, "close")
			conn = true
		}
		fields = append(fields, hfield{k, value})
	}
	hc.fields = fields
	if cl < 0 {
		return nil
	}
	var h http.Header
	if !fieldsOnly || conn {
		h = hc.header()
	}
	hc.body = clBody{r: hc.br, n: cl}
	hc.resp = http.Response{
		Status: status, StatusCode: code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: &hc.body, ContentLength: cl, Close: closing, Request: r,
	}
	return &hc.resp
}

// header returns hc.fields as hc's reused header map.
func (hc *h1conn) header() http.Header {
	if hc.hdr == nil {
		hc.hdr = make(http.Header, 8)
	}
	h := hc.hdr
	clear(h)
	clear(hc.vals)
	hc.vals = append(hc.vals[:0], make([]string, len(hc.fields))...)
	for i, f := range hc.fields {
		hc.vals[i] = f.v
		if vv := h[f.k]; vv != nil {
			h[f.k] = append(vv, f.v)
		} else {
			h[f.k] = hc.vals[i : i+1 : i+1]
		}
	}
	return h
}

// clBody reads a body of n bytes from r; the last bytes come with io.EOF.
type clBody struct {
	r *bufio.Reader
	n int64
}

func (b *clBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	if b.n == 0 {
		return n, io.EOF
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (b *clBody) Close() error { return nil }

// classify maps a fast-path I/O error to the gateway's errors.
func classify(ctx context.Context, err error, nothingRead bool) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ErrResponseHeaderTimeout
	}
	if nothingRead && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isConnReset(err)) {
		return errStaleConn
	}
	return err
}

func isConnReset(err error) bool {
	s := err.Error()
	return strings.Contains(s, "connection reset") || strings.Contains(s, "broken pipe")
}

// h1Body reads a fast-path response body with the idle timeout on every
// read and knows, at EOF, whether its connection can be reused.
type h1Body struct {
	body   io.ReadCloser
	hc     *h1conn
	idle   time.Duration
	ctx    context.Context
	hook   *clientHook // or stop
	stop   func() bool
	at     time.Time // when the response header was in
	waited bool      // a read went to the socket after at
	eof    bool
	fault  error // the origin's fault, if the body was cut
}

func (b *h1Body) Read(p []byte) (int, error) {
	// NB: a small body usually arrived with its header and sits in the
	// buffer; a deadline is only worth its timer update when the read may
	// reach the socket.
	if b.hc.br.Buffered() == 0 {
		b.hc.c.SetReadDeadline(time.Now().Add(b.idle))
		b.hc.dl = time.Time{}
		b.waited = true
	}
	n, err := b.body.Read(p)
	if err == io.EOF {
		b.eof = true
	} else if err != nil {
		if b.ctx.Err() != nil {
			err = b.ctx.Err()
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			err = ErrIdleTimeout
		}
		b.fault = err
	}
	return n, err
}

func (b *h1Body) Close() error { return nil } // finishH1 decides

// finishH1 ends a fast-path exchange: the connection goes back to the pool
// when the body was read to its end and both sides allow keep-alive. now
// is mono().
func (p *pool) finishH1(b *h1Body, resp *http.Response, now int64) {
	// NB: if the client-gone hook has started it may still be about to
	// set a past deadline on the connection; pooled, that would break the
	// next request that takes it. Such a connection is closed instead.
	var unhooked bool
	switch {
	case b.hook != nil:
		unhooked = b.hook.detach()
	case b.stop != nil:
		unhooked = b.stop()
	default:
		unhooked = true
	}
	b.body.Close()
	// NB: the client's own Connection: close is hop-by-hop: it ends the
	// client's connection, never the origin's.
	if unhooked && b.eof && !resp.Close && b.hc.br.Buffered() == 0 {
		// The deadline left on it is replaced before its next use, or
		// kept when it suits (h1Exchange).
		p.putH1(b.hc, now)
		return
	}
	b.hc.c.Close()
}

// clientIP returns the host part of remoteAddr ("" if it has none),
// remembering the last one: requests on one origin connection mostly come
// from one client connection.
func (hc *h1conn) clientIP(remoteAddr string) string {
	if remoteAddr != hc.ra {
		hc.ra, hc.raIP = remoteAddr, ""
		if ip, _, err := net.SplitHostPort(remoteAddr); err == nil {
			hc.raIP = ip
		}
	}
	return hc.raIP
}

// writeH1Request writes r's request line and headers for the origin: the
// end-to-end headers as received, plus X-Forwarded-For (when ip, r's
// client address, is known), X-Forwarded-Proto/-Host and "Te: trailers"
// when asked; no body (fast path only). Header values were validated by
// net/http when it parsed the request.
func writeH1Request(bw *bufio.Writer, r *http.Request, path, ip string) {
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	bw.WriteString(path)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(r.Host)
	bw.WriteString("\r\n")
	conn := r.Header["Connection"]
	hasXFH := false
	for k, vv := range r.Header {
		switch {
		case isHop(k), k == "Host", k == "X-Forwarded-For", k == "X-Forwarded-Proto":
			continue
		case conn != nil && listedIn(conn, k):
			continue
		case k == "X-Forwarded-Host":
			hasXFH = true
		}
		for _, v := range vv {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	if ip != "" {
		bw.WriteString("X-Forwarded-For: ")
		for _, prior := range r.Header["X-Forwarded-For"] {
			bw.WriteString(prior)
			bw.WriteString(", ")
		}
		bw.WriteString(ip)
		bw.WriteString("\r\n")
	}
	if r.TLS != nil {
		bw.WriteString("X-Forwarded-Proto: https\r\n")
	} else {
		bw.WriteString("X-Forwarded-Proto: http\r\n")
	}
	if !hasXFH && r.Host != "" {
		bw.WriteString("X-Forwarded-Host: ")
		bw.WriteString(r.Host)
		bw.WriteString("\r\n")
	}
	for _, v := range r.Header["Te"] {
		if strings.Contains(strings.ToLower(v), "trailers") {
			bw.WriteString("Te: trailers\r\n")
			break
		}
	}
	if r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch {
		bw.WriteString("Content-Length: 0\r\n")
	}
	bw.WriteString("\r\n")
}

// requestTarget returns the request-target to send for r on route re.
func requestTarget(r *http.Request, re *routeEntry) string {
	if re.StripPrefix {
		u := *r.URL
		u.Path = stripPrefix(u.Path, re.PathPrefix)
		u.RawPath = ""
		return u.RequestURI()
	}
	if strings.HasPrefix(r.RequestURI, "/") {
		return r.RequestURI // as the client sent it: no re-encoding
	}
	return r.URL.RequestURI()
}

// nextHeaderLine takes one CRLF-terminated header line off rest and
// returns its canonical name and trimmed value; end reports the blank line
// that ends the header, !ok a line that is not a valid field (the caller
// then leaves the fast path). Shared by the request and response parsers.
func nextHeaderLine(rest string) (key, value, tail string, end, ok bool) {
	line, tail, _ := strings.Cut(rest, "\r\n")
	if line == "" {
		return "", "", tail, true, true
	}
	name, value, found := strings.Cut(line, ":")
	if !found || !httpguts.ValidHeaderFieldName(name) {
		return "", "", tail, false, false
	}
	value = trimOWS(value)
	if !httpguts.ValidHeaderFieldValue(value) {
		return "", "", tail, false, false
	}
	return textproto.CanonicalMIMEHeaderKey(name), value, tail, false, true
}

// trimOWS trims the spaces and tabs around a header value (strings.Trim
// with a cutset builds the set on every call).
func trimOWS(v string) string {
	for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
		v = v[1:]
	}
	for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		v = v[:len(v)-1]
	}
	return v
}
