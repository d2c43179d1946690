package gossip

import (
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Role says what a pool member is.
type Role string

// Roles a member advertises in its metadata.
const (
	RoleServer Role = "server"
	RoleAgent  Role = "agent"
)

// Config configures one pool member.
type Config struct {
	// Name is the member's unique name in the pool; for agents and servers
	// it is also the catalog node name. Required.
	Name string
	// Role is advertised in the member's metadata. Required.
	Role Role

	// BindAddr is host:port for gossip, UDP and TCP on the same port. Port
	// 0 picks a free port (tests). Required.
	BindAddr string
	// AdvertiseAddr is host:port other members use to reach this one.
	// Empty means BindAddr (with the port actually bound); needed when
	// BindAddr is a wildcard or behind NAT.
	AdvertiseAddr string
	// Join lists host:port of existing members to join at start. Empty
	// means this member starts a pool alone and waits for others.
	Join []string
	// RetryJoinInterval is the pause between join attempts while no
	// member in Join answers. Default 1s.
	RetryJoinInterval time.Duration

	// EncryptKey is the base64 of a 16, 24 or 32 byte AES key. Empty means
	// no encryption. Every member must use the same key.
	EncryptKey string

	// ProbeInterval is how often this member probes a random other member.
	// Default 1s. Lower detects failures faster and costs more packets.
	ProbeInterval time.Duration
	// ProbeTimeout is how long a probe waits for an ack before asking
	// others to probe indirectly. Default 500ms; must be below
	// ProbeInterval and above the network's round trip.
	ProbeTimeout time.Duration
	// SuspicionMult scales how long a suspected member has to refute before
	// it is declared failed: SuspicionMult × max(1, log10 n) ×
	// ProbeInterval. Default 4. Lower detects faster and risks declaring a
	// slow (GC-paused, overloaded) member failed.
	SuspicionMult int
	// SuspicionMaxTimeoutMult bounds the suspicion timeout while
	// independent confirmations are missing, as a multiple of the above.
	// Default 6. 1 makes the timeout fixed.
	SuspicionMaxTimeoutMult int
	// GossipInterval is how often state changes are gossiped to a few
	// random members. Default 200ms.
	GossipInterval time.Duration
	// PushPullInterval is how often this member syncs its full state with a
	// random member over TCP. Default 30s; 0 disables (not recommended).
	PushPullInterval time.Duration

	// ForgetAfter is how long a failed or left member stays in the Roster
	// before it is forgotten. Default 72h (Consul's reconnect timeout).
	ForgetAfter time.Duration

	// Logger receives memberlist's logs and pool state changes; nil
	// discards them.
	Logger *slog.Logger
	// Registerer receives the pool's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Now is the clock the Roster records state changes with; nil means
	// time.Now.
	Now func() time.Time
}

// DefaultConfig returns LAN defaults for a member; set Name, Role and
// BindAddr.
func DefaultConfig() Config {
	return Config{
		RetryJoinInterval:       time.Second,            // one join attempt per second until one member answers
		ProbeInterval:           time.Second,            // memberlist's LAN default
		ProbeTimeout:            500 * time.Millisecond, // LAN round trip with ample slack
		SuspicionMult:           4,                      // 4s to refute in pools under 10 members
		SuspicionMaxTimeoutMult: 6,                      // up to 24s while confirmations are missing
		GossipInterval:          200 * time.Millisecond, // state changes spread in a few hundred ms
		PushPullInterval:        30 * time.Second,       // full state sync repairs lost gossip
		ForgetAfter:             72 * time.Hour,         // as Consul's reconnect_timeout
	}
}

// ConfigError names the Config field that is wrong.
type ConfigError struct {
	Field string
	Err   error
}

func (e *ConfigError) Error() string { return fmt.Sprintf("gossip config %s: %v", e.Field, e.Err) }
func (e *ConfigError) Unwrap() error { return e.Err }

// Validate checks the configuration and returns a *ConfigError naming the
// first bad field.
func (c *Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Err: fmt.Errorf(format, args...)}
	}
	if c.Name == "" {
		return bad("name", "must not be empty")
	}
	if c.Role != RoleServer && c.Role != RoleAgent {
		return bad("role", "%q is neither %q nor %q", c.Role, RoleServer, RoleAgent)
	}
	if _, _, err := splitHostPort(c.BindAddr); err != nil {
		return bad("bind", "%q: %v", c.BindAddr, err)
	}
	if c.AdvertiseAddr != "" {
		if _, _, err := splitHostPort(c.AdvertiseAddr); err != nil {
			return bad("advertise", "%q: %v", c.AdvertiseAddr, err)
		}
	}
	for _, j := range c.Join {
		if _, _, err := net.SplitHostPort(j); err != nil {
			return bad("join", "%q is not host:port: %v", j, err)
		}
	}
	if _, err := c.key(); err != nil {
		return &ConfigError{Field: "encrypt", Err: err}
	}
	if c.ProbeInterval <= 0 || c.ProbeTimeout <= 0 || c.ProbeTimeout >= c.ProbeInterval {
		return bad("probe-timeout", "must be positive and below probe-interval (%v), got %v", c.ProbeInterval, c.ProbeTimeout)
	}
	if c.SuspicionMult < 1 || c.SuspicionMaxTimeoutMult < 1 {
		return bad("suspicion-mult", "suspicion-mult (%d) and its max multiplier (%d) must be at least 1", c.SuspicionMult, c.SuspicionMaxTimeoutMult)
	}
	if c.GossipInterval <= 0 {
		return bad("gossip-interval", "must be positive")
	}
	if c.RetryJoinInterval <= 0 {
		return bad("retry-join-interval", "must be positive")
	}
	if c.ForgetAfter <= 0 {
		return bad("forget-after", "must be positive")
	}
	return nil
}

// ErrBadKey means EncryptKey is not base64 of a 16, 24 or 32 byte key.
var ErrBadKey = errors.New("gossip: encryption key must be base64 of 16, 24 or 32 bytes")

func (c *Config) key() ([]byte, error) {
	if c.EncryptKey == "" {
		return nil, nil
	}
	k, err := base64.StdEncoding.DecodeString(c.EncryptKey)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadKey, err)
	}
	switch len(k) {
	case 16, 24, 32:
		return k, nil
	}
	return nil, fmt.Errorf("%w: got %d bytes", ErrBadKey, len(k))
}

// DetectionBound is an upper bound on how long after a member of a pool of
// n dies every other member has declared it failed: one probe round over
// the others, the failed probe itself (memberlist waits out the whole
// ProbeInterval for indirect acks before it suspects, not just
// ProbeTimeout), the longest suspicion timeout and a few gossip rounds to
// spread the verdict. It errs long; memberlist's
// awareness back-off (a member that misses its own deadlines probes less
// often) can still exceed it on a starved host.
func (c Config) DetectionBound(n int) time.Duration {
	n = max(n, 2)
	scale := math.Max(1, math.Log10(float64(n)))
	suspicion := time.Duration(float64(c.SuspicionMult) * scale * float64(c.ProbeInterval))
	return time.Duration(n)*c.ProbeInterval +
		time.Duration(c.SuspicionMaxTimeoutMult)*suspicion + 4*c.GossipInterval
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	if host == "" {
		return "", 0, errors.New("host must not be empty")
	}
	return host, port, nil
}
