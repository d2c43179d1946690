package server

import (
	"fmt"
	"io"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/consul/api/watch"
	"github.com/hashicorp/go-hclog"
)

// runWatch runs a watch plan of the official client's watch package
// against cl and returns its results as they come; the plan stops, and
// its goroutine is gone, when the test ends.
func runWatch(t *testing.T, cl *consul.Client, params map[string]any) <-chan any {
	t.Helper()
	plan, err := watch.Parse(params)
	if err != nil {
		t.Fatalf("parse watch %v: %v", params, err)
	}
	results := make(chan any, 64)
	plan.HybridHandler = func(_ watch.BlockingParamVal, raw any) { results <- raw }
	done := make(chan error, 1)
	logger := hclog.New(&hclog.LoggerOptions{Output: io.Discard})
	go func() { done <- plan.RunWithClientAndHclog(cl, logger) }()
	t.Cleanup(func() {
		plan.Stop()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("watch %v did not stop", params)
		}
	})
	return results
}

// awaitResult waits for a result of the watch that satisfies ok.
func awaitResult(t *testing.T, what string, results <-chan any, ok func(any) bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case raw := <-results:
			if ok(raw) {
				return
			}
		case <-deadline:
			t.Fatalf("%s: no matching watch result within 10s", what)
		}
	}
}

// Every watch type of the official watch package whose endpoints
// Lodestone serves fires on its first answer and again on a change.
// ("event" needs /v1/event and the connect types Connect: neither is
// served here.)
func TestConsulWatchPackage(t *testing.T) {
	c := newTestCluster(t, 1)
	lead := c.waitLeader()
	cl := consulClient(t, c, lead)
	if _, err := cl.KV().Put(&consul.KVPair{Key: "cfg/a", Value: []byte("1")}, nil); err != nil {
		t.Fatal(err)
	}
	register := func(node, id, status string) {
		t.Helper()
		if _, err := cl.Catalog().Register(&consul.CatalogRegistration{Node: node, Address: "10.0.0.1",
			Service: &consul.AgentService{ID: id, Service: "web", Port: 80},
			Check:   &consul.AgentCheck{CheckID: id + "-check", ServiceID: id, Status: status}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	register("edge-1", "web-1", consul.HealthCritical)

	key := runWatch(t, cl, map[string]any{"type": "key", "key": "cfg/a"})
	prefix := runWatch(t, cl, map[string]any{"type": "keyprefix", "prefix": "cfg/"})
	services := runWatch(t, cl, map[string]any{"type": "services"})
	nodes := runWatch(t, cl, map[string]any{"type": "nodes"})
	service := runWatch(t, cl, map[string]any{"type": "service", "service": "web", "passingonly": true})
	critical := runWatch(t, cl, map[string]any{"type": "checks", "state": "critical"})
	webChecks := runWatch(t, cl, map[string]any{"type": "checks", "service": "web"})
	if err := cl.Agent().ServiceRegister(&consul.AgentServiceRegistration{ID: "api-1", Name: "api", Port: 81}); err != nil {
		t.Fatal(err)
	}
	agentService := runWatch(t, cl, map[string]any{"type": "agent_service", "service_id": "api-1"})

	awaitResult(t, "key: first answer", key, func(r any) bool { p, _ := r.(*consul.KVPair); return p != nil && string(p.Value) == "1" })
	awaitResult(t, "keyprefix: first answer", prefix, func(r any) bool { ps, _ := r.(consul.KVPairs); return len(ps) == 1 })
	awaitResult(t, "services: first answer", services, func(r any) bool { m, _ := r.(map[string][]string); return m["web"] != nil })
	awaitResult(t, "nodes: first answer", nodes, func(r any) bool { ns, _ := r.([]*consul.Node); return len(ns) >= 1 })
	awaitResult(t, "service: first answer", service, func(r any) bool { es, ok := r.([]*consul.ServiceEntry); return ok && len(es) == 0 })
	awaitResult(t, "checks: first answer", critical, func(r any) bool { cs, _ := r.([]*consul.HealthCheck); return len(cs) == 1 })
	awaitResult(t, "checks of web: first answer", webChecks, func(r any) bool { cs, _ := r.([]*consul.HealthCheck); return len(cs) == 1 })
	awaitResult(t, "agent_service: first answer", agentService, func(r any) bool { s, _ := r.(*consul.AgentService); return s != nil && s.Port == 81 })

	if _, err := cl.KV().Put(&consul.KVPair{Key: "cfg/a", Value: []byte("2")}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.KV().Put(&consul.KVPair{Key: "cfg/b", Value: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Catalog().Register(&consul.CatalogRegistration{Node: "edge-2", Address: "10.0.0.2",
		Service: &consul.AgentService{ID: "db-1", Service: "db"}}, nil); err != nil {
		t.Fatal(err)
	}
	register("edge-1", "web-1", consul.HealthPassing)
	if err := cl.Agent().ServiceRegister(&consul.AgentServiceRegistration{ID: "api-1", Name: "api", Port: 82}); err != nil {
		t.Fatal(err)
	}

	awaitResult(t, "key: change", key, func(r any) bool { p, _ := r.(*consul.KVPair); return p != nil && string(p.Value) == "2" })
	awaitResult(t, "keyprefix: change", prefix, func(r any) bool { ps, _ := r.(consul.KVPairs); return len(ps) == 2 })
	awaitResult(t, "services: change", services, func(r any) bool { m, _ := r.(map[string][]string); return m["db"] != nil })
	awaitResult(t, "nodes: change", nodes, func(r any) bool {
		ns, _ := r.([]*consul.Node)
		for _, n := range ns {
			if n.Node == "edge-2" {
				return true
			}
		}
		return false
	})
	awaitResult(t, "service: now passing", service, func(r any) bool {
		es, _ := r.([]*consul.ServiceEntry)
		return len(es) == 1 && es[0].Service.ID == "web-1"
	})
	awaitResult(t, "checks: none critical", critical, func(r any) bool { cs, ok := r.([]*consul.HealthCheck); return ok && len(cs) == 0 })
	awaitResult(t, "checks of web: passing", webChecks, func(r any) bool {
		cs, _ := r.([]*consul.HealthCheck)
		return len(cs) == 1 && cs[0].Status == consul.HealthPassing
	})

	awaitResult(t, "agent_service: change", agentService, func(r any) bool { s, _ := r.(*consul.AgentService); return s != nil && s.Port == 82 })

	// The event type needs /v1/event/list, which Lodestone does not serve:
	// its plan parses, and its first call fails with a 404.
	if _, err := watch.Parse(map[string]any{"type": "event", "name": "deploy"}); err != nil {
		t.Fatalf("parse an event watch: %v", err)
	}
	if _, _, err := cl.Event().List("deploy", nil); err == nil {
		t.Fatal(fmt.Errorf("/v1/event/list answered; the event watch type should be tested now"))
	}
}
