package server

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// withFastChecks lets the servers' own checks probe every few
// milliseconds and reap within them (Consul's minimums are 1s and 1m).
func withFastChecks(c *Config) {
	c.Catalog.CheckMinInterval, c.Catalog.MinDeregisterCriticalServiceAfter = time.Millisecond, time.Millisecond
	c.Catalog.CheckReapInterval = 10 * time.Millisecond
}

// origin is an HTTP server a check probes, which the test stops and
// starts again on the same address.
type origin struct {
	t    *testing.T
	addr string
	mu   sync.Mutex
	srv  *http.Server
	wg   sync.WaitGroup
}

func newOrigin(t *testing.T) *origin {
	o := &origin{t: t, addr: freeAddr(t)}
	o.start()
	t.Cleanup(o.stop)
	return o
}

func (o *origin) url() string { return "http://" + o.addr + "/health" }

func (o *origin) start() {
	o.t.Helper()
	l, err := net.Listen("tcp", o.addr)
	if err != nil {
		o.t.Fatalf("origin listen: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })}
	o.mu.Lock()
	o.srv = srv
	o.mu.Unlock()
	o.wg.Go(func() { srv.Serve(l) })
}

func (o *origin) stop() {
	o.mu.Lock()
	srv := o.srv
	o.srv = nil
	o.mu.Unlock()
	if srv != nil {
		srv.Close()
		o.wg.Wait()
	}
}

// localRuns is how many times s ran its own checks.
func localRuns(t *testing.T, s *Server) float64 {
	t.Helper()
	mf := family(t, s.Registry(), "lodestone_localagent_checks_run_total")
	sum := 0.0
	for _, m := range mf.GetMetric() {
		sum += metricValue(m)
	}
	return sum
}

// checkOn is check id of node as s's store holds it (nil: none).
func checkOn(s *Server, node, id string) *lodestonepb.Check {
	cs, _ := s.Store().NodeChecks(node)
	for _, c := range cs {
		if c.CheckId == id {
			return c
		}
	}
	return nil
}

func statusOn(s *Server, node, id string) lodestonepb.HealthStatus {
	if c := checkOn(s, node, id); c != nil {
		return c.Status
	}
	return 0
}

// steadyIndex waits until s ran its checks n more times and fails if its
// applied index moved meanwhile: nothing changed, so nothing is written.
func steadyIndex(t *testing.T, s *Server, n float64) {
	t.Helper()
	before, runs := s.Store().Index(), localRuns(t, s)
	waitFor(t, 10*time.Second, func() bool { return localRuns(t, s) >= runs+n })
	if got := s.Store().Index(); got != before {
		t.Fatalf("index moved from %d to %d over %v check runs with no status change", before, got, n)
	}
}

// An HTTP check registered on a server runs there: critical when its
// origin stops, passing when it is back, one Raft entry per transition
// and none while the status holds; the instance leaves the passing
// answer at the first critical result.
func TestServerHTTPCheckWritesOneEntryPerTransition(t *testing.T) {
	c := newTestCluster(t, 1, withFastChecks)
	n := c.waitLeader()
	s := c.servers[n]
	cl := consulClient(t, c, n)
	o := newOrigin(t)
	waitFor(t, 10*time.Second, s.selfPublished) // NB: the member's own startup write
	if err := cl.Agent().ServiceRegister(&consul.AgentServiceRegistration{ID: "web1", Name: "web", Port: 80,
		Check: &consul.AgentServiceCheck{HTTP: o.url(), Interval: "20ms"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return statusOn(s, n, "service:web1") == lodestonepb.HealthStatus_HEALTH_PASSING })
	steadyIndex(t, s, 10)

	for _, step := range []struct {
		do   func()
		want lodestonepb.HealthStatus
	}{{o.stop, lodestonepb.HealthStatus_HEALTH_CRITICAL}, {o.start, lodestonepb.HealthStatus_HEALTH_PASSING}} {
		before := s.Store().Index()
		step.do()
		waitFor(t, 10*time.Second, func() bool { return statusOn(s, n, "service:web1") == step.want })
		steadyIndex(t, s, 10)
		chk := checkOn(s, n, "service:web1")
		if got := s.Store().Index(); got != before+1 || chk.ModifyIndex != got {
			t.Fatalf("to %v: %d entries (check at %d, index %d), want exactly one", step.want, got-before, chk.ModifyIndex, got)
		}
		passing, _, err := cl.Health().Service("web", "", true, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := step.want == lodestonepb.HealthStatus_HEALTH_PASSING; (len(passing) == 1) != want {
			t.Fatalf("status %v: %d passing instances", step.want, len(passing))
		}
	}
}

// TTL checks go critical at their TTL and move with the application's
// reports; a service whose check stays critical past its
// DeregisterCriticalServiceAfter is deregistered; ids with a slash work
// with and without percent-encoding.
func TestServerTTLAndDeregisterCriticalServiceAfter(t *testing.T) {
	c := newTestCluster(t, 1, withFastChecks)
	n := c.waitLeader()
	s := c.servers[n]
	ag := consulClient(t, c, n).Agent()
	ttl := 200 * time.Millisecond
	if err := ag.ServiceRegister(&consul.AgentServiceRegistration{ID: "db/pg1", Name: "db", Port: 5432,
		Check: &consul.AgentServiceCheck{TTL: ttl.String()}}); err != nil {
		t.Fatal(err)
	}
	reported := time.Now() // NB: before the call: the server re-arms the TTL inside it
	if err := ag.UpdateTTL("service:db/pg1", "replica caught up", consul.HealthPassing); err != nil {
		t.Fatal(err)
	}
	if st := statusOn(s, n, "service:db/pg1"); st != lodestonepb.HealthStatus_HEALTH_PASSING {
		t.Fatalf("after a report: %v", st) // NB: written before the answer
	}
	waitFor(t, 10*time.Second, func() bool {
		return statusOn(s, n, "service:db/pg1") == lodestonepb.HealthStatus_HEALTH_CRITICAL
	})
	if took := time.Since(reported); took < ttl {
		t.Fatalf("critical %v after the report, before its TTL %v", took, ttl)
	}
	if out := checkOn(s, n, "service:db/pg1").Output; !strings.HasPrefix(out, "TTL expired") || !strings.Contains(out, "replica caught up") {
		t.Fatalf("expired output %q", out)
	}
	if err := ag.PassTTL("service:db/pg1", ""); err != nil {
		t.Fatal(err)
	}

	short, after := 100*time.Millisecond, 300*time.Millisecond
	registered := time.Now()
	if err := ag.ServiceRegister(&consul.AgentServiceRegistration{ID: "cache1", Name: "cache",
		Check: &consul.AgentServiceCheck{TTL: short.String(), Status: consul.HealthPassing, DeregisterCriticalServiceAfter: after.String()}}); err != nil {
		t.Fatal(err)
	}
	// NB: the agent drops its own record once the catalog's deregistration
	// is acknowledged, so a reader can see the catalog first.
	var agentErr error
	waitFor(t, 10*time.Second, func() bool {
		if ns, _ := s.Store().Node(n); len(ns.GetServices()) != 1 {
			return false
		}
		_, _, agentErr = ag.Service("cache1", nil)
		return agentErr != nil
	})
	if took := time.Since(registered); took < short+after {
		t.Fatalf("cache1 deregistered %v after registration, before its TTL and deregister interval %v", took, short+after)
	}
	if !strings.Contains(agentErr.Error(), "404") {
		t.Fatalf("agent service cache1 after reaping: %v", agentErr)
	}

	if err := ag.ServiceDeregister("db/pg1"); err != nil {
		t.Fatalf("deregister db/pg1: %v", err)
	}
	if err := ag.ServiceRegister(&consul.AgentServiceRegistration{ID: "db/pg2", Name: "db", Check: &consul.AgentServiceCheck{TTL: "1m"}}); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	put := func(path string) int {
		req, _ := http.NewRequest("PUT", "http://"+s.HTTPAddr()+path, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := put("/v1/agent/check/pass/service%3Adb%2Fpg2"); code != 200 || statusOn(s, n, "service:db/pg2") != lodestonepb.HealthStatus_HEALTH_PASSING {
		t.Fatalf("percent-encoded check id: %d", code)
	}
	if code := put("/v1/agent/service/deregister/db%2Fpg2"); code != 200 {
		t.Fatalf("percent-encoded service id: %d", code)
	}
	if ns, _ := s.Store().Node(n); len(ns.GetServices()) != 0 {
		t.Fatalf("services left: %v", ns.GetServices())
	}
}

// Checks live on the server that registered them: registered on a
// follower, they keep running and writing through a leader change and a
// restart of that follower, and no other server runs them.
func TestServerChecksSurviveLeaderChangeAndRestart(t *testing.T) {
	c := newTestCluster(t, 3, withFastChecks)
	lead := c.waitLeader()
	f := c.followersOf(lead)[0]
	o := newOrigin(t)
	if err := consulClient(t, c, f).Agent().ServiceRegister(&consul.AgentServiceRegistration{ID: "api1", Name: "api",
		Check: &consul.AgentServiceCheck{HTTP: o.url(), Interval: "20ms"}}); err != nil {
		t.Fatal(err)
	}
	onAll := func(want lodestonepb.HealthStatus) func() bool {
		return func() bool {
			for _, s := range c.servers {
				if statusOn(s, f, "service:api1") != want {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, 10*time.Second, onAll(lodestonepb.HealthStatus_HEALTH_PASSING))

	c.stop(lead)
	o.stop()
	waitFor(t, 20*time.Second, onAll(lodestonepb.HealthStatus_HEALTH_CRITICAL))
	c.start(lead, false)

	c.stop(f)
	c.start(f, false)
	c.waitLeader()
	o.start()
	waitFor(t, 20*time.Second, onAll(lodestonepb.HealthStatus_HEALTH_PASSING))
	for name, s := range c.servers {
		if name != f && localRuns(t, s) != 0 {
			t.Fatalf("%s ran %v checks it was never given", name, localRuns(t, s))
		}
	}
	if svc, _, err := consulClient(t, c, f).Agent().Service("api1", nil); err != nil || svc.Service != "api" {
		t.Fatalf("api1 after the restart: %+v %v", svc, err)
	}
}

func TestServerScriptChecksOnlyWhenEnabled(t *testing.T) {
	c := newTestCluster(t, 1, withFastChecks)
	n := c.waitLeader()
	s := c.servers[n]
	ag := consulClient(t, c, n).Agent()
	waitFor(t, 10*time.Second, s.selfPublished) // NB: the member's own startup write
	before := s.Store().Index()
	err := ag.ServiceRegister(&consul.AgentServiceRegistration{Name: "sh", Check: &consul.AgentServiceCheck{Args: []string{"true"}, Interval: "1s"}})
	if err == nil || !strings.Contains(err.Error(), "500") || !strings.Contains(err.Error(), "Scripts are disabled on this agent from remote calls") {
		t.Fatalf("script check: %v, want Consul's 500", err)
	}
	if got := s.Store().Index(); got != before {
		t.Fatalf("a refused script check wrote %d entries", got-before)
	}

	c = newTestCluster(t, 1, withFastChecks, func(c *Config) { c.Catalog.EnableScriptChecks = true })
	n = c.waitLeader()
	if err := consulClient(t, c, n).Agent().ServiceRegister(&consul.AgentServiceRegistration{Name: "sh",
		Check: &consul.AgentServiceCheck{Args: []string{"sh", "-c", "echo lagging; exit 1"}, Interval: "50ms"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool {
		chk := checkOn(c.servers[n], n, "service:sh")
		return chk != nil && chk.Status == lodestonepb.HealthStatus_HEALTH_WARNING && chk.Output == "lagging\n"
	})
}

func TestAgentEndpointsThroughConsulClient(t *testing.T) {
	c := newTestCluster(t, 2, withFastChecks, withGossip())
	n := c.waitLeader()
	other := c.followersOf(n)[0]
	s := c.servers[n]
	cl := consulClient(t, c, n)
	ag := cl.Agent()

	self, err := ag.Self()
	if err != nil {
		t.Fatal(err)
	}
	if self["Config"]["NodeName"] != n || self["Config"]["Datacenter"] != "dc1" || self["Config"]["Server"] != true ||
		!strings.HasPrefix(self["Config"]["NodeID"].(string), "00000000-0000-0000-") {
		t.Fatalf("self config %v", self["Config"])
	}
	if self["Member"]["Name"] != n || self["Member"]["Addr"] != "127.0.0.1" || self["Member"]["Status"] != float64(1) {
		t.Fatalf("self member %v", self["Member"])
	}
	if self["Stats"] == nil || self["Stats"]["raft"] == nil {
		t.Fatalf("self stats %v", self["Stats"])
	}

	// Members: this server's pool. The servers' pools start apart; a join
	// through the API merges them.
	members, err := ag.Members(false)
	if err != nil || len(members) != 1 || members[0].Name != n || !members[0].IsConsulServer() || members[0].Status != 1 {
		t.Fatalf("members before the join: %+v %v", members, err)
	}
	if err := ag.Join(c.servers[other].GossipAddr(), true); err == nil || !strings.Contains(err.Error(), "WAN") {
		t.Fatalf("WAN join: %v", err)
	}
	if err := ag.Join(c.servers[other].GossipAddr(), false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { m, _ := ag.Members(false); return len(m) == 2 })
	wan, err := ag.Members(true)
	if err != nil || len(wan) != 2 || !strings.HasSuffix(wan[0].Name, ".dc1") {
		t.Fatalf("WAN members %+v %v", wan, err)
	}
	if _, err := ag.MembersOpts(consul.MembersOpts{Segment: "alpha"}); err == nil {
		t.Fatal("a segment was accepted")
	}

	// One service, read back with its content hash; a blocking read on
	// the hash returns when the service changes.
	reg := &consul.AgentServiceRegistration{ID: "web1", Name: "web", Port: 80, Tags: []string{"v1"},
		Check: &consul.AgentServiceCheck{TTL: "1m", Status: consul.HealthPassing}}
	if err := ag.ServiceRegister(reg); err != nil {
		t.Fatal(err)
	}
	svc, meta, err := ag.Service("web1", nil)
	if err != nil || svc.Service != "web" || svc.Port != 80 || svc.ContentHash == "" || meta.LastContentHash != svc.ContentHash ||
		svc.Datacenter != "dc1" || svc.Weights.Passing != 1 {
		t.Fatalf("agent service: %+v %+v %v", svc, meta, err)
	}
	if _, _, err := ag.Service("nope", nil); err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), "unknown service ID: nope") {
		t.Fatalf("unknown service: %v", err)
	}
	changed := make(chan *consul.AgentService, 1)
	go func() {
		s, _, err := ag.Service("web1", &consul.QueryOptions{WaitHash: svc.ContentHash, WaitTime: 10 * time.Second})
		if err != nil {
			t.Error(err)
		}
		changed <- s
	}()
	reg.Port = 81
	if err := ag.ServiceRegister(reg); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-changed:
		if got.Port != 81 || got.ContentHash == svc.ContentHash {
			t.Fatalf("blocking read returned %+v", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a hash-blocking read did not return on a change")
	}
	start := time.Now()
	if _, _, err := ag.Service("web1", &consul.QueryOptions{WaitHash: "no-such-hash"}); err != nil || time.Since(start) > 2*time.Second {
		t.Fatalf("a stale hash must answer at once: %v after %v", err, time.Since(start))
	}

	// Maintenance: a critical check that takes the node's, then the
	// service's instances out of the passing answer.
	passing := func() int {
		t.Helper()
		entries, _, err := cl.Health().Service("web", "", true, nil)
		if err != nil {
			t.Fatal(err)
		}
		return len(entries)
	}
	if passing() != 1 {
		t.Fatal("web not passing before maintenance")
	}
	if err := ag.EnableNodeMaintenance("kernel upgrade"); err != nil {
		t.Fatal(err)
	}
	if chk := checkOn(s, n, "_node_maintenance"); chk == nil || chk.Notes != "kernel upgrade" || chk.Status != lodestonepb.HealthStatus_HEALTH_CRITICAL || passing() != 0 {
		t.Fatalf("node maintenance: %+v, %d passing", chk, passing())
	}
	if err := ag.DisableNodeMaintenance(); err != nil || checkOn(s, n, "_node_maintenance") != nil || passing() != 1 {
		t.Fatalf("node maintenance off: %v", err)
	}
	if err := ag.EnableServiceMaintenance("web1", ""); err != nil {
		t.Fatal(err)
	}
	if chk := checkOn(s, n, "_service_maintenance:web1"); chk == nil || chk.ServiceId != "web1" || !strings.HasPrefix(chk.Notes, "Maintenance mode is enabled for this service") || passing() != 0 {
		t.Fatalf("service maintenance: %+v, %d passing", chk, passing())
	}
	if err := ag.DisableServiceMaintenance("web1"); err != nil || passing() != 1 {
		t.Fatalf("service maintenance off: %v", err)
	}
	if err := ag.EnableServiceMaintenance("nope", ""); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("maintenance of an unknown service: %v", err)
	}
	waitFor(t, 10*time.Second, func() bool { return c.publishedOn(s) })
	before := s.Store().Index()
	for path, want := range map[string]string{
		"/v1/agent/maintenance":                   "Missing value for enable",
		"/v1/agent/maintenance?enable=maybe":      `Invalid value for enable: "maybe"`,
		"/v1/agent/service/maintenance/web1":      "Missing value for enable",
		"/v1/agent/service/maintenance/?enable=1": "Missing service ID",
	} {
		req, _ := http.NewRequest("PUT", "http://"+s.HTTPAddr()+path, nil)
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(body), want) {
			t.Errorf("PUT %s: %d %q, want 400 %q", path, resp.StatusCode, body, want)
		}
	}
	if got := s.Store().Index(); got != before {
		t.Fatalf("refused maintenance requests wrote %d entries", got-before)
	}
}

// Leave on a server (here the leader, which hands leadership over first)
// leaves the Raft configuration and stops the server cleanly; with two
// voters left, another leave is refused.
func TestAgentLeave(t *testing.T) {
	c := newTestCluster(t, 3)
	f := c.waitLeader()
	done := c.servers[f].Done()
	if err := consulClient(t, c, f).Agent().Leave(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a server that left stopped with %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not stop after leaving")
	}
	c.stop(f)
	lead := c.waitLeader()
	waitFor(t, 10*time.Second, func() bool { return len(c.servers[lead].Store().Members()) == 2 })
	for _, m := range c.servers[lead].Store().Members() {
		if m.Name == f {
			t.Fatalf("%s still a member", f)
		}
	}
	err := consulClient(t, c, lead).Agent().Leave()
	if err == nil || !strings.Contains(err.Error(), "refused to leave") {
		t.Fatalf("leaving a two-voter cluster: %v", err)
	}
	if got := len(c.servers[lead].Store().Members()); got != 2 {
		t.Fatalf("a refused leave changed the membership: %d members", got)
	}
}

// Each agent endpoint checks its permission as Consul does; a token
// without it is refused (or, for the member list, sees nothing) and
// nothing changes, while a token with it succeeds.
func TestAgentEndpointsACL(t *testing.T) {
	c := newTestCluster(t, 2, withACLs, withGossip())
	n := c.waitLeader()
	other := c.followersOf(n)[0]
	s := c.servers[n]
	boot, _, err := consulAs(t, c, n, "").ACL().Bootstrap()
	if err != nil {
		t.Fatal(err)
	}
	mgmt := consulAs(t, c, n, boot.SecretID)
	if err := mgmt.Agent().ServiceRegister(&consul.AgentServiceRegistration{ID: "web1", Name: "web",
		Check: &consul.AgentServiceCheck{TTL: "1m", Status: consul.HealthPassing}}); err != nil {
		t.Fatal(err)
	}
	weak := consulAs(t, c, n, tokenWith(t, mgmt, "kv-read", `key_prefix "" { policy = "read" }`)).Agent()
	agentRead := consulAs(t, c, n, tokenWith(t, mgmt, "agent-read", `agent_prefix "" { policy = "read" }`)).Agent()

	// Reads: self needs agent:read, a service service:read, members are
	// filtered by node:read.
	_, err = weak.Self()
	wantDenied(t, "self without agent:read", err)
	if self, err := agentRead.Self(); err != nil || self["Config"]["NodeName"] != n {
		t.Fatalf("self with agent:read: %v", err)
	}
	_, _, err = weak.Service("web1", nil)
	wantDenied(t, "service without service:read", err)
	webRead := consulAs(t, c, n, tokenWith(t, mgmt, "web-read", `service "web" { policy = "read" }`)).Agent()
	if svc, _, err := webRead.Service("web1", nil); err != nil || svc.Service != "web" {
		t.Fatalf("service with service:read: %v", err)
	}
	if m, err := weak.Members(false); err != nil || len(m) != 0 {
		t.Fatalf("members without node:read: %+v %v, want none", m, err)
	}
	nodeRead := consulAs(t, c, n, tokenWith(t, mgmt, "node-read", `node_prefix "" { policy = "read" }`)).Agent()
	if m, err := nodeRead.Members(false); err != nil || len(m) != 1 {
		t.Fatalf("members with node:read: %+v %v", m, err)
	}

	// Maintenance needs node:write, service maintenance service:write.
	wantDenied(t, "node maintenance without node:write", weak.EnableNodeMaintenance("x"))
	wantDenied(t, "service maintenance without service:write", weak.EnableServiceMaintenance("web1", "x"))
	wantDenied(t, "service maintenance with service:read", webRead.EnableServiceMaintenance("web1", "x"))
	if checkOn(s, n, "_node_maintenance") != nil || checkOn(s, n, "_service_maintenance:web1") != nil {
		t.Fatal("a denied maintenance request registered its check")
	}
	nodeWrite := consulAs(t, c, n, tokenWith(t, mgmt, "node-write", `node_prefix "" { policy = "write" }`)).Agent()
	if err := nodeWrite.EnableNodeMaintenance("x"); err != nil || checkOn(s, n, "_node_maintenance") == nil {
		t.Fatalf("node maintenance with node:write: %v", err)
	}
	webWrite := consulAs(t, c, n, tokenWith(t, mgmt, "web-write", `service "web" { policy = "write" }`)).Agent()
	if err := webWrite.EnableServiceMaintenance("web1", "x"); err != nil || checkOn(s, n, "_service_maintenance:web1") == nil {
		t.Fatalf("service maintenance with service:write: %v", err)
	}

	// Join and leave need agent:write.
	wantDenied(t, "join without agent:write", weak.Join(c.servers[other].GossipAddr(), false))
	wantDenied(t, "join with agent:read", agentRead.Join(c.servers[other].GossipAddr(), false))
	if got := len(s.GossipMembers()); got != 1 {
		t.Fatalf("a denied join changed the pool: %d members", got)
	}
	wantDenied(t, "leave without agent:write", weak.Leave())
	wantDenied(t, "leave with agent:read", agentRead.Leave())
	if got := len(s.Store().Members()); got != 2 {
		t.Fatalf("a denied leave changed the membership: %d members", got)
	}
	agentWrite := consulAs(t, c, n, tokenWith(t, mgmt, "agent-write", `agent_prefix "" { policy = "write" }`)).Agent()
	if err := agentWrite.Join(c.servers[other].GossipAddr(), false); err != nil {
		t.Fatalf("join with agent:write: %v", err)
	}
	waitFor(t, 10*time.Second, func() bool { return len(s.GossipMembers()) == 2 })

	// The registration endpoints: TTL reports and deregistration need
	// service:write on the service.
	wantDenied(t, "TTL report without service:write", weak.PassTTL("service:web1", ""))
	wantDenied(t, "deregister without service:write", weak.ServiceDeregister("web1"))
	if _, _, err := mgmt.Agent().Service("web1", nil); err != nil {
		t.Fatalf("web1 after denied requests: %v", err)
	}
}
