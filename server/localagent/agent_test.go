package localagent

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/checks"
	"github.com/lodestone-kv/lodestone/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	passing  = lodestonepb.HealthStatus_HEALTH_PASSING
	critical = lodestonepb.HealthStatus_HEALTH_CRITICAL
)

// storeApplier applies commands to a real store, one at a time, at the
// next index, as the server's write path does; entries counts them.
type storeApplier struct {
	mu sync.Mutex
	st *store.Store
}

func (s *storeApplier) apply(_ context.Context, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cmd.TimeUnixNano == 0 {
		cmd.TimeUnixNano = time.Now().UnixNano()
	}
	if err := store.DefaultLimits().ValidateCommand(cmd); err != nil {
		return nil, 0, err
	}
	index := s.st.Index() + 1
	res, _ := s.st.Apply(index, cmd)
	if err := store.ResultError(res); err != nil {
		return nil, index, err
	}
	return res, index, nil
}

// entries is how many commands the store applied: a Raft log's length.
func (s *storeApplier) entries() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.Index()
}

// fast lets checks probe every few milliseconds.
var fast = checks.Options{MinInterval: time.Millisecond, MinDeregisterAfter: time.Millisecond}

type harness struct {
	t   *testing.T
	st  *store.Store
	ap  *storeApplier
	dir string
	reg *prometheus.Registry
}

func newHarness(t *testing.T) *harness {
	st := store.New()
	return &harness{t: t, st: st, ap: &storeApplier{st: st}, dir: t.TempDir()}
}

// start runs an agent over the harness's store and directory, with cfg's
// non-zero fields.
func (h *harness) start(tune func(*Config)) *Agent {
	h.t.Helper()
	h.reg = prometheus.NewRegistry()
	cfg := Config{Node: "n1", Address: "127.0.0.1", Dir: h.dir, Catalog: h.st, Apply: h.ap.apply,
		Barrier: func(context.Context) error { return nil }, Checks: fast, Registerer: h.reg,
		RetryMin: 5 * time.Millisecond, RetryMax: 50 * time.Millisecond, AntiEntropyInterval: time.Hour, ReapInterval: time.Hour}
	if tune != nil {
		tune(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	a.Start()
	h.t.Cleanup(a.Close)
	return a
}

func (h *harness) check(id string) *lodestonepb.Check {
	cs, _ := h.st.NodeChecks("n1")
	for _, c := range cs {
		if c.CheckId == id {
			return c
		}
	}
	return nil
}

func (h *harness) status(id string) lodestonepb.HealthStatus {
	if c := h.check(id); c != nil {
		return c.Status
	}
	return 0
}

func (h *harness) hasService(id string) bool {
	ns, _ := h.st.Node("n1")
	for _, s := range ns.GetServices() {
		if s.Id == id {
			return true
		}
	}
	return false
}

// runs is how many times the agent's checks have run.
func (h *harness) runs() float64 { return h.counter("lodestone_localagent_checks_run_total") }

// counter sums every series of a counter family.
func (h *harness) counter(name string) float64 {
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
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

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// steady waits for n more check runs and fails if the store applied
// anything meanwhile.
func (h *harness) steady(n float64) {
	h.t.Helper()
	before, runs := h.ap.entries(), h.runs()
	waitFor(h.t, "check runs", func() bool { return h.runs() >= runs+n })
	if got := h.ap.entries(); got != before {
		h.t.Fatalf("%d entries written while no status changed", got-before)
	}
}

func record(t *testing.T, svc *lodestonepb.Service, d checks.Definition, i, n int) *lodestonepb.Check {
	t.Helper()
	rec, err := d.Catalog("n1", svc, i, n)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

type origin struct {
	code atomic.Int32
	srv  *httptest.Server
}

func newOrigin(t *testing.T) *origin {
	o := &origin{}
	o.code.Store(200)
	o.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(int(o.code.Load())) }))
	t.Cleanup(o.srv.Close)
	return o
}

func TestTransitionsWriteOncePerChangeAndSurviveARestart(t *testing.T) {
	h := newHarness(t)
	o := newOrigin(t)
	svc := &lodestonepb.Service{Id: "web1", Name: "web", Port: 80}
	recs := []*lodestonepb.Check{
		record(t, svc, checks.Definition{HTTP: o.srv.URL, Interval: checks.Duration(10 * time.Millisecond)}, 0, 2),
		record(t, svc, checks.Definition{TTL: checks.Duration(time.Hour), Status: "passing"}, 1, 2),
	}
	a := h.start(nil)
	if err := a.AddService(context.Background(), svc, recs, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "first probe written", func() bool { return h.status("service:web1:1") == passing })
	h.steady(10)

	o.code.Store(500)
	before := h.ap.entries()
	waitFor(t, "critical", func() bool { return h.status("service:web1:1") == critical })
	h.steady(10)
	if got := h.ap.entries(); got != before+1 || h.check("service:web1:1").ModifyIndex != got {
		t.Fatalf("%d entries for one transition (check at index %d, store at %d)", got-before, h.check("service:web1:1").ModifyIndex, got)
	}

	// A restart: the checks come back from the file and take the
	// catalog's statuses, so the same results write nothing.
	a.Close()
	a = h.start(nil)
	h.steady(10)
	if st := h.status("service:web1:2"); st != passing {
		t.Fatalf("TTL check after the restart: %v", st)
	}
	o.code.Store(200)
	before = h.ap.entries()
	waitFor(t, "passing after the restart", func() bool { return h.status("service:web1:1") == passing })
	h.steady(10)
	if got := h.ap.entries(); got != before+1 {
		t.Fatalf("%d entries for one transition after a restart", got-before)
	}
	if _, _, ok := a.Service("web1"); !ok {
		t.Fatal("web1 not restored")
	}
}

func TestAntiEntropyRegistersWhatTheCatalogLost(t *testing.T) {
	h := newHarness(t)
	a := h.start(func(c *Config) { c.AntiEntropyInterval = 20 * time.Millisecond })
	svc := &lodestonepb.Service{Id: "db1", Name: "db"}
	if err := a.AddService(context.Background(), svc, []*lodestonepb.Check{record(t, svc, checks.Definition{TTL: checks.Duration(time.Hour)}, 0, 1)}, false); err != nil {
		t.Fatal(err)
	}
	if err := a.UpdateTTL(context.Background(), "service:db1", passing, "ok"); err != nil {
		t.Fatal(err)
	}
	if st := h.status("service:db1"); st != passing {
		t.Fatalf("a TTL report was not written before it returned: %v", st)
	}
	// An operator deregisters it behind the agent's back.
	if _, _, err := h.ap.apply(context.Background(), &lodestonepb.Command{Op: &lodestonepb.Command_CatalogDeregister{
		CatalogDeregister: &lodestonepb.CatalogDeregisterRequest{Node: "n1", ServiceId: "db1"}}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "db1 registered again, passing", func() bool { return h.hasService("db1") && h.status("service:db1") == passing })
	// The catalog agrees again: anti-entropy reads and writes nothing.
	before, passes := h.ap.entries(), h.counter("lodestone_localagent_anti_entropy_runs_total")
	waitFor(t, "five anti-entropy passes", func() bool {
		return h.counter("lodestone_localagent_anti_entropy_runs_total") >= passes+5
	})
	if got := h.ap.entries(); got != before {
		t.Fatalf("anti-entropy wrote %d entries while the catalog agreed", got-before)
	}
}

func TestReRegistrationKeepsStatusesAndReplaceRemovesChecks(t *testing.T) {
	h := newHarness(t)
	a := h.start(nil)
	ctx := context.Background()
	svc := &lodestonepb.Service{Id: "api1", Name: "api"}
	ttl := record(t, svc, checks.Definition{CheckID: "alive", TTL: checks.Duration(time.Hour)}, 0, 1)
	if err := a.AddService(ctx, svc, []*lodestonepb.Check{ttl}, false); err != nil {
		t.Fatal(err)
	}
	if err := a.UpdateTTL(ctx, "alive", passing, ""); err != nil {
		t.Fatal(err)
	}
	// The same registration again (tools re-register periodically): the
	// check keeps running with its status.
	svc2 := &lodestonepb.Service{Id: "api1", Name: "api", Port: 8080}
	if err := a.AddService(ctx, svc2, []*lodestonepb.Check{ttl}, false); err != nil {
		t.Fatal(err)
	}
	if st := h.status("alive"); st != passing {
		t.Fatalf("re-registration reset the check to %v", st)
	}
	// Without replace, a registration with another check keeps both;
	// with it, only the new one stays.
	other := record(t, svc, checks.Definition{CheckID: "other", TTL: checks.Duration(time.Hour)}, 0, 1)
	if err := a.AddService(ctx, svc2, []*lodestonepb.Check{other}, false); err != nil {
		t.Fatal(err)
	}
	if h.check("alive") == nil || h.check("other") == nil {
		t.Fatal("a registration without replace dropped a check")
	}
	if err := a.AddService(ctx, svc2, []*lodestonepb.Check{other}, true); err != nil {
		t.Fatal(err)
	}
	if h.check("alive") != nil || h.check("other") == nil {
		t.Fatal("replace-existing-checks kept the old check")
	}
	if err := a.UpdateTTL(ctx, "alive", passing, ""); !errors.Is(err, ErrUnknownCheck) {
		t.Fatalf("TTL report on a replaced check: %v", err)
	}
	// Refusals change nothing.
	before := h.ap.entries()
	bad := record(t, svc, checks.Definition{ScriptArgs: []string{"true"}, Interval: checks.Duration(time.Second)}, 0, 1)
	if err := a.AddService(ctx, svc2, []*lodestonepb.Check{bad}, false); !errors.Is(err, checks.ErrScriptsDisabled) {
		t.Fatalf("script check: %v", err)
	}
	if err := a.AddCheck(ctx, &lodestonepb.Check{CheckId: "x", Name: "x", ServiceId: "nope",
		Definition: &lodestonepb.CheckDefinition{Ttl: ttl.Definition.Ttl}}); !errors.Is(err, ErrUnknownService) {
		t.Fatalf("check of an unknown service: %v", err)
	}
	if err := a.RemoveService(ctx, "nope"); !errors.Is(err, ErrUnknownService) {
		t.Fatalf("removing an unknown service: %v", err)
	}
	if got := h.ap.entries(); got != before+1 { // NB: the failed deregistration is an entry
		t.Fatalf("refusals wrote %d entries", got-before)
	}
}

func TestServiceCriticalTooLongIsDeregistered(t *testing.T) {
	h := newHarness(t)
	a := h.start(func(c *Config) { c.ReapInterval = 10 * time.Millisecond })
	svc := &lodestonepb.Service{Id: "cache1", Name: "cache"}
	ttl, after := 50*time.Millisecond, 100*time.Millisecond
	rec := record(t, svc, checks.Definition{TTL: checks.Duration(ttl), Status: "passing",
		DeregisterCriticalServiceAfter: checks.Duration(after)}, 0, 1)
	start := time.Now()
	if err := a.AddService(context.Background(), svc, []*lodestonepb.Check{rec}, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "critical at its TTL", func() bool { return h.status("service:cache1") == critical })
	if took := time.Since(start); took < ttl {
		t.Fatalf("critical after %v, before its TTL %v", took, ttl)
	}
	waitFor(t, "deregistered", func() bool { return !h.hasService("cache1") })
	if took := time.Since(start); took < ttl+after {
		t.Fatalf("deregistered after %v, before TTL + deregister interval %v", took, ttl+after)
	}
	// The store applies the deregistration before RemoveService drops
	// its local record, so the catalog can be seen without it first.
	waitFor(t, "no longer a local service", func() bool {
		_, _, ok := a.Service("cache1")
		return !ok
	})
}

func TestMaintenance(t *testing.T) {
	h := newHarness(t)
	a := h.start(nil)
	ctx := context.Background()
	if err := a.SetNodeMaintenance(ctx, true, ""); err != nil {
		t.Fatal(err)
	}
	c := h.check(NodeMaintenanceID)
	if c == nil || c.Status != critical || c.Name != "Node Maintenance Mode" || !strings.HasPrefix(c.Notes, "Maintenance mode is enabled for this node") {
		t.Fatalf("node maintenance check: %+v", c)
	}
	before := h.ap.entries()
	if err := a.SetNodeMaintenance(ctx, true, "again"); err != nil || h.ap.entries() != before {
		t.Fatalf("enabling twice wrote something (%v)", err)
	}
	if err := a.SetServiceMaintenance(ctx, "nope", true, "x"); !errors.Is(err, ErrUnknownService) {
		t.Fatalf("unknown service: %v", err)
	}
	svc := &lodestonepb.Service{Id: "db/pg1", Name: "db"}
	if err := a.AddService(ctx, svc, nil, false); err != nil {
		t.Fatal(err)
	}
	if err := a.SetServiceMaintenance(ctx, "db/pg1", true, "upgrade"); err != nil {
		t.Fatal(err)
	}
	if c := h.check("_service_maintenance:db/pg1"); c == nil || c.ServiceId != "db/pg1" || c.Notes != "upgrade" || c.Status != critical {
		t.Fatalf("service maintenance check: %+v", c)
	}
	// Maintenance survives a restart (Consul persists it too).
	a.Close()
	a = h.start(nil)
	if err := a.SetServiceMaintenance(ctx, "db/pg1", false, ""); err != nil {
		t.Fatal(err)
	}
	if err := a.SetNodeMaintenance(ctx, false, ""); err != nil {
		t.Fatal(err)
	}
	if h.check("_service_maintenance:db/pg1") != nil || h.check(NodeMaintenanceID) != nil {
		t.Fatal("maintenance checks left behind")
	}
}

func TestDamagedFileIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	st := store.New()
	cfg := Config{Node: "n1", Dir: dir, Catalog: st, Apply: (&storeApplier{st: st}).apply, Barrier: func(context.Context) error { return nil }}
	for _, content := range []string{"{", `{"version": 9, "registrations": []}`, `{"version": 1, "registrations": [{}]}`} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("%q: %v, want an error naming %s", content, err, path)
		}
	}
}
