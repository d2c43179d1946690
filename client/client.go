package client

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/ctxtime"
)

// Client talks to a Lodestone cluster. It is safe for concurrent use.
type Client struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	closed bool
	conns  map[string]*conn // by endpoint address, dialed lazily (conns.go)
	book   book
	wmux   *watchMux // every Watch's stream; nil until the first Watch (watch_mux.go)

	// gets coalesce Gets, by consistency (getbatch.go); getManyOff is set
	// once a server answered that it has no GetMany, getStreamOff once
	// one answered that it has no GetStream (getstream.go).
	gets         [2]*getBatcher
	getManyOff   atomic.Bool
	getStreamOff atomic.Bool
}

// New returns a Client for cfg (zero fields take their defaults; see
// Config). It validates cfg and dials nothing: connections are made by the
// first call that needs them.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	c := &Client{
		cfg:   cfg,
		log:   log,
		conns: make(map[string]*conn),
		book:  newBook(cfg.Endpoints),
	}
	for i := range c.gets {
		c.gets[i] = &getBatcher{c: c, consistency: lodestonepb.Consistency(i)}
	}
	return c, nil
}

// Close closes every connection and returns the first error. Calls in
// flight fail; later calls fail with ErrClosed. Close is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	wmux := c.wmux
	c.mu.Unlock()
	if wmux != nil {
		wmux.shutdown() // before the connections: it waits for its stream
	}
	c.mu.Lock()
	conns := c.conns
	c.conns = nil
	c.closed = true
	c.mu.Unlock()
	var first error
	for _, cn := range conns {
		if cn.cc == nil {
			continue
		}
		if err := cn.cc.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Endpoints returns the endpoints the client would try now, in order: the
// leader's address if known, the configured endpoints starting with the
// one that answered last, then addresses learned from the membership.
func (c *Client) Endpoints() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.book.plan()
}

// LeaderID returns the leader's member id as last reported by a server,
// 0 if unknown.
func (c *Client) LeaderID() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.book.leaderID
}

// callSpec describes one client call for invoke.
type callSpec struct {
	op    string // for errors and logs, e.g. `put "k"`
	write bool   // retried only when provably not applied
	// only, when set, pins the call to this endpoint: one attempt, no
	// failover.
	only string
}

// invoke runs rpc under the retry policy (see doc.go and judge) and
// returns its answer. header extracts the answer's ResponseHeader so the
// client can follow the leader.
func invoke[R any](ctx context.Context, c *Client, spec callSpec,
	rpc func(ctx context.Context, cc *grpc.ClientConn) (R, error),
	header func(R) *lodestonepb.ResponseHeader,
) (R, error) {
	var zero R
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.RequestTimeout)
		defer cancel()
	}
	var (
		plan     []string
		round    int
		attempts int
		last     attempt
		lastEP   string
		prev     string // description of the last failure, for ctx errors
	)
	for {
		if len(plan) == 0 {
			if round > 0 {
				delay := backoff(round, c.cfg.BackoffBase, c.cfg.BackoffMax, rand.Int64N)
				if hint := hintDelay(retryHint(last.err), rand.Int64N); hint > delay {
					delay = hint
				}
				if dl, _ := ctx.Deadline(); time.Until(dl) < delay {
					// Sleeping would outlive the call: the last failure
					// says more than a deadline error would.
					return zero, c.newError(spec, lastEP, last, attempts, verdict{}, "", nil)
				}
				if err := ctxtime.Sleep(ctx, delay); err != nil {
					return zero, c.ctxError(spec, lastEP, ctx, attempts, prev)
				}
			}
			round++
			switch {
			case spec.only != "":
				plan = []string{spec.only}
			case refusedWithSlot(last.err):
				plan = []string{lastEP} // back to the slot it booked
			default:
				c.mu.Lock()
				plan = c.book.plan()
				c.mu.Unlock()
			}
		}
		ep := plan[0]
		plan = plan[1:]

		cc, err := c.acquire(ep)
		var wait *redialWaitError
		if err != nil && !errors.As(err, &wait) {
			if errors.Is(err, ErrClosed) {
				return zero, &Error{Op: spec.op, Endpoint: lastEP, Code: codes.Canceled, Message: "client closed", Attempts: attempts, cause: ErrClosed}
			}
			return zero, &Error{Op: spec.op, Endpoint: ep, Code: codes.InvalidArgument, Message: err.Error(), Attempts: attempts, cause: err}
		}
		tctx, tr := WithRPCTrace(ctx)
		var resp R
		if cc != nil {
			// NB: else the attempt is the redial wait, failed unsent as
			// an RPC on a connection gRPC was still redialing would.
			resp, err = rpc(tctx, cc)
			c.release(ep, cc)
		}
		attempts++
		if err == nil {
			c.observe(ep, header(resp))
			return resp, nil
		}
		last = attempt{err: err, sent: tr.Sent(), responded: tr.Responded(), ctxDone: ctx.Err() != nil}
		lastEP = ep
		v := judge(spec.write, last)
		if !v.retry || spec.only != "" {
			if spec.only != "" && v.retry {
				v = verdict{}
			}
			return zero, c.newError(spec, ep, last, attempts, v, prev, ctx.Err())
		}
		prev = ep + ": " + status.Convert(err).Message()
		if refusedWithSlot(err) {
			c.log.Debug("client: refused by admission control; retrying there when told", "op", spec.op, "endpoint", ep,
				"attempt", attempts, "err", err)
			plan = nil
		} else {
			c.log.Debug("client: retrying on next endpoint", "op", spec.op, "endpoint", ep,
				"attempt", attempts, "sent", last.sent, "from_server", last.responded, "err", err)
			c.mu.Lock()
			c.book.failed(ep)
			c.mu.Unlock()
		}
		if c.cfg.MaxAttempts > 0 && attempts >= c.cfg.MaxAttempts {
			return zero, c.newError(spec, ep, last, attempts, verdict{}, "", nil)
		}
	}
}

// observe records a successful answer from ep.
func (c *Client) observe(ep string, h *lodestonepb.ResponseHeader) {
	c.mu.Lock()
	before := c.book.leaderID
	c.book.succeeded(ep)
	c.book.observeHeader(ep, h)
	after := c.book.leaderID
	c.mu.Unlock()
	if after != before && after != 0 {
		c.log.Info("client: leader changed", "node", after, "term", h.GetTerm(), "endpoint", ep)
	}
}

// observeMembers records a full membership list and the header that came
// with it.
func (c *Client) observeMembers(h *lodestonepb.ResponseHeader, ms []*lodestonepb.Member) {
	if len(ms) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.book.observeMembers(ms)
	c.book.observeHeader("", h)
}

// newError builds the *Error for a call that ends with attempt a. ctxErr
// is the call's ctx error (nil while the ctx is live).
func (c *Client) newError(spec callSpec, ep string, a attempt, attempts int, v verdict, prev string, ctxErr error) *Error {
	st := status.Convert(a.err)
	e := &Error{
		Op:             spec.op,
		Endpoint:       ep,
		Code:           st.Code(),
		Message:        st.Message(),
		FromServer:     a.responded,
		Attempts:       attempts,
		UnknownOutcome: v.unknown,
		cause:          a.err,
	}
	if ctxErr != nil && !a.responded {
		// The ctx ended the attempt: say so in its own terms, and keep what
		// went wrong before, which is usually why the deadline was hit.
		e.Code = status.FromContextError(ctxErr).Code()
		e.cause = ctxErr
		if e.Message != ctxErr.Error() {
			e.Message = ctxErr.Error() + " (" + e.Message + ")"
		}
		if prev != "" {
			e.Message += "; previous failure: " + prev
		}
	}
	return e
}

// ctxError builds the *Error for a call whose ctx ended between attempts.
func (c *Client) ctxError(spec callSpec, ep string, ctx context.Context, attempts int, prev string) *Error {
	err := ctx.Err()
	msg := err.Error()
	if prev != "" {
		msg += "; previous failure: " + prev
	}
	return &Error{
		Op:       spec.op,
		Endpoint: ep,
		Code:     status.FromContextError(err).Code(),
		Message:  msg,
		Attempts: attempts,
		cause:    err,
	}
}
