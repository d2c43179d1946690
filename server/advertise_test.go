package server

import (
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Members listed by host name in --initial-cluster keep those names as
// their peer addresses, though they listen on an IP, and publish the
// client addresses they advertise rather than the ones they bound: what a
// member in a container must do.
func TestMembersPublishAdvertisedAddresses(t *testing.T) {
	byName := func(addr string) string {
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		return net.JoinHostPort("localhost", port)
	}
	c := newTestClusterWith(t, 3, func(name string, cfg *Config) {
		for n, addr := range cfg.InitialCluster {
			cfg.InitialCluster[n] = byName(addr)
		}
		cfg.AdvertiseGRPC = name + ".grpc.test:7400"
		cfg.AdvertiseHTTP = name + ".http.test:8500"
	})
	lead := c.waitLeader()
	index := put(t, c.kv(lead), "advertised", "x").Header.Index
	want := map[string]*lodestonepb.Member{}
	for _, n := range c.names {
		c.waitApplied(n, index)
		want[n] = &lodestonepb.Member{Name: n, PeerAddr: byName(c.peers[n]), GrpcAddr: n + ".grpc.test:7400", HttpAddr: n + ".http.test:8500"}
	}
	published := func(s *Server) error {
		ms := s.store.Members()
		if len(ms) != len(want) {
			return errors.New("not every member listed")
		}
		for _, m := range ms {
			w := want[m.Name]
			if w == nil || m.PeerAddr != w.PeerAddr || m.GrpcAddr != w.GrpcAddr || m.HttpAddr != w.HttpAddr {
				return errors.New("member " + m.Name + " listed at peer " + m.PeerAddr + " grpc " + m.GrpcAddr + " http " + m.HttpAddr)
			}
		}
		return nil
	}
	var last error
	deadline := time.Now().Add(10 * time.Second)
	for _, n := range c.names {
		for last = published(c.servers[n]); last != nil && time.Now().Before(deadline); last = published(c.servers[n]) {
			time.Sleep(20 * time.Millisecond)
		}
		if last != nil {
			t.Fatalf("%s's membership: %v; want every member at its initial-cluster entry and advertised addresses", n, last)
		}
	}
	for _, n := range c.names {
		st, err := c.cluster(n).Status(ctxT(t), &lodestonepb.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if got, w := st.Self, want[n]; got.PeerAddr != w.PeerAddr || got.GrpcAddr != w.GrpcAddr || got.HttpAddr != w.HttpAddr {
			t.Errorf("%s's status says it is at peer %s grpc %s http %s, want %s %s %s",
				n, got.PeerAddr, got.GrpcAddr, got.HttpAddr, w.PeerAddr, w.GrpcAddr, w.HttpAddr)
		}
		if s := c.servers[n]; s.AdvertisedGRPC() == s.GRPCAddr() {
			t.Errorf("%s advertises its bound gRPC address %s", n, s.GRPCAddr())
		}
	}
}

// A member listed at port 0 (a test letting the kernel pick) is listed at
// the port its listener got, and the caller's map is left as given.
func TestPortZeroEntryTakesBoundPort(t *testing.T) {
	cfg := testConfig()
	cfg.Name, cfg.DataDir = "a", filepath.Join(t.TempDir(), "a")
	cfg.ListenPeer, cfg.ListenGRPC, cfg.ListenHTTP = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	given := map[string]string{"a": "127.0.0.1:0"}
	cfg.InitialCluster = given
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Close() })
	waitFor(t, 10*time.Second, func() bool { return s.raft.Status().Lead != 0 })
	ms := s.store.Members()
	if len(ms) != 1 || ms[0].PeerAddr != s.PeerAddr() {
		t.Fatalf("members %v, want a at its bound peer address %s", ms, s.PeerAddr())
	}
	if given["a"] != "127.0.0.1:0" {
		t.Errorf("New changed the caller's InitialCluster to %v", given)
	}
	if s.AdvertisedGRPC() != s.GRPCAddr() || s.AdvertisedHTTP() != s.HTTPAddr() {
		t.Errorf("advertises %s and %s without AdvertiseGRPC/HTTP, want the bound %s and %s",
			s.AdvertisedGRPC(), s.AdvertisedHTTP(), s.GRPCAddr(), s.HTTPAddr())
	}
}

// Advertise addresses nobody can dial, or a peer address that contradicts
// the initial cluster, are refused naming the flag.
func TestAdvertiseConfigRefused(t *testing.T) {
	for _, tc := range []struct {
		name, field string
		set         func(*Config)
	}{
		{"wildcard grpc", "advertise-grpc", func(c *Config) { c.AdvertiseGRPC = "0.0.0.0:7400" }},
		{"wildcard ipv6 http", "advertise-http", func(c *Config) { c.AdvertiseHTTP = "[::]:8500" }},
		{"no port", "advertise-http", func(c *Config) { c.AdvertiseHTTP = "server1" }},
		{"no host", "advertise-grpc", func(c *Config) { c.AdvertiseGRPC = ":7400" }},
		{"port 0", "advertise-grpc", func(c *Config) { c.AdvertiseGRPC = "server1:0" }},
		{"named port", "advertise-http", func(c *Config) { c.AdvertiseHTTP = "server1:http" }},
		{"peer not the entry", "advertise-peer", func(c *Config) { c.AdvertisePeer = "server1:7401" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := singleMemberConfig(t)
			tc.set(&cfg)
			var ce *ConfigError
			if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != tc.field {
				t.Fatalf("got %v, want a ConfigError on %s", err, tc.field)
			}
		})
	}
	cfg := singleMemberConfig(t)
	cfg.AdvertisePeer, cfg.AdvertiseGRPC, cfg.AdvertiseHTTP = "127.0.0.1:1", "server1:7400", "10.0.0.1:8500"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("good advertise addresses refused: %v", err)
	}
}
