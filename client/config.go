package client

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc"
)

// DefaultEndpoint is the gRPC address `lodestone dev` listens on.
const DefaultEndpoint = "127.0.0.1:7400"

// Config configures a [Client]. The zero value of every field means its
// default, so Config{} talks to a local `lodestone dev`.
type Config struct {
	// Endpoints lists the servers' gRPC addresses as host:port. Any server
	// will do; the client finds the leader by itself and learns the other
	// members' addresses from Members and Status answers.
	// Default (nil or empty): []string{DefaultEndpoint}.
	Endpoints []string

	// DialTimeout bounds one attempt to establish a connection to one
	// endpoint: TCP connect plus the HTTP/2 handshake. When it expires the
	// endpoint counts as unreachable and the call moves to the next one, so
	// a black-holed endpoint costs at most this much per call. It never
	// extends a call past its ctx deadline.
	// Default (zero): 2s. Raising it tolerates slow networks; lowering it
	// fails over faster but may give up on a loaded server.
	DialTimeout time.Duration

	// RequestTimeout bounds a call whose ctx has no deadline (all attempts
	// and backoffs together). A ctx deadline always wins.
	// Default (zero): 10s.
	RequestTimeout time.Duration

	// BackoffBase is the delay before the second round of attempts (a round
	// tries every endpoint once). Each further round doubles it up to
	// BackoffMax; each delay is jittered to between half and all of its
	// value.
	// Default (zero): 50ms.
	BackoffBase time.Duration

	// BackoffMax caps the delay between rounds.
	// Default (zero): 1s. A server's RetryInfo hint may exceed it.
	BackoffMax time.Duration

	// ReconnectBase is how long the client waits before it dials an
	// endpoint again after a connection to it could not be made; each
	// further failure multiplies the wait by 1.6 up to ReconnectMax,
	// jittered by 20% (gRPC's connection backoff). A call meanwhile goes
	// to the other endpoints; the endpoint is redialed when a call or
	// watch picks it after the wait, never in the background. NB: every
	// client of a fleet loses its connections in the same instant when a
	// server goes down; at 50 ms the redials of thousands of clients were
	// the storm the server's admission ramp then had to absorb, and the
	// clients' own CPU went to dialing a server that was not there.
	// Default (zero): 1s, gRPC's own.
	ReconnectBase time.Duration

	// ReconnectMax caps the wait between redials of one endpoint, so a
	// client finds a server that comes back after a long outage within
	// about this long.
	// Default (zero): 5s.
	ReconnectMax time.Duration

	// MaxAttempts caps the attempts of one call across all endpoints.
	// Default (zero): no cap, attempts continue until the ctx deadline.
	// Negative values are invalid.
	MaxAttempts int

	// GetBatch is the most concurrent Gets of one consistency the client
	// coalesces into one batch (a GetMany request, sent on the
	// connection's GetStream). A Get that finds none of its
	// kind in flight goes alone at once; those that arrive while one is
	// in flight wait for it and then go together, so a lone caller waits
	// for nothing and a busy process pays gRPC's cost of a call once for
	// many reads. Each Get still gets its own answer or its own error.
	// Default (zero): 64, a server's default max-txn-ops. 1 turns
	// coalescing off; negative values are invalid.
	GetBatch int

	// WatchProgressInterval is how long a watch stream may stay silent
	// before the client probes its server (a Status call on the same
	// connection). A server that does not answer within another interval,
	// or answers that it knows no leader (it is cut off from the cluster),
	// loses the stream: its watches resume on the next endpoint. This
	// catches a dead server that sent no TCP reset, and a partitioned one.
	// Default (zero): 10s. Shorter detects both sooner at the cost of one
	// Status call per interval on quiet streams.
	WatchProgressInterval time.Duration

	// WatchFrom says which servers the client's watch stream prefers.
	// Default (zero): WatchFromFollowers.
	WatchFrom WatchFrom

	// Logger receives Debug records for retries and Info records for
	// leader changes the client observes. Default (nil): discard.
	Logger *slog.Logger

	// Token is the ACL token's secret sent with every call (gRPC metadata
	// x-consul-token). Default (empty): the anonymous token, which on a
	// cluster with ACLs on and default deny may do nothing.
	Token string
	// TLS, when set, dials every endpoint over TLS with it (a copy whose
	// ServerName, when empty, is the endpoint's host); nil dials plain
	// text. tlsutil.Store.ClientConfig makes one that presents a client
	// certificate and verifies servers against the cluster's CA.
	TLS *tls.Config

	// DialOptions are appended to the client's own gRPC dial options
	// (insecure transport credentials, connect params, a stats handler);
	// later options win. Default (nil): none.
	DialOptions []grpc.DialOption
}

// WatchFrom names the servers a client's watch stream goes to first.
type WatchFrom int

const (
	// WatchFromFollowers sends the watch stream to a follower, the leader
	// only when no follower serves it. Before each (re)connection the
	// client refreshes the membership (one Members call) and prefers the
	// followers a quorum can do without: with n members, the n-1-⌊n/2⌋
	// (at least one) with the lowest ids, the same for every client,
	// which spread over them at random. Fan-out work inside the leader's
	// process delays its writes much more than the same work on another
	// member, and the followers left free keep commits fast; every member
	// delivers the same committed events in the same order. A follower
	// that loses the leader is left as WatchProgressInterval says, and so
	// is one that becomes the leader: a stream found on the leader at a
	// tick of WatchProgressInterval moves to a follower when the client
	// knows one, resuming every watch there from its last index (after an
	// election, or a storm that let streams land anywhere, the leader
	// would otherwise carry them for as long as they live).
	WatchFromFollowers WatchFrom = iota
	// WatchFromLeader sends the watch stream where every other call goes:
	// the leader first.
	WatchFromLeader
)

func (w WatchFrom) String() string {
	switch w {
	case WatchFromFollowers:
		return "followers"
	case WatchFromLeader:
		return "leader"
	}
	return fmt.Sprintf("WatchFrom(%d)", int(w))
}

// ParseWatchFrom parses "followers" or "leader".
func ParseWatchFrom(s string) (WatchFrom, error) {
	for _, w := range []WatchFrom{WatchFromFollowers, WatchFromLeader} {
		if s == w.String() {
			return w, nil
		}
	}
	return 0, fmt.Errorf("watch placement %q: want followers or leader", s)
}

// DefaultConfig returns the configuration New uses for zero fields.
func DefaultConfig() Config {
	return Config{
		Endpoints:      []string{DefaultEndpoint}, // lodestone dev
		DialTimeout:    2 * time.Second,           // per endpoint connect attempt
		RequestTimeout: 10 * time.Second,          // only when ctx has no deadline
		BackoffBase:    50 * time.Millisecond,     // first round-to-round delay
		BackoffMax:     time.Second,               // longest round-to-round delay
		ReconnectBase:  time.Second,               // first redial of a lost endpoint
		ReconnectMax:   5 * time.Second,           // longest wait between redials
		MaxAttempts:    0,                         // until the deadline
		GetBatch:       64,                        // a server's default max-txn-ops

		WatchProgressInterval: 10 * time.Second, // a silent watch stream is probed, then abandoned
	}
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if len(c.Endpoints) == 0 {
		c.Endpoints = d.Endpoints
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = d.DialTimeout
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = d.RequestTimeout
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = d.BackoffBase
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = d.BackoffMax
	}
	if c.ReconnectBase == 0 {
		c.ReconnectBase = d.ReconnectBase
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = max(d.ReconnectMax, c.ReconnectBase)
	}
	if c.WatchProgressInterval == 0 {
		c.WatchProgressInterval = d.WatchProgressInterval
	}
	if c.GetBatch == 0 {
		c.GetBatch = d.GetBatch
	}
	return c
}

// ConfigError reports an invalid Config field.
type ConfigError struct {
	Field  string // the Config field, e.g. "Endpoints[1]"
	Reason string // what is wrong with it
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("client: invalid config: %s: %s", e.Field, e.Reason)
}

// Validate reports the first invalid field of c as a *ConfigError. Zero
// fields are valid (they mean the default).
func (c Config) Validate() error {
	for i, ep := range c.Endpoints {
		if strings.TrimSpace(ep) == "" {
			return &ConfigError{Field: fmt.Sprintf("Endpoints[%d]", i), Reason: "empty address"}
		}
		if strings.Contains(ep, "://") {
			return &ConfigError{Field: fmt.Sprintf("Endpoints[%d]", i), Reason: fmt.Sprintf("%q: want host:port, not a URL", ep)}
		}
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"DialTimeout", c.DialTimeout},
		{"RequestTimeout", c.RequestTimeout},
		{"BackoffBase", c.BackoffBase},
		{"BackoffMax", c.BackoffMax},
		{"ReconnectBase", c.ReconnectBase},
		{"ReconnectMax", c.ReconnectMax},
		{"WatchProgressInterval", c.WatchProgressInterval},
	} {
		if f.d < 0 {
			return &ConfigError{Field: f.name, Reason: fmt.Sprintf("negative duration %v", f.d)}
		}
	}
	for _, b := range []struct {
		base, max       string
		baseDur, maxDur time.Duration
	}{
		{"BackoffBase", "BackoffMax", c.BackoffBase, c.BackoffMax},
		{"ReconnectBase", "ReconnectMax", c.ReconnectBase, c.ReconnectMax},
	} {
		if b.baseDur > 0 && b.maxDur > 0 && b.baseDur > b.maxDur {
			return &ConfigError{Field: b.base, Reason: fmt.Sprintf("%v exceeds %s %v", b.baseDur, b.max, b.maxDur)}
		}
	}
	if c.MaxAttempts < 0 {
		return &ConfigError{Field: "MaxAttempts", Reason: fmt.Sprintf("negative count %d", c.MaxAttempts)}
	}
	if c.GetBatch < 0 {
		return &ConfigError{Field: "GetBatch", Reason: fmt.Sprintf("negative count %d (1 turns coalescing off)", c.GetBatch)}
	}
	if c.WatchFrom != WatchFromFollowers && c.WatchFrom != WatchFromLeader {
		return &ConfigError{Field: "WatchFrom", Reason: fmt.Sprintf("%v: want WatchFromFollowers or WatchFromLeader", c.WatchFrom)}
	}
	return nil
}
