package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/testnet"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/gossip"
)

// fastGossip is the detection tuning every process of these tests runs
// with, flag for flag with gossipConfig.
var fastGossip = []string{
	"--gossip-probe-interval", "200ms", "--gossip-probe-timeout", "100ms",
	"--gossip-suspicion-mult", "3", "--gossip-suspicion-max-mult", "1", "--gossip-interval", "50ms",
}

func gossipConfig() gossip.Config {
	c := gossip.DefaultConfig()
	c.ProbeInterval, c.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
	c.SuspicionMult, c.SuspicionMaxTimeoutMult = 3, 1
	c.GossipInterval = 50 * time.Millisecond
	return c
}

// freeAddrOn reserves a TCP and UDP port on ip (gossip needs both).
func freeAddrOn(t *testing.T, ip string) string { return testnet.FreeAddrOn(t, ip, true) }

type gossipServer struct {
	grpc, http, gossip string
	catalog            lodestonepb.CatalogClient
	session            lodestonepb.SessionClient
	conn               func() lodestonepb.ClusterClient
}

func startGossipServer(t *testing.T, dir string, extra ...string) *gossipServer {
	t.Helper()
	s := &gossipServer{grpc: freeAddr(t), http: freeAddr(t), gossip: freeAddrOn(t, "127.0.0.2")}
	args := append([]string{"server", "--name", "s1", "--data-dir", filepath.Join(dir, "s1"),
		"--listen-peer", freeAddr(t), "--listen-grpc", s.grpc, "--listen-http", s.http,
		"--gossip-listen", s.gossip, "--gossip-reconcile-interval", "1s"}, fastGossip...)
	start(t, "s1", dir, append(args, extra...)...)
	waitReady(t, s.http, 30*time.Second)
	conn := dial(t, s.grpc)
	s.catalog = lodestonepb.NewCatalogClient(conn)
	s.session = lodestonepb.NewSessionClient(conn)
	s.conn = func() lodestonepb.ClusterClient { return lodestonepb.NewClusterClient(conn) }
	return s
}

type agentProc struct {
	*proc
	name, http, gossip string
}

func startAgentProc(t *testing.T, dir, name, ip string, s *gossipServer, services string, extra ...string) *agentProc {
	t.Helper()
	cfgPath := filepath.Join(dir, name+".json")
	if err := os.WriteFile(cfgPath, []byte(services), 0o644); err != nil {
		t.Fatal(err)
	}
	a := &agentProc{name: name, http: freeAddrOn(t, ip), gossip: freeAddrOn(t, ip)}
	args := append([]string{"agent", "--node", name, "--endpoints", s.grpc, "--listen-http", a.http,
		"--gossip-listen", a.gossip, "--gossip-join", s.gossip, "--config-file", cfgPath}, fastGossip...)
	a.proc = start(t, name, dir, append(args, extra...)...)
	return a
}

// serfStatus returns node's serfHealth status and output (unspecified if
// the node or check is missing).
func serfStatus(ctx context.Context, t *testing.T, s *gossipServer, node string) (lodestonepb.HealthStatus, string) {
	t.Helper()
	resp, err := s.catalog.Checks(ctx, &lodestonepb.ChecksRequest{Node: node})
	if err != nil {
		return 0, err.Error()
	}
	for _, c := range resp.Checks {
		if c.CheckId == "serfHealth" {
			return c.Status, c.Output
		}
	}
	return 0, ""
}

func pollUntil(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

const ttlService = `{"services": [{"Name": "web", "Port": 8080, "Check": {"TTL": "1h", "Status": "passing"}}]}`

// The leader turns a gossip-detected node failure into critical checks and
// invalidated sessions (docs/architecture.md, "What else travels the log").
// kill -9 of an agent process must do so within the configured detection
// time.
func TestGossipKillAgentTurnsNodeCritical(t *testing.T) {
	dir := t.TempDir()
	s := startGossipServer(t, dir)
	a := startAgentProc(t, dir, "a1", "127.0.0.3", s, ttlService)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	pollUntil(t, 20*time.Second, "a1 registered and alive", func() bool {
		st, _ := serfStatus(ctx, t, s, "a1")
		h, err := s.catalog.HealthService(ctx, &lodestonepb.HealthServiceRequest{Name: "web", PassingOnly: true})
		return st == lodestonepb.HealthStatus_HEALTH_PASSING && err == nil && len(h.Instances) == 1
	})
	sess, err := s.session.Create(ctx, &lodestonepb.CreateSessionRequest{Session: &lodestonepb.SessionEntry{Node: "a1", LockDelay: durationpb.New(0)}})
	if err != nil {
		t.Fatalf("create session on a1: %v", err)
	}

	a.kill()
	killed := time.Now()
	bound := gossipConfig().DetectionBound(2) + time.Second // + reconcile write and polling
	pollUntil(t, bound, "a1 critical after kill -9", func() bool {
		st, _ := serfStatus(ctx, t, s, "a1")
		return st == lodestonepb.HealthStatus_HEALTH_CRITICAL
	})
	took := time.Since(killed)
	t.Logf("kill -9 to serfHealth critical: %v (bound %v)", took, bound)

	if st, out := serfStatus(ctx, t, s, "a1"); out != "Agent not live or unreachable" {
		t.Fatalf("serfHealth %v output %q", st, out)
	}
	h, err := s.catalog.HealthService(ctx, &lodestonepb.HealthServiceRequest{Name: "web", PassingOnly: true})
	if err != nil || len(h.Instances) != 0 {
		t.Fatalf("web still passing after its node failed: %v %v", h, err)
	}
	pollUntil(t, 5*time.Second, "session invalidated", func() bool {
		info, err := s.session.Info(ctx, &lodestonepb.SessionInfoRequest{Id: sess.Session.Id})
		return err == nil && info.Session == nil
	})

	// The agent comes back: passing again.
	startAgentProc(t, dir, "a1", "127.0.0.3", s, ttlService)
	pollUntil(t, 20*time.Second, "a1 alive again", func() bool {
		st, _ := serfStatus(ctx, t, s, "a1")
		return st == lodestonepb.HealthStatus_HEALTH_PASSING
	})
}

// Graceful stops: --on-stop leave keeps the node, marked left; --on-stop
// deregister removes it.
func TestGossipAgentStopLeavesOrDeregisters(t *testing.T) {
	dir := t.TempDir()
	s := startGossipServer(t, dir)
	leave := startAgentProc(t, dir, "a-leave", "127.0.0.4", s, ttlService)
	dereg := startAgentProc(t, dir, "a-dereg", "127.0.0.5", s, ttlService, "--on-stop", "deregister")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, n := range []string{"a-leave", "a-dereg"} {
		pollUntil(t, 20*time.Second, n+" alive", func() bool {
			st, _ := serfStatus(ctx, t, s, n)
			return st == lodestonepb.HealthStatus_HEALTH_PASSING
		})
	}
	leave.stop(t)
	dereg.stop(t)
	pollUntil(t, 10*time.Second, "a-leave marked left", func() bool {
		st, out := serfStatus(ctx, t, s, "a-leave")
		return st == lodestonepb.HealthStatus_HEALTH_CRITICAL && out == "Agent left the gossip pool"
	})
	pollUntil(t, 10*time.Second, "a-dereg removed", func() bool {
		n, err := s.catalog.Node(ctx, &lodestonepb.NodeRequest{Name: "a-dereg"})
		return err == nil && n.Node == nil
	})
}

// Only members with the pool's key get in.
func TestGossipEncryptionKeyMismatchKeepsAgentOut(t *testing.T) {
	dir := t.TempDir()
	key1, key2 := "MTIzNDU2Nzg5MDEyMzQ1Ng==", "NjU0MzIxMDk4NzY1NDMyMQ=="
	s := startGossipServer(t, dir, "--gossip-encrypt", key1)
	bad := startAgentProc(t, dir, "a-bad", "127.0.0.6", s, ttlService, "--gossip-encrypt", key2)
	startAgentProc(t, dir, "a-good", "127.0.0.7", s, ttlService, "--gossip-encrypt", key1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Positive control: the right key gets in.
	pollUntil(t, 20*time.Second, "a-good alive", func() bool {
		st, _ := serfStatus(ctx, t, s, "a-good")
		return st == lodestonepb.HealthStatus_HEALTH_PASSING
	})
	// The wrong key registers through gRPC (that path is not gossip) but
	// never joins: its own view holds itself only, and the leader never
	// gives its node a serfHealth check.
	pollUntil(t, 20*time.Second, "a-bad registered its node", func() bool {
		n, err := s.catalog.Node(ctx, &lodestonepb.NodeRequest{Name: "a-bad"})
		return err == nil && n.Node != nil
	})
	pollUntil(t, 10*time.Second, "a-bad logs a failed join", func() bool {
		b, _ := os.ReadFile(bad.log)
		return strings.Contains(string(b), "gossip join failed")
	})
	resp, err := http.Get("http://" + bad.http + "/v1/agent/members")
	if err != nil {
		t.Fatal(err)
	}
	var members []struct{ Name string }
	err = json.NewDecoder(resp.Body).Decode(&members)
	resp.Body.Close()
	if err != nil || len(members) != 1 || members[0].Name != "a-bad" {
		t.Fatalf("a-bad sees members %+v (%v), want itself only", members, err)
	}
	if st, _ := serfStatus(ctx, t, s, "a-bad"); st != 0 {
		t.Fatalf("a-bad has serfHealth %v: it got into the pool", st)
	}
}

// stabilityWindow is how long the steady-state test watches the index:
// 20s by default to keep the suite short; LODESTONE_GOSSIP_STABILITY=1m
// runs the full minute of the issue.
func stabilityWindow(t *testing.T) time.Duration {
	if v := os.Getenv("LODESTONE_GOSSIP_STABILITY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("LODESTONE_GOSSIP_STABILITY: %v", err)
		}
		return d
	}
	return 20 * time.Second
}

// docs/architecture.md, "Liveness costs no steady Raft writes". 100 healthy
// services with TCP checks running every 500ms, a gossip pool probing
// every 200ms, a leader reconciling every second: the Raft index does not
// move.
func TestGossipSteadyStateKeepsRaftIndex(t *testing.T) {
	dir := t.TempDir()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		wg.Wait()
	})
	var svcs []string
	for i := range 100 {
		svcs = append(svcs, fmt.Sprintf(`{"ID": "svc-%03d", "Name": "svc-%03d", "Port": %d, "Check": {"TCP": %q, "Interval": "500ms"}}`, i, i, 9000+i, lis.Addr().String()))
	}
	s := startGossipServer(t, dir)
	a := startAgentProc(t, dir, "a1", "127.0.0.8", s, `{"services": [`+strings.Join(svcs, ",")+`]}`)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	pollUntil(t, 30*time.Second, "100 services passing, a1 and s1 alive", func() bool {
		p, err := s.catalog.ChecksInState(ctx, &lodestonepb.ChecksInStateRequest{State: lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED})
		if err != nil {
			return false
		}
		passing := map[string]int{}
		for _, c := range p.Checks {
			if c.Status == lodestonepb.HealthStatus_HEALTH_PASSING {
				passing[c.Node]++
			}
		}
		// a1: 100 service checks and serfHealth; s1: serfHealth.
		return len(p.Checks) == 102 && passing["a1"] == 101 && passing["s1"] == 1
	})
	// The server publishes its own client addresses once, at start: a
	// startup write, not liveness. Wait for it before watching.
	pollUntil(t, 20*time.Second, "s1 published its addresses", func() bool {
		ms, err := s.conn().Members(ctx, &lodestonepb.MembersRequest{})
		return err == nil && len(ms.Members) == 1 && ms.Members[0].GrpcAddr != ""
	})
	index := func() uint64 {
		st, err := s.conn().Status(ctx, &lodestonepb.StatusRequest{})
		if err != nil {
			t.Fatalf("status: %v", err)
		}
		return st.CommitIndex
	}
	runs := func() float64 { return metricSum(t, a.http, "lodestone_agent_checks_run_total") }
	window := stabilityWindow(t)
	idx0, runs0 := index(), runs()
	moved := func(got uint64) {
		t.Helper()
		t.Fatalf("raft commit index moved from %d to %d with nothing changing; changed since: %s", idx0, got, changedSince(ctx, t, s, idx0))
	}
	deadline := time.Now().Add(window)
	for time.Now().Before(deadline) {
		if got := index(); got != idx0 {
			moved(got)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if got := index(); got != idx0 {
		moved(got)
	}
	ran := runs() - runs0
	// 100 checks every 500ms: expect ~200/s; demand a quarter of that so a
	// slow CI host does not fail the test, while a stalled agent does.
	if min := 50 * window.Seconds(); ran < min {
		t.Fatalf("only %v check runs in %v: the agent was not checking", ran, window)
	}
	t.Logf("raft commit index stayed at %d for %v while the agent ran %v checks", idx0, window, ran)
}

// changedSince names the catalog records modified after index.
func changedSince(ctx context.Context, t *testing.T, s *gossipServer, index uint64) string {
	var out []string
	checks, err := s.catalog.ChecksInState(ctx, &lodestonepb.ChecksInStateRequest{})
	if err != nil {
		return err.Error()
	}
	for _, c := range checks.Checks {
		if c.ModifyIndex > index {
			out = append(out, fmt.Sprintf("check %s/%s=%v@%d %q", c.Node, c.CheckId, c.Status, c.ModifyIndex, c.Output))
		}
	}
	nodes, err := s.catalog.Nodes(ctx, &lodestonepb.NodesRequest{})
	if err != nil {
		return err.Error()
	}
	for _, n := range nodes.Nodes {
		if n.ModifyIndex > index {
			out = append(out, fmt.Sprintf("node %s@%d", n.Name, n.ModifyIndex))
		}
	}
	return strings.Join(out, "; ")
}

// metricSum sums a metric family (every label set) from the /metrics of
// the process whose HTTP listener is httpAddr.
func metricSum(t *testing.T, httpAddr, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatalf("metrics of %s: %v", httpAddr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			var v float64
			fields := strings.Fields(line)
			fmt.Sscan(fields[len(fields)-1], &v)
			sum += v
		}
	}
	return sum
}
