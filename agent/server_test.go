package agent

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/server"
	"github.com/lodestone-kv/lodestone/server/servertest"
)

// startServer runs a one-member registry with gossip on ip, in process.
func startServer(t *testing.T, ip string) (*server.Server, lodestonepb.CatalogClient) {
	t.Helper()
	logs := &syncBuffer{}
	srv := servertest.Start(t, func(cfg *server.Config) {
		cfg.Gossip.Pool = fastGossip(ip)
		cfg.Gossip.ReconcileInterval = 200 * time.Millisecond
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		if t.Failed() {
			logs.mu.Lock()
			t.Logf("server logs:\n%s", logs.b.String())
			logs.mu.Unlock()
		}
	})
	cluster := lodestonepb.NewClusterClient(conn)
	waitFor(t, 10*time.Second, "a leader", func() bool {
		st, err := cluster.Status(context.Background(), &lodestonepb.StatusRequest{})
		return err == nil && st.LeaderId != 0
	})
	return srv, lodestonepb.NewCatalogClient(conn)
}

func checkStatus(t *testing.T, cat lodestonepb.CatalogClient, node, id string) lodestonepb.HealthStatus {
	t.Helper()
	resp, err := cat.Checks(context.Background(), &lodestonepb.ChecksRequest{Node: node})
	if err != nil {
		return 0
	}
	for _, c := range resp.Checks {
		if c.CheckId == id {
			return c.Status
		}
	}
	return 0
}

// The agent against a real server: it registers through the Catalog
// service, the leader adds serfHealth once the agent is in the pool,
// anti-entropy reads write nothing while the registry agrees, and a
// service an operator deregisters comes back.
func TestAgentAgainstServer(t *testing.T) {
	srv, cat := startServer(t, "127.0.0.13")
	cfg := DefaultConfig()
	cfg.NodeName, cfg.Endpoints = "a1", []string{srv.GRPCAddr()}
	cfg.Gossip = fastGossip("127.0.0.14")
	cfg.Gossip.Join = []string{srv.GossipAddr()}
	cfg.AntiEntropyInterval = 100 * time.Millisecond
	cfg.Services = []ServiceDefinition{{Name: "web", Port: 80, Check: &CheckDefinition{TTL: Duration(time.Hour), Status: "passing"}}}
	a := startAgent(t, cfg)

	waitFor(t, 10*time.Second, "registered and alive", func() bool {
		return checkStatus(t, cat, "a1", "service:web") == lodestonepb.HealthStatus_HEALTH_PASSING &&
			checkStatus(t, cat, "a1", "serfHealth") == lodestonepb.HealthStatus_HEALTH_PASSING
	})
	waitFor(t, 10*time.Second, "the server's own addresses published", func() bool {
		ms := srv.Store().Members()
		return len(ms) == 1 && ms[0].GrpcAddr != ""
	})
	// Anti-entropy runs ten times: reads only.
	idx := srv.Store().Index()
	runs := counterSum(t, a.prom, "lodestone_agent_anti_entropy_runs_total")
	waitFor(t, 10*time.Second, "ten anti-entropy rounds", func() bool {
		return counterSum(t, a.prom, "lodestone_agent_anti_entropy_runs_total") >= runs+10
	})
	if got := srv.Store().Index(); got != idx {
		t.Fatalf("index moved from %d to %d while the registry agreed with the agent", idx, got)
	}

	if err := a.UpdateTTL("service:web", lodestonepb.HealthStatus_HEALTH_CRITICAL, "down"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "critical through UpdateCheck", func() bool {
		return checkStatus(t, cat, "a1", "service:web") == lodestonepb.HealthStatus_HEALTH_CRITICAL
	})
	if _, err := cat.Deregister(context.Background(), &lodestonepb.CatalogDeregisterRequest{Node: "a1", ServiceId: "web"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "web registered again by anti-entropy", func() bool {
		return checkStatus(t, cat, "a1", "service:web") == lodestonepb.HealthStatus_HEALTH_CRITICAL
	})
}
