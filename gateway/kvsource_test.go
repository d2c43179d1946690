package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/testnet"

	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/gateway"
	"github.com/lodestone-kv/lodestone/gateway/gatewaytest"
	"github.com/lodestone-kv/lodestone/server"
)

// registry is a real single-node Lodestone server in this process, with
// fixed addresses so it can be stopped and started again (an outage).
type registry struct {
	t          *testing.T
	dir        string
	grpc, peer string
	srv        *server.Server
	logs       *slog.Logger
	stopped    bool
}

func freeAddr(t *testing.T) string { return testnet.FreeAddr(t) }

func startRegistry(t *testing.T) *registry {
	r := &registry{t: t, dir: t.TempDir(), grpc: freeAddr(t), peer: freeAddr(t),
		logs: slog.New(slog.NewTextHandler(io.Discard, nil))}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *registry) start() {
	r.t.Helper()
	cfg := server.DefaultConfig()
	cfg.Name = "r1"
	cfg.DataDir = r.dir
	cfg.ListenPeer, cfg.ListenGRPC, cfg.ListenHTTP = r.peer, r.grpc, "127.0.0.1:0"
	cfg.InitialCluster = map[string]string{"r1": r.peer}
	cfg.TickInterval = 20 * time.Millisecond
	cfg.ElectionTicks = 10
	cfg.Logger = r.logs
	s, err := server.New(cfg)
	if err != nil {
		r.t.Fatalf("start registry: %v", err)
	}
	s.Start()
	r.srv, r.stopped = s, false
}

func (r *registry) stop() {
	if r.stopped {
		return
	}
	r.stopped = true
	if err := r.srv.Close(); err != nil {
		r.t.Errorf("stop registry: %v", err)
	}
}

// newClient returns a client of r, closed when the test ends.
func (r *registry) newClient(t *testing.T) *client.Client {
	c, err := client.New(client.Config{
		Endpoints: []string{r.grpc}, DialTimeout: time.Second,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		WatchProgressInterval: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// kvSource returns a KVSource over a fresh client of r, quick to notice an
// outage.
func (r *registry) kvSource(t *testing.T) *gateway.KVSource {
	cfg := gateway.DefaultKVSourceConfig()
	cfg.GiveUpAfter = 700 * time.Millisecond
	cfg.BackoffBase, cfg.BackoffMax = 50*time.Millisecond, 300*time.Millisecond
	cfg.PageSize = 7 // small pages: reloads exercise paging
	cfg.Logger = testLogger(t)
	src, err := gateway.NewKVSource(r.newClient(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// model is what a recording sink has applied.
type model struct {
	mu        sync.Mutex
	index     uint64
	instances map[string]gateway.Instance
	routes    map[string]gateway.Route
	updates   []gateway.Update
	resets    int
	connected []bool
	changed   chan struct{}
}

func newModel() *model {
	return &model{instances: map[string]gateway.Instance{}, routes: map[string]gateway.Route{}, changed: make(chan struct{})}
}

func (m *model) Apply(u gateway.Update) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if u.Index < m.index && !u.Reset {
		panic(fmt.Sprintf("index went back: %d after %d", u.Index, m.index))
	}
	m.updates = append(m.updates, u)
	if u.Reset {
		m.resets++
		clear(m.instances)
	}
	if u.Reset || u.ResetRoutes {
		clear(m.routes)
	}
	for _, s := range u.Sets {
		for k, in := range m.instances {
			if in.Service == s.Service {
				delete(m.instances, k)
			}
		}
		for _, in := range s.Instances {
			in.Service = s.Service
			m.instances[s.Service+"/"+in.ID] = in
		}
	}
	for _, c := range u.Instances {
		if c.Instance == nil {
			delete(m.instances, c.Service+"/"+c.ID)
		} else {
			in := *c.Instance
			in.Service, in.ID = c.Service, c.ID
			m.instances[c.Service+"/"+c.ID] = in
		}
	}
	for _, c := range u.Routes {
		if c.Route == nil {
			delete(m.routes, c.Name)
		} else {
			r := *c.Route
			r.Name = c.Name
			m.routes[c.Name] = r
		}
	}
	m.index = u.Index
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *model) SetConnected(c bool, _ error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.connected = append(m.connected, c)
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *model) wait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx := testCtx(t, 15*time.Second)
	for {
		m.mu.Lock()
		ok, ch := cond(), m.changed
		m.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-ch:
		}
	}
}

func (m *model) waitIndex(t *testing.T, idx uint64) {
	t.Helper()
	m.wait(t, fmt.Sprintf("index %d", idx), func() bool { return m.index >= idx })
}

// sourceHarness is one Source implementation with a way to write to its
// registry.
type sourceHarness struct {
	src       gateway.Source
	put       func(gateway.Instance) uint64
	del       func(service, id string) uint64
	putRoute  func(gateway.Route) uint64
	delRoute  func(name string) uint64
	reloads   func() int // full loads so far
	resumes   func() int // watches resumed after a break; nil for the fake
	interrupt func()     // an outage and its end; nil when not supported
	// id maps an instance id as put to the ID the source delivers (a
	// CatalogSource prefixes the node); nil: the same.
	id func(string) string
}

// key is the model's key of instance service/id.
func (h *sourceHarness) key(service, id string) string {
	if h.id != nil {
		id = h.id(id)
	}
	return service + "/" + id
}

// mustIndex fails t on err and returns idx.
func mustIndex(t *testing.T) func(uint64, error) uint64 {
	return func(idx uint64, err error) uint64 {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return idx
	}
}

func fakeHarness(t *testing.T) *sourceHarness {
	src := gatewaytest.NewSource()
	return &sourceHarness{
		src: src, put: src.PutInstance, del: src.DeleteInstance, putRoute: src.PutRoute, delRoute: src.DeleteRoute,
		reloads:   src.Resets,
		interrupt: func() { src.Disconnect(); src.Reconnect() },
	}
}

func kvHarness(t *testing.T) *sourceHarness { return kvHarnessOn(t, startRegistry(t)) }

// kvHarnessOn is a KVSource on reg.
func kvHarnessOn(t *testing.T, reg *registry) *sourceHarness {
	src := reg.kvSource(t)
	must := mustIndex(t)
	ctx := testCtx(t, 60*time.Second)
	return &sourceHarness{
		src:      src,
		put:      func(in gateway.Instance) uint64 { return must(src.PutInstance(ctx, in)) },
		del:      func(s, id string) uint64 { return must(src.DeleteInstance(ctx, s, id)) },
		putRoute: func(r gateway.Route) uint64 { return must(src.PutRoute(ctx, r)) },
		delRoute: func(n string) uint64 { return must(src.DeleteRoute(ctx, n)) },
		reloads:  func() int { return int(src.Stats().Reloads) },
		resumes:  func() int { return int(src.Stats().Resumes) },
	}
}

// TestSourceConformance runs the Source contract against every
// implementation (STYLE rule 23): the in-memory fake, and the KVSource and
// the CatalogSource over a real registry.
func TestSourceConformance(t *testing.T) {
	for name, mk := range map[string]func(*testing.T) *sourceHarness{"fake": fakeHarness, "kv": kvHarness, "catalog": catalogHarness} {
		t.Run(name, func(t *testing.T) {
			h := mk(t)
			inst := func(svc, id string, port int) gateway.Instance {
				return gateway.Instance{Service: svc, ID: id, Address: "10.0.0.1", Port: port, Healthy: true,
					Meta: map[string]string{"zone": "a"}}
			}
			// State before the first Run arrives as one Reset.
			for i := range 20 {
				h.put(inst("web", fmt.Sprint("w", i), 8000+i))
			}
			h.putRoute(gateway.Route{Name: "web", PathPrefix: "/", Service: "web"})
			idx := h.del("web", "w3")

			m := newModel()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- h.src.Run(ctx, 0, m) }()
			m.waitIndex(t, idx)
			// Connected is reported right after the load is applied.
			m.wait(t, "connected", func() bool { return slices.Contains(m.connected, true) })
			m.mu.Lock()
			first := m.updates[0]
			if !first.Reset || m.resets != 1 {
				t.Errorf("first update reset=%v (resets %d), want one Reset", first.Reset, m.resets)
			}
			if got, want := len(m.instances), 19; got != want {
				t.Errorf("instances after the load: %d, want %d", got, want)
			}
			m.mu.Unlock()

			// Deltas follow, in index order.
			h.put(inst("api", "a1", 9000))
			h.putRoute(gateway.Route{Name: "api", Host: "api.test", PathPrefix: "/", Service: "api"})
			h.put(inst("web", "w0", 7000)) // moved
			h.delRoute("web")
			idx = h.del("web", "w1")
			m.waitIndex(t, idx)
			// A CatalogSource follows routes on their own watch: its index
			// covers instances only.
			m.wait(t, "routes [api]", func() bool { return len(m.routes) == 1 && m.routes["api"].Service == "api" })
			m.mu.Lock()
			if m.resets != 1 {
				t.Errorf("%d resets, want deltas after the first", m.resets)
			}
			if got := m.instances[h.key("web", "w0")].Port; got != 7000 {
				t.Errorf("web/w0 port %d, want the update's 7000", got)
			}
			if _, ok := m.instances[h.key("web", "w1")]; ok {
				t.Error("web/w1 still present after its delete")
			}
			if got := slices.Sorted(maps.Keys(m.routes)); !slices.Equal(got, []string{"api"}) {
				t.Errorf("routes %v, want [api]", got)
			}
			if got := m.instances[h.key("api", "a1")].Meta["zone"]; got != "a" {
				t.Errorf("meta lost: zone=%q", got)
			}
			last := m.index
			m.mu.Unlock()

			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Run after cancel = %v, want context.Canceled", err)
			}

			// A later Run resumes from the last index: deltas only.
			h.put(inst("api", "a2", 9001))
			idx = h.del("api", "a1")
			reloads := h.reloads()
			m2 := newModel()
			m2.index = last
			ctx2, cancel2 := context.WithCancel(context.Background())
			done2 := make(chan error, 1)
			go func() { done2 <- h.src.Run(ctx2, last, m2) }()
			m2.waitIndex(t, idx)
			if m2.resets != 0 || h.reloads() != reloads {
				t.Errorf("resume made %d resets and %d reloads, want none", m2.resets, h.reloads()-reloads)
			}
			m2.mu.Lock()
			if _, ok := m2.instances[h.key("api", "a2")]; !ok {
				t.Error("resumed run missed api/a2")
			}
			if c, ok := m2.instances[h.key("api", "a1")]; ok || len(m2.updates) == 0 {
				t.Errorf("resumed run: a1=%v updates=%d", c, len(m2.updates))
			}
			m2.mu.Unlock()
			cancel2()
			<-done2
		})
	}
}

// registrySources are the registry-backed sources, each on a given
// registry.
var registrySources = map[string]func(*testing.T, *registry) *sourceHarness{
	"kv": kvHarnessOn, "catalog": catalogHarnessOn,
}

// TestSourceSurvivesRegistryOutage: a gateway on a real registry keeps
// serving through a registry outage (stale, reported), then resumes its
// watch from its last index without a full reload and picks up the
// changes made after the registry came back.
func TestSourceSurvivesRegistryOutage(t *testing.T) {
	for name, on := range registrySources {
		t.Run(name, func(t *testing.T) {
			a := startOrigin(t, nameHandler("a"), false)
			b := startOrigin(t, nameHandler("b"), false)
			reg := startRegistry(t)
			h := on(t, reg)
			ctx := testCtx(t, 60*time.Second)
			h.putRoute(gateway.Route{Name: "all", PathPrefix: "/", Service: "svc"})
			idx := h.put(a.instance("svc", "a", nil))
			cfg := testConfig(t, h.src)
			cfg.StateDir = t.TempDir()
			g := startGateway(t, cfg)
			if err := g.WaitIndex(ctx, idx); err != nil {
				t.Fatal(err)
			}
			c := httpClient(t)
			if _, body := get(t, c, g, "x", "/"); body != "a /" {
				t.Fatalf("before the outage: %q", body)
			}

			reg.stop()
			if err := g.WaitConnected(ctx, false); err != nil {
				t.Fatal(err)
			}
			for range 10 {
				if resp, body := get(t, c, g, "x", "/"); resp.StatusCode != 200 || body != "a /" {
					t.Fatalf("during the outage: %d %q, want the last known good table", resp.StatusCode, body)
				}
			}
			if g.Staleness() <= 0 {
				t.Error("staleness is 0 during an outage")
			}

			reg.start()
			if err := g.WaitConnected(ctx, true); err != nil {
				t.Fatal(err)
			}
			h.put(b.instance("svc", "b", nil))
			idx = h.del("svc", "a")
			if err := g.WaitIndex(ctx, idx); err != nil {
				t.Fatal(err)
			}
			if _, body := get(t, c, g, "x", "/"); body != "b /" {
				t.Errorf("after the outage: %q, want b", body)
			}
			if got := h.reloads(); got != 1 || h.resumes() < 1 {
				t.Errorf("source: %d reloads, %d resumes; want exactly the first reload and at least one resume", got, h.resumes())
			}
		})
	}
}

// TestSourceColdStartWithRegistryDown: the table persisted by one run
// serves the next run while the registry is down; when it returns, the
// watch resumes from the persisted index (no reload), and a route replaced
// after the table was persisted is replaced in the gateway too.
func TestSourceColdStartWithRegistryDown(t *testing.T) {
	for name, on := range registrySources {
		t.Run(name, func(t *testing.T) {
			a := startOrigin(t, nameHandler("a"), false)
			b := startOrigin(t, nameHandler("b"), false)
			reg := startRegistry(t)
			ctx := testCtx(t, 60*time.Second)
			state := t.TempDir()
			h1 := on(t, reg)
			h1.putRoute(gateway.Route{Name: "all", PathPrefix: "/", Service: "svc"})
			idx := h1.put(a.instance("svc", "a", nil))
			{
				cfg := testConfig(t, h1.src)
				cfg.StateDir = state
				g, err := gateway.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				g.Start()
				if err := g.WaitIndex(ctx, idx); err != nil {
					t.Fatal(err)
				}
				if err := g.Close(); err != nil {
					t.Fatal(err)
				}
			}
			// Not in the persisted table: host y replaces the catch-all.
			h1.putRoute(gateway.Route{Name: "y", Host: "y", PathPrefix: "/", Service: "svc"})
			h1.delRoute("all")
			reg.stop()

			h2 := on(t, reg)
			cfg := testConfig(t, h2.src)
			cfg.StateDir = state
			g := startGateway(t, cfg)
			if !g.Ready() || g.Index() < idx {
				t.Fatalf("cold start: ready=%v index=%d, want ready at ≥ %d", g.Ready(), g.Index(), idx)
			}
			c := httpClient(t)
			if _, body := get(t, c, g, "x", "/"); body != "a /" {
				t.Fatalf("cold start, registry down: %q, want a", body)
			}
			reg.start()
			if err := g.WaitConnected(ctx, true); err != nil {
				t.Fatal(err)
			}
			h1.put(b.instance("svc", "b", nil))
			idx = h1.del("svc", "a")
			if err := g.WaitIndex(ctx, idx); err != nil {
				t.Fatal(err)
			}
			if _, body := get(t, c, g, "y", "/"); body != "b /" {
				t.Errorf("after the registry returned: %q, want b", body)
			}
			if resp, body := get(t, c, g, "x", "/"); resp.StatusCode != http.StatusNotFound {
				t.Errorf("route deleted while the gateway was down still serves: %d %q, want 404", resp.StatusCode, body)
			}
			if got := h2.reloads(); got != 0 {
				t.Errorf("the cold-started source reloaded %d times, want 0 (resume from the persisted index)", got)
			}
		})
	}
}
