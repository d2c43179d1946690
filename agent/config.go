package agent

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lodestone-kv/lodestone/checks"
	"github.com/lodestone-kv/lodestone/gossip"
)

// Stop behaviours (Config.OnStop).
const (
	// OnStopLeave leaves the gossip pool; the catalog keeps the node with
	// its serfHealth check critical ("left").
	OnStopLeave = "leave"
	// OnStopDeregister leaves the pool and removes the node from the
	// catalog.
	OnStopDeregister = "deregister"
)

// Config configures one agent.
type Config struct {
	// NodeName is the catalog node and gossip member name. Required.
	NodeName string
	// Address is the node's address in the catalog. Empty means the host
	// of the gossip advertise (or bind) address.
	Address string
	// NodeMeta is the node's catalog metadata.
	NodeMeta map[string]string

	// Endpoints are the servers' gRPC addresses; writes go to any of them
	// (followers forward to the leader). Required.
	Endpoints []string
	// Token is the ACL token the agent writes its node, services and check
	// results with: node write on its node, service write on its
	// services. Default (empty): the anonymous token.
	Token string
	// TLS, when set, dials the servers over TLS with it (presenting the
	// agent's client certificate); nil dials plain text.
	TLS *tls.Config
	// ListenHTTP is host:port for the local Consul-compatible agent API and
	// /metrics. Empty disables it. Port 0 picks a free port.
	ListenHTTP string

	// Gossip configures the pool member; Name and Role are filled in.
	Gossip gossip.Config

	// Services are registered at start (the config file's "services").
	Services []ServiceDefinition

	// EnableScriptChecks runs script checks (Args) from any source, the
	// local API included; EnableLocalScriptChecks only those of Services.
	// Default off: anyone who reaches the local API could run commands as
	// the agent (Consul's enable_script_checks and
	// enable_local_script_checks).
	EnableScriptChecks, EnableLocalScriptChecks bool
	// CheckMinInterval is the shortest probe interval; shorter ones are
	// raised to it. Default 1s, as Consul.
	CheckMinInterval time.Duration
	// MinDeregisterCriticalServiceAfter is the shortest
	// DeregisterCriticalServiceAfter; shorter ones are raised to it.
	// Default 1m, as Consul.
	MinDeregisterCriticalServiceAfter time.Duration
	// CheckReapInterval is how often the agent deregisters services whose
	// check has been critical longer than their
	// DeregisterCriticalServiceAfter. Default 30s, as Consul.
	CheckReapInterval time.Duration

	// OnStop is OnStopLeave (default) or OnStopDeregister.
	OnStop string

	// AntiEntropyInterval is how often the agent reads its node back from
	// the registry and repairs differences (a service an operator
	// deregistered, a status someone else overwrote). Default 1m. Reads
	// only; it writes nothing when the registry agrees.
	AntiEntropyInterval time.Duration

	// WriteTimeout bounds one registry write. Default 5s.
	WriteTimeout time.Duration
	// RetryMin and RetryMax bound the back-off between failed writes.
	// Defaults 200ms and 5s.
	RetryMin, RetryMax time.Duration

	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// Registerer receives the agent's metrics; nil means a fresh registry
	// (served on /metrics).
	Registerer *prometheus.Registry
	// Now is the clock checks decide with (TTL expiry); nil is time.Now.
	Now func() time.Time

	// registry, when set, replaces the gRPC Catalog client (tests of the
	// sync logic).
	registry Registry
}

// DefaultConfig returns the defaults explained on each field.
func DefaultConfig() Config {
	return Config{
		Gossip:       gossip.DefaultConfig(),
		OnStop:       OnStopLeave,
		WriteTimeout: 5 * time.Second, // a leader election plus a commit
		// two stale reads a minute per agent
		AntiEntropyInterval: time.Minute,
		RetryMin:            200 * time.Millisecond, // first retry soon: most failures are an election
		RetryMax:            5 * time.Second,        // a registry outage costs one write per 5s per agent
		CheckMinInterval:    checks.DefaultOptions().MinInterval,
		CheckReapInterval:   30 * time.Second,

		MinDeregisterCriticalServiceAfter: checks.DefaultOptions().MinDeregisterAfter,
	}
}

// checkOptions are the rules the agent's checks compile under; local is
// true for Services (the config file), false for the local API.
func (c *Config) checkOptions(local bool) checks.Options {
	return checks.Options{EnableScriptChecks: c.EnableScriptChecks, EnableLocalScriptChecks: c.EnableLocalScriptChecks,
		Local: local, MinInterval: c.CheckMinInterval, MinDeregisterAfter: c.MinDeregisterCriticalServiceAfter, Logger: c.Logger}
}

// ConfigError names the Config field that is wrong.
type ConfigError struct {
	Field string
	Err   error
}

func (e *ConfigError) Error() string { return fmt.Sprintf("agent config %s: %v", e.Field, e.Err) }
func (e *ConfigError) Unwrap() error { return e.Err }

// Validate checks the configuration, filling the gossip member's name and
// role, and returns a *ConfigError naming the first bad field.
func (c *Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Err: fmt.Errorf(format, args...)}
	}
	if c.NodeName == "" || strings.ContainsRune(c.NodeName, 0) {
		return bad("node", "must be a non-empty name")
	}
	if len(c.Endpoints) == 0 && c.registry == nil {
		return bad("endpoints", "must list at least one server gRPC address")
	}
	if c.ListenHTTP != "" {
		if _, _, err := net.SplitHostPort(c.ListenHTTP); err != nil {
			return bad("listen-http", "%q is not host:port: %v", c.ListenHTTP, err)
		}
	}
	switch c.OnStop {
	case OnStopLeave, OnStopDeregister:
	default:
		return bad("on-stop", "%q: use %q or %q", c.OnStop, OnStopLeave, OnStopDeregister)
	}
	if c.WriteTimeout <= 0 || c.RetryMin <= 0 || c.RetryMax < c.RetryMin || c.AntiEntropyInterval <= 0 {
		return bad("retry", "write timeout, anti-entropy interval and retry back-off must be positive, min at most max")
	}
	if c.CheckMinInterval < 0 || c.MinDeregisterCriticalServiceAfter < 0 || c.CheckReapInterval <= 0 {
		return bad("check-reap-interval", "check minimums must not be negative and the reap interval must be positive")
	}
	c.Gossip.Name, c.Gossip.Role = c.NodeName, gossip.RoleAgent
	if err := c.Gossip.Validate(); err != nil {
		return &ConfigError{Field: "gossip", Err: err}
	}
	for i := range c.Services {
		if _, err := c.Services[i].compile(c.checkOptions(true)); err != nil {
			return &ConfigError{Field: "services", Err: err}
		}
	}
	return nil
}

// File is the agent's JSON config file: {"services": [...]} with each
// service as the HTTP API's /v1/agent/service/register body (Consul's
// AgentServiceRegistration; keys match case-insensitively).
type File struct {
	Services []ServiceDefinition `json:"services"`
}

// LoadFile reads a config file. Its services are checked with the rest
// of the configuration (Config.Validate), which knows whether scripts
// may run.
func LoadFile(path string) (File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return File{}, fmt.Errorf("read agent config: %w", err)
	}
	var f File
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&f); err != nil {
		return File{}, fmt.Errorf("parse agent config %s: %w", path, err)
	}
	return f, nil
}

// ErrBadDefinition wraps every problem with a service or check definition.
var ErrBadDefinition = errors.New("agent: bad definition")
