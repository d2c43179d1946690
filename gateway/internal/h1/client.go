package h1

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"
)

// The origin side: a request without a body goes out on a keep-alive
// connection, written straight from the inbound request (no header map
// is built), and the response is read on the same goroutine. NB:
// http.Transport costs two goroutines per connection and two channel
// hand-offs per request, which showed as a large share of the proxy's
// CPU per request. Timeouts are connection deadlines: the write and the
// response header share the header timeout, every body read that may
// reach the socket gets the idle timeout.

// Conn is one keep-alive HTTP/1.1 connection to an origin. One exchange
// at a time uses it, from Exchange until its Body's Finish; between
// exchanges its owner keeps it (a pool) or closes it. Only Abort and
// Close may run while an exchange does.
type Conn struct {
	c   net.Conn
	raw net.Conn // what c wraps (CloseIdle)
	io  *connIO  // c as br and bw read and write it
	br  *bufio.Reader
	bw  *bufio.Writer
	dl  time.Time // the deadline set on c (zero: none known), see exchange
	ra  string    // the last request's RemoteAddr, and its host (clientIP)
	// raIP is ra's host.
	raIP string

	// Reused by every exchange on the connection: valid until the
	// exchange's Finish.
	resp   http.Response
	fields []field // the response's header fields, in order
	hdr    http.Header
	vals   []string // hdr's values; NB: whoever keeps a value past the exchange copies it (ResponseWriter renders the header, net/http clones it)
	body   clBody
	hb     Body
}

// field is one header field: canonical name, trimmed and valid value.
type field struct{ k, v string }

// NewConn returns the Conn of c, a connection just dialed. raw is the
// connection c wraps (c itself unless c is a wrapper, such as one that
// counts Close): its socket is read and written directly where the
// platform allows. Nothing but the Conn may read or write c from now on,
// and only the Conn's owner may close it.
func NewConn(c, raw net.Conn) *Conn {
	x := newConnIO(c, raw)
	x.own() // NB: a connection in use is closed only by its user
	return &Conn{c: c, raw: raw, io: x, br: bufio.NewReaderSize(x, 4<<10), bw: bufio.NewWriterSize(x, 4<<10)}
}

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// CloseIdle closes a connection that no exchange is using with a reset
// (SO_LINGER 0) rather than a FIN. NB: a gateway ends idle origin
// connections by the hundred a second when origins come and go; closed
// with a FIN, each stayed in TIME_WAIT on the gateway for a minute,
// holding a local port toward the same few origin addresses, and cost
// both ends the FIN exchange. An idle connection has nothing in flight,
// so the reset loses nothing (HAProxy closes server connections so too).
func (c *Conn) CloseIdle() error {
	if tc, ok := c.raw.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	return c.c.Close()
}

// Abort makes the running read or write of the connection, and every
// later one, fail at once; the exchange then fails with its context's
// error when that has ended. It may run on any goroutine. An aborted
// connection must not be reused.
func (c *Conn) Abort() { c.c.SetDeadline(aLongTimeAgo) }

var aLongTimeAgo = time.Unix(1, 0)

// ErrHeaderTimeout means the origin sent no whole response header within
// ExchangeOptions.HeaderTimeout of the exchange's start.
var ErrHeaderTimeout = errors.New("h1: origin response header timeout")

// ErrIdleTimeout means a read of the response body got nothing for
// ExchangeOptions.IdleTimeout.
var ErrIdleTimeout = errors.New("h1: origin idle timeout")

// ErrStaleConn means the connection failed before any byte of a response
// came back, as a keep-alive connection the origin closed while it sat
// idle does: the request may be sent again on a fresh connection.
var ErrStaleConn = errors.New("h1: origin closed an idle connection")

// ExchangeOptions are an exchange's timeouts and how its header is read.
type ExchangeOptions struct {
	// HeaderTimeout bounds the request's write and the response header
	// together, from the exchange's start (late by at most its slack, see
	// deadlineSlack).
	HeaderTimeout time.Duration
	// IdleTimeout bounds each body read that may reach the socket.
	IdleTimeout time.Duration
	// FieldsOnly is for a caller that renders the header with
	// ResponseWriter.WriteHeaderFrom before it reads the body: a plain
	// response (see readResponse) then comes with a nil Header when its
	// fields can be sent on as they are.
	FieldsOnly bool
}

// Exchange sends r, a request without a body, with target as its
// request-target, and reads the response header; 1xx responses are
// skipped. start is the exchange's start (a recent clock reading). The
// response and its Body belong to c: they are valid until the Body's
// Finish, which tells whether c may carry another exchange.
//
// The error is r's context's when it ended (the caller aborts c for
// that), ErrHeaderTimeout, ErrStaleConn, or the connection's. After an
// error c must be closed.
func (c *Conn) Exchange(r *http.Request, target string, start time.Time, o ExchangeOptions) (*http.Response, *Body, error) {
	resp, err := c.exchange(r, target, start, o)
	if err != nil {
		return nil, nil, err
	}
	b := &c.hb
	*b = Body{body: resp.Body, c: c, resp: resp, idle: o.IdleTimeout, ctx: r.Context(), at: time.Now()}
	resp.Body = b
	return resp, b, nil
}

// exchange writes the request and reads the response header.
func (c *Conn) exchange(r *http.Request, target string, start time.Time, o ExchangeOptions) (*http.Response, error) {
	ctx := r.Context()
	// NB: the write and the response header share the header timeout,
	// late by at most its slack: a connection busy with one request after
	// another re-arms its deadline only now and then.
	d := o.HeaderTimeout
	if want := start.Add(d); c.dl.Before(want) || c.dl.After(want.Add(deadlineSlack(d))) {
		c.dl = want.Add(deadlineSlack(d))
		if err := c.c.SetDeadline(c.dl); err != nil {
			return nil, err
		}
	}
	writeRequest(c.bw, r, target, c.clientIP(r.RemoteAddr))
	if err := c.io.flushAwait(c.bw); err != nil {
		return nil, classify(ctx, err, true)
	}
	for {
		resp, err := c.readResponse(r, o.FieldsOnly)
		if err != nil {
			return nil, classify(ctx, err, c.br.Buffered() == 0)
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 {
			continue // informational (103 Early Hints): wait for the real one
		}
		return resp, nil
	}
}

// deadlineSlack is how late a read deadline may be, so that a busy
// connection re-arms it only now and then: a timer update per request
// cost more than the request's parsing. nginx lets its timers drift up to
// 300 ms for the same reason (NGX_TIMER_LAZY_DELAY).
func deadlineSlack(d time.Duration) time.Duration { return min(d/64, 250*time.Millisecond) }

// readResponse reads a response header. A plain one (HTTP/1.1, a final
// status with a body framed by one Content-Length, not to HEAD) is
// parsed into c's reused Response and fields; anything else (chunked,
// no length, 204, 304, HEAD, an odd status line) is left to
// http.ReadResponse. With fieldsOnly a plain response's Header is nil
// when its fields can be sent on as they are (no Connection field), and
// the strings of the header are views of br's buffer, valid until the
// next read from it.
func (c *Conn) readResponse(r *http.Request, fieldsOnly bool) (*http.Response, error) {
	for {
		buf, _ := c.br.Peek(c.br.Buffered())
		end, bare := headerEnd(buf)
		if end >= 0 {
			if resp := c.parseResponse(buf[:end], r, fieldsOnly); resp != nil {
				c.br.Discard(end)
				return resp, nil
			}
			break
		}
		if bare || len(buf) == c.br.Size() {
			break
		}
		if _, err := c.br.Peek(len(buf) + 1); err != nil {
			if len(buf) == 0 {
				return nil, err
			}
			break // http.ReadResponse reports what it makes of it
		}
	}
	return http.ReadResponse(c.br, r)
}

// parseResponse parses a whole plain response header (see readResponse)
// into c.resp, or returns nil.
func (c *Conn) parseResponse(b []byte, r *http.Request, fieldsOnly bool) *http.Response {
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
		ch := status[i]
		if ch < '0' || ch > '9' {
			return nil
		}
		code = code*10 + int(ch-'0')
	}
	if code < 200 || code == http.StatusNoContent || code == http.StatusNotModified {
		return nil
	}
	clear(c.fields)
	fields := c.fields[:0]
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
			// NB: digits only, as net/http reads it (ParseInt would take
			// a sign): the two must agree on where the body ends.
			n, err := strconv.ParseUint(value, 10, 63)
			if err != nil || cl >= 0 {
				return nil
			}
			cl = int64(n)
		case "Transfer-Encoding", "Trailer":
			return nil
		case "Connection":
			closing = closing || hasToken(value, "close")
			conn = true
		}
		fields = append(fields, field{k, value})
	}
	c.fields = fields
	if cl < 0 {
		return nil
	}
	var h http.Header
	if !fieldsOnly || conn {
		h = c.header()
	}
	c.body = clBody{r: c.br, n: cl, x: c.io}
	c.resp = http.Response{
		Status: status, StatusCode: code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: &c.body, ContentLength: cl, Close: closing, Request: r,
	}
	return &c.resp
}

// header returns c.fields as c's reused header map.
func (c *Conn) header() http.Header {
	if c.hdr == nil {
		c.hdr = make(http.Header, 8)
	}
	h := c.hdr
	clear(h)
	clear(c.vals)
	c.vals = append(c.vals[:0], make([]string, len(c.fields))...)
	for i, f := range c.fields {
		c.vals[i] = f.v
		if vv := h[f.k]; vv != nil {
			h[f.k] = append(vv, f.v)
		} else {
			h[f.k] = c.vals[i : i+1 : i+1]
		}
	}
	return h
}

// clBody reads a body of n bytes from r; the last bytes come with io.EOF.
type clBody struct {
	r *bufio.Reader
	n int64
	x *connIO // the socket under r
}

func (b *clBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	buffered := b.r.Buffered()
	n, err := b.r.Read(p)
	if err == nil && buffered > 0 && n == buffered && n < len(p) {
		// NB: the body's first bytes came with the header into the
		// buffer, and what followed them is often in the socket by now:
		// taking it into the same p gives the client one large write
		// instead of a small one and then a large one.
		n += b.x.tryRead(p[n:])
	}
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

// classify maps an exchange's I/O error to the package's errors.
func classify(ctx context.Context, err error, nothingRead bool) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ErrHeaderTimeout
	}
	if nothingRead && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isConnReset(err)) {
		return ErrStaleConn
	}
	return err
}

func isConnReset(err error) bool {
	s := err.Error()
	return strings.Contains(s, "connection reset") || strings.Contains(s, "broken pipe")
}

// Body is an exchange's response body. Every read that may reach the
// socket gets the idle timeout; a read fails with the request context's
// error once that has ended, with ErrIdleTimeout when the origin was
// silent, or with the connection's error. Close does nothing: Finish
// ends the exchange.
type Body struct {
	body   io.ReadCloser
	c      *Conn
	resp   *http.Response
	idle   time.Duration
	ctx    context.Context
	at     time.Time // when the response header was in
	waited bool      // a read went to the socket after at
	eof    bool
}

func (b *Body) Read(p []byte) (int, error) {
	// NB: a small body usually arrived with its header and sits in the
	// buffer; a deadline is only worth its timer update when the read may
	// reach the socket.
	if b.c.br.Buffered() == 0 {
		b.c.c.SetReadDeadline(time.Now().Add(b.idle))
		b.c.dl = time.Time{}
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
	}
	return n, err
}

// Close does nothing; see Finish.
func (b *Body) Close() error { return nil }

// HeaderAt returns when the response header was in (read once, after it).
func (b *Body) HeaderAt() time.Time { return b.at }

// Waited reports whether a read of the body went to the socket, so the
// body did not all come with the header.
func (b *Body) Waited() bool { return b.waited }

// Finish ends the exchange and reports whether the connection may carry
// another: the body was read to its end, neither side asked to close,
// and the origin sent nothing more. The response, its header and the
// Body are not to be used after it. A body not read to its end is read
// on only when net/http parsed the response (its Close drains).
func (b *Body) Finish() bool {
	b.body.Close()
	// NB: the client's own Connection: close is hop-by-hop: it ends the
	// client's connection, never the origin's.
	return b.eof && !b.resp.Close && b.c.br.Buffered() == 0
}

// ClientHook aborts the exchange running for a client connection of a
// Server when the client goes away or the Server closes (the connection
// is abandoned, which also ends its context): one hook for the
// connection's life, where one per request cost an allocation and a
// registration on the context each time. Get it from ResponseWriter.Hook.
type ClientHook struct {
	mu    sync.Mutex
	c     *Conn // the running exchange's connection; nil between exchanges
	fired bool  // the client is gone (for good)
}

// fire marks the client gone and aborts the attached exchange. The
// client-gone watch and Close may both call it; a second call changes
// nothing.
func (h *ClientHook) fire() {
	h.mu.Lock()
	h.fired = true
	if h.c != nil {
		h.c.Abort()
	}
	h.mu.Unlock()
}

// Attach makes c the connection the client's going away aborts (at once
// if it has gone).
func (h *ClientHook) Attach(c *Conn) {
	h.mu.Lock()
	h.c = c
	if h.fired {
		c.Abort()
	}
	h.mu.Unlock()
}

// Detach ends Attach; false if the hook may have aborted the connection,
// which then must not be reused.
func (h *ClientHook) Detach() bool {
	h.mu.Lock()
	h.c = nil
	fired := h.fired
	h.mu.Unlock()
	return !fired
}

// clientIP returns the host part of remoteAddr ("" if it has none),
// remembering the last one: requests on one origin connection mostly come
// from one client connection.
func (c *Conn) clientIP(remoteAddr string) string {
	if remoteAddr != c.ra {
		c.ra, c.raIP = remoteAddr, ""
		if ip, _, err := net.SplitHostPort(remoteAddr); err == nil {
			c.raIP = ip
		}
	}
	return c.raIP
}

// writeRequest writes r's request line and headers for the origin: the
// end-to-end headers as received, plus X-Forwarded-For (when ip, r's
// client address, is known), X-Forwarded-Proto/-Host and "Te: trailers"
// when asked; no body. Header values were validated when the request
// was parsed (by Server or net/http).
func writeRequest(bw *bufio.Writer, r *http.Request, target, ip string) {
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	bw.WriteString(target)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(r.Host)
	bw.WriteString("\r\n")
	conn := r.Header["Connection"]
	hasXFH := false
	for k, vv := range r.Header {
		switch {
		case HopByHop(k, conn), k == "Host", k == "X-Forwarded-For", k == "X-Forwarded-Proto":
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
