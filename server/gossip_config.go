package server

import (
	"errors"
	"time"

	"github.com/lodestone-kv/lodestone/gossip"
)

// GossipConfig joins a server to the gossip pool and makes its leader
// reconcile pool membership into the catalog. Zero Pool.BindAddr: no
// gossip.
type GossipConfig struct {
	// Pool configures the member. Name defaults to Config.Name and Role is
	// always server.
	Pool gossip.Config
	// ReconcileInterval is how often the leader diffs the whole pool
	// against the catalog even when no membership event arrived. Default
	// 30s. It repairs writes that failed or were lost to a leader change;
	// with nothing to repair it writes nothing.
	ReconcileInterval time.Duration
	// RetryInterval is the pause before retrying after a write failed for
	// want of a leader or quorum. Default 1s. Rejections wait for the next
	// ReconcileInterval instead, so a refused command cannot loop.
	RetryInterval time.Duration
	// ReapGrace is how long after this server's pool started before its
	// leader marks critical the catalog nodes that carry a passing
	// serfHealth check yet are unknown to the pool (members that died
	// while no leader watched). Default 1m. Shorter reaps sooner and
	// risks marking members the pool has not yet gossiped about.
	ReapGrace time.Duration
}

// DefaultGossipConfig returns the defaults explained on each field, gossip
// off.
func DefaultGossipConfig() GossipConfig {
	return GossipConfig{
		Pool:              gossip.DefaultConfig(),
		ReconcileInterval: 30 * time.Second, // repairs only; steady state writes nothing
		RetryInterval:     time.Second,      // about one election
		ReapGrace:         time.Minute,      // several push/pull rounds of a fresh pool
	}
}

// Enabled reports whether the server joins a gossip pool.
func (g GossipConfig) Enabled() bool { return g.Pool.BindAddr != "" }

func (g *GossipConfig) validate(name string) error {
	if !g.Enabled() {
		return nil
	}
	if g.Pool.Name == "" {
		g.Pool.Name = name
	}
	g.Pool.Role = gossip.RoleServer
	if err := g.Pool.Validate(); err != nil {
		return &ConfigError{Field: "gossip", Err: err}
	}
	if g.ReconcileInterval <= 0 || g.RetryInterval <= 0 || g.ReapGrace <= 0 {
		return &ConfigError{Field: "gossip-reconcile-interval", Err: errors.New("reconcile interval, retry interval and reap grace must be positive")}
	}
	return nil
}
