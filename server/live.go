package server

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/lodestone-kv/lodestone/store"
)

// LiveConfig is the part of Config a running server takes new values of
// (Reload). Every field is read per request or per accepted connection,
// through one atomic pointer to an immutable LiveConfig, so a change costs
// the hot path nothing and a request sees either the old set or the new.
//
// What is not here is fixed at start because something holds it that
// cannot change under live traffic: the gRPC server's message size and
// stream cap (MaxRequestBytes, MaxStreamsPerConnection), the connection
// semaphores (MaxConnections, MaxHTTPConnections), the http.Server's
// timeouts (HTTPIdleTimeout), the Raft node's timings, the listeners and
// the data dir.
type LiveConfig struct {
	// Limits bounds keys, values, transactions and range answers.
	Limits store.Limits
	// MaxTxnRequestBytes and MaxRangeResponseBytes as in Config.
	MaxTxnRequestBytes    int
	MaxRangeResponseBytes int
	// MaxWatchesPerStream and MaxWatchesPerConnection bound new watches;
	// watches already open stay.
	MaxWatchesPerStream     int
	MaxWatchesPerConnection int
	// The per-client connection caps and their exempt networks apply to
	// connections accepted from then on; open ones stay.
	MaxGRPCConnectionsPerClient int
	MaxHTTPConnectionsPerClient int
	ConnectionLimitExempt       []netip.Prefix
}

// Live returns the live-changeable part of c.
func (c *Config) Live() LiveConfig {
	return LiveConfig{
		Limits:                      c.Limits,
		MaxTxnRequestBytes:          c.MaxTxnRequestBytes,
		MaxRangeResponseBytes:       c.MaxRangeResponseBytes,
		MaxWatchesPerStream:         c.MaxWatchesPerStream,
		MaxWatchesPerConnection:     c.MaxWatchesPerConnection,
		MaxGRPCConnectionsPerClient: c.MaxGRPCConnectionsPerClient,
		MaxHTTPConnectionsPerClient: c.MaxHTTPConnectionsPerClient,
		ConnectionLimitExempt:       slices.Clone(c.ConnectionLimitExempt),
	}
}

// withLive returns c with l's fields in place of its own.
func (c Config) withLive(l LiveConfig) Config {
	c.Limits = l.Limits
	c.MaxTxnRequestBytes = l.MaxTxnRequestBytes
	c.MaxRangeResponseBytes = l.MaxRangeResponseBytes
	c.MaxWatchesPerStream = l.MaxWatchesPerStream
	c.MaxWatchesPerConnection = l.MaxWatchesPerConnection
	c.MaxGRPCConnectionsPerClient = l.MaxGRPCConnectionsPerClient
	c.MaxHTTPConnectionsPerClient = l.MaxHTTPConnectionsPerClient
	c.ConnectionLimitExempt = slices.Clone(l.ConnectionLimitExempt)
	return c
}

// live is the LiveConfig in force.
func (s *core) live() *LiveConfig { return s.liveCfg.Load() }

// Reload puts l in force for requests and connections from now on. It
// checks l with the rest of the running configuration first (Validate:
// for instance values must still fit --max-request-bytes), and changes
// nothing when that fails. Call it after Start.
func (s *Server) Reload(l LiveConfig) error {
	next := s.cfg.withLive(l)
	if err := next.Validate(); err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	l = next.Live() // NB: a copy the caller cannot change under readers
	s.liveCfg.Store(&l)
	s.applyConnCaps(&l)
	return nil
}

// applyConnCaps gives the client listeners l's per-client caps.
func (s *Server) applyConnCaps(l *LiveConfig) {
	def := DefaultConfig()
	if s.httpConns != nil {
		s.httpConns.setPerClient(s.perClient("http", l.MaxHTTPConnectionsPerClient, s.cfg.MaxHTTPConnections, def.MaxHTTPConnectionsPerClient, def.MaxHTTPConnections),
			l.ConnectionLimitExempt)
	}
	if s.grpcConns != nil {
		s.grpcConns.setPerClient(s.perClient("grpc", l.MaxGRPCConnectionsPerClient, s.cfg.MaxConnections, def.MaxGRPCConnectionsPerClient, def.MaxConnections),
			l.ConnectionLimitExempt)
	}
}
