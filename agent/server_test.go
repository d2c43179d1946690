package agent

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

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

func serviceOnNode(t *testing.T, cat lodestonepb.CatalogClient, node, id string) bool {
	t.Helper()
	resp, err := cat.Node(context.Background(), &lodestonepb.NodeRequest{Name: node})
	if err != nil {
		return false
	}
	for _, s := range resp.GetNode().GetServices() {
		if s.Id == id {
			return true
		}
	}
	return false
}

// The agent's part of the checks shared with servers (package checks),
// through its local API and the official client: a gRPC health check, a
// TTL check whose service is deregistered once it stayed critical past
// DeregisterCriticalServiceAfter, ids with a slash, and script checks
// refused with Consul's words.
func TestAgentGRPCDeregisterAfterAndScripts(t *testing.T) {
	srv, cat := startServer(t, "127.0.0.15")
	cfg := testConfig(nil, "127.0.0.16")
	cfg.registry = nil
	cfg.NodeName, cfg.Endpoints = "a2", []string{srv.GRPCAddr()}
	cfg.Gossip.Join = []string{srv.GossipAddr()}
	cfg.ListenHTTP = "127.0.0.16:0"
	cfg.CheckReapInterval = 20 * time.Millisecond
	a := startAgent(t, cfg)
	cl, err := api.NewClient(&api.Config{Address: a.HTTPAddr()})
	if err != nil {
		t.Fatal(err)
	}
	ag := cl.Agent()

	// gRPC: a real server with the standard health service.
	l, err := net.Listen("tcp", "127.0.0.16:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	var wg sync.WaitGroup
	wg.Go(func() { gs.Serve(l) })
	t.Cleanup(func() {
		gs.Stop()
		wg.Wait()
	})
	if err := ag.ServiceRegister(&api.AgentServiceRegistration{ID: "db/pg1", Name: "db", Port: 5432,
		Check: &api.AgentServiceCheck{GRPC: l.Addr().String(), Interval: "50ms"}}); err != nil {
		t.Fatalf("register grpc: %v", err)
	}
	waitFor(t, 10*time.Second, "gRPC check passing", func() bool {
		return checkStatus(t, cat, "a2", "service:db/pg1") == lodestonepb.HealthStatus_HEALTH_PASSING
	})
	if err := ag.ServiceDeregister("db/pg1"); err != nil {
		t.Fatalf("deregister db/pg1: %v", err)
	}
	waitFor(t, 10*time.Second, "db/pg1 gone", func() bool { return !serviceOnNode(t, cat, "a2", "db/pg1") })

	ttl, after := 100*time.Millisecond, 300*time.Millisecond
	registered := time.Now()
	if err := ag.ServiceRegister(&api.AgentServiceRegistration{ID: "cache1", Name: "cache",
		Check: &api.AgentServiceCheck{TTL: ttl.String(), Status: api.HealthPassing, DeregisterCriticalServiceAfter: after.String()}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "cache1 registered passing", func() bool {
		return checkStatus(t, cat, "a2", "service:cache1") == lodestonepb.HealthStatus_HEALTH_PASSING
	})
	waitFor(t, 10*time.Second, "cache1 deregistered", func() bool { return !serviceOnNode(t, cat, "a2", "cache1") })
	if took := time.Since(registered); took < ttl+after {
		t.Fatalf("deregistered %v after registration, before its TTL and deregister interval (%v)", took, ttl+after)
	}
	if svcs, err := ag.Services(); err != nil || svcs["cache1"] != nil {
		t.Fatalf("agent still lists cache1: %v %v", svcs, err)
	}

	err = ag.ServiceRegister(&api.AgentServiceRegistration{Name: "sh", Check: &api.AgentServiceCheck{Args: []string{"true"}, Interval: "1s"}})
	if err == nil || !strings.Contains(err.Error(), "500") || !strings.Contains(err.Error(), "Scripts are disabled on this agent from remote calls") {
		t.Fatalf("script check: %v, want Consul's 500", err)
	}
	if svcs, err := ag.Services(); err != nil || svcs["sh"] != nil {
		t.Fatalf("a refused service is listed: %v %v", svcs, err)
	}
}
