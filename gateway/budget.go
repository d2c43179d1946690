package gateway

import (
	"sync/atomic"
	"time"
)

// retryBudget caps retries at a share of requests (a token bucket: every
// request deposits ratio tokens, every retry withdraws one) with a floor of
// minPerSec retries per second for low traffic. It is lock-free: one
// atomic add per request. Time comes from the Clock.
type retryBudget struct {
	clock     Clock
	perReq    int64 // milli-tokens deposited per request
	minPerSec int64 // tokens per second refilled regardless of traffic
	capMilli  int64 // the bucket's size

	tokens     atomic.Int64 // milli-tokens
	lastRefill atomic.Int64 // unix nanos of the last floor refill
}

func newRetryBudget(clock Clock, ratio float64, minPerSec int) *retryBudget {
	b := &retryBudget{
		clock:     clock,
		perReq:    int64(ratio * 1000),
		minPerSec: int64(minPerSec),
		// NB: a small bucket: a calm hour must not save up a retry storm.
		capMilli: 1000 * max(10, int64(minPerSec)),
	}
	b.tokens.Store(b.capMilli)
	b.lastRefill.Store(clock.Now().UnixNano())
	return b
}

// deposit credits one request.
func (b *retryBudget) deposit() {
	if b.perReq > 0 && b.tokens.Load() < b.capMilli {
		b.tokens.Add(b.perReq)
	}
}

// withdraw takes one retry from the budget; false means the budget is
// spent and the request must not be retried.
func (b *retryBudget) withdraw() bool {
	b.refill()
	for {
		v := b.tokens.Load()
		if v < 1000 {
			return false
		}
		if b.tokens.CompareAndSwap(v, v-1000) {
			return true
		}
	}
}

// refill adds the floor's tokens for the time since the last refill.
func (b *retryBudget) refill() {
	if b.minPerSec <= 0 {
		return
	}
	now := b.clock.Now().UnixNano()
	last := b.lastRefill.Load()
	add := b.minPerSec * 1000 * (now - last) / int64(time.Second)
	if add <= 0 || !b.lastRefill.CompareAndSwap(last, now) {
		return
	}
	for {
		v := b.tokens.Load()
		nv := min(v+add, max(v, b.capMilli))
		if b.tokens.CompareAndSwap(v, nv) {
			return
		}
	}
}
