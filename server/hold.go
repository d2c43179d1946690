package server

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lodestone-kv/lodestone/raftnode"
)

// The hold. A request that finds no leader (an election under way, or a
// member that just started) waits for one, as Consul's servers do for up
// to rpc_hold_timeout, instead of failing at once: held on leader change,
// never by polling, for at most Config.RPCHoldTimeout from when it was
// first held and never past its own context. Only then does it fail as
// before (gRPC Unavailable, Consul HTTP 500 "No cluster leader").
//
// There are two holds, one per path: write (write.go) around
// raftnode.Propose, read (core.read, and the Consul API's barriers)
// around ReadIndex and LeaderRead. A call is tried again only after an
// error that promises nothing happened (retryable), and only after the
// leader changed since it was made, so a member that still believes in a
// dead leader waits for the election instead of spinning. A write is
// tried again only on ErrNoLeader, which Raft returns for a proposal it
// dropped before it entered any log; ErrLeaderChanged (outcome unknown)
// and context errors end the hold, as they did the request before.

// holdMetrics count the hold's work.
type holdMetrics struct {
	held     *prometheus.CounterVec   // requests that waited for a leader, by path
	timeouts *prometheus.CounterVec   // holds that ran out, by path
	seconds  *prometheus.HistogramVec // how long each hold lasted, by path
}

func newHoldMetrics(reg prometheus.Registerer) *holdMetrics {
	m := &holdMetrics{
		held: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "rpc_held_total",
			Help: "Requests held for want of a leader (--rpc-hold-timeout), by path (read, write).",
		}, []string{"path"}),
		timeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "rpc_hold_timeouts_total",
			Help: "Held requests that found no leader within --rpc-hold-timeout and failed, by path.",
		}, []string{"path"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "lodestone", Name: "rpc_hold_seconds",
			Help:    "How long held requests waited for a leader, by path, however the hold ended.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"path"}),
	}
	for _, p := range []string{"read", "write"} {
		m.held.WithLabelValues(p)
		m.timeouts.WithLabelValues(p)
	}
	reg.MustRegister(m.held, m.timeouts, m.seconds)
	return m
}

// holdPath names a path in the hold's metrics.
type holdPath string

const (
	holdRead  holdPath = "read"
	holdWrite holdPath = "write"
)

// retryWrite: Raft dropped the proposal before any log held it.
func retryWrite(err error) bool { return errors.Is(err, raftnode.ErrNoLeader) }

// retryRead: nothing was read, and the leader is what was missing.
func retryRead(err error) bool {
	return errors.Is(err, raftnode.ErrNoLeader) || errors.Is(err, raftnode.ErrReadTimeout)
}

// hold runs call once a leader is known, and again after each retryable
// error once the leader changed, until it succeeds, fails otherwise, ctx
// ends, the server closes or the hold runs out: then it returns the last
// retryable error (ErrNoLeader when no leader was known), which promises
// nothing was applied.
// call's errors come back unmapped.
func (s *core) hold(ctx context.Context, path holdPath, retryable func(error) bool, call func() error) error {
	var (
		start time.Time // when the hold began; zero while not held
		timer *time.Timer
		err   error
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if !start.IsZero() {
			s.holdMetrics.seconds.WithLabelValues(string(path)).Observe(time.Since(start).Seconds())
		}
	}()
	for {
		// NB: taken before the status is read, so a change between the
		// two is not missed.
		changed := s.raft.LeaderChanged()
		if s.raft.Status().Lead != 0 {
			if err = call(); err == nil || !retryable(err) {
				return err
			}
		} else {
			err = raftnode.ErrNoLeader
		}
		if start.IsZero() {
			if s.cfg.RPCHoldTimeout <= 0 {
				return err
			}
			start = time.Now()
			timer = time.NewTimer(s.cfg.RPCHoldTimeout)
			s.holdMetrics.held.WithLabelValues(string(path)).Inc()
		}
		select {
		case <-changed:
		case <-timer.C:
			s.holdMetrics.timeouts.WithLabelValues(string(path)).Inc()
			return err
		case <-ctx.Done():
			return err // NB: not ctx.Err(): nothing was applied, and err says so
		case <-s.ctx.Done():
			return err // the server is closing
		case <-s.raft.Done():
			return s.raft.Err()
		}
	}
}
