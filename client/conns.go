package client

import (
	"math"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/internal/grpcopt"
	"github.com/lodestone-kv/lodestone/internal/token"
)

// conn is the client's connection to one endpoint, how many calls and
// watch streams use it now, and when a failed one may be dialed again.
//
// A gRPC connection that could not be made (TRANSIENT_FAILURE) redials on
// its own, with backoff, for as long as it exists. Kept, every endpoint a
// call failed over from during an outage would be redialed when the
// servers return, needed or not: after a whole cluster restarts each
// client would connect to every server at once, and the servers would set
// up connections nobody uses in the seconds their Raft loops most need
// the CPU. So the last user of a failed connection closes it (cc = nil),
// and the endpoint is dialed again only when a call or watch picks it, no
// sooner than the backoff gRPC would have kept (ReconnectBase, times 1.6
// per failure in a row, up to ReconnectMax, jittered by 20%). A
// connection lost after it worked goes IDLE and redials only when used:
// it is kept.
type conn struct {
	cc       *grpc.ClientConn // nil after a failure, until redialed
	users    int
	failures int       // in a row, without a working connection
	redialAt time.Time // with cc nil: not dialed again before
}

// redialWaitError is a call's attempt on an endpoint whose last
// connection failed less than its backoff ago: Unavailable, not sent.
type redialWaitError struct {
	ep   string
	wait time.Duration
}

func (e *redialWaitError) Error() string { return e.GRPCStatus().Message() }

func (e *redialWaitError) GRPCStatus() *status.Status {
	return status.Newf(codes.Unavailable, "%s: its last connection failed; redialed in %v at the earliest (Config.ReconnectBase, ReconnectMax)",
		e.ep, e.wait.Round(time.Millisecond))
}

// acquire returns the connection to ep, dialing it (lazily: gRPC connects
// on the first RPC) if there is none, or a *redialWaitError if ep's last
// connection failed too recently. The caller calls release with the same
// ep and cc when it no longer uses cc.
func (c *Client) acquire(ep string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	cn := c.conns[ep]
	if cn == nil {
		cn = &conn{}
		c.conns[ep] = cn
	}
	if cn.cc == nil {
		if wait := time.Until(cn.redialAt); wait > 0 {
			return nil, &redialWaitError{ep: ep, wait: wait}
		}
		cc, err := c.dial(ep)
		if err != nil {
			return nil, err
		}
		cn.cc = cc
	}
	cn.users++
	return cn.cc, nil
}

// release ends one use of cc, acquired for ep. The last user of a
// connection that failed closes it (see conn).
func (c *Client) release(ep string, cc *grpc.ClientConn) {
	c.mu.Lock()
	cn := c.conns[ep]
	if cn == nil || cn.cc != cc {
		c.mu.Unlock() // the client closed
		return
	}
	cn.users--
	var drop bool
	if cn.users == 0 || cn.failures > 0 {
		// NB: only then: GetState takes the connection's own lock, and
		// a busy connection is neither dropped nor recovering.
		state := cc.GetState()
		drop = cn.users == 0 && state == connectivity.TransientFailure
		switch {
		case drop:
			cn.cc = nil
			cn.failures++
			cn.redialAt = time.Now().Add(redialDelay(cn.failures, c.cfg.ReconnectBase, c.cfg.ReconnectMax, rand.Float64))
		case state == connectivity.Ready:
			cn.failures = 0
		}
	}
	c.mu.Unlock()
	if drop {
		_ = cc.Close() // NB: unused and not connected: nothing to lose
	}
}

// redialDelay is gRPC's reconnect backoff after failures in a row: base
// times 1.6 per failure after the first, at most max, jittered by 20%
// (rnd returns [0, 1)).
func redialDelay(failures int, base, max time.Duration, rnd func() float64) time.Duration {
	d := float64(base)
	for i := 1; i < failures && d < float64(max); i++ {
		d *= 1.6
	}
	d = math.Min(d, float64(max))
	return time.Duration(d * (0.8 + 0.4*rnd()))
}

// dial makes the (idle) connection to ep.
func (c *Client) dial(ep string) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if c.cfg.TLS != nil {
		creds = credentials.NewTLS(c.cfg.TLS) // NB: takes the endpoint's host as ServerName when unset
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		RPCTraceDialOption(),
		grpc.WithPerRPCCredentials(token.PerRPC(c.cfg.Token)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: grpcbackoff.Config{
				BaseDelay:  c.cfg.ReconnectBase,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   c.cfg.ReconnectMax,
			},
			// NB: bounds TCP connect + HTTP/2 handshake, so a peer that
			// accepts and never speaks HTTP/2 fails the connection (and
			// every fail-fast RPC waiting on it) after DialTimeout instead
			// of gRPC's default 20s.
			MinConnectTimeout: c.cfg.DialTimeout,
		}),
	}
	opts = append(opts, grpcopt.DialOptions()...)
	opts = append(opts, c.cfg.DialOptions...)
	return grpc.NewClient(ep, opts...)
}
