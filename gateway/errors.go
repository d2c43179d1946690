package gateway

import (
	"errors"
	"fmt"
)

// ErrNoRoute means no route matches the request's host and path. The
// gateway answers 404.
var ErrNoRoute = errors.New("gateway: no route matches the request")

// ErrNoOrigin means the route's service has no instance that may take the
// request now: none is registered and healthy, or every one in reach is
// ejected or at its concurrency limit. The gateway answers 503 with
// Retry-After.
var ErrNoOrigin = errors.New("gateway: no origin available")

// ErrOverloaded means the gateway is at Config.MaxInFlight and the request
// could not get a slot within Config.MaxQueueTime (or the queue was full).
// The gateway answers 503 with Retry-After at once instead of queueing
// until everything times out.
var ErrOverloaded = errors.New("gateway: overloaded")

// ErrConnect means an attempt could not open a connection to the origin
// within Config.ConnectTimeout (or the origin refused it). Counted as an
// origin failure; retried on another origin when the request allows it.
var ErrConnect = errors.New("gateway: connect to origin failed")

// ErrResponseHeaderTimeout means the origin accepted the request but sent
// no response header within Config.ResponseHeaderTimeout. The gateway
// answers 504.
var ErrResponseHeaderTimeout = errors.New("gateway: origin response header timeout")

// ErrIdleTimeout means the origin stopped sending the response body for
// Config.IdleTimeout. The response is cut off (the status is already sent).
var ErrIdleTimeout = errors.New("gateway: origin idle timeout")

// ErrClosed is returned by calls on a Gateway after Close.
var ErrClosed = errors.New("gateway: closed")

// ErrCorruptState wraps every failure to decode a persisted routing table:
// a bad header, a checksum mismatch or bad JSON. The gateway then starts
// with an empty table and waits for the registry.
var ErrCorruptState = errors.New("gateway: persisted table is corrupt")

// ConfigError names the Config field that is invalid and why.
type ConfigError struct {
	Field  string // e.g. "Shards"
	Reason string // e.g. "must be a power of two"
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("gateway: invalid config: %s: %s", e.Field, e.Reason)
}

// RouteError names a route that is invalid and why. It is returned when the
// routes file is loaded; a bad route from the registry is logged and
// ignored instead, so one bad key cannot stop routing.
type RouteError struct {
	Name   string // the route's name ("" if it has none)
	Reason string
}

func (e *RouteError) Error() string {
	return fmt.Sprintf("gateway: invalid route %q: %s", e.Name, e.Reason)
}
