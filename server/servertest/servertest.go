// Package servertest runs a real one-member Lodestone server in process,
// for the tests of packages built on it (the CLI, the agent, the gateway,
// the fault hooks). It is the real server on loopback sockets and a
// temporary data directory, with fast Raft ticks so a test need not wait
// for an election.
package servertest

import (
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/testnet"
	"github.com/lodestone-kv/lodestone/server"
)

// Start starts a one-member server named "r1" and closes it when the test
// ends. configure, if set, adjusts the configuration first (a logger, fault
// hooks, gossip). Start does not wait for the member to lead.
func Start(t testing.TB, configure func(*server.Config)) *server.Server {
	t.Helper()
	peer := testnet.FreeAddr(t)
	cfg := server.DefaultConfig()
	cfg.Name, cfg.DataDir = "r1", t.TempDir()
	cfg.ListenPeer, cfg.ListenGRPC, cfg.ListenHTTP = peer, "127.0.0.1:0", "127.0.0.1:0"
	cfg.InitialCluster = map[string]string{"r1": peer}
	cfg.TickInterval, cfg.ElectionTicks = 20*time.Millisecond, 10
	if configure != nil {
		configure(&cfg)
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatalf("servertest: %v", err)
	}
	srv.Start()
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("servertest: close server: %v", err)
		}
	})
	return srv
}
