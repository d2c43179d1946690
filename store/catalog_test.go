package store

import (
	"errors"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

func TestRegister(t *testing.T) {
	t.Run("node, service and checks with Consul defaults", func(t *testing.T) {
		c := newClock(t)
		res, evs := c.do(register(&lodestonepb.CatalogRegisterRequest{
			Node:    &lodestonepb.Node{Name: "n1", Address: "10.0.0.1", Id: sid(1), Meta: map[string]string{"rack": "a"}},
			Service: &lodestonepb.Service{Name: "web", Tags: []string{"v1"}, Port: 80},
			Checks: []*lodestonepb.Check{
				{Name: "web-alive", ServiceId: "web", ServiceName: "lies", Status: PASSING},
				{CheckId: "mem", Node: "n1"}, // no status: critical
			},
		}))
		if res.GetCatalogRegister() == nil || res.Rejected != nil {
			t.Fatalf("result %v", res)
		}
		ns, meta := c.s.Node("n1")
		if got, want := meta.Index, uint64(1); got != want {
			t.Errorf("NodeIndex = %d, want %d", got, want)
		}
		svc := ns.GetServices()[0]
		if svc.Id != "web" || svc.Node != "n1" || svc.Weights.GetPassing() != 1 || svc.Weights.GetWarning() != 1 || svc.CreateIndex != 1 {
			t.Errorf("service stored as %v; want id defaulted to name, node n1, weights 1/1", svc)
		}
		checks, _ := c.s.NodeChecks("n1")
		if len(checks) != 2 {
			t.Fatalf("checks %v", checks)
		}
		if ch := checks[0]; ch.CheckId != "mem" || ch.Status != CRITICAL || ch.Node != "n1" {
			t.Errorf("check without status stored as %v, want critical", ch)
		}
		if ch := checks[1]; ch.CheckId != "web-alive" || ch.ServiceName != "web" || !slices.Equal(ch.ServiceTags, []string{"v1"}) {
			t.Errorf("service check stored as %v; want id from name and service name/tags from the service", ch)
		}
		if got, want := evKeys(evs), []string{
			"put |catalog/check/n1|mem", "put |catalog/check/n1|web-alive", "put |catalog/node/n1", "put |catalog/service/web|n1|web",
		}; !slices.Equal(got, want) {
			t.Errorf("events %q, want %q", got, want)
		}
		h := &lodestonepb.ServiceHealth{}
		if err := proto.Unmarshal(evs[3].KV.Value, h); err != nil || h.Status != CRITICAL || len(h.Checks) != 2 {
			t.Errorf("instance event value %v (%v); want health with both checks, critical", h, err)
		}
	})

	t.Run("identical re-registration changes nothing", func(t *testing.T) {
		c := newClock(t)
		reg := regSvc("n1", "web-1", "web", "a")
		reg.GetCatalogRegister().Checks = []*lodestonepb.Check{{CheckId: "c", Status: PASSING, ServiceId: "web-1"}}
		c.ok(reg)
		before := dumpCatalog(c.s)
		res, evs := c.do(proto.CloneOf(reg))
		if res.Rejected != nil || len(evs) != 0 {
			t.Errorf("re-registration: %v, events %q", res, evKeys(evs))
		}
		if got := dumpCatalog(c.s); got != before {
			t.Errorf("state changed:\n%s\nwant\n%s", got, before)
		}
	})

	rejected := []struct {
		name     string
		setup    []*lodestonepb.Command
		cmd      *lodestonepb.Command
		wantRule string
		wantMsg  string
	}{
		{"service without node registration", nil,
			register(&lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: "n9"}, SkipNodeUpdate: true,
				Service: &lodestonepb.Service{Name: "web"}}),
			RejectNodeMissing, `node "n9" is not registered; register it with an address (skip_node_update needs an existing node)`},
		{"check of a service not on the node", []*lodestonepb.Command{regSvc("n2", "web", "web")},
			regCheck("n1", "c1", "web", PASSING),
			RejectServiceMissing, `check "c1" refers to service "web", which is not registered on node "n1"; register the service first`},
		{"node id owned by another node", []*lodestonepb.Command{register(&lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: "n1", Address: "a", Id: sid(7)}})},
			register(&lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: "n2", Address: "b", Id: sid(7)}}),
			RejectNodeIDTaken, `node id "00000007-0000-4000-8000-000000000007" already belongs to node "n1"; node ids are unique`},
	}
	for _, tt := range rejected {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock(t)
			c.ok(tt.setup...)
			before := dumpCatalog(c.s)
			res, evs := c.do(tt.cmd)
			err := ResultError(res)
			var re *RejectedError
			if !errors.As(err, &re) || !errors.Is(err, ErrRejected) {
				t.Fatalf("ResultError = %v, want a *RejectedError", err)
			}
			if re.Rule != tt.wantRule || re.Detail != tt.wantMsg {
				t.Errorf("rejected %s: %s\nwant      %s: %s", re.Rule, re.Detail, tt.wantRule, tt.wantMsg)
			}
			if len(evs) != 0 {
				t.Errorf("events %q from a rejected command", evKeys(evs))
			}
			if got := dumpCatalog(c.s); got != before {
				t.Errorf("a rejected command changed the catalog:\n%s\nwant\n%s", got, before)
			}
		})
	}

	t.Run("renaming a node id frees the old id", func(t *testing.T) {
		c := newClock(t)
		c.ok(register(&lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: "n1", Address: "a", Id: sid(1)}}),
			register(&lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: "n1", Address: "a", Id: sid(2)}}),
			register(&lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: "n2", Address: "b", Id: sid(1)}}))
	})

	t.Run("service rename and retag update its checks", func(t *testing.T) {
		c := newClock(t)
		c.ok(regSvc("n1", "s1", "web", "a"), regCheck("n1", "c1", "s1", PASSING), regCheck("n1", "node", "", PASSING))
		_, evs := c.do(regSvc("n1", "s1", "www", "b"))
		checks, _ := c.s.NodeChecks("n1")
		if ch := checks[0]; ch.ServiceName != "www" || !slices.Equal(ch.ServiceTags, []string{"b"}) || ch.ModifyIndex != 4 {
			t.Errorf("check after rename %v, want service www [b] at index 4", ch)
		}
		if got, want := evKeys(evs), []string{
			"put |catalog/check/n1|c1", "put |catalog/node/n1", "delete |catalog/service/web|n1|s1", "put |catalog/service/www|n1|s1",
		}; !slices.Equal(got, want) {
			t.Errorf("events %q, want %q", got, want)
		}
		if got, _ := c.s.HealthService("web", nil, false); len(got) != 0 {
			t.Errorf("old name still has instances %v", got)
		}
	})
}

func TestDeregister(t *testing.T) {
	setup := func(t *testing.T) *clock {
		c := newClock(t)
		c.ok(regSvc("n1", "web-1", "web"), regSvc("n1", "db-1", "db"),
			regCheck("n1", "web-alive", "web-1", PASSING), regCheck("n1", "db-alive", "db-1", PASSING),
			regCheck("n1", "serfHealth", "", PASSING), regSvc("n2", "web-2", "web"),
			sessCreate(sid(1), "n1", withChecks("web-alive")), sessCreate(sid(2), "n1"), sessCreate(sid(3), "n2"),
			acquireCmd("lock/a", "x", sid(1)), acquireCmd("lock/b", "y", sid(2)))
		return c
	}
	tests := []struct {
		name                         string
		cmd                          *lodestonepb.Command
		wantSvcs, wantChks, wantSess uint32
		wantSessions                 []string // left after
		wantServices                 []string // web instances left, by node
		wantEvents                   []string
	}{
		{"node", dereg("n1", "", ""), 2, 3, 2, []string{sid(3)}, []string{"n2"}, []string{
			"put lock/a", "put lock/b", // released by the invalidated sessions
			"delete |catalog/check/n1|db-alive", "delete |catalog/check/n1|serfHealth", "delete |catalog/check/n1|web-alive",
			"delete |catalog/node/n1", "delete |catalog/service/db|n1|db-1", "delete |catalog/service/web|n1|web-1",
			"delete |session/" + sid(1), "delete |session/" + sid(2)}},
		{"service takes its checks and their sessions", dereg("n1", "web-1", ""), 1, 1, 1, []string{sid(2), sid(3)}, []string{"n2"}, []string{
			"put lock/a", "delete |catalog/check/n1|web-alive", "put |catalog/node/n1", "delete |catalog/service/web|n1|web-1",
			"delete |session/" + sid(1)}},
		{"node check", dereg("n1", "", "serfHealth"), 0, 1, 0, []string{sid(1), sid(2), sid(3)}, []string{"n1", "n2"}, []string{
			"delete |catalog/check/n1|serfHealth", "put |catalog/node/n1", "put |catalog/service/db|n1|db-1", "put |catalog/service/web|n1|web-1"}},
		{"missing node is a no-op", dereg("n7", "", ""), 0, 0, 0, []string{sid(1), sid(2), sid(3)}, []string{"n1", "n2"}, nil},
		{"missing service is a no-op", dereg("n1", "nope", ""), 0, 0, 0, []string{sid(1), sid(2), sid(3)}, []string{"n1", "n2"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := setup(t)
			res, evs := c.do(tt.cmd)
			r := res.GetCatalogDeregister()
			if r == nil || r.RemovedServices != tt.wantSvcs || r.RemovedChecks != tt.wantChks || r.InvalidatedSessions != tt.wantSess {
				t.Errorf("result %v, want %d services, %d checks, %d sessions", r, tt.wantSvcs, tt.wantChks, tt.wantSess)
			}
			var ids []string
			ss, _ := c.s.Sessions()
			for _, s := range ss {
				ids = append(ids, s.Id)
			}
			if !slices.Equal(ids, tt.wantSessions) {
				t.Errorf("sessions %v, want %v", ids, tt.wantSessions)
			}
			var nodes []string
			insts, _ := c.s.ServiceInstances("web", nil, false)
			for _, in := range insts {
				nodes = append(nodes, in.Node.Name)
			}
			if !slices.Equal(nodes, tt.wantServices) {
				t.Errorf("web instances on %v, want %v", nodes, tt.wantServices)
			}
			if got := evKeys(evs); !slices.Equal(got, tt.wantEvents) {
				t.Errorf("events\n%q\nwant\n%q", got, tt.wantEvents)
			}
		})
	}
}

func TestCheckUpdate(t *testing.T) {
	c := newClock(t)
	c.ok(regSvc("n1", "web-1", "web"), regCheck("n1", "http", "web-1", PASSING))
	idx := c.s.ServiceIndex("web")

	res, evs := c.do(checkUpd("n1", "http", PASSING, ""))
	if res.GetCheckUpdate().GetCheck().GetModifyIndex() != 2 || len(evs) != 0 || c.s.ServiceIndex("web") != idx {
		t.Errorf("same status: %v, events %q, index %d->%d; want no change", res, evKeys(evs), idx, c.s.ServiceIndex("web"))
	}
	res, evs = c.do(checkUpd("n1", "http", WARNING, "slow"))
	if ch := res.GetCheckUpdate().GetCheck(); ch.Status != WARNING || ch.Output != "slow" || ch.ModifyIndex != 4 {
		t.Errorf("updated check %v", ch)
	}
	if got, want := evKeys(evs), []string{"put |catalog/check/n1|http", "put |catalog/node/n1", "put |catalog/service/web|n1|web-1"}; !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	if got, want := c.s.ServiceIndex("web"), uint64(4); got != want {
		t.Errorf("ServiceIndex = %d, want %d", got, want)
	}
	res, _ = c.do(checkUpd("n1", "nope", PASSING, ""))
	if err := ResultError(res); err == nil || err.(*RejectedError).Rule != RejectCheckMissing {
		t.Errorf("update of a missing check: %v", err)
	}
}

func TestHealthQueries(t *testing.T) {
	c := newClock(t)
	c.ok(
		regSvc("n1", "web-1", "web", "Primary", "v1"), regCheck("n1", "web-1-http", "web-1", PASSING),
		regSvc("n2", "web-2", "web", "v1"), regCheck("n2", "web-2-http", "web-2", WARNING),
		regSvc("n3", "web-3", "web", "v2", "primary"), regCheck("n3", "serfHealth", "", CRITICAL),
		regSvc("n4", "web-4", "web"), // no checks: passing
		regSvc("n1", "db-1", "db", "primary"), regCheck("n1", "db-1-tcp", "db-1", CRITICAL),
	)
	nodesOf := func(hs []*lodestonepb.ServiceHealth) []string {
		var out []string
		for _, h := range hs {
			out = append(out, h.Node.Name+":"+h.Status.String())
		}
		return out
	}
	tests := []struct {
		name    string
		service string
		tags    []string
		passing bool
		want    []string
	}{
		{"all", "web", nil, false, []string{"n1:HEALTH_PASSING", "n2:HEALTH_WARNING", "n3:HEALTH_CRITICAL", "n4:HEALTH_PASSING"}},
		{"passing only: warning is not passing", "web", nil, true, []string{"n1:HEALTH_PASSING", "n4:HEALTH_PASSING"}},
		{"tag, case-insensitive", "web", []string{"PRIMARY"}, false, []string{"n1:HEALTH_PASSING", "n3:HEALTH_CRITICAL"}},
		{"every tag must match", "web", []string{"primary", "v1"}, false, []string{"n1:HEALTH_PASSING"}},
		{"tag and passing", "web", []string{"v1"}, true, []string{"n1:HEALTH_PASSING"}},
		{"node check counts for every service on the node", "db", nil, false, []string{"n1:HEALTH_CRITICAL"}},
		{"unknown service", "nope", nil, false, nil},
		{"no prefix match", "we", nil, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hs, meta := c.s.HealthService(tt.service, tt.tags, tt.passing)
			if got := nodesOf(hs); !slices.Equal(got, tt.want) {
				t.Errorf("HealthService = %v, want %v", got, tt.want)
			}
			insts, meta2 := c.s.ServiceInstances(tt.service, tt.tags, tt.passing)
			if len(insts) != len(hs) || meta != meta2 {
				t.Errorf("ServiceInstances gives %d (%v), HealthService %d (%v)", len(insts), meta2, len(hs), meta)
			}
			if meta.Index == 0 || meta.Applied != c.s.Index() {
				t.Errorf("meta %+v", meta)
			}
		})
	}

	hs, _ := c.s.HealthService("web", nil, false)
	if got := hs[2].Checks; len(got) != 1 || got[0].CheckId != "serfHealth" {
		t.Errorf("n3 checks %v, want its node check", got)
	}
	if got := hs[0].Checks; len(got) != 1 || got[0].CheckId != "web-1-http" {
		t.Errorf("n1 web checks %v, want only web's own (db's check is not web's)", got)
	}

	sums, _ := c.s.Services()
	if len(sums) != 2 || sums[0].Name != "db" || !slices.Equal(sums[1].Tags, []string{"Primary", "primary", "v1", "v2"}) {
		t.Errorf("Services = %v", sums)
	}
	nodes, meta := c.s.Nodes()
	if len(nodes) != 4 || nodes[3].Name != "n4" || meta.Index != c.s.NodesIndex() {
		t.Errorf("Nodes = %v %+v", nodes, meta)
	}
	if ns, _ := c.s.Node("n1"); len(ns.GetServices()) != 2 || ns.Services[0].Id != "db-1" {
		t.Errorf("Node(n1) = %v", ns)
	}
	if ns, meta := c.s.Node("zz"); ns != nil || meta.Index != c.s.NodesIndex() {
		t.Errorf("Node(zz) = %v %+v, want nil at NodesIndex", ns, meta)
	}
	sc, _ := c.s.ServiceChecks("web")
	if len(sc) != 2 || sc[0].CheckId != "web-1-http" || sc[1].CheckId != "web-2-http" {
		t.Errorf("ServiceChecks(web) = %v, want the two service checks, no node checks", sc)
	}
	crit, meta := c.s.ChecksInState(CRITICAL)
	if len(crit) != 2 || crit[0].CheckId != "db-1-tcp" || crit[1].CheckId != "serfHealth" || meta.Index != c.s.ChecksIndex() {
		t.Errorf("ChecksInState(critical) = %v", crit)
	}
	if all, _ := c.s.ChecksInState(ANY); len(all) != 4 {
		t.Errorf("ChecksInState(any) has %d checks, want 4", len(all))
	}
}
