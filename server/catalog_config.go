package server

import (
	"fmt"
	"time"
)

// CatalogConfig tunes the catalog and session side of a server.
type CatalogConfig struct {
	// AgentNode names the catalog node this server is the agent of: the
	// node /v1/agent/* registers on, and the node of sessions created
	// without one (as a Consul agent does). Empty means Config.Name.
	AgentNode string
	// AgentAddress is that node's address in the catalog. Empty means the
	// HTTP listener's host (127.0.0.1 when it listens on every address).
	AgentAddress string

	// SessionTTLRecheck is the longest the leader sleeps between looks at
	// session TTLs when no deadline is nearer. Default 1m. It only bounds
	// how late a missed wake-up is noticed; timers are armed at each
	// session's deadline.
	SessionTTLRecheck time.Duration
	// SessionTTLRetry is the pause after a failed invalidation before the
	// leader tries again. Default 1s. Shorter frees expired locks sooner
	// during an outage, at the cost of more proposals.
	SessionTTLRetry time.Duration
	// SessionInvalidateBatch caps the sessions one SessionInvalidate
	// command carries. Default 256. Larger makes one Raft entry (and one
	// apply pause) bigger when many sessions expire at once.
	SessionInvalidateBatch int
}

// DefaultCatalogConfig returns the defaults explained on each field.
func DefaultCatalogConfig() CatalogConfig {
	return CatalogConfig{
		SessionTTLRecheck:      time.Minute, // a safety net, not the timer
		SessionTTLRetry:        time.Second, // an election takes about as long
		SessionInvalidateBatch: 256,         // ~256 × 60 B of ids per entry
	}
}

func (c CatalogConfig) validate() error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Err: fmt.Errorf(format, args...)}
	}
	if c.SessionTTLRecheck <= 0 {
		return bad("session-ttl-recheck", "must be positive, got %v", c.SessionTTLRecheck)
	}
	if c.SessionTTLRetry <= 0 {
		return bad("session-ttl-retry", "must be positive, got %v", c.SessionTTLRetry)
	}
	if c.SessionInvalidateBatch <= 0 {
		return bad("session-invalidate-batch", "must be positive, got %d", c.SessionInvalidateBatch)
	}
	return nil
}
