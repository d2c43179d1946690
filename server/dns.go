package server

import (
	"errors"
	"fmt"
	"net"

	"github.com/lodestone-kv/lodestone/server/dnsapi"
)

// DNSConfig turns on Consul's DNS interface (server/dnsapi), answered from
// this member's catalog with no Raft round.
type DNSConfig struct {
	// Listen is the host:port answered on, UDP and TCP; empty (the
	// default here; lodestone server's is 127.0.0.1:8600): no DNS.
	Listen string
	// ListenOptional runs the server without DNS, with a warning, when
	// Listen cannot be bound, instead of refusing to start: lodestone
	// server sets it for its default address, which another server on the
	// same host (or a Consul agent) may hold, and never for an address
	// given with --listen-dns.
	ListenOptional bool
	dnsapi.Config
}

// DefaultDNSConfig is off, with dnsapi's defaults once given an address.
func DefaultDNSConfig() DNSConfig { return DNSConfig{Config: dnsapi.DefaultConfig()} }

func (c *DNSConfig) validate() error {
	if c.Listen == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return &ConfigError{Field: "listen-dns", Err: fmt.Errorf("%q is not host:port: %v", c.Listen, err)}
	}
	if err := c.Config.Validate(); err != nil {
		return &ConfigError{Field: "dns", Err: err}
	}
	return nil
}

// listenDNS binds the DNS address in New, beside the other listeners, so
// a member asked for port 0 knows its port before Start. Nil without DNS,
// or when an optional address is taken.
func (s *Server) listenDNS() (*dnsapi.Listeners, error) {
	c := s.cfg.DNS
	if c.Listen == "" {
		return nil, nil
	}
	l, err := dnsapi.Listen(c.Listen)
	if err != nil && c.ListenOptional {
		s.logger.Warn("DNS interface not started: its default address is taken; give another (--listen-dns; lodestone dev: --dns), or \"\" to turn it off",
			"addr", c.Listen, "err", err)
		return nil, nil
	}
	return l, err
}

// startDNS serves DNS on the listeners bound in New.
func (s *Server) startDNS() {
	if s.dnsLis == nil {
		return
	}
	d, err := dnsapi.New(consulBackend{s: s.core, local: s.local, membership: membership{s}}, s.dnsLis, s.cfg.DNS.Config, s.logger.With("component", "dns"), s.metrics.reg)
	s.dnsLis = nil // NB: dnsapi.New owns them now, also when it failed
	if err != nil {
		s.errC <- fmt.Errorf("start DNS: %w", err)
		return
	}
	s.dns = d
	s.serve("dns udp", d.ServeUDP)
	s.serve("dns tcp", d.ServeTCP)
}

// DNSAddr is the DNS interface's address (UDP and TCP), or "" without it.
func (s *Server) DNSAddr() string {
	switch {
	case s.dns != nil:
		return s.dns.Addr()
	case s.dnsLis != nil:
		return s.dnsLis.Addr()
	}
	return ""
}

func (s *Server) closeDNS() error {
	var errs []error
	if s.dns != nil {
		errs = append(errs, s.dns.Close())
	}
	if s.dnsLis != nil {
		errs = append(errs, s.dnsLis.Close())
		s.dnsLis = nil
	}
	return errors.Join(errs...)
}
