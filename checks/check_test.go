package checks

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

func compile(t *testing.T, d Definition, opts Options) *Spec {
	t.Helper()
	s, err := Compile(record(t, d), opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fast allows sub-second intervals and deregistration for tests.
var fast = Options{EnableScriptChecks: true, MinInterval: time.Millisecond, MinDeregisterAfter: time.Millisecond}

func TestTTLStateWithAFakeClock(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := compile(t, Definition{TTL: Duration(10 * time.Second), DeregisterCriticalServiceAfter: Duration(30 * time.Second)}, fast)
	c := New(s, t0)
	if st, _ := c.Status(); st != critical || c.CriticalFor(t0.Add(time.Second)) != time.Second {
		t.Fatalf("a new check: %v, critical for %v", st, c.CriticalFor(t0.Add(time.Second)))
	}
	steps := []struct {
		name    string
		do      func() bool
		changed bool
		want    lodestonepb.HealthStatus
	}{
		{"report passing", func() bool { ch, _ := c.UpdateTTL(passing, "ok", t0.Add(5*time.Second)); return ch }, true, passing},
		{"same report", func() bool { ch, _ := c.UpdateTTL(passing, "ok again", t0.Add(6*time.Second)); return ch }, false, passing},
		{"before the deadline", func() bool { return c.ExpireTTL(t0.Add(15 * time.Second)) }, false, passing},
		{"at the deadline", func() bool { return c.ExpireTTL(t0.Add(16 * time.Second)) }, true, critical},
		{"expired once only", func() bool { return c.ExpireTTL(t0.Add(17 * time.Second)) }, false, critical},
	}
	for _, s := range steps {
		if got := s.do(); got != s.changed {
			t.Fatalf("%s: changed %v, want %v", s.name, got, s.changed)
		}
		if st, _ := c.Status(); st != s.want {
			t.Fatalf("%s: status %v, want %v", s.name, st, s.want)
		}
	}
	if _, out := c.Status(); out != "TTL expired (last output before timeout follows): ok again" {
		t.Fatalf("expired output %q", out)
	}
	if c.CriticalFor(t0.Add(46*time.Second)) != 30*time.Second || c.Reapable(t0.Add(46*time.Second)) {
		t.Fatal("reapable at exactly its deregister interval; Consul waits until it is passed")
	}
	if !c.Reapable(t0.Add(47 * time.Second)) {
		t.Fatal("not reapable 31s after going critical with a 30s deregister interval")
	}
	if ch, _ := c.UpdateTTL(warning, "", t0.Add(48*time.Second)); !ch || c.CriticalFor(t0.Add(50*time.Second)) != 0 || c.Reapable(t0.Add(99*time.Second)) {
		t.Fatal("a report out of critical must reset the critical time")
	}
	http := New(compile(t, Definition{HTTP: "http://x", Interval: Duration(time.Second)}, fast), t0)
	if _, err := http.UpdateTTL(passing, "", t0); err != ErrNotTTL {
		t.Fatalf("TTL report on an HTTP check: %v", err)
	}
}

// results collects a running check's results.
type results struct {
	mu  sync.Mutex
	all []Result
	c   chan struct{}
}

func newResults() *results { return &results{c: make(chan struct{}, 1000)} }

func (r *results) hook(_ *Check, res Result) {
	r.mu.Lock()
	r.all = append(r.all, res)
	r.mu.Unlock()
	r.c <- struct{}{}
}

// next waits for the next result.
func (r *results) next(t *testing.T) Result {
	t.Helper()
	select {
	case <-r.c:
	case <-time.After(10 * time.Second):
		t.Fatal("no result within 10s")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.all[len(r.all)-1]
}

// until waits for a result with status st.
func (r *results) until(t *testing.T, st lodestonepb.HealthStatus) Result {
	t.Helper()
	for {
		if res := r.next(t); res.Status == st {
			return res
		}
	}
}

func start(t *testing.T, s *Spec) (*Check, *results) {
	t.Helper()
	r := newResults()
	c := New(s, time.Now())
	c.Start(context.Background(), Hooks{Result: r.hook})
	t.Cleanup(c.Stop)
	return c, r
}

func TestHTTPProbeFollowsConsulsRules(t *testing.T) {
	var code atomic.Int32
	code.Store(200)
	var agent atomic.Value
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		agent.Store(r.Header.Get("User-Agent") + " " + r.Header.Get("X-Probe") + " " + r.Method)
		w.WriteHeader(int(code.Load()))
		w.Write([]byte("body"))
	}))
	defer origin.Close()
	s := compile(t, Definition{HTTP: origin.URL + "/health", Method: "HEAD", Header: map[string][]string{"X-Probe": {"1"}},
		Interval: Duration(20 * time.Millisecond)}, fast)
	_, r := start(t, s)
	if first := r.next(t); !first.First || first.Status != passing || !first.Changed {
		t.Fatalf("first result %+v, want a passing first probe that changed the critical start", first)
	}
	if got := agent.Load(); got != "Lodestone Health Check 1 HEAD" {
		t.Fatalf("request seen as %q", got)
	}
	if again := r.next(t); again.First || again.Changed {
		t.Fatalf("second probe %+v, want an unchanged result", again)
	}
	code.Store(429)
	if res := r.until(t, warning); !res.Changed || !strings.Contains(res.Output, "429 Too Many Requests") {
		t.Fatalf("429: %+v", res)
	}
	code.Store(503)
	r.until(t, critical)
	code.Store(204)
	r.until(t, passing)
	origin.Close()
	if res := r.until(t, critical); !strings.Contains(res.Output, "connect") {
		t.Fatalf("origin gone: %+v", res)
	}
}

func TestTCPProbe(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	})
	t.Cleanup(wg.Wait)
	_, r := start(t, compile(t, Definition{TCP: l.Addr().String(), Interval: Duration(20 * time.Millisecond)}, fast))
	if res := r.until(t, passing); !strings.HasSuffix(res.Output, "Success") {
		t.Fatalf("output %q", res.Output)
	}
	l.Close()
	r.until(t, critical)
}

func TestGRPCProbe(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	hs.SetServingStatus("db", healthpb.HealthCheckResponse_SERVING)
	var wg sync.WaitGroup
	wg.Go(func() { srv.Serve(l) })
	t.Cleanup(func() {
		srv.Stop()
		wg.Wait()
	})
	_, r := start(t, compile(t, Definition{GRPC: l.Addr().String() + "/db", Interval: Duration(20 * time.Millisecond)}, fast))
	if res := r.until(t, passing); !strings.HasSuffix(res.Output, ": success") {
		t.Fatalf("output %q", res.Output)
	}
	hs.SetServingStatus("db", healthpb.HealthCheckResponse_NOT_SERVING)
	if res := r.until(t, critical); !strings.Contains(res.Output, "NOT_SERVING") {
		t.Fatalf("output %q", res.Output)
	}
	hs.SetServingStatus("db", healthpb.HealthCheckResponse_SERVING)
	r.until(t, passing)
	// A service the server does not know is not serving.
	_, unknown := start(t, compile(t, Definition{GRPC: l.Addr().String() + "/nope", Interval: Duration(time.Hour)}, fast))
	if res := unknown.next(t); res.Status != critical {
		t.Fatalf("unknown service: %+v", res)
	}
	srv.Stop()
	r.until(t, critical)
}

func TestScriptProbe(t *testing.T) {
	every := Duration(time.Hour) // one run each: the first
	cases := []struct {
		args []string
		want lodestonepb.HealthStatus
		out  string
	}{
		{[]string{"sh", "-c", "echo fine"}, passing, "fine\n"},
		{[]string{"sh", "-c", "echo slow >&2; exit 1"}, warning, "slow\n"},
		{[]string{"sh", "-c", "exit 2"}, critical, ""},
		{[]string{"/no/such/binary"}, critical, "Failed to run check"},
	}
	for _, tc := range cases {
		_, r := start(t, compile(t, Definition{ScriptArgs: tc.args, Interval: every}, fast))
		if res := r.next(t); res.Status != tc.want || !strings.HasPrefix(res.Output, tc.out) {
			t.Fatalf("%v: %+v, want %v with output %q", tc.args, res, tc.want, tc.out)
		}
	}
	_, r := start(t, compile(t, Definition{ScriptArgs: []string{"sleep", "10"}, Interval: every, Timeout: Duration(50 * time.Millisecond)}, fast))
	if res := r.next(t); res.Status != critical || !strings.HasPrefix(res.Output, "Timed out (50ms)") {
		t.Fatalf("timeout: %+v", res)
	}
	_, r = start(t, compile(t, Definition{ScriptArgs: []string{"sh", "-c", "head -c 10000 /dev/zero | tr '\\0' x"}, Interval: every}, fast))
	if res := r.next(t); len(res.Output) > MaxOutput || !strings.HasPrefix(res.Output, "Captured 4032 of 10000 bytes\n...\nxxx") {
		t.Fatalf("long output: %d bytes, starts %q", len(res.Output), res.Output[:40])
	}
}

func TestTTLRunnerExpiresAtItsTTL(t *testing.T) {
	ttl := 150 * time.Millisecond
	c, r := start(t, compile(t, Definition{TTL: Duration(ttl), Status: "passing"}, fast))
	reported := time.Now()
	if _, err := c.UpdateTTL(passing, "alive", reported); err != nil {
		t.Fatal(err)
	}
	res := r.next(t)
	if took := time.Since(reported); res.Status != critical || took < ttl {
		t.Fatalf("%+v after %v, want critical no sooner than %v", res, took, ttl)
	}
	// Expired: nothing more until a report re-arms it.
	if changed, _ := c.UpdateTTL(passing, "back", time.Now()); !changed {
		t.Fatal("report after expiry did not change the status")
	}
	if res := r.next(t); res.Status != critical {
		t.Fatalf("re-armed TTL: %+v", res)
	}
	c.Stop()
	c.Stop() // twice is harmless
}
