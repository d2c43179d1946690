package gateway

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// limiter bounds in-flight requests. Admission is one atomic add while
// there is room; only when the gateway is full does a request take the
// wait queue's lock, and it waits at most maxWait (the queue-time bound)
// before it is shed. Release hands a freed slot straight to the oldest
// waiter.
//
// NB: no shared channel on the fast path: a single contended Go channel in
// every request's path is the failure mode the Roblox write-up describes.
type limiter struct {
	max      int64
	maxQueue int // negative: never wait
	maxWait  time.Duration

	inflight atomic.Int64
	nwait    atomic.Int64 // len(waiters), readable without mu

	mu      sync.Mutex
	waiters []*waiter // FIFO
}

type waiter struct {
	ready chan struct{} // closed when the slot was handed over
}

func newLimiter(max, maxQueue int, maxWait time.Duration) *limiter {
	return &limiter{max: int64(max), maxQueue: maxQueue, maxWait: maxWait}
}

// tryAcquire takes a slot if one is free at once.
func (l *limiter) tryAcquire() bool {
	if l.inflight.Add(1) <= l.max {
		return true
	}
	l.inflight.Add(-1)
	return false
}

// acquire takes a slot, waiting up to maxWait; ErrOverloaded when none
// came, ctx.Err() when ctx ended first.
func (l *limiter) acquire(ctx context.Context) error {
	if l.tryAcquire() {
		return nil
	}
	if l.maxQueue < 0 || l.maxWait <= 0 {
		return ErrOverloaded
	}
	l.mu.Lock()
	// NB: announce the waiter before re-checking, so a release that ran
	// between the failed add and here either is seen by the re-check or
	// sees nwait > 0 and hands its slot over (see release).
	l.nwait.Add(1)
	if l.inflight.Add(1) <= l.max {
		l.nwait.Add(-1)
		l.mu.Unlock()
		return nil
	}
	l.inflight.Add(-1)
	if len(l.waiters) >= l.maxQueue {
		l.nwait.Add(-1)
		l.mu.Unlock()
		return ErrOverloaded
	}
	w := &waiter{ready: make(chan struct{})}
	l.waiters = append(l.waiters, w)
	l.mu.Unlock()

	t := time.NewTimer(l.maxWait)
	defer t.Stop()
	var err error
	select {
	case <-w.ready:
		return nil
	case <-t.C:
		err = ErrOverloaded
	case <-ctx.Done():
		err = ctx.Err()
	}
	l.mu.Lock()
	for i, x := range l.waiters {
		if x == w {
			l.waiters = append(l.waiters[:i], l.waiters[i+1:]...)
			l.nwait.Add(-1)
			l.mu.Unlock()
			return err
		}
	}
	l.mu.Unlock()
	// Handed a slot while giving up: give it back.
	<-w.ready
	l.release()
	return err
}

// release frees a slot, handing it to the oldest waiter if there is one.
func (l *limiter) release() {
	l.inflight.Add(-1)
	if l.nwait.Load() == 0 {
		return
	}
	l.mu.Lock()
	for len(l.waiters) > 0 {
		if l.inflight.Add(1) > l.max {
			l.inflight.Add(-1)
			break
		}
		w := l.waiters[0]
		l.waiters = l.waiters[1:]
		l.nwait.Add(-1)
		close(w.ready)
	}
	l.mu.Unlock()
}

// inFlight returns the admitted requests.
func (l *limiter) inFlight() int64 { return l.inflight.Load() }
