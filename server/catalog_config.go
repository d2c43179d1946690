package server

import (
	"fmt"
	"time"

	"github.com/lodestone-kv/lodestone/checks"
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

	// EnableScriptChecks lets checks registered through this server's
	// /v1/agent API run scripts (Args) on it. Default off, as Consul's
	// enable_script_checks: anyone who may register a check could run
	// commands as the server. Off, such a registration is refused.
	EnableScriptChecks bool
	// CheckMinInterval is the shortest interval the server's own checks
	// probe at; shorter ones are raised to it. Default 1s, as Consul.
	CheckMinInterval time.Duration
	// MinDeregisterCriticalServiceAfter is the shortest
	// DeregisterCriticalServiceAfter; shorter ones are raised to it.
	// Default 1m, as Consul.
	MinDeregisterCriticalServiceAfter time.Duration
	// CheckReapInterval is how often the server deregisters its services
	// whose check stayed critical past their
	// DeregisterCriticalServiceAfter. Default 30s, as Consul.
	CheckReapInterval time.Duration
	// AgentAntiEntropyInterval is how often the server reads its own
	// node back and registers again what the catalog lost. Default 1m;
	// reads only while the catalog agrees.
	AgentAntiEntropyInterval time.Duration
}

// DefaultCatalogConfig returns the defaults explained on each field.
func DefaultCatalogConfig() CatalogConfig {
	return CatalogConfig{
		SessionTTLRecheck:      time.Minute, // a safety net, not the timer
		SessionTTLRetry:        time.Second, // an election takes about as long
		SessionInvalidateBatch: 256,         // ~256 × 60 B of ids per entry

		CheckMinInterval:                  checks.DefaultOptions().MinInterval,
		MinDeregisterCriticalServiceAfter: checks.DefaultOptions().MinDeregisterAfter,
		CheckReapInterval:                 30 * time.Second,
		AgentAntiEntropyInterval:          time.Minute,
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
	if c.CheckMinInterval < 0 || c.MinDeregisterCriticalServiceAfter < 0 {
		return bad("check-min-interval", "check minimums must not be negative, got %v and %v", c.CheckMinInterval, c.MinDeregisterCriticalServiceAfter)
	}
	if c.CheckReapInterval <= 0 || c.AgentAntiEntropyInterval <= 0 {
		return bad("check-reap-interval", "reap and anti-entropy intervals must be positive, got %v and %v", c.CheckReapInterval, c.AgentAntiEntropyInterval)
	}
	return nil
}
