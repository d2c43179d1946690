// Package gatewaytest holds hand-written fakes for testing the gateway and
// code that feeds it: Source, an in-memory gateway.Source with fault
// switches, and Clock, a hand-stepped gateway.Clock.
//
// Fakes are for unit tests; integration tests run the gateway against a
// real registry through gateway.KVSource.
package gatewaytest

import (
	"sync"
	"time"

	"github.com/lodestone-kv/lodestone/gateway"
)

// Clock is a gateway.Clock that moves only when told.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

var _ gateway.Clock = (*Clock)(nil)

// NewClock returns a clock reading start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
