package server

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
)

// A member listens on one address and may be reached at another: it
// listens on a wildcard (0.0.0.0) in a container or a pod, or sits behind
// NAT. What it publishes is what others dial, so it publishes its
// --initial-cluster entry as its peer address and AdvertiseGRPC and
// AdvertiseHTTP (default: the bound listeners) as its client addresses.

// validateAdvertise checks the advertise addresses: host:port with a host
// others can dial and a real port, and a peer address that agrees with
// this member's InitialCluster entry.
func (c *Config) validateAdvertise() error {
	for _, f := range []struct{ field, addr string }{
		{"advertise-peer", c.AdvertisePeer}, {"advertise-grpc", c.AdvertiseGRPC}, {"advertise-http", c.AdvertiseHTTP},
	} {
		if f.addr == "" {
			continue
		}
		if err := checkDialable(f.addr); err != nil {
			return &ConfigError{Field: f.field, Err: err}
		}
	}
	// NB: a joining member's peer address is the one given to 'lodestone
	// members add'; only the leader's membership knows it.
	if c.AdvertisePeer != "" && !c.Join {
		if entry := c.InitialCluster[c.Name]; entry != c.AdvertisePeer {
			return &ConfigError{Field: "advertise-peer", Err: fmt.Errorf(
				"%q differs from this member's initial-cluster entry %s=%s: give both the same address, or leave out --advertise-peer",
				c.AdvertisePeer, c.Name, entry)}
		}
	}
	return nil
}

// checkDialable refuses an address nobody can dial: not host:port, a
// wildcard host, or a port outside 1-65535.
func checkDialable(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %v", addr, err)
	}
	if host == "" {
		return fmt.Errorf("%q has no host: advertise a name or an IP address others can dial", addr)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("%q is a wildcard address: advertise a name or an IP address others can dial", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: the port must be a number from 1 to 65535", addr)
	}
	return nil
}

// selfPeerEntry is the peer address this member is listed at: its
// InitialCluster entry as given, except that an entry with port 0 (a test
// that let the kernel pick) takes the port the listener got.
func selfPeerEntry(entry string, bound net.Addr) string {
	host, port, err := net.SplitHostPort(entry)
	if err != nil || port != "0" {
		return entry
	}
	_, boundPort, err := net.SplitHostPort(bound.String())
	if err != nil {
		return bound.String()
	}
	return net.JoinHostPort(host, boundPort)
}

// advertisedAddr is configured when set, else the bound address; it warns
// when that leaves a wildcard, which no client can dial.
func advertisedAddr(configured string, bound net.Addr, flag string, logger *slog.Logger) string {
	if configured != "" {
		return configured
	}
	addr := bound.String()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			logger.Warn("listening on a wildcard address without --"+flag+": clients that look up the members are told an address they cannot dial",
				"advertised", addr, "set", "--"+flag)
		}
	}
	return addr
}
