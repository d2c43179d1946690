package server

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
)

// Catalog register, then a blocking health/service?passing that sleeps
// through an unrelated registration, wakes when the instance's check
// fails, and no longer lists it.
func TestConsulHealthServicePassingWakesOnCheckFailure(t *testing.T) {
	c := newTestCluster(t, 3)
	cl := consulClient(t, c, c.follower())
	reg := func(status string) {
		t.Helper()
		_, err := cl.Catalog().Register(&consul.CatalogRegistration{
			Node: "web-1", Address: "10.0.0.1",
			Service: &consul.AgentService{ID: "web-a", Service: "web", Tags: []string{"v1"}, Port: 8080},
			Check:   &consul.AgentCheck{CheckID: "web-alive", Name: "alive", Status: status, ServiceID: "web-a"},
		}, nil)
		if err != nil {
			t.Fatalf("register (%s): %v", status, err)
		}
	}
	reg(consul.HealthPassing)

	entries, meta, err := cl.Health().Service("web", "v1", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Service.ID != "web-a" || entries[0].Node.Node != "web-1" || len(entries[0].Checks) != 1 {
		t.Fatalf("health/service web?passing&tag=v1: %+v", entries)
	}
	if got, _, _ := cl.Health().Service("web", "v2", false, nil); len(got) != 0 {
		t.Fatalf("tag filter v2: got %d instances, want 0", len(got))
	}

	// An unrelated registration must not wake the query: it returns after
	// its wait with the same index.
	start := time.Now()
	idle := make(chan *consul.QueryMeta, 1)
	go func() {
		_, m, err := cl.Health().Service("web", "", true, &consul.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 400 * time.Millisecond})
		if err != nil {
			t.Errorf("idle blocking query: %v", err)
		}
		idle <- m
	}()
	if _, err := cl.Catalog().Register(&consul.CatalogRegistration{Node: "db-1", Address: "10.0.0.2",
		Service: &consul.AgentService{Service: "db"}}, nil); err != nil {
		t.Fatal(err)
	}
	if m := <-idle; m == nil || m.LastIndex != meta.LastIndex || time.Since(start) < 400*time.Millisecond {
		t.Fatalf("an unrelated write woke the query: meta %+v after %v (want index %d after 400ms)", m, time.Since(start), meta.LastIndex)
	}

	type result struct {
		entries []*consul.ServiceEntry
		meta    *consul.QueryMeta
	}
	woke := make(chan result, 1)
	go func() {
		e, m, err := cl.Health().Service("web", "", true, &consul.QueryOptions{WaitIndex: meta.LastIndex, WaitTime: 30 * time.Second})
		if err != nil {
			t.Errorf("blocking health query: %v", err)
		}
		woke <- result{e, m}
	}()
	reg(consul.HealthCritical)
	select {
	case r := <-woke:
		if r.meta == nil || r.meta.LastIndex <= meta.LastIndex {
			t.Fatalf("woke with index %+v, want above %d", r.meta, meta.LastIndex)
		}
		if len(r.entries) != 0 {
			t.Fatalf("a critical instance is still listed as passing: %+v", r.entries[0].Service)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("blocking health/service?passing did not wake when the check failed")
	}
	all, _, err := cl.Health().Service("web", "", false, nil)
	if err != nil || len(all) != 1 || all[0].Checks.AggregatedStatus() != consul.HealthCritical {
		t.Fatalf("without ?passing: %v %+v", err, all)
	}

	for _, q := range []*consul.QueryOptions{nil, {AllowStale: true}, {RequireConsistent: true}} {
		svcs, m, err := cl.Catalog().Services(q)
		if err != nil || len(svcs) != 2 || strings.Join(svcs["web"], ",") != "v1" {
			t.Fatalf("catalog/services (%+v): %v %v", q, svcs, err)
		}
		if !m.KnownLeader || m.LastIndex == 0 {
			t.Fatalf("catalog/services (%+v) meta: %+v", q, m)
		}
	}
	nodes, _, err := cl.Catalog().Nodes(nil)
	if err != nil || len(nodes) != 2 {
		t.Fatalf("catalog/nodes: %v %v", nodes, err)
	}
	node, _, err := cl.Catalog().Node("web-1", nil)
	if err != nil || node == nil || node.Node.Address != "10.0.0.1" || node.Services["web-a"] == nil {
		t.Fatalf("catalog/node/web-1: %+v %v", node, err)
	}
	if missing, _, err := cl.Catalog().Node("nope", nil); err != nil || missing != nil {
		t.Fatalf("catalog/node/nope: %+v %v, want nil nil", missing, err)
	}
	insts, _, err := cl.Catalog().Service("web", "", nil)
	if err != nil || len(insts) != 1 || insts[0].ServicePort != 8080 || insts[0].Address != "10.0.0.1" {
		t.Fatalf("catalog/service/web: %+v %v", insts, err)
	}
	crit, _, err := cl.Health().State(consul.HealthCritical, nil)
	if err != nil || len(crit) != 1 || crit[0].CheckID != "web-alive" {
		t.Fatalf("health/state/critical: %+v %v", crit, err)
	}
	if _, err := cl.Catalog().Deregister(&consul.CatalogDeregistration{Node: "web-1"}, nil); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := cl.Health().Service("web", "", false, nil); len(got) != 0 {
		t.Fatalf("after deregistering the node: %d instances", len(got))
	}
}

// The server is the agent of its own node: services registered through
// /v1/agent land there, and TTL checks move with pass/warn/fail.
func TestConsulAgentServiceAndTTLCheck(t *testing.T) {
	c := newTestCluster(t, 1)
	lead := c.waitLeader()
	cl := consulClient(t, c, lead)
	err := cl.Agent().ServiceRegister(&consul.AgentServiceRegistration{
		ID: "api-1", Name: "api", Port: 9000, Tags: []string{"blue"},
		Check: &consul.AgentServiceCheck{TTL: "30s"},
	})
	if err != nil {
		t.Fatal(err)
	}
	name, err := cl.Agent().NodeName()
	if err != nil || name != lead {
		t.Fatalf("agent node name %q %v, want %q", name, err, lead)
	}
	status := func() string {
		t.Helper()
		checks, _, err := cl.Health().Checks("api", nil)
		if err != nil || len(checks) != 1 {
			t.Fatalf("health/checks/api: %+v %v", checks, err)
		}
		if checks[0].CheckID != "service:api-1" || checks[0].Node != lead || checks[0].Type != "ttl" {
			t.Fatalf("check %+v, want service:api-1 (ttl) on %s", checks[0], lead)
		}
		return checks[0].Status
	}
	if got := status(); got != consul.HealthCritical {
		t.Fatalf("a new TTL check: %s, want critical", got)
	}
	for _, step := range []struct {
		update func(string, string) error
		want   string
	}{{cl.Agent().PassTTL, consul.HealthPassing}, {cl.Agent().WarnTTL, consul.HealthWarning}, {cl.Agent().FailTTL, consul.HealthCritical}} {
		if err := step.update("service:api-1", "note"); err != nil {
			t.Fatal(err)
		}
		if got := status(); got != step.want {
			t.Fatalf("after update: %s, want %s", got, step.want)
		}
	}
	if err := cl.Agent().PassTTL("no-such-check", ""); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("pass on an unknown check: %v, want a 404", err)
	}
	// Newer clients send the status in a body.
	if err := cl.Agent().UpdateTTL("service:api-1", "all good", consul.HealthPassing); err != nil {
		t.Fatal(err)
	}
	if got := status(); got != consul.HealthPassing {
		t.Fatalf("after UpdateTTL: %s, want passing", got)
	}
	if svcs, err := cl.Agent().Services(); err != nil || svcs["api-1"] == nil || svcs["api-1"].Port != 9000 {
		t.Fatalf("agent services: %+v %v", svcs, err)
	}
	if err := cl.Agent().CheckRegister(&consul.AgentCheckRegistration{ID: "disk", Name: "disk space",
		AgentServiceCheck: consul.AgentServiceCheck{TTL: "1m", Status: consul.HealthWarning}}); err != nil {
		t.Fatal(err)
	}
	if checks, err := cl.Agent().Checks(); err != nil || checks["disk"] == nil || checks["disk"].Status != consul.HealthWarning || checks["disk"].ServiceID != "" {
		t.Fatalf("agent checks: %+v %v", checks, err)
	}
	if err := cl.Agent().CheckDeregister("disk"); err != nil {
		t.Fatal(err)
	}
	if err := cl.Agent().CheckDeregister("disk"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("deregistering a check twice: %v, want a 404", err)
	}
	nodeChecks, _, err := cl.Health().Node(lead, nil)
	if err != nil || len(nodeChecks) != 1 {
		t.Fatalf("health/node: %+v %v", nodeChecks, err)
	}
	if err := cl.Agent().ServiceDeregister("api-1"); err != nil {
		t.Fatal(err)
	}
	if err := cl.Agent().ServiceDeregister("api-1"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("deregistering twice: %v, want a 404", err)
	}
}

// Bad input gets a 400 that names the problem, and changes nothing.
func TestConsulBadInputIsRefused(t *testing.T) {
	c := newTestCluster(t, 1)
	lead := c.waitLeader()
	base := "http://" + c.servers[lead].HTTPAddr()
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Make the agent node exist first so the refusals below could not
	// even have registered it.
	if code, body := do("PUT", "/v1/agent/service/register", `{"Name":"ok"}`); code != 200 {
		t.Fatalf("setup: %d %s", code, body)
	}
	// The member's own address record is its last write of its own.
	waitFor(t, 10*time.Second, c.servers[lead].selfPublished)
	before := c.servers[lead].store.Index()
	cases := []struct{ method, path, body, want string }{
		{"PUT", "/v1/catalog/register", `{"Node":"n","Address":"1.2.3.4"`, "decode"},
		{"PUT", "/v1/catalog/register", `{"Node":"n","Address":"1.2.3.4","Service":{"Service":"s","Port":70000}}`, "port"},
		{"PUT", "/v1/catalog/register", `{"Node":"n","Address":"1.2.3.4","Check":{"CheckID":"c","Status":"sideways"}}`, "status"},
		{"PUT", "/v1/catalog/register", `{"Node":"n\u0000x","Address":"1.2.3.4"}`, "NUL"},
		{"GET", "/v1/health/state/bogus", ``, "Invalid check state"},
		{"GET", "/v1/health/service/web?passing=maybe", ``, "passing"},
		{"GET", "/v1/catalog/services?index=abc", ``, "index"},
		{"GET", "/v1/catalog/nodes?wait=forever", ``, "wait"},
		{"GET", "/v1/catalog/nodes?stale&consistent", ``, "conflicting"},
		{"PUT", "/v1/session/create", `{"LockDelay":"-"}`, "LockDelay"},
		{"PUT", "/v1/session/renew/not-a-uuid", ``, "UUID"},
		{"PUT", "/v1/kv/k?acquire", ``, "session"},
		{"PUT", "/v1/kv/k?acquire=x&release=y", ``, "Conflicting"},
		{"PUT", "/v1/agent/service/register", `{"Name":"s","Check":{"TTL":"later"}}`, "duration"},
		{"PUT", "/v1/agent/service/register", `{"Name":"s","Kind":"connect-proxy"}`, "kind"},
	}
	for _, tc := range cases {
		code, body := do(tc.method, tc.path, tc.body)
		if code != http.StatusBadRequest || !strings.Contains(strings.ToLower(body), strings.ToLower(tc.want)) {
			t.Errorf("%s %s %s: %d %q, want 400 mentioning %q", tc.method, tc.path, tc.body, code, strings.TrimSpace(body), tc.want)
		}
	}
	// What Consul refuses in its RPC layer is a 500 with Consul's words,
	// which its clients match on.
	consulCases := []struct{ method, path, body, want string }{
		{"PUT", "/v1/catalog/register", `{"Address":"1.2.3.4"}`, "Must provide node"},
		{"PUT", "/v1/catalog/register", `{"Node":"n"}`, "Must provide address if SkipNodeUpdate is not set"},
		{"PUT", "/v1/catalog/deregister", `{}`, "Must provide node"},
		{"PUT", "/v1/session/create", `{"TTL":"1s"}`, "Invalid Session TTL '1000000000', must be between [10s=24h0m0s]"},
		{"PUT", "/v1/session/create", `{"TTL":"25h"}`, "Invalid Session TTL '90000000000000', must be between [10s=24h0m0s]"},
		{"PUT", "/v1/session/create", `{"TTL":"soon"}`, `Session TTL 'soon' invalid: time: invalid duration "soon"`},
		{"PUT", "/v1/session/create", `{"Behavior":"explode"}`, "Invalid Behavior setting 'explode'"},
	}
	for _, tc := range consulCases {
		code, body := do(tc.method, tc.path, tc.body)
		if code != http.StatusInternalServerError || strings.TrimSpace(body) != tc.want {
			t.Errorf("%s %s %s: %d %q, want 500 %q", tc.method, tc.path, tc.body, code, strings.TrimSpace(body), tc.want)
		}
	}
	if after := c.servers[lead].store.Index(); after != before {
		t.Fatalf("refused requests moved the applied index from %d to %d", before, after)
	}
	if code, _ := do("GET", "/v1/catalog/nodes", ``); code != 200 {
		t.Fatalf("a good request after the bad ones: %d", code)
	}

	// Well-formed requests the state refuses answer as Consul does (an
	// unknown session: 500 for a put, 409 for a txn) and write nothing.
	if code, body := do("PUT", "/v1/kv/k?acquire=1b4e28ba-2fa1-11d2-883f-0016d3cca427", "v"); code != 500 || !strings.Contains(body, "Invalid session") {
		t.Errorf("acquire with an unknown session: %d %q", code, body)
	}
	if code, body := do("PUT", "/v1/txn", `[{"KV":{"Verb":"lock","Key":"k","Session":"1b4e28ba-2fa1-11d2-883f-0016d3cca427"}}]`); code != 409 || !strings.Contains(body, "does not exist") {
		t.Errorf("txn lock with an unknown session: %d %q", code, body)
	}
	// Sessions the state refuses: Consul's state store words, as 500s.
	if code, body := do("PUT", "/v1/agent/check/register", `{"ID":"down","Name":"down","TTL":"1m"}`); code != 200 {
		t.Fatalf("register a critical check: %d %s", code, body)
	}
	for body, want := range map[string]string{
		`{"Node":"nowhere"}`:  "Missing node registration",
		`{"Checks":["nope"]}`: "Missing check 'nope' registration",
		`{"Checks":["down"]}`: "Check 'down' is in critical state",
	} {
		if code, got := do("PUT", "/v1/session/create", body); code != 500 || strings.TrimSpace(got) != want {
			t.Errorf("session create %s: %d %q, want 500 %q", body, code, strings.TrimSpace(got), want)
		}
	}
	if code, body := do("GET", "/v1/session/list", ``); code != 200 || strings.TrimSpace(body) != "[]" {
		t.Errorf("sessions after refused creates: %d %s", code, body)
	}
	if code, _ := do("GET", "/v1/kv/k", ``); code != 404 {
		t.Errorf("key k after refused acquires: %d, want 404", code)
	}
}
