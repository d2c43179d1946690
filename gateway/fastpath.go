package gateway

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/lodestone-kv/lodestone/gateway/internal/h1"
)

// The HTTP/1.1 fast path. Requests without a body to plain-HTTP origins
// (nearly all proxied traffic) skip http.Transport: the request goroutine
// takes a keep-alive h1.Conn from its pool and runs the exchange itself
// (gateway/internal/h1 says how, and why). Everything else (bodies,
// upgrades, h2c, TLS) goes through the pool's http.Transport.

// h1idle is a pool's idle fast-path connections, most recently used last.
type h1idle struct {
	mu    sync.Mutex
	conns []idleConn
}

// idleConn is an idle fast-path connection and since when (mono()).
type idleConn struct {
	c  *h1.Conn
	at int64
}

// fastPath reports whether r to o can use the fast path.
func fastPath(o *origin, r *http.Request) bool {
	return o.proto == ProtocolHTTP && noBody(r) && !h1.IsUpgrade(r) &&
		len(r.TransferEncoding) == 0 && r.ProtoMajor == 1
}

// getH1 returns an idle connection (reused true) or dials a new one.
// now is mono().
//
// NB: with no idle connection of its own, the pool borrows one from
// another shard's pool to the same origin before it dials (the
// connection then goes back to this pool). A request picks its shard at
// random, so otherwise each shard's pool grew to the most requests its
// shard ever had in flight at once, and an origin got several times as
// many connections as it had requests in flight (nginx: about as many).
func (p *pool) getH1(ctx context.Context, now int64) (*h1.Conn, bool, error) {
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
	return h1.NewConn(c, raw), false, nil
}

// idleH1 takes p's most recently used idle connection, closing those
// idle longer than the pool's idle timeout; nil if none is left. now is
// mono().
func (p *pool) idleH1(now int64) *h1.Conn {
	p.h1.mu.Lock()
	for n := len(p.h1.conns); n > 0; n = len(p.h1.conns) {
		ic := p.h1.conns[n-1]
		p.h1.conns[n-1] = idleConn{}
		p.h1.conns = p.h1.conns[:n-1]
		if now-ic.at < int64(p.f.poolIdle) {
			p.h1.mu.Unlock()
			return ic.c
		}
		// The newest is too old: so are all the others.
		stale := append(p.h1.conns, ic)
		p.h1.conns = nil
		p.h1.mu.Unlock()
		for _, s := range stale {
			s.c.CloseIdle()
		}
		p.h1.mu.Lock()
	}
	p.h1.mu.Unlock()
	return nil
}

// putH1 returns hc to the idle list, or closes it when the pool is closed
// or already keeps as many idle connections as the origin's limit. now is
// mono().
func (p *pool) putH1(hc *h1.Conn, now int64) {
	p.h1.mu.Lock()
	if p.closed.Load() || len(p.h1.conns) >= p.f.maxIdle {
		p.h1.mu.Unlock()
		hc.CloseIdle()
		return
	}
	p.h1.conns = append(p.h1.conns, idleConn{c: hc, at: now})
	p.h1.mu.Unlock()
}

// closeH1 closes the idle fast-path connections (older than minAge nanos
// when minAge > 0, else all).
func (p *pool) closeH1(minAge int64) {
	now := mono()
	p.h1.mu.Lock()
	var drop []idleConn
	keep := p.h1.conns[:0]
	for _, ic := range p.h1.conns {
		if minAge > 0 && now-ic.at < minAge {
			keep = append(keep, ic)
		} else {
			drop = append(drop, ic)
		}
	}
	clear(p.h1.conns[len(keep):])
	p.h1.conns = keep
	p.h1.mu.Unlock()
	for _, ic := range drop {
		ic.c.CloseIdle()
	}
}

// h1RoundTrip sends r (no body) on a fast-path connection of p and reads
// the response header. On success the attempt owns the connection
// (a.hc, a.h1) until finishH1. path is the request-target to send. a.hook,
// when not nil, is r's client connection's (an h1.Server's); otherwise
// the exchange gets a hook of its own on r's context (a.stop).
func (g *Gateway) h1RoundTrip(a *attempt, path string) (*http.Response, error) {
	p, r, now := a.p, a.req, a.start
	ctx := r.Context()
	opts := h1.ExchangeOptions{
		HeaderTimeout: g.cfg.ResponseHeaderTimeout,
		IdleTimeout:   g.cfg.IdleTimeout,
		// NB: a client connection of an h1.Server renders the response
		// header straight from its fields (WriteHeaderFrom).
		FieldsOnly: a.hook != nil,
	}
	for try := 0; ; try++ {
		if try > 0 {
			now = time.Now()
		}
		hc, reused, err := p.getH1(ctx, int64(now.Sub(epoch)))
		if err != nil {
			return nil, err
		}
		// The client going away aborts the wait for the origin, and later
		// the body copy.
		if a.hook != nil {
			a.hook.Attach(hc)
		} else {
			a.stop = context.AfterFunc(ctx, hc.Abort)
		}
		resp, body, err := hc.Exchange(r, path, now, opts)
		if err == nil {
			a.hc, a.h1 = hc, body
			return resp, nil
		}
		if a.hook != nil {
			a.hook.Detach()
		} else {
			a.stop()
		}
		hc.Close()
		// NB: a keep-alive connection the origin closed while it sat idle
		// fails at once with EOF or a reset before any byte of a response:
		// send again on a fresh connection (Transport does the same).
		if reused && try == 0 && errors.Is(err, h1.ErrStaleConn) && idempotent(r.Method) && ctx.Err() == nil {
			continue
		}
		if errors.Is(err, h1.ErrHeaderTimeout) {
			err = ErrResponseHeaderTimeout
		}
		return nil, err
	}
}

// finishH1 ends a fast-path exchange: the connection goes back to the pool
// when the body was read to its end and both sides allow keep-alive. now
// is mono().
func (p *pool) finishH1(a *attempt, now int64) {
	// NB: if the client-gone hook has started it may still be about to
	// abort the connection; pooled, that would break the next request
	// that takes it. Such a connection is closed instead.
	var unhooked bool
	switch {
	case a.hook != nil:
		unhooked = a.hook.Detach()
	case a.stop != nil:
		unhooked = a.stop()
	default:
		unhooked = true
	}
	if a.h1.Finish() && unhooked {
		// The deadline left on it is replaced before its next use, or
		// kept when it suits (Exchange).
		p.putH1(a.hc, now)
		return
	}
	a.hc.Close()
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
