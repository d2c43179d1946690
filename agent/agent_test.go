package agent

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/gossip"
)

// fakeRegistry records the agent's writes in order. It stands in for the
// Catalog service only where the test is about which writes the agent
// makes; server_test.go runs the agent against a real server.
type fakeRegistry struct {
	mu     sync.Mutex
	writes []string
}

func (f *fakeRegistry) add(s string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = append(f.writes, s)
}

func (f *fakeRegistry) all() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.writes...)
}

func (f *fakeRegistry) Register(_ context.Context, in *lodestonepb.CatalogRegisterRequest, _ ...grpc.CallOption) (*lodestonepb.CatalogRegisterResponse, error) {
	s := "register:" + in.Node.Name
	if in.Service != nil {
		s = "register:" + in.Service.Id
		for _, c := range in.Checks {
			s += ":" + lodestonepb.HealthStatusWord(c.Status)
		}
	}
	f.add(s)
	return &lodestonepb.CatalogRegisterResponse{}, nil
}

func (f *fakeRegistry) Deregister(_ context.Context, in *lodestonepb.CatalogDeregisterRequest, _ ...grpc.CallOption) (*lodestonepb.CatalogDeregisterResponse, error) {
	f.add("deregister:" + in.ServiceId)
	return &lodestonepb.CatalogDeregisterResponse{}, nil
}

func (f *fakeRegistry) UpdateCheck(_ context.Context, in *lodestonepb.UpdateCheckRequest, _ ...grpc.CallOption) (*lodestonepb.UpdateCheckResponse, error) {
	f.add("check:" + in.CheckId + ":" + lodestonepb.HealthStatusWord(in.Status))
	return &lodestonepb.UpdateCheckResponse{}, nil
}

func (f *fakeRegistry) Node(context.Context, *lodestonepb.NodeRequest, ...grpc.CallOption) (*lodestonepb.NodeResponse, error) {
	return &lodestonepb.NodeResponse{}, nil
}

func (f *fakeRegistry) Checks(context.Context, *lodestonepb.ChecksRequest, ...grpc.CallOption) (*lodestonepb.ChecksResponse, error) {
	return &lodestonepb.ChecksResponse{}, nil
}

// count returns how many recorded writes equal w.
func (f *fakeRegistry) count(w string) int {
	n := 0
	for _, s := range f.all() {
		if s == w {
			n++
		}
	}
	return n
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func fastGossip(ip string) gossip.Config {
	c := gossip.DefaultConfig()
	c.BindAddr = ip + ":0"
	c.ProbeInterval, c.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
	c.SuspicionMult, c.SuspicionMaxTimeoutMult = 3, 1
	c.GossipInterval = 50 * time.Millisecond
	c.RetryJoinInterval = 100 * time.Millisecond
	return c
}

func startAgent(t *testing.T, cfg Config) *Agent {
	t.Helper()
	logs := &syncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	a, err := New(cfg)
	if err != nil {
		t.Fatalf("new agent: %v", err)
	}
	a.Start()
	t.Cleanup(func() {
		if err := a.Close(context.Background()); err != nil {
			t.Errorf("close agent: %v", err)
		}
		if t.Failed() {
			logs.mu.Lock()
			t.Logf("agent logs:\n%s", logs.b.String())
			logs.mu.Unlock()
		}
	})
	return a
}

func testConfig(reg Registry, ip string) Config {
	cfg := DefaultConfig()
	cfg.NodeName = "agent-" + ip
	cfg.registry = reg
	cfg.Gossip = fastGossip(ip)
	cfg.RetryMin, cfg.RetryMax = 10*time.Millisecond, 100*time.Millisecond
	cfg.CheckMinInterval, cfg.MinDeregisterCriticalServiceAfter = testChecks.MinInterval, testChecks.MinDeregisterAfter
	return cfg
}

// waitFor polls cond until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// counterSum adds up every series of a counter family in reg.
func counterSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// waitRuns waits until n more checks have run: time for any write a
// (wrong) agent would make while nothing changes.
func waitRuns(t *testing.T, a *Agent, n float64) {
	t.Helper()
	start := counterSum(t, a.prom, "lodestone_agent_checks_run_total")
	waitFor(t, 10*time.Second, fmt.Sprintf("%v check runs", n), func() bool {
		return counterSum(t, a.prom, "lodestone_agent_checks_run_total") >= start+n
	})
}

func TestAgentHTTPAndTCPChecksWriteEachTransitionOnce(t *testing.T) {
	var code atomic.Int32
	code.Store(200)
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(int(code.Load())) }))
	defer web.Close()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var tcpWG sync.WaitGroup
	tcpWG.Add(1)
	go func() {
		defer tcpWG.Done()
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() {
		tcp.Close()
		tcpWG.Wait()
	})
	tcpAddr := tcp.Addr().String()

	reg := &fakeRegistry{}
	cfg := testConfig(reg, "127.0.0.11")
	every := Duration(30 * time.Millisecond)
	cfg.Services = []ServiceDefinition{
		{Name: "web", Port: 80, Check: &CheckDefinition{HTTP: web.URL + "/health", Interval: every}},
		{Name: "db", Port: 5432, Check: &CheckDefinition{TCP: tcpAddr, Interval: every}},
	}
	a := startAgent(t, cfg)

	// Registered once, with the first probe's result, not critical first.
	waitFor(t, 5*time.Second, "both services registered", func() bool {
		return reg.count("register:web:passing") == 1 && reg.count("register:db:passing") == 1
	})
	steady := len(reg.all())
	waitRuns(t, a, 20)
	if got := len(reg.all()); got != steady {
		t.Fatalf("writes while nothing changed: %v", reg.all()[steady:])
	}

	code.Store(500)
	waitFor(t, 5*time.Second, "web critical", func() bool { return reg.count("check:service:web:critical") == 1 })
	code.Store(429)
	waitFor(t, 5*time.Second, "web warning", func() bool { return reg.count("check:service:web:warning") == 1 })
	code.Store(200)
	waitFor(t, 5*time.Second, "web passing", func() bool { return reg.count("check:service:web:passing") == 1 })
	tcp.Close()
	waitFor(t, 5*time.Second, "db critical", func() bool { return reg.count("check:service:db:critical") == 1 })
	waitRuns(t, a, 20)
	want := []string{"register:agent-127.0.0.11", "check:service:web:critical", "check:service:web:warning", "check:service:web:passing", "check:service:db:critical"}
	var got []string
	for _, w := range reg.all() {
		if !strings.HasPrefix(w, "register:web") && !strings.HasPrefix(w, "register:db") {
			got = append(got, w)
		}
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("writes %v, want %v (each transition once)", got, want)
	}
	if got := counterSum(t, a.prom, "lodestone_agent_check_transitions_total"); got != 6 {
		t.Fatalf("transitions metric %v, want 6 (2 first results + 4 changes)", got)
	}
}

func TestAgentTTLThroughConsulClient(t *testing.T) {
	reg := &fakeRegistry{}
	cfg := testConfig(reg, "127.0.0.12")
	cfg.ListenHTTP = "127.0.0.12:0"
	a := startAgent(t, cfg)
	c, err := api.NewClient(&api.Config{Address: a.HTTPAddr()})
	if err != nil {
		t.Fatal(err)
	}
	ag := c.Agent()
	ttl := 400 * time.Millisecond
	if err := ag.ServiceRegister(&api.AgentServiceRegistration{ID: "cache1", Name: "cache", Port: 6379, Tags: []string{"v1"},
		Check: &api.AgentServiceCheck{TTL: ttl.String()}}); err != nil {
		t.Fatalf("register: %v", err)
	}
	waitFor(t, 5*time.Second, "registered critical", func() bool { return reg.count("register:cache1:critical") == 1 })

	if err := ag.PassTTL("service:cache1", "warming done"); err != nil {
		t.Fatalf("pass: %v", err)
	}
	passedAt := time.Now()
	waitFor(t, 5*time.Second, "passing", func() bool { return reg.count("check:service:cache1:passing") == 1 })
	checks, err := ag.Checks()
	if err != nil {
		t.Fatal(err)
	}
	if got := checks["service:cache1"]; got == nil || got.Status != api.HealthPassing || got.Output != "warming done" {
		t.Fatalf("agent checks: %+v", got)
	}
	// Not reporting: the TTL expires, once.
	waitFor(t, 5*time.Second, "expired", func() bool { return reg.count("check:service:cache1:critical") == 1 })
	if took := time.Since(passedAt); took < ttl {
		t.Fatalf("expired after %v, before its TTL %v", took, ttl)
	}
	if err := ag.UpdateTTL("service:cache1", "recovered", api.HealthPassing); err != nil {
		t.Fatalf("update: %v", err)
	}
	waitFor(t, 5*time.Second, "passing again", func() bool { return reg.count("check:service:cache1:passing") == 2 })
	if err := ag.WarnTTL("service:cache1", "slow"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "warning", func() bool { return reg.count("check:service:cache1:warning") == 1 })

	if err := ag.PassTTL("nope", ""); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("unknown check: %v, want a 404", err)
	}
	svcs, err := ag.Services()
	if err != nil {
		t.Fatal(err)
	}
	if s := svcs["cache1"]; s == nil || s.Service != "cache" || s.Port != 6379 {
		t.Fatalf("agent services: %+v", svcs)
	}
	if err := ag.ServiceDeregister("cache1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "deregistered", func() bool { return reg.count("deregister:cache1") == 1 })
	if err := ag.ServiceDeregister("cache1"); err == nil {
		t.Fatal("deregistering an unknown service succeeded")
	}
}
