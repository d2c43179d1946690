// Package watchtest holds hand-written fakes for testing code that uses
// package watch: a Clock whose time moves only when the test says so.
package watchtest

import (
	"slices"
	"sync"
	"time"

	"github.com/lodestone-kv/lodestone/watch"
)

// Clock is a fake watch.Clock. Time starts where NewClock puts it and moves
// only with Advance, which fires due timers. Safe for concurrent use.
type Clock struct {
	mu     sync.Mutex
	cond   sync.Cond
	now    time.Time
	timers []*timer
}

var _ watch.Clock = (*Clock)(nil)

// NewClock returns a fake clock reading start.
func NewClock(start time.Time) *Clock {
	c := &Clock{now: start}
	c.cond.L = &c.mu
	return c
}

// Now returns the fake time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTimer returns a timer that fires when Advance moves the clock d past
// now. d ≤ 0 fires at the next Advance.
func (c *Clock) NewTimer(d time.Duration) watch.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &timer{c: c, at: c.now.Add(d), ch: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	c.cond.Broadcast()
	return t
}

// Advance moves the clock by d and fires (in deadline order) every timer
// that is due. Firing never blocks: each timer's channel has room for its
// one send.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	var due []*timer
	for _, t := range c.timers {
		if !t.at.After(c.now) {
			due = append(due, t)
		} else {
			kept = append(kept, t)
		}
	}
	clear(c.timers[len(kept):])
	c.timers = kept
	for i := 1; i < len(due); i++ { // insertion sort by deadline: few timers
		for j := i; j > 0 && due[j].at.Before(due[j-1].at); j-- {
			due[j], due[j-1] = due[j-1], due[j]
		}
	}
	for _, t := range due {
		t.ch <- c.now
	}
	c.cond.Broadcast()
}

// Timers returns the number of pending (unfired, unstopped) timers.
func (c *Clock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// BlockUntilTimers blocks until at least n timers are pending, so a test
// can Advance only once the code under test has armed its timer.
func (c *Clock) BlockUntilTimers(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.timers) < n {
		c.cond.Wait()
	}
}

type timer struct {
	c  *Clock
	at time.Time
	ch chan time.Time
}

func (t *timer) C() <-chan time.Time { return t.ch }

func (t *timer) Stop() bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.timers {
		if x == t {
			c.timers = slices.Delete(c.timers, i, i+1)
			c.cond.Broadcast()
			return true
		}
	}
	return false
}
