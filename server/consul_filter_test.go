package server

import (
	"slices"
	"sort"
	"strings"
	"testing"

	consul "github.com/hashicorp/consul/api"
)

// filterFixture registers, through the official client, two nodes with
// meta, three instances with tags and checks, and a service on the
// server's own agent node.
func filterFixture(t *testing.T, cl *consul.Client) {
	t.Helper()
	regs := []*consul.CatalogRegistration{
		{Node: "edge-1", Address: "10.0.0.1", NodeMeta: map[string]string{"env": "prod", "rack": "a"},
			Service: &consul.AgentService{ID: "web-1", Service: "web", Port: 80, Tags: []string{"v1"}},
			Check:   &consul.AgentCheck{CheckID: "web-1-http", Name: "http", ServiceID: "web-1", Status: consul.HealthPassing}},
		{Node: "edge-2", Address: "10.0.0.2", NodeMeta: map[string]string{"env": "dev"},
			Service: &consul.AgentService{ID: "web-2", Service: "web", Port: 81, Tags: []string{"v2"}},
			Check:   &consul.AgentCheck{CheckID: "web-2-http", Name: "http", ServiceID: "web-2", Status: consul.HealthCritical}},
		{Node: "edge-1", Address: "10.0.0.1", NodeMeta: map[string]string{"env": "prod", "rack": "a"},
			Service: &consul.AgentService{ID: "db-1", Service: "db", Port: 5432, Tags: []string{"primary"}},
			Check:   &consul.AgentCheck{CheckID: "db-1-tcp", Name: "tcp", ServiceID: "db-1", Status: consul.HealthWarning}},
	}
	for _, reg := range regs {
		if _, err := cl.Catalog().Register(reg, nil); err != nil {
			t.Fatalf("register %s: %v", reg.Service.ID, err)
		}
	}
	if err := cl.Agent().ServiceRegister(&consul.AgentServiceRegistration{ID: "api-1", Name: "api", Port: 9000,
		Tags: []string{"blue"}, Check: &consul.AgentServiceCheck{TTL: "30s"}}); err != nil {
		t.Fatal(err)
	}
	if err := cl.Agent().ServiceRegister(&consul.AgentServiceRegistration{ID: "api-2", Name: "api", Port: 9001,
		Tags: []string{"green"}, Check: &consul.AgentServiceCheck{TTL: "30s", Status: consul.HealthPassing}}); err != nil {
		t.Fatal(err)
	}
}

// Every listing Consul filters takes ?filter with Consul's selectors, and
// the catalog and health listings ?node-meta, through the official client.
func TestConsulFilterAndNodeMeta(t *testing.T) {
	c := newTestCluster(t, 1)
	lead := c.waitLeader()
	cl := consulClient(t, c, lead)
	filterFixture(t, cl)
	q := func(expr string) *consul.QueryOptions { return &consul.QueryOptions{Filter: expr} }
	meta := func(k, v string) *consul.QueryOptions { return &consul.QueryOptions{NodeMeta: map[string]string{k: v}} }

	nodes, _, err := cl.Catalog().Nodes(q(`Meta.env == "prod"`))
	if err != nil || len(nodes) != 1 || nodes[0].Node != "edge-1" {
		t.Fatalf("nodes with Meta.env == prod: %+v %v", nodes, err)
	}
	nodes, _, err = cl.Catalog().Nodes(meta("env", "dev"))
	if err != nil || len(nodes) != 1 || nodes[0].Node != "edge-2" {
		t.Fatalf("nodes with node-meta env:dev: %+v %v", nodes, err)
	}
	// Two ?node-meta pairs must both match.
	nodes, _, err = cl.Catalog().Nodes(&consul.QueryOptions{NodeMeta: map[string]string{"env": "prod", "rack": "b"}})
	if err != nil || len(nodes) != 0 {
		t.Fatalf("nodes with env:prod and rack:b: %+v %v", nodes, err)
	}

	svcs, _, err := cl.Catalog().Services(q(`ServiceTags contains "v2"`))
	if err != nil || len(svcs) != 1 || !slices.Equal(svcs["web"], []string{"v2"}) {
		t.Fatalf("services with tag v2: %+v %v", svcs, err)
	}
	svcs, _, err = cl.Catalog().Services(meta("env", "prod"))
	if err != nil || len(svcs) != 2 || !slices.Equal(svcs["web"], []string{"v1"}) || svcs["db"] == nil {
		t.Fatalf("services on env:prod nodes: %+v %v", svcs, err)
	}

	insts, _, err := cl.Catalog().Service("web", "", q(`NodeMeta.env == "dev" and ServicePort == 81`))
	if err != nil || len(insts) != 1 || insts[0].ServiceID != "web-2" {
		t.Fatalf("web on dev nodes: %+v %v", insts, err)
	}
	insts, _, err = cl.Catalog().Service("web", "", meta("env", "prod"))
	if err != nil || len(insts) != 1 || insts[0].ServiceID != "web-1" {
		t.Fatalf("web with node-meta env:prod: %+v %v", insts, err)
	}

	list, _, err := cl.Catalog().NodeServiceList("edge-1", q(`Service == "db"`))
	if err != nil || list.Node == nil || list.Node.Node != "edge-1" || len(list.Services) != 1 || list.Services[0].ID != "db-1" {
		t.Fatalf("node-services of edge-1 filtered to db: %+v %v", list, err)
	}
	list, _, err = cl.Catalog().NodeServiceList("edge-1", nil)
	if err != nil || len(list.Services) != 2 {
		t.Fatalf("node-services of edge-1: %+v %v", list, err)
	}
	list, _, err = cl.Catalog().NodeServiceList("no-such-node", nil)
	if err != nil || list.Node != nil || len(list.Services) != 0 {
		t.Fatalf("node-services of an unknown node: %+v %v", list, err)
	}

	entries, _, err := cl.Health().Service("web", "", false, q(`Service.Tags contains "v1" and Node.Meta.rack == "a"`))
	if err != nil || len(entries) != 1 || entries[0].Service.ID != "web-1" {
		t.Fatalf("health of web v1 on rack a: %+v %v", entries, err)
	}
	entries, _, err = cl.Health().Service("web", "", false, meta("env", "dev"))
	if err != nil || len(entries) != 1 || entries[0].Service.ID != "web-2" {
		t.Fatalf("health of web with node-meta env:dev: %+v %v", entries, err)
	}

	checks, _, err := cl.Health().Checks("web", q(`Status == "critical"`))
	if err != nil || len(checks) != 1 || checks[0].CheckID != "web-2-http" {
		t.Fatalf("critical web checks: %+v %v", checks, err)
	}
	checks, _, err = cl.Health().Checks("web", meta("env", "prod"))
	if err != nil || len(checks) != 1 || checks[0].CheckID != "web-1-http" {
		t.Fatalf("web checks with node-meta env:prod: %+v %v", checks, err)
	}
	checks, _, err = cl.Health().State("any", q(`ServiceName == "db"`))
	if err != nil || len(checks) != 1 || checks[0].CheckID != "db-1-tcp" {
		t.Fatalf("checks of db in any state: %+v %v", checks, err)
	}
	checks, _, err = cl.Health().State("any", meta("env", "dev"))
	if err != nil || len(checks) != 1 || checks[0].Node != "edge-2" {
		t.Fatalf("checks on env:dev nodes: %+v %v", checks, err)
	}
	checks, _, err = cl.Health().Node("edge-1", q(`ServiceID == "web-1"`))
	if err != nil || len(checks) != 1 || checks[0].CheckID != "web-1-http" {
		t.Fatalf("edge-1 checks of web-1: %+v %v", checks, err)
	}

	agentSvcs, err := cl.Agent().ServicesWithFilter(`"green" in Tags`)
	if err != nil || len(agentSvcs) != 1 || agentSvcs["api-2"] == nil {
		t.Fatalf("agent services tagged green: %+v %v", agentSvcs, err)
	}
	agentChecks, err := cl.Agent().ChecksWithFilter(`Status == "passing"`)
	if err != nil || len(agentChecks) != 1 || agentChecks["service:api-2"] == nil {
		t.Fatalf("passing agent checks: %+v %v", agentChecks, err)
	}
	var ids []string
	all, err := cl.Agent().Services()
	for id := range all {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	if err != nil || !slices.Equal(ids, []string{"api-1", "api-2"}) {
		t.Fatalf("agent services without a filter: %v %v", ids, err)
	}
}

// A filter that does not parse is a 400 with the parser's error, on every
// listing, and a selector the elements do not have is a 400 too.
func TestConsulBadFilterIsRefused(t *testing.T) {
	c := newTestCluster(t, 1)
	lead := c.waitLeader()
	cl := consulClient(t, c, lead)
	filterFixture(t, cl)
	bad := &consul.QueryOptions{Filter: `Meta.env ==`}
	calls := map[string]func() error{
		"catalog/nodes":    func() error { _, _, err := cl.Catalog().Nodes(bad); return err },
		"catalog/services": func() error { _, _, err := cl.Catalog().Services(bad); return err },
		"catalog/service":  func() error { _, _, err := cl.Catalog().Service("web", "", bad); return err },
		"node-services":    func() error { _, _, err := cl.Catalog().NodeServiceList("edge-1", bad); return err },
		"health/service":   func() error { _, _, err := cl.Health().Service("web", "", false, bad); return err },
		"health/checks":    func() error { _, _, err := cl.Health().Checks("web", bad); return err },
		"health/state":     func() error { _, _, err := cl.Health().State("any", bad); return err },
		"health/node":      func() error { _, _, err := cl.Health().Node("edge-1", bad); return err },
		"agent/services":   func() error { _, err := cl.Agent().ServicesWithFilter(bad.Filter); return err },
		"agent/checks":     func() error { _, err := cl.Agent().ChecksWithFilter(bad.Filter); return err },
	}
	for name, call := range calls {
		err := call()
		if err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), "Failed to create boolean expression evaluator") {
			t.Errorf("%s with a bad filter: %v, want a 400 with the parse error", name, err)
		}
	}
	_, _, err := cl.Catalog().Nodes(&consul.QueryOptions{Filter: `NoSuchField == "x"`})
	if err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("nodes filtered on an unknown selector: %v, want a 400", err)
	}
}
