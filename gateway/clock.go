package gateway

import "time"

// Clock is the gateway's source of time for its decisions: outlier
// ejection (when an ejection ends, how the ejection time grows and
// decays), the retry budget's refill and the table's staleness. Tests step
// a fake (gatewaytest.Clock) by hand. Implementations must be safe for
// concurrent use.
//
// NB: timeouts on sockets (connect, response header, idle) and the
// admission queue's wait are enforced with package time directly: they
// are I/O, and a fake clock could not interrupt a blocked read anyway.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
}

// SystemClock returns the Clock backed by package time.
func SystemClock() Clock { return systemClock{} }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }
