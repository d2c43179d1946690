package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lodestone-kv/lodestone/gateway/internal/h1"
)

// tlsStateKey holds a handed-off TLS connection's state in its context.
type tlsStateKey struct{}

// handedTLS keeps the TLS state of a connection the fast path handed to
// net/http: net/http sets r.TLS only for a *tls.Conn it holds itself,
// and a handed connection is wrapped to replay what was read.
func handedTLS(ctx context.Context, c net.Conn) context.Context {
	for {
		if tc, ok := c.(*tls.Conn); ok {
			st := tc.ConnectionState()
			return context.WithValue(ctx, tlsStateKey{}, &st)
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return ctx
		}
		c = u.NetConn()
	}
}

// ServeHTTP proxies one request: admission (MaxInFlight, MaxQueueTime),
// route match on the current table (one atomic load, no lock), origin
// choice (subset of a random shard, power of two choices), attempts with
// per-attempt timeouts, retries under the budget, and a streamed response.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.TLS == nil {
		r.TLS, _ = r.Context().Value(tlsStateKey{}).(*tls.ConnectionState)
	}
	if g.handle(w, r) {
		// The status line is out and the body is cut short: abort the
		// client connection so the client cannot mistake it for a whole
		// response (net/http recovers this panic silently).
		panic(http.ErrAbortHandler)
	}
}

// handle proxies r (ServeHTTP's work, and the h1.Server's Handler) and
// reports whether the response was cut short, in which case the caller
// must abort the client connection.
func (g *Gateway) handle(w http.ResponseWriter, r *http.Request) (abort bool) {
	g.handlers.Add(1)
	defer g.handlers.Done()
	// NB: a request on the fast path reads the clock twice (here, and
	// when the response header arrives), three times when its body was
	// not all there with the header: each read costs as much as parsing
	// a small header. What runs in between without waiting uses the
	// reading before it.
	start := time.Now()
	now := start
	if !g.admit.tryAcquire() {
		if err := g.admit.acquire(r.Context()); err != nil {
			if errors.Is(err, ErrOverloaded) {
				g.shed(w, shedOverload)
			}
			return false
		}
		now = time.Now() // queued
	}
	slot := &admission{l: g.admit}
	defer slot.release()

	t := g.table.Load()
	re := t.router.match(r.Host, r.URL.Path)
	if re == nil {
		g.m.unrouted.Inc()
		http.Error(w, "no route for "+hostOnly(r.Host)+r.URL.Path, http.StatusNotFound)
		return false
	}
	status, abort, end := g.proxy(w, r, t, re, slot, now)
	if end.IsZero() {
		end = time.Now()
	}
	if re.m != nil {
		re.m.requests[classOf(status)].Inc()
		re.m.latency.Observe(end.Sub(start).Seconds())
	}
	if fw, ok := w.(*h1.ResponseWriter); ok {
		fw.SetNow(end) // for a Date header not written yet
	}
	return abort
}

// admission is one request's slot; released at most once (a WebSocket
// gives its slot back once upgraded).
type admission struct {
	l    *limiter
	done bool
}

func (a *admission) release() {
	if !a.done {
		a.done = true
		a.l.release()
	}
}

// clockAt returns the gateway Clock's time for t, a time just read from
// package time: t itself when the Clock is the system's.
func (g *Gateway) clockAt(t time.Time) time.Time {
	if _, ok := g.clock.(systemClock); ok {
		return t
	}
	return g.clock.Now()
}

// proxy runs the attempts, the first at now, and returns the status the
// client got (0: none), whether the response was cut short, and when the
// last attempt ended (zero: unknown).
func (g *Gateway) proxy(w http.ResponseWriter, r *http.Request, t *table, re *routeEntry, slot *admission, now time.Time) (int, bool, time.Time) {
	svc := t.services[re.Service]
	if svc == nil {
		g.shed(w, shedNoOrigin)
		return http.StatusServiceUnavailable, false, time.Time{}
	}
	shard := rand.IntN(len(svc.shards))
	if h1.IsUpgrade(r) {
		status, abort := g.proxyUpgrade(w, r, svc, re, shard, slot)
		return status, abort, time.Time{}
	}
	fw, _ := w.(*h1.ResponseWriter)
	g.budget.deposit()
	retriable := g.cfg.MaxRetries > 0 && idempotent(r.Method) && noBody(r)
	var hdr http.Header  // the outbound header of the Transport path, built once if needed
	var tried [4]*origin // origins this request failed on (MaxRetries ≤ 10; the first few matter)
	var exclude []*origin
	for try := 0; ; try++ {
		if try > 0 {
			// NB: a retry routes by the table of now, not of the first
			// attempt: an origin deregistered meanwhile must not get it.
			if svc = g.table.Load().services[re.Service]; svc == nil {
				g.shed(w, shedNoOrigin)
				return http.StatusServiceUnavailable, false, time.Time{}
			}
			shard = min(shard, len(svc.shards)-1)
			now = time.Now()
		}
		p := svc.choose(shard, g.clockAt(now).UnixNano(), exclude, rand.IntN)
		if p == nil {
			g.shed(w, shedSaturated)
			return http.StatusServiceUnavailable, false, time.Time{}
		}
		mayRetry := retriable && try < g.cfg.MaxRetries
		var a *attempt
		if fastPath(p.origin, r) {
			a = &attempt{p: p, parent: r.Context(), start: now, req: r, fast: true}
			if fw != nil {
				a.hook = fw.Hook()
			}
		} else {
			if hdr == nil {
				hdr = outboundHeader(r)
			}
			a = g.startAttempt(r, re, p, hdr)
		}
		resp, err := g.roundTrip(a, re)
		if err != nil {
			clientGone := r.Context().Err() != nil
			end := g.finishAttempt(svc, a, 0, !clientGone)
			if clientGone {
				return 0, false, end
			}
			g.log.Debug("gateway: attempt failed", "route", re.Name, "origin", p.origin.String(), "attempt", try, "err", err)
			if mayRetry && g.retry(re) {
				exclude = appendTried(tried[:len(exclude)], p.origin)
				continue
			}
			status := http.StatusBadGateway
			if errors.Is(err, ErrResponseHeaderTimeout) {
				status = http.StatusGatewayTimeout
			}
			http.Error(w, http.StatusText(status), status)
			return status, false, end
		}
		if retryStatus(resp.StatusCode) && mayRetry && g.retry(re) {
			drain(resp.Body)
			g.finishAttempt(svc, a, resp.StatusCode, true)
			exclude = appendTried(tried[:len(exclude)], p.origin)
			continue
		}
		// NB: the fast path reuses resp once its connection is pooled
		// (in finishAttempt): read nothing of it after that.
		status := resp.StatusCode
		if a.fast && fw != nil {
			fw.SetNow(a.h1.HeaderAt())
		}
		originFault, abort := g.writeResponse(w, resp, a)
		if a.fast && fw != nil && !a.h1.Waited() && !fw.WriteWaited() {
			// NB: the whole body came with the header and went to the
			// client's buffer without a wait: the response ended then,
			// within the copy's microseconds.
			a.end = a.h1.HeaderAt()
		}
		end := g.finishAttempt(svc, a, status, status >= 500 || originFault)
		return status, abort, end
	}
}

// roundTrip sends the attempt's request and returns the response header
// (its body streams later), or why there is none: ErrConnect,
// ErrResponseHeaderTimeout, the client's ctx error, or another transport
// error.
func (g *Gateway) roundTrip(a *attempt, re *routeEntry) (*http.Response, error) {
	if a.fast {
		return g.h1RoundTrip(a, requestTarget(a.req, re))
	}
	var resp *http.Response
	tr, err := a.p.transport(a.ctx)
	if err == nil {
		resp, err = tr.RoundTrip(a.out)
	}
	a.timer.headers()
	if err != nil && context.Cause(a.ctx) == ErrResponseHeaderTimeout {
		err = ErrResponseHeaderTimeout
	}
	return resp, err
}

// appendTried adds o to the tried origins, keeping at most cap(xs).
func appendTried(xs []*origin, o *origin) []*origin {
	if len(xs) == cap(xs) {
		copy(xs, xs[1:])
		xs = xs[:len(xs)-1]
	}
	return append(xs, o)
}

// retry reports whether the budget allows one more attempt.
func (g *Gateway) retry(re *routeEntry) bool {
	if !g.budget.withdraw() {
		g.m.budgetSpent.Inc()
		return false
	}
	g.stats.retries.Add(1)
	if re.m != nil {
		re.m.retries.Inc()
	}
	return true
}

// attempt is one try of a request on one pool, on the HTTP/1.1 fast path
// (fastpath.go) or through the pool's http.Transport.
type attempt struct {
	p      *pool
	parent context.Context // the client's request context
	start  time.Time
	end    time.Time // when the response ended, if known without reading the clock

	// Fast path.
	fast bool
	hook *h1.ClientHook // the client connection's, when an h1.Server serves it
	stop func() bool    // without hook: ends the exchange's own hook on the request's context
	req  *http.Request
	hc   *h1.Conn // the exchange's connection, from its response until finishH1
	h1   *h1.Body

	// Transport path.
	ctx    context.Context // parent + this attempt's timeouts
	cancel context.CancelCauseFunc
	out    *http.Request
	timer  *attemptTimer
}

// active records body progress for the idle timeout (the fast path sets a
// deadline before every read instead).
func (a *attempt) active() {
	if a.timer != nil {
		a.timer.active()
	}
}

func (g *Gateway) startAttempt(r *http.Request, re *routeEntry, p *pool, hdr http.Header) *attempt {
	ctx, cancel := context.WithCancelCause(r.Context())
	out := r.WithContext(ctx)
	u := *r.URL
	u.Scheme, u.Host = p.origin.scheme, p.origin.host
	if re.StripPrefix {
		u.Path = stripPrefix(u.Path, re.PathPrefix)
		u.RawPath = ""
	}
	out.URL = &u
	out.Header = hdr
	out.RequestURI = ""
	out.Close = false
	if r.ContentLength == 0 {
		out.Body = nil // NB: lets the transport reuse the connection at once
	}
	return &attempt{
		p: p, parent: r.Context(), ctx: ctx, cancel: cancel, out: out, start: time.Now(),
		timer: newAttemptTimer(cancel, g.cfg.ResponseHeaderTimeout, g.cfg.IdleTimeout),
	}
}

// finishAttempt releases the origin's slot, records metrics and feeds the
// outlier detector, and returns when the attempt ended. status 0 means no
// response.
func (g *Gateway) finishAttempt(svc *service, a *attempt, status int, failed bool) time.Time {
	end := a.end
	if end.IsZero() {
		end = time.Now()
	}
	if a.fast {
		if a.h1 != nil {
			a.p.finishH1(a, int64(end.Sub(epoch)))
		}
	} else {
		a.timer.stop()
		a.cancel(nil)
	}
	o := a.p.origin
	o.release()
	a.p.done()
	if o.m != nil {
		o.m.requests[classOf(status)].Inc()
		o.m.latency.Observe(end.Sub(a.start).Seconds())
	}
	if !failed && !o.failing.Load() {
		return end // the common case: nothing to record
	}
	res, d := recordResult(g.cfg.Outlier, svc, o, failed, g.clockAt(end))
	switch res {
	case outcomeEjected:
		g.stats.ejections.Add(1)
		if m := o.state.m; m != nil {
			m.ejections.Inc()
		}
		g.log.Info("gateway: origin ejected", "service", o.state.name, "origin", o.inst.ID, "addr", o.host, "for", d)
	case outcomeCapped:
		g.log.Debug("gateway: origin not ejected: service at its ejection cap", "service", o.state.name, "origin", o.inst.ID)
	}
	return end
}

// writeResponse streams resp to w. originFault reports a body cut short by
// the origin (error or idle timeout); abort that the client's response is
// incomplete.
func (g *Gateway) writeResponse(w http.ResponseWriter, resp *http.Response, a *attempt) (originFault, abort bool) {
	defer resp.Body.Close()
	h := w.Header()
	announced := len(resp.Trailer)
	if fw, ok := w.(*h1.ResponseWriter); ok && resp.Header == nil && a.h1 != nil {
		// The exchange left the header as its fields (FieldsOnly).
		fw.WriteHeaderFrom(a.h1)
	} else {
		copyHeader(h, resp.Header)
		if announced > 0 {
			keys := make([]string, 0, announced)
			for k := range resp.Trailer {
				keys = append(keys, k)
			}
			h.Add("Trailer", strings.Join(keys, ", "))
		}
		w.WriteHeader(resp.StatusCode)
	}
	// NB: flush as we go when the length is unknown (server-sent events,
	// streamed downloads): the client must see bytes as the origin sends
	// them, never a whole buffered body.
	var flusher http.Flusher
	if resp.ContentLength < 0 {
		flusher, _ = w.(http.Flusher)
		if flusher != nil {
			flusher.Flush()
		}
	}
	bufs := &copyBufs
	if resp.ContentLength > copyBufSize {
		bufs = &bigCopyBufs
	}
	bufp := bufs.Get().(*[]byte)
	defer bufs.Put(bufp)
	buf := *bufp
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			a.active()
			if _, werr := w.Write(buf[:n]); werr != nil {
				return false, true // the client went away
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if a.parent.Err() != nil {
				return false, true // the client went away
			}
			cause := rerr
			if a.ctx != nil { // the Transport path: the timer's cause
				cause = context.Cause(a.ctx)
			}
			g.log.Debug("gateway: response body cut short", "origin", a.p.origin.String(), "err", rerr, "cause", cause)
			return true, true
		}
	}
	if len(resp.Trailer) > 0 {
		if len(resp.Trailer) == announced {
			copyHeader(h, resp.Trailer)
		} else {
			for k, vv := range resp.Trailer {
				h[http.TrailerPrefix+k] = vv
			}
		}
	}
	return false, false
}

// Body copy buffers. NB: a body longer than copyBufSize is copied with a
// buffer of bigCopyBufSize: each read and write is a syscall, and a
// 64 KiB body then takes two of each instead of three or four. Smaller
// and unknown lengths keep the smaller buffer, so that many slow
// streams hold less memory.
const (
	copyBufSize    = 32 << 10
	bigCopyBufSize = 64 << 10
)

var (
	copyBufs    = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}
	bigCopyBufs = sync.Pool{New: func() any { b := make([]byte, bigCopyBufSize); return &b }}
)

// drain reads a little of a response being discarded (so its connection
// may be reused) and closes it.
func drain(b io.ReadCloser) {
	io.CopyN(io.Discard, b, 4<<10)
	b.Close()
}

// shed answers 503 with Retry-After without touching an origin.
func (g *Gateway) shed(w http.ResponseWriter, reason string) {
	g.stats.shed.Add(1)
	g.m.shed.WithLabelValues(reason).Inc()
	h := w.Header()
	h["Retry-After"] = []string{g.retryAfter}
	h["Content-Type"] = []string{"text/plain; charset=utf-8"}
	w.WriteHeader(http.StatusServiceUnavailable)
	io.WriteString(w, "service unavailable: "+reason+"\n")
}

// retryStatus reports origin answers worth another origin's try.
func retryStatus(code int) bool {
	return code == http.StatusBadGateway || code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout
}

// idempotent reports methods RFC 9110 calls idempotent.
func idempotent(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// noBody reports a request without a body: only those are retried, since
// a body already streamed to the first origin cannot be sent again.
func noBody(r *http.Request) bool {
	return r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 && len(r.TransferEncoding) == 0
}

// copyHeader copies end-to-end headers of src into dst, sharing values.
func copyHeader(dst, src http.Header) {
	conn := src["Connection"]
	for k, vv := range src {
		if !h1.HopByHop(k, conn) {
			dst[k] = vv
		}
	}
}

// outboundHeader builds the header sent to origins: end-to-end headers of
// r (values shared, never modified), X-Forwarded-*, and "Te: trailers"
// when the client asked for trailers (gRPC needs it).
func outboundHeader(r *http.Request) http.Header {
	h := make(http.Header, len(r.Header)+3)
	copyHeader(h, r.Header)
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		if prior := r.Header["X-Forwarded-For"]; len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		h["X-Forwarded-For"] = []string{ip}
	}
	if r.TLS != nil {
		h["X-Forwarded-Proto"] = []string{"https"}
	} else {
		h["X-Forwarded-Proto"] = []string{"http"}
	}
	if _, ok := h["X-Forwarded-Host"]; !ok && r.Host != "" {
		h["X-Forwarded-Host"] = []string{r.Host}
	}
	for _, v := range r.Header["Te"] {
		if strings.Contains(strings.ToLower(v), "trailers") {
			h["Te"] = []string{"trailers"}
		}
	}
	if _, ok := h["User-Agent"]; !ok {
		h["User-Agent"] = []string{""} // NB: no Go default User-Agent
	}
	return h
}

// epoch anchors mono: durations since it use the monotonic clock.
var epoch = time.Now()

func mono() int64 { return int64(time.Since(epoch)) }

// attemptTimer enforces an attempt's response-header timeout and then its
// idle timeout with one timer: the header phase cancels the attempt with
// ErrResponseHeaderTimeout; the body phase re-arms itself lazily (reads
// only store a timestamp) and cancels with ErrIdleTimeout after idle
// without a read.
type attemptTimer struct {
	t      *time.Timer
	cancel context.CancelCauseFunc
	idle   time.Duration
	phase  atomic.Int32 // 0 header, 1 body, 2 stopped
	last   atomic.Int64 // mono() of the last body read
}

func newAttemptTimer(cancel context.CancelCauseFunc, header, idle time.Duration) *attemptTimer {
	a := &attemptTimer{cancel: cancel, idle: idle}
	a.t = time.AfterFunc(header, a.fire)
	return a
}

func (a *attemptTimer) fire() {
	switch a.phase.Load() {
	case 0:
		a.cancel(ErrResponseHeaderTimeout)
	case 1:
		since := time.Duration(mono() - a.last.Load())
		if since >= a.idle {
			a.cancel(ErrIdleTimeout)
			return
		}
		if a.phase.Load() == 1 {
			a.t.Reset(a.idle - since)
		}
	}
}

// headers switches from the header timeout to the idle timeout.
func (a *attemptTimer) headers() {
	if !a.t.Stop() {
		return // fired: the attempt is canceled already
	}
	a.last.Store(mono())
	a.phase.Store(1)
	a.t.Reset(a.idle)
}

// active records body progress.
func (a *attemptTimer) active() { a.last.Store(mono()) }

func (a *attemptTimer) stop() {
	a.phase.Store(2)
	a.t.Stop()
}
