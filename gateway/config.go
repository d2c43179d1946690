package gateway

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"strings"
	"time"
)

// Config configures a Gateway. Start from DefaultConfig (or DevConfig for
// `lodestone dev`); Validate names the first bad field.
type Config struct {
	// Listen is the proxy's host:port. Port 0 picks a free port (tests).
	// Default: 127.0.0.1:8080.
	Listen string
	// AdminListen is the admin listener's host:port (/healthz, /readyz,
	// /metrics, /routes). It has its own http.Server and goroutines, so it
	// answers while the proxy is saturated. Default: 127.0.0.1:8081.
	AdminListen string

	// FrontTLS, when set, terminates TLS on Listen (before both the fast
	// path and net/http); tlsutil.SNI picks a certificate per host.
	// AdminTLS does the same for AdminListen. RegistryTLS dials the
	// registry over TLS, presenting the gateway's client certificate.
	// nil: plain text.
	FrontTLS    *tls.Config
	AdminTLS    *tls.Config
	RegistryTLS *tls.Config

	// Source feeds instances and routes. When nil, New builds the source
	// Instances names over a client of Registry and closes that client on
	// Close.
	Source Source
	// Registry lists the registry's gRPC endpoints (host:port), used only
	// when Source is nil. Default: 127.0.0.1:7400 (lodestone dev).
	Registry []string
	// RegistryToken is the ACL token the gateway reads the registry with:
	// it needs read on the route keys (KVRoutePrefix) and on the services
	// they name. Default (empty): the anonymous token.
	RegistryToken string
	// AdminToken, when set, is required (Authorization: Bearer or
	// X-Consul-Token) for the admin endpoints that reveal the table
	// (/routes); /healthz, /readyz and /metrics stay open for probes and
	// scrapers. Default (empty): every admin endpoint is open.
	AdminToken string
	// Instances picks the source New builds when Source is nil:
	// InstancesCatalog (default: the catalog's healthy instances, a
	// CatalogSource) or InstancesKV (JSON values under
	// KVPrefix+"instances/", a KVSource, for users who feed instances by
	// KV).
	Instances string
	// KVPrefix is the KV prefix the built source watches: routes under
	// KVPrefix+"routes/" and, for InstancesKV, instances under
	// KVPrefix+"instances/". Default: "gateway/".
	KVPrefix string

	// RoutesFile is a JSON file of static routes (see LoadRoutesFile); ""
	// means none. Registry routes with the same name override them.
	RoutesFile string

	// StateDir is where the last known good routing table is persisted
	// (crash-safe) for cold starts while the registry is down. "" disables
	// persistence.
	StateDir string
	// PersistInterval is the most often the table is written to StateDir;
	// updates in between are coalesced. Default 1s. Shorter loses less on
	// a crash and costs one write + two fsyncs per interval under churn.
	PersistInterval time.Duration

	// Shards is the number of connection-pool shards (Zuul's event loops).
	// Every request is served from one shard, chosen at random; each shard
	// holds pools only to the origins of its subset. A power of two.
	// Default 16. More shards spread pool contention thinner and raise
	// the connections per origin (each origin is held by
	// Shards/subsets pools).
	Shards int
	// SubsetSize is the smallest subset the ring is split into: a service
	// of n instances gets the largest power-of-two number of subsets
	// (capped by Shards/Replication) that keeps every subset at or above
	// SubsetSize, so subsets hold SubsetSize to 2×SubsetSize origins
	// (Netflix: 25–50). Default 25. Smaller means fewer connections per
	// shard and coarser balance within a subset.
	SubsetSize int
	// Replication is the minimum number of shards that share each subset.
	// Default 2. Higher keeps more shards on each origin (more
	// connections, more headroom if a shard's subset is unhealthy).
	Replication int
	// Seed orders bulk loads onto the ring (Zuul shuffles them so gateways
	// do not all fill subsets in the same order). Default 0: derived from
	// the host name and Listen.
	Seed uint64

	// MaxInFlight bounds the requests being proxied at once. Default 4096.
	// Beyond it requests wait (MaxQueue, MaxQueueTime), then are shed.
	MaxInFlight int
	// MaxQueue bounds the requests waiting for a slot. Default 1024; 0
	// means the default; negative means no waiting at all.
	MaxQueue int
	// MaxQueueTime bounds how long a request waits for a slot before it is
	// shed with 503. Default 50ms. Longer rides out bursts; shorter fails
	// faster under sustained overload.
	MaxQueueTime time.Duration
	// RetryAfter is the Retry-After a shed request is told. Default 1s
	// (sent in whole seconds, at least 1).
	RetryAfter time.Duration

	// OriginConcurrency bounds in-flight requests per origin instance over
	// all shards; an origin at its limit is skipped by the balancer, and a
	// request that finds every origin in reach at its limit is shed.
	// Default 256.
	OriginConcurrency int

	// ConnectTimeout bounds one TCP connect (plus TLS handshake) to an
	// origin, per attempt. Default 1s.
	ConnectTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for the origin's response
	// header after the request was written, per attempt. Default 15s.
	ResponseHeaderTimeout time.Duration
	// IdleTimeout bounds the silence between two reads of a response body
	// (and of a WebSocket in either direction). Default 60s.
	IdleTimeout time.Duration
	// PoolIdleTimeout closes keep-alive connections to origins that stay
	// unused this long. Default 90s.
	PoolIdleTimeout time.Duration

	// MaxRetries bounds the retries of one request (attempts = 1 +
	// MaxRetries). Only idempotent requests without a body are retried,
	// on a different origin, after a connect failure, a response-header
	// timeout or a 502/503/504. Default 2; 0 disables retries.
	MaxRetries int
	// RetryBudgetRatio caps retries at this fraction of requests (a token
	// bucket filled by each request). Default 0.2.
	RetryBudgetRatio float64
	// RetryBudgetMinPerSec allows this many retries per second even at low
	// traffic. Default 10.
	RetryBudgetMinPerSec int

	// Outlier configures per-origin outlier ejection.
	Outlier OutlierConfig

	// OriginTLS is the TLS configuration for origins whose meta says
	// protocol=https (ALPN offers h2 and http/1.1). nil means the system
	// roots. Its NextProtos and ServerName are set per origin.
	OriginTLS *tls.Config

	// ReadHeaderTimeout bounds how long a client may take to send request
	// headers to the proxy. Default 10s.
	ReadHeaderTimeout time.Duration
	// ClientIdleTimeout closes idle client keep-alive connections.
	// Default 120s.
	ClientIdleTimeout time.Duration

	// Clock is the time source for ejection, the retry budget and
	// staleness. Default: SystemClock().
	Clock Clock
	// Logger receives state changes at Info (table loads, registry
	// connection changes, ejections) and per-request detail at Debug.
	// nil discards.
	Logger *slog.Logger
}

// OutlierConfig configures outlier ejection: an origin that fails
// Consecutive times in a row (5xx answers, connect failures, timeouts) is
// taken out of balancing for BaseEjection × (times ejected), capped at
// MaxEjection; the multiplier decays by one for every Decay the origin
// spends without an ejection.
type OutlierConfig struct {
	// Consecutive is the run of failures that ejects. Default 5; negative
	// disables ejection.
	Consecutive int
	// BaseEjection is the first ejection's length. Default 10s.
	BaseEjection time.Duration
	// MaxEjection caps an ejection's length. Default 5m.
	MaxEjection time.Duration
	// Decay is how long an origin must stay un-ejected for its multiplier
	// to drop by one. Default 30s.
	Decay time.Duration
	// MaxEjectedPercent caps the share of a service's origins ejected at
	// once (at least one may be ejected when the service has two or more).
	// Default 50.
	MaxEjectedPercent int
}

// Values of Config.Instances.
const (
	InstancesCatalog = "catalog" // CatalogSource
	InstancesKV      = "kv"      // KVSource
)

// DefaultConfig returns production defaults; each value is explained on
// its field.
func DefaultConfig() Config {
	return Config{
		Listen:          "127.0.0.1:8080", // lodestone dev's gateway port
		AdminListen:     "127.0.0.1:8081", // its admin port
		Registry:        []string{"127.0.0.1:7400"},
		Instances:       InstancesCatalog, // registered services, health-checked
		KVPrefix:        "gateway/",
		PersistInterval: time.Second, // ≤ 1 write+fsync per second under churn

		Shards:      16, // like Zuul's event loops on a 16-core box
		SubsetSize:  25, // subsets of 25..50 origins (Netflix)
		Replication: 2,  // each subset served by ≥ 2 shards

		MaxInFlight:  4096,                  // concurrent proxied requests
		MaxQueue:     1024,                  // waiting for a slot
		MaxQueueTime: 50 * time.Millisecond, // then 503, fast
		RetryAfter:   time.Second,

		OriginConcurrency: 256, // per origin instance

		ConnectTimeout:        time.Second,
		ResponseHeaderTimeout: 15 * time.Second,
		IdleTimeout:           60 * time.Second,
		PoolIdleTimeout:       90 * time.Second,

		MaxRetries:           2,
		RetryBudgetRatio:     0.2, // retries ≤ 20% of requests
		RetryBudgetMinPerSec: 10,

		Outlier: OutlierConfig{
			Consecutive:       5,
			BaseEjection:      10 * time.Second,
			MaxEjection:       5 * time.Minute,
			Decay:             30 * time.Second,
			MaxEjectedPercent: 50,
		},

		ReadHeaderTimeout: 10 * time.Second,
		ClientIdleTimeout: 120 * time.Second,
		Clock:             SystemClock(),
	}
}

// DevConfig returns the configuration `lodestone dev` uses: the defaults,
// with fewer shards (a laptop has few cores and the demo few instances)
// and a short base ejection so a broken demo origin comes back quickly.
func DevConfig() Config {
	c := DefaultConfig()
	c.Shards = 4                             // one small machine
	c.Outlier.BaseEjection = 2 * time.Second // quick recovery while experimenting
	return c
}

// withDefaults fills zero fields from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	setS := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	setI := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	setD := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	setS(&c.Listen, d.Listen)
	setS(&c.AdminListen, d.AdminListen)
	if len(c.Registry) == 0 {
		c.Registry = d.Registry
	}
	setS(&c.KVPrefix, d.KVPrefix)
	setS(&c.Instances, d.Instances)
	setD(&c.PersistInterval, d.PersistInterval)
	setI(&c.Shards, d.Shards)
	setI(&c.SubsetSize, d.SubsetSize)
	setI(&c.Replication, d.Replication)
	setI(&c.MaxInFlight, d.MaxInFlight)
	setI(&c.MaxQueue, d.MaxQueue)
	setD(&c.MaxQueueTime, d.MaxQueueTime)
	setD(&c.RetryAfter, d.RetryAfter)
	setI(&c.OriginConcurrency, d.OriginConcurrency)
	setD(&c.ConnectTimeout, d.ConnectTimeout)
	setD(&c.ResponseHeaderTimeout, d.ResponseHeaderTimeout)
	setD(&c.IdleTimeout, d.IdleTimeout)
	setD(&c.PoolIdleTimeout, d.PoolIdleTimeout)
	if c.RetryBudgetRatio == 0 {
		c.RetryBudgetRatio = d.RetryBudgetRatio
	}
	setI(&c.RetryBudgetMinPerSec, d.RetryBudgetMinPerSec)
	setI(&c.Outlier.Consecutive, d.Outlier.Consecutive)
	setD(&c.Outlier.BaseEjection, d.Outlier.BaseEjection)
	setD(&c.Outlier.MaxEjection, d.Outlier.MaxEjection)
	setD(&c.Outlier.Decay, d.Outlier.Decay)
	setI(&c.Outlier.MaxEjectedPercent, d.Outlier.MaxEjectedPercent)
	setD(&c.ReadHeaderTimeout, d.ReadHeaderTimeout)
	setD(&c.ClientIdleTimeout, d.ClientIdleTimeout)
	if c.Clock == nil {
		c.Clock = d.Clock
	}
	return c
}

// Validate reports the first invalid field as a *ConfigError. Zero fields
// are valid: they take DefaultConfig's value.
func (c Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	for field, addr := range map[string]string{"Listen": c.Listen, "AdminListen": c.AdminListen} {
		if addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return bad(field, "%q is not host:port", addr)
		}
	}
	if c.Listen != "" && c.Listen == c.AdminListen && !strings.HasSuffix(c.Listen, ":0") {
		return bad("AdminListen", "must differ from Listen (%s): the admin port must not share the proxy's listener", c.Listen)
	}
	if c.Source == nil {
		for i, ep := range c.Registry {
			if _, _, err := net.SplitHostPort(ep); err != nil {
				return bad(fmt.Sprintf("Registry[%d]", i), "%q is not host:port", ep)
			}
		}
	}
	switch c.Instances {
	case "", InstancesCatalog, InstancesKV:
	default:
		return bad("Instances", "%q is not %q or %q", c.Instances, InstancesCatalog, InstancesKV)
	}
	if c.KVPrefix != "" && !strings.HasSuffix(c.KVPrefix, "/") {
		return bad("KVPrefix", "%q must end with '/'", c.KVPrefix)
	}
	if c.Shards < 0 || (c.Shards > 0 && bits.OnesCount(uint(c.Shards)) != 1) || c.Shards > 1024 {
		return bad("Shards", "%d must be a power of two between 1 and 1024", c.Shards)
	}
	if c.SubsetSize < 0 {
		return bad("SubsetSize", "%d must not be negative", c.SubsetSize)
	}
	if c.Replication < 0 {
		return bad("Replication", "%d must not be negative", c.Replication)
	}
	shards := c.Shards
	if shards == 0 {
		shards = DefaultConfig().Shards
	}
	if c.Replication > shards {
		return bad("Replication", "%d exceeds Shards (%d)", c.Replication, shards)
	}
	if c.MaxInFlight < 0 {
		return bad("MaxInFlight", "%d must not be negative", c.MaxInFlight)
	}
	if c.OriginConcurrency < 0 {
		return bad("OriginConcurrency", "%d must not be negative", c.OriginConcurrency)
	}
	if c.MaxRetries < 0 || c.MaxRetries > 10 {
		return bad("MaxRetries", "%d must be between 0 and 10", c.MaxRetries)
	}
	if c.RetryBudgetRatio < 0 || c.RetryBudgetRatio > 1 {
		return bad("RetryBudgetRatio", "%v must be between 0 and 1", c.RetryBudgetRatio)
	}
	if c.RetryBudgetMinPerSec < 0 {
		return bad("RetryBudgetMinPerSec", "%d must not be negative", c.RetryBudgetMinPerSec)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"PersistInterval", c.PersistInterval},
		{"MaxQueueTime", c.MaxQueueTime},
		{"RetryAfter", c.RetryAfter},
		{"ConnectTimeout", c.ConnectTimeout},
		{"ResponseHeaderTimeout", c.ResponseHeaderTimeout},
		{"IdleTimeout", c.IdleTimeout},
		{"PoolIdleTimeout", c.PoolIdleTimeout},
		{"ReadHeaderTimeout", c.ReadHeaderTimeout},
		{"ClientIdleTimeout", c.ClientIdleTimeout},
		{"Outlier.BaseEjection", c.Outlier.BaseEjection},
		{"Outlier.MaxEjection", c.Outlier.MaxEjection},
		{"Outlier.Decay", c.Outlier.Decay},
	} {
		if f.d < 0 {
			return bad(f.name, "negative duration %v", f.d)
		}
	}
	if c.Outlier.BaseEjection > 0 && c.Outlier.MaxEjection > 0 && c.Outlier.BaseEjection > c.Outlier.MaxEjection {
		return bad("Outlier.BaseEjection", "%v exceeds Outlier.MaxEjection %v", c.Outlier.BaseEjection, c.Outlier.MaxEjection)
	}
	if c.Outlier.MaxEjectedPercent < 0 || c.Outlier.MaxEjectedPercent > 100 {
		return bad("Outlier.MaxEjectedPercent", "%d must be between 0 and 100", c.Outlier.MaxEjectedPercent)
	}
	return nil
}
