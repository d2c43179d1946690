package dnsapi

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Config tunes the DNS interface. Start from DefaultConfig.
type Config struct {
	// Domain is the zone answered, "consul" by default (Consul's domain).
	Domain string
	// Datacenter is the only datacenter answered; "dc1" by default, as the
	// Consul HTTP API reports.
	Datacenter string
	// OnlyPassing answers only instances whose every check passes;
	// otherwise warning instances are answered too and only critical ones
	// left out (Consul's only_passing, default false).
	OnlyPassing bool
	// ServiceTTL is the TTL of service answers, by service (Consul's
	// service_ttl). Nil: 0 for every service.
	ServiceTTL TTLs
	// NodeTTL is the TTL of node answers (Consul's node_ttl). Default 0.
	NodeTTL time.Duration
	// Recursors receive questions outside Domain, tried in order; empty
	// (the default) refuses them.
	Recursors []string
	// RecursorTimeout bounds each forwarded exchange. Default 2s, as
	// Consul's recursor_timeout.
	RecursorTimeout time.Duration
	// MaxRecursions bounds the questions forwarded at once: each holds a
	// goroutine for up to RecursorTimeout per recursor. Default 256.
	MaxRecursions int
	// Token is the ACL secret answers are read with; empty: anonymous.
	Token string
	// UDPAnswerLimit caps the answers of a UDP reply to a client without
	// EDNS0 (Consul's udp_answer_limit, default 3, and at most 8 as
	// Consul).
	UDPAnswerLimit int
	// EnableTruncate sets the TC bit on a reply that left answers out, so
	// the client retries over TCP (Consul's enable_truncate). Default true
	// here: without it a UDP client silently gets a subset.
	EnableTruncate bool
	// MaxTCPConnections caps open TCP connections; one more is closed at
	// accept. Default 1024.
	MaxTCPConnections int
	// ReadTimeout bounds the wait for a TCP connection's first query and
	// a reply's write. Default 2s.
	ReadTimeout time.Duration
	// IdleTimeout bounds the wait for a TCP connection's next query.
	// Default 8s (RFC 7766's advice of seconds).
	IdleTimeout time.Duration
	// UDPReaders is how many goroutines read the UDP socket on the fast
	// path (fastpath.go); 0 (the default) is one per GOMAXPROCS. Only a
	// socket bound to one address has the fast path.
	UDPReaders int
	// UDPHandoffQueue bounds the UDP questions the fast path passes to
	// the full handler that wait to be read; one more is dropped and
	// counted (lodestone_dns_refused_total{reason="udp_handoff"}).
	// Default 1024.
	UDPHandoffQueue int
	// AnswerCacheBytes bounds the packed service answers kept (cache.go);
	// past it they are all dropped and built again as asked, counted in
	// lodestone_dns_answer_cache_flushes_total. Default 8 MiB.
	AnswerCacheBytes int
}

// DefaultConfig returns the defaults named on each field.
func DefaultConfig() Config {
	return Config{
		Domain:            "consul",
		Datacenter:        "dc1",
		RecursorTimeout:   2 * time.Second,
		MaxRecursions:     256,
		UDPAnswerLimit:    3,
		EnableTruncate:    true,
		MaxTCPConnections: 1024,
		ReadTimeout:       2 * time.Second,
		IdleTimeout:       8 * time.Second,
		UDPHandoffQueue:   1024,
		AnswerCacheBytes:  8 << 20,
	}
}

// maxUDPAnswerLimit is Consul's ceiling on UDPAnswerLimit: 512 bytes hold
// about 25 A records, and a client without EDNS0 gains little from more.
const maxUDPAnswerLimit = 8

// maxUDPReaders bounds UDPReaders: each holds its buffers, and past the
// cores there are nothing but more goroutines waiting on one socket.
const maxUDPReaders = 256

// Validate says which setting is wrong and what it may be.
func (c *Config) Validate() error {
	labels := strings.Split(strings.TrimSuffix(c.Domain, "."), ".")
	if slices.ContainsFunc(labels, func(l string) bool { return !validLabel(l) }) {
		return fmt.Errorf("dns domain %q is not a domain name such as consul or example.internal (labels of letters, digits and hyphens)", c.Domain)
	}
	if !validLabel(c.Datacenter) {
		return fmt.Errorf("dns datacenter %q must be one DNS label such as dc1 (letters, digits and hyphens)", c.Datacenter)
	}
	if c.NodeTTL < 0 || c.NodeTTL > maxTTL {
		return fmt.Errorf("dns node TTL %v must be between 0 and %v", c.NodeTTL, maxTTL)
	}
	for _, r := range c.Recursors {
		if _, err := RecursorAddr(r); err != nil {
			return err
		}
	}
	if len(c.Recursors) > 0 && (c.RecursorTimeout <= 0 || c.RecursorTimeout > time.Minute) {
		return fmt.Errorf("dns recursor timeout %v must be above 0 and at most 1m", c.RecursorTimeout)
	}
	if len(c.Recursors) > 0 && c.MaxRecursions <= 0 {
		return fmt.Errorf("dns max recursions %d must be positive", c.MaxRecursions)
	}
	if c.UDPAnswerLimit < 1 || c.UDPAnswerLimit > maxUDPAnswerLimit {
		return fmt.Errorf("dns UDP answer limit %d must be between 1 and %d", c.UDPAnswerLimit, maxUDPAnswerLimit)
	}
	if c.MaxTCPConnections <= 0 {
		return fmt.Errorf("dns max TCP connections %d must be positive", c.MaxTCPConnections)
	}
	if c.UDPReaders < 0 || c.UDPReaders > maxUDPReaders {
		return fmt.Errorf("dns UDP readers %d must be between 0 (one per GOMAXPROCS) and %d", c.UDPReaders, maxUDPReaders)
	}
	if c.UDPHandoffQueue <= 0 {
		return fmt.Errorf("dns UDP handoff queue %d must be positive", c.UDPHandoffQueue)
	}
	if c.AnswerCacheBytes < 0 {
		return fmt.Errorf("dns answer cache bytes %d must be 0 (keep no answers) or more", c.AnswerCacheBytes)
	}
	if c.ReadTimeout <= 0 || c.IdleTimeout <= 0 {
		return fmt.Errorf("dns read timeout %v and idle timeout %v must be positive", c.ReadTimeout, c.IdleTimeout)
	}
	return nil
}

// validLabel says whether l is one DNS label of letters, digits, hyphens
// and underscores.
func validLabel(l string) bool {
	if l == "" || len(l) > 63 {
		return false
	}
	for _, r := range l {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// RecursorAddr is r as host:port, port 53 when r names none; an error
// says what r should look like.
func RecursorAddr(r string) (string, error) {
	if ip := net.ParseIP(strings.Trim(r, "[]")); ip != nil {
		return net.JoinHostPort(ip.String(), "53"), nil
	}
	host, port, err := net.SplitHostPort(r)
	if err != nil {
		return "", fmt.Errorf("dns recursor %q: use an IP address, optionally with a port (10.0.0.2, 10.0.0.2:5353, [::1]:53)", r)
	}
	if net.ParseIP(host) == nil {
		return "", fmt.Errorf("dns recursor %q: the host must be an IP address, not a name to resolve", r)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("dns recursor %q: port %q must be between 1 and 65535", r, port)
	}
	return r, nil
}

// maxTTL bounds a configured TTL: a DNS TTL is 32 bits of seconds, and a
// day is already longer than any registry answer should be cached.
const maxTTL = 24 * time.Hour

// TTLs are service TTLs by name, as Consul's service_ttl: an exact name,
// or a prefix ending in "*" ("web-*"; "*" alone matches every service).
// An exact name wins over prefixes, and the longest prefix over shorter
// ones.
type TTLs struct {
	exact    map[string]time.Duration
	prefixes []prefixTTL // longest first
}

type prefixTTL struct {
	prefix string
	ttl    time.Duration
}

// Set adds one "name=duration" (a bare duration means "*=duration"),
// case-insensitively as DNS names are; a bad one changes nothing.
func (t *TTLs) Set(v string) error {
	name, dur, ok := strings.Cut(v, "=")
	if !ok {
		name, dur = "*", v
	}
	name = strings.ToLower(strings.TrimSpace(name))
	d, err := time.ParseDuration(strings.TrimSpace(dur))
	if err != nil || d < 0 || d > maxTTL {
		return fmt.Errorf("service TTL %q: use name=duration with a duration from 0 to %v (web=10s, web-*=5s, *=1s)", v, maxTTL)
	}
	if name == "" || strings.Count(name, "*") > 1 || (strings.Contains(name, "*") && !strings.HasSuffix(name, "*")) {
		return fmt.Errorf("service TTL %q: the name is a service, or a prefix ending in * (web=10s, web-*=5s, *=1s)", v)
	}
	if p, ok := strings.CutSuffix(name, "*"); ok {
		t.prefixes = slices.DeleteFunc(t.prefixes, func(x prefixTTL) bool { return x.prefix == p })
		t.prefixes = append(t.prefixes, prefixTTL{p, d})
		slices.SortStableFunc(t.prefixes, func(a, b prefixTTL) int { return len(b.prefix) - len(a.prefix) })
		return nil
	}
	if t.exact == nil {
		t.exact = map[string]time.Duration{}
	}
	t.exact[name] = d
	return nil
}

// For is the TTL of service name (lowercase): 0 when nothing matches.
func (t TTLs) For(name string) time.Duration {
	if d, ok := t.exact[name]; ok {
		return d
	}
	for _, p := range t.prefixes {
		if strings.HasPrefix(name, p.prefix) {
			return p.ttl
		}
	}
	return 0
}

// String lists the TTLs as Set takes them, exact names first.
func (t TTLs) String() string {
	var out []string
	for _, n := range slices.Sorted(maps.Keys(t.exact)) {
		out = append(out, n+"="+t.exact[n].String())
	}
	for _, p := range t.prefixes {
		out = append(out, p.prefix+"*="+p.ttl.String())
	}
	return strings.Join(out, ",")
}

// Type names the flag's value in help.
func (t *TTLs) Type() string { return "name=duration" }
