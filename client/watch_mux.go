package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/internal/ctxtime"
)

// watchMux carries every Watch of a Client over one gRPC Watch stream at a
// time. Its one goroutine (run), started by the first Watch and stopped by
// Client.Close, owns the stream: it picks an endpoint, sends creates and
// cancels, dispatches responses, and on a break moves to the next endpoint
// and recreates every live watch from its resume point. A second goroutine
// per stream only calls Recv.
type watchMux struct {
	c *Client

	ctx    context.Context // canceled by shutdown
	cancel context.CancelFunc
	kick   chan struct{} // cap 1: pending has work
	done   chan struct{} // closed when run returns

	spread int // where followerPlan starts; random per client

	mu      sync.Mutex
	closed  bool
	started bool
	watches map[*Watch]struct{}
	pending []*Watch // need a create or cancel on the current stream
}

func newWatchMux(c *Client) *watchMux {
	ctx, cancel := context.WithCancel(context.Background())
	return &watchMux{c: c, ctx: ctx, cancel: cancel, kick: make(chan struct{}, 1),
		done: make(chan struct{}), watches: map[*Watch]struct{}{}, spread: rand.IntN(1 << 16)}
}

// plan returns the endpoints a new stream tries, in order
// (Config.WatchFrom). For followers it first refreshes the membership,
// within DialTimeout; without an answer it plans with what it knows.
func (m *watchMux) plan() []string {
	if m.c.cfg.WatchFrom == WatchFromLeader {
		m.c.mu.Lock()
		defer m.c.mu.Unlock()
		return m.c.book.plan()
	}
	ctx, cancel := context.WithTimeout(m.ctx, m.c.cfg.DialTimeout)
	_, err := m.c.Members(ctx)
	cancel()
	if err != nil && m.ctx.Err() == nil {
		m.c.log.Debug("client: watch placement: membership not refreshed; planning with the members known", "err", err)
	}
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	return m.c.book.followerPlan(m.spread)
}

// watchMux returns the client's multiplexer, creating it on first use.
func (c *Client) watchMux() *watchMux {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.wmux == nil {
		c.wmux = newWatchMux(c)
	}
	return c.wmux
}

// add registers w and starts run if needed; false after shutdown.
func (m *watchMux) add(w *Watch) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.watches[w] = struct{}{}
	m.pending = append(m.pending, w)
	if !m.started {
		m.started = true
		go m.run()
	}
	signal(m.kick)
	return true
}

// requeue asks run to look at w again (closed, unpaused, to recreate).
func (m *watchMux) requeue(w *Watch) {
	m.mu.Lock()
	if !m.closed {
		m.pending = append(m.pending, w)
	}
	m.mu.Unlock()
	signal(m.kick)
}

// shutdown stops run, waits for it, and ends every watch with ErrClosed.
func (m *watchMux) shutdown() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	started := m.started
	ws := m.watches
	m.watches, m.pending = nil, nil
	m.mu.Unlock()
	m.cancel()
	if started {
		<-m.done
	}
	for w := range ws {
		w.finish(fmt.Errorf("client: watch %q: %w", w.key, ErrClosed))
	}
}

// errSessionIdle ends a stream that carries no watch any more.
var errSessionIdle = errors.New("client: watch stream idle")

// errOnLeader ends a stream that found itself on the leader while the
// client places watches on followers (WatchFromFollowers).
var errOnLeader = errors.New("client: watch stream on the leader; moving to a follower")

// errStalled ends a stream that stayed silent and whose server did not
// answer a probe.
var errStalled = errors.New("client: watch stream stalled: its server did not answer a probe")

// run keeps a stream up while there are live watches, until shutdown.
func (m *watchMux) run() {
	defer close(m.done)
	var (
		plan      []string
		round     int // rounds (every endpoint once) without a serving stream
		downSince = time.Now()
		lastEP    string
		lastErr   error
	)
	for {
		if !m.waitWork() {
			return
		}
		if len(plan) == 0 {
			if round > 0 {
				d := backoff(round, m.c.cfg.BackoffBase, m.c.cfg.BackoffMax, rand.Int64N)
				if hint := hintDelay(retryHint(lastErr), rand.Int64N); hint > d {
					d = hint // admission control asked for it
				}
				if err := ctxtime.Sleep(m.ctx, d); err != nil {
					return
				}
			}
			round++
			if refusedWithSlot(lastErr) {
				plan = []string{lastEP} // back to the slot it booked
			} else {
				plan = m.plan()
			}
		}
		ep := plan[0]
		plan = plan[1:]
		served, err := m.session(ep)
		if m.ctx.Err() != nil || errors.Is(err, ErrClosed) {
			return
		}
		if served {
			round = 0
			downSince = time.Now()
		}
		if errors.Is(err, errSessionIdle) || errors.Is(err, errOnLeader) {
			if errors.Is(err, errOnLeader) {
				m.c.log.Debug(err.Error(), "endpoint", ep)
			}
			plan = nil
			continue
		}
		if st, ok := status.FromError(err); ok && terminalStreamCode(st.Code()) {
			m.failAll(&Error{Op: "watch", Endpoint: ep, Code: st.Code(), Message: st.Message(), FromServer: true, cause: err})
			plan = nil
			continue
		}
		lastEP, lastErr = ep, err
		if refusedWithSlot(err) {
			m.c.log.Debug("client: watch stream refused by admission control; resuming there when told",
				"endpoint", ep, "served", served, "err", err)
			plan = nil
			m.expire(downSince, lastEP, lastErr)
			continue
		}
		m.c.log.Debug("client: watch stream ended; resuming on the next endpoint",
			"endpoint", ep, "served", served, "err", err)
		m.c.mu.Lock()
		m.c.book.failed(ep)
		m.c.mu.Unlock()
		m.expire(downSince, lastEP, lastErr)
	}
}

// terminalStreamCode reports whether a stream error code means every
// endpoint would refuse the watches the same way.
func terminalStreamCode(c codes.Code) bool {
	switch c {
	case codes.Unimplemented, codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated:
		return true
	}
	return false
}

// waitWork prunes ended watches and waits until a live one exists; false
// on shutdown.
func (m *watchMux) waitWork() bool {
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return false
		}
		for w := range m.watches {
			if !w.live() {
				delete(m.watches, w)
			}
		}
		n := len(m.watches)
		m.pending = m.pending[:0]
		m.mu.Unlock()
		if n > 0 {
			return true
		}
		select {
		case <-m.ctx.Done():
			return false
		case <-m.kick:
		}
	}
}

// failAll ends every live watch with err.
func (m *watchMux) failAll(err *Error) {
	m.mu.Lock()
	ws := make([]*Watch, 0, len(m.watches))
	for w := range m.watches {
		ws = append(ws, w)
	}
	m.mu.Unlock()
	for _, w := range ws {
		e := *err
		e.Op = w.op()
		w.fail(&e)
	}
}

// expire ends the watches whose WatchGiveUpAfter has passed without a
// serving stream.
func (m *watchMux) expire(downSince time.Time, ep string, last error) {
	now := time.Now()
	m.mu.Lock()
	var ws []*Watch
	for w := range m.watches {
		if w.set.giveUp > 0 && now.Sub(maxTime(downSince, w.born)) >= w.set.giveUp {
			ws = append(ws, w)
		}
	}
	m.mu.Unlock()
	for _, w := range ws {
		st := status.Convert(last)
		w.fail(&Error{Op: w.op(), Endpoint: ep, Code: codes.Unavailable,
			Message: fmt.Sprintf("no server served the watch for %v (last: %s)", w.set.giveUp, st.Message()), cause: last})
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
