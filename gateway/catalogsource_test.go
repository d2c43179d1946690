package gateway_test

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/gateway"
)

// testNode is the catalog node the harness registers instances on.
const testNode = "n1"

// catalogSource returns a CatalogSource over a fresh client of r, quick to
// notice an outage.
func (r *registry) catalogSource(t *testing.T, routeWarning bool) *gateway.CatalogSource {
	cfg := gateway.DefaultCatalogSourceConfig()
	cfg.GiveUpAfter = 700 * time.Millisecond
	cfg.BackoffBase, cfg.BackoffMax = 50*time.Millisecond, 300*time.Millisecond
	cfg.PageSize = 7 // small pages: reloads exercise paging
	cfg.Logger = testLogger(t)
	cfg.RouteWarning = routeWarning
	src, err := gateway.NewCatalogSource(r.newClient(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// register registers in on node testNode (at in.Address; the service
// itself has no address, so the node's is used) with one check of the
// service named "<id>-check" in status passing, or critical when
// !in.Healthy.
func register(ctx context.Context, c *client.Client, in gateway.Instance) (uint64, error) {
	st := lodestonepb.HealthStatus_HEALTH_PASSING
	if !in.Healthy {
		st = lodestonepb.HealthStatus_HEALTH_CRITICAL
	}
	resp, err := c.Register(ctx, &lodestonepb.CatalogRegisterRequest{
		Node:    &lodestonepb.Node{Name: testNode, Address: in.Address},
		Service: &lodestonepb.Service{Id: in.ID, Name: in.Service, Port: uint32(in.Port), Meta: in.Meta},
		Checks:  []*lodestonepb.Check{{CheckId: in.ID + "-check", Name: "probe", ServiceId: in.ID, Status: st}},
	})
	if err != nil {
		return 0, err
	}
	return resp.GetHeader().GetIndex(), nil
}

func catalogHarness(t *testing.T) *sourceHarness { return catalogHarnessOn(t, startRegistry(t)) }

// catalogHarnessOn is a CatalogSource on reg, writing through the Catalog
// gRPC service.
func catalogHarnessOn(t *testing.T, reg *registry) *sourceHarness {
	src := reg.catalogSource(t, false)
	c := reg.newClient(t)
	must := mustIndex(t)
	ctx := testCtx(t, 60*time.Second)
	return &sourceHarness{
		src: src,
		put: func(in gateway.Instance) uint64 { return must(register(ctx, c, in)) },
		del: func(_, id string) uint64 {
			resp, err := c.Deregister(ctx, testNode, id, "")
			return must(resp.GetHeader().GetIndex(), err)
		},
		putRoute: func(r gateway.Route) uint64 { return must(src.PutRoute(ctx, r)) },
		delRoute: func(n string) uint64 { return must(src.DeleteRoute(ctx, n)) },
		reloads:  func() int { return int(src.Stats().Reloads) },
		resumes:  func() int { return int(src.Stats().Resumes) },
		id:       func(id string) string { return testNode + "/" + id },
	}
}

// TestCatalogSourceFollowsHealth: instances registered through the
// Catalog gRPC service get traffic at their service address (not the
// node's); once the index of a check turning critical, of a warning, or
// of a deregistration is applied, not one request reaches the instance;
// a check passing again brings it back.
func TestCatalogSourceFollowsHealth(t *testing.T) {
	a := startOrigin(t, nameHandler("a"), false)
	b := startOrigin(t, nameHandler("b"), false)
	reg := startRegistry(t)
	src := reg.catalogSource(t, false)
	c := reg.newClient(t)
	ctx := testCtx(t, 60*time.Second)
	if _, err := src.PutRoute(ctx, gateway.Route{Name: "all", PathPrefix: "/", Service: "svc"}); err != nil {
		t.Fatal(err)
	}
	var idx uint64
	for _, o := range []struct {
		id string
		o  *origin
	}{{"a", a}, {"b", b}} {
		in := o.o.instance("svc", o.id, nil)
		resp, err := c.Register(ctx, &lodestonepb.CatalogRegisterRequest{
			// The node's address does not answer: the service's must win.
			Node:    &lodestonepb.Node{Name: "n-" + o.id, Address: "192.0.2.1"},
			Service: &lodestonepb.Service{Id: o.id, Name: "svc", Address: in.Address, Port: uint32(in.Port)},
			Checks: []*lodestonepb.Check{{CheckId: "ttl", Name: "ttl", ServiceId: o.id,
				Status: lodestonepb.HealthStatus_HEALTH_PASSING}},
		})
		if err != nil {
			t.Fatal(err)
		}
		idx = resp.GetHeader().GetIndex()
	}
	g := startGateway(t, testConfig(t, src))
	if err := g.WaitIndex(ctx, idx); err != nil {
		t.Fatal(err)
	}
	hc := httpClient(t)
	// answers sends n requests and counts the answers by body.
	answers := func(n int) map[string]int {
		t.Helper()
		got := map[string]int{}
		for range n {
			resp, body := get(t, hc, g, "x", "/")
			if resp.StatusCode != 200 {
				t.Fatalf("status %d (%q), want 200", resp.StatusCode, body)
			}
			got[body]++
		}
		return got
	}
	if got := answers(40); got["a /"] == 0 || got["b /"] == 0 {
		t.Fatalf("both passing: answers %v, want both a and b", got)
	}
	setCheck := func(node string, st lodestonepb.HealthStatus) uint64 {
		t.Helper()
		resp, err := c.UpdateCheck(ctx, node, "ttl", st, "set by the test")
		if err != nil {
			t.Fatal(err)
		}
		if err := g.WaitIndex(ctx, resp.GetHeader().GetIndex()); err != nil {
			t.Fatal(err)
		}
		return resp.GetHeader().GetIndex()
	}

	setCheck("n-a", lodestonepb.HealthStatus_HEALTH_CRITICAL)
	if got := answers(40); got["a /"] != 0 {
		t.Errorf("a critical: answers %v, want none from a", got)
	}
	setCheck("n-a", lodestonepb.HealthStatus_HEALTH_WARNING)
	if got := answers(40); got["a /"] != 0 {
		t.Errorf("a warning (RouteWarning off): answers %v, want none from a", got)
	}
	setCheck("n-a", lodestonepb.HealthStatus_HEALTH_PASSING)
	if got := answers(40); got["a /"] == 0 {
		t.Errorf("a passing again: answers %v, want some from a", got)
	}

	resp, err := c.Deregister(ctx, "n-b", "b", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.WaitIndex(ctx, resp.GetHeader().GetIndex()); err != nil {
		t.Fatal(err)
	}
	if got := answers(40); got["b /"] != 0 {
		t.Errorf("b deregistered: answers %v, want none from b", got)
	}
	// A node-level check counts for every instance on the node.
	resp2, err := c.Register(ctx, &lodestonepb.CatalogRegisterRequest{
		Node:           &lodestonepb.Node{Name: "n-a", Address: "192.0.2.1"},
		SkipNodeUpdate: true,
		Checks:         []*lodestonepb.Check{{CheckId: "serf", Name: "node", Status: lodestonepb.HealthStatus_HEALTH_CRITICAL}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.WaitIndex(ctx, resp2.GetHeader().GetIndex()); err != nil {
		t.Fatal(err)
	}
	if resp, body := get(t, hc, g, "x", "/"); resp.StatusCode != 503 {
		t.Errorf("a's node critical, b gone: %d %q, want 503 (no routable instance)", resp.StatusCode, body)
	}
	if got := src.Stats(); got.Reloads != 1 {
		t.Errorf("%d reloads, want only the first: changes arrive as deltas", got.Reloads)
	}
}

// TestCatalogSourceRouteWarning: with RouteWarning an instance whose
// check warns keeps its traffic.
func TestCatalogSourceRouteWarning(t *testing.T) {
	a := startOrigin(t, nameHandler("a"), false)
	reg := startRegistry(t)
	src := reg.catalogSource(t, true)
	c := reg.newClient(t)
	ctx := testCtx(t, 60*time.Second)
	if _, err := src.PutRoute(ctx, gateway.Route{Name: "all", PathPrefix: "/", Service: "svc"}); err != nil {
		t.Fatal(err)
	}
	if _, err := register(ctx, c, a.instance("svc", "a", nil)); err != nil {
		t.Fatal(err)
	}
	resp, err := c.UpdateCheck(ctx, testNode, "a-check", lodestonepb.HealthStatus_HEALTH_WARNING, "")
	if err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, testConfig(t, src))
	if err := g.WaitIndex(ctx, resp.GetHeader().GetIndex()); err != nil {
		t.Fatal(err)
	}
	if resp, body := get(t, httpClient(t), g, "x", "/"); resp.StatusCode != 200 || body != "a /" {
		t.Errorf("a warning with RouteWarning: %d %q, want a", resp.StatusCode, body)
	}
}

// TestCatalogSourceChurnNeverRoutesToDeregistered: under steady load while
// instances are deregistered and registered again through the Catalog
// service, no request is answered by an instance whose deregistration the
// gateway had applied for the whole time the request was routed: a request
// that saw table indices [before, after] and was answered by slot s needs
// s registered at some index in that range.
func TestCatalogSourceChurnNeverRoutesToDeregistered(t *testing.T) {
	const slots = 6
	reg := startRegistry(t)
	src := reg.catalogSource(t, false)
	c := reg.newClient(t)
	ctx := testCtx(t, 60*time.Second)
	if _, err := src.PutRoute(ctx, gateway.Route{Name: "all", PathPrefix: "/", Service: "svc"}); err != nil {
		t.Fatal(err)
	}
	insts := make([]gateway.Instance, slots)
	var idx uint64
	for i := range insts {
		insts[i] = startOrigin(t, nameHandler(fmt.Sprint(i)), false).instance("svc", fmt.Sprint("s", i), nil)
		var err error
		if idx, err = register(ctx, c, insts[i]); err != nil {
			t.Fatal(err)
		}
	}
	g := startGateway(t, testConfig(t, src))
	if err := g.WaitIndex(ctx, idx); err != nil {
		t.Fatal(err)
	}

	type answer struct {
		before, after uint64
		slot          int
	}
	var (
		mu      sync.Mutex
		answers []answer
		failed  []string
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	hc := httpClient(t)
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				before := g.Index()
				resp, err := hc.Get("http://" + g.Addr() + "/")
				var (
					body   []byte
					status int
				)
				if err == nil {
					status = resp.StatusCode
					body, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				after := g.Index()
				mu.Lock()
				var slot int
				if _, serr := fmt.Sscanf(string(body), "%d /", &slot); err != nil || serr != nil || status != 200 {
					failed = append(failed, fmt.Sprintf("status %d, err %v, body %q", status, err, body))
				} else {
					answers = append(answers, answer{before, after, slot})
				}
				mu.Unlock()
			}
		})
	}

	// gaps[s] are the table index ranges [from, to) during which slot s
	// was deregistered.
	type gap struct{ from, to uint64 }
	gaps := make([][]gap, slots)
	deadline := time.Now().Add(3 * time.Second)
	for n := 0; time.Now().Before(deadline); n++ {
		s := n % slots
		resp, err := c.Deregister(ctx, testNode, insts[s].ID, "")
		if err != nil {
			t.Fatal(err)
		}
		from := resp.GetHeader().GetIndex()
		to, err := register(ctx, c, insts[s])
		if err != nil {
			t.Fatal(err)
		}
		gaps[s] = append(gaps[s], gap{from, to})
	}
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(failed) > 0 {
		t.Errorf("%d of %d requests failed under churn, first: %s", len(failed), len(failed)+len(answers), failed[0])
	}
	bad := 0
	for _, a := range answers {
		for _, gp := range gaps[a.slot] {
			if a.before >= gp.from && a.after < gp.to {
				bad++
				if bad == 1 {
					t.Errorf("a request routed at table indices [%d, %d] reached slot %d, deregistered over [%d, %d)",
						a.before, a.after, a.slot, gp.from, gp.to)
				}
			}
		}
	}
	n := 0
	for _, g := range gaps {
		n += len(g)
	}
	t.Logf("%d deregistrations and registrations, %d requests, %d reached a deregistered instance", n, len(answers), bad)
	if n < slots || len(answers) < 100 {
		t.Errorf("%d deregistrations and %d requests: too little churn or load to mean anything", n, len(answers))
	}
}
