package gateway_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/buildinfo"
)

// slowOrigin holds every request until release is closed (or the request
// ends). waitInside blocks until at least n requests have entered it.
func slowOrigin(t *testing.T, release <-chan struct{}) (o *origin, waitInside func(n int), inside func() int) {
	var (
		mu      sync.Mutex
		entered int
		changed = make(chan struct{})
	)
	o = startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		entered++
		close(changed)
		changed = make(chan struct{})
		mu.Unlock()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		io.WriteString(w, "slow")
	}), false)
	inside = func() int {
		mu.Lock()
		defer mu.Unlock()
		return entered
	}
	waitInside = func(n int) {
		t.Helper()
		ctx := testCtx(t, 30*time.Second)
		for {
			mu.Lock()
			got, ch := entered, changed
			mu.Unlock()
			if got >= n {
				return
			}
			select {
			case <-ch:
			case <-ctx.Done():
				t.Fatalf("only %d of %d requests reached the slow origin", got, n)
			}
		}
	}
	return o, waitInside, inside
}

// TestOverloadShedsFast: past MaxInFlight a request waits at most
// MaxQueueTime and then gets 503 with Retry-After at once, instead of
// queueing behind slow origins until everything times out.
func TestOverloadShedsFast(t *testing.T) {
	const maxInFlight = 8
	release := make(chan struct{})
	o, waitInside, _ := slowOrigin(t, release)
	src := fakeWithRoute("slow")
	idx := src.PutInstance(o.instance("slow", "s1", nil))
	cfg := testConfig(t, src)
	cfg.MaxInFlight = maxInFlight
	cfg.MaxQueueTime = 50 * time.Millisecond
	cfg.ResponseHeaderTimeout = time.Minute
	g := startGateway(t, cfg)
	g.WaitIndex(testCtx(t, 10*time.Second), idx)
	c := httpClient(t)

	var wg sync.WaitGroup
	for range maxInFlight {
		wg.Go(func() {
			if resp, body := get(t, c, g, "x", "/hold"); resp.StatusCode != 200 || body != "slow" {
				t.Errorf("held request: %d %q", resp.StatusCode, body)
			}
		})
	}
	waitInside(maxInFlight) // the gateway is full: every slot is inside the slow origin

	for range 5 {
		start := time.Now()
		resp, _ := get(t, c, g, "x", "/extra")
		took := time.Since(start)
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("extra request: %d Retry-After=%q, want 503 with Retry-After 1", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		if took > 2*time.Second {
			t.Errorf("extra request shed after %v, want about MaxQueueTime (50ms)", took)
		}
	}
	close(release)
	wg.Wait()
	if st := g.Stats(); st.Shed != 5 {
		t.Errorf("shed = %d, want 5", st.Shed)
	}
}

// TestOriginConcurrencyLimit: an origin at its limit takes no more; the
// request is shed with 503 instead of piling onto it.
func TestOriginConcurrencyLimit(t *testing.T) {
	const limit = 3
	release := make(chan struct{})
	o, waitInside, inside := slowOrigin(t, release)
	src := fakeWithRoute("slow")
	idx := src.PutInstance(o.instance("slow", "s1", nil))
	cfg := testConfig(t, src)
	cfg.OriginConcurrency = limit
	cfg.ResponseHeaderTimeout = time.Minute
	g := startGateway(t, cfg)
	g.WaitIndex(testCtx(t, 10*time.Second), idx)
	c := httpClient(t)
	var wg sync.WaitGroup
	for range limit {
		wg.Go(func() { get(t, c, g, "x", "/hold") })
	}
	waitInside(limit)
	resp, body := get(t, c, g, "x", "/more")
	if resp.StatusCode != 503 || !strings.Contains(body, "origin_limit") {
		t.Errorf("request over the origin's limit: %d %q, want 503 origin_limit", resp.StatusCode, body)
	}
	if got := inside(); got != limit {
		t.Errorf("origin holds %d requests, want its limit %d", got, limit)
	}
	close(release)
	wg.Wait()
}

// TestAdminAnswersWhileSaturated: with the proxy saturated by slow origins
// (every admission slot and the queue taken), the admin listener still
// answers /healthz, /readyz, /metrics and /routes quickly: it has its own
// listener and goroutines and takes no lock the proxy takes (the Riot
// failure: health checks starved behind the worker pool).
func TestAdminAnswersWhileSaturated(t *testing.T) {
	const maxInFlight = 64
	release := make(chan struct{})
	o, waitInside, _ := slowOrigin(t, release)
	src := fakeWithRoute("slow")
	idx := src.PutInstance(o.instance("slow", "s1", nil))
	cfg := testConfig(t, src)
	cfg.MaxInFlight = maxInFlight
	cfg.MaxQueue = 64
	cfg.MaxQueueTime = 5 * time.Second // queued requests stay queued through the checks
	cfg.ResponseHeaderTimeout = time.Minute
	g := startGateway(t, cfg)
	g.WaitIndex(testCtx(t, 10*time.Second), idx)
	c := httpClient(t)

	var wg sync.WaitGroup
	for range maxInFlight + 32 { // 64 inside the origin, 32 queued
		wg.Go(func() { get(t, c, g, "x", "/hold") })
	}
	waitInside(maxInFlight)
	if st := g.Stats(); st.InFlight != maxInFlight {
		t.Fatalf("in flight = %d, want %d (saturated)", st.InFlight, maxInFlight)
	}

	admin := httpClient(t)
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/routes"} {
		for range 5 {
			start := time.Now()
			resp, err := admin.Get("http://" + g.AdminAddr() + path)
			if err != nil {
				t.Fatalf("admin %s: %v", path, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			took := time.Since(start)
			if resp.StatusCode != 200 {
				t.Errorf("admin %s: %d %s", path, resp.StatusCode, b)
			}
			// Generous for a loaded 2-core machine with -race; a starved
			// admin would wait for the slow origin (a minute).
			if took > 3*time.Second {
				t.Errorf("admin %s answered after %v while the proxy was saturated", path, took)
			}
			if path == "/metrics" && !strings.Contains(string(b), fmt.Sprintf("gateway_in_flight_requests %d", maxInFlight)) {
				t.Errorf("/metrics does not show %d requests in flight", maxInFlight)
			}
		}
	}
	close(release)
	wg.Wait()
}

// TestMetricsExported: every number the issue asks for is on /metrics,
// with its labels, after some traffic.
func TestMetricsExported(t *testing.T) {
	o := startOrigin(t, nameHandler("o"), false)
	g, src := gatewayTo(t, o, "o1")
	c := httpClient(t)
	for range 5 {
		get(t, c, g, "x", "/")
	}
	resp, err := c.Get("http://" + g.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m := readAll(t, resp)
	b := buildinfo.Get()
	for _, want := range []string{
		`gateway_requests_total{class="2xx",route="all"} 5`,
		`gateway_request_duration_seconds_count{route="all"} 5`,
		`gateway_origin_requests_total{class="2xx",origin="o1",service="svc"} 5`,
		`gateway_origin_request_duration_seconds_count{origin="o1",service="svc"} 5`,
		`gateway_origin_connections_open{service="svc"}`,
		`gateway_origin_connections_opened_total{service="svc"}`,
		`gateway_ejections_total{service="svc"} 0`,
		`gateway_shed_requests_total{reason="overload"} 0`,
		`gateway_table_staleness_seconds 0`,
		`gateway_registry_connected 1`,
		`gateway_origins{service="svc"} 1`,
		`gateway_subsets{service="svc"} 1`,
		`gateway_in_flight_requests 0`,
		`lodestone_build_info{commit="` + b.Commit + `",goversion="` + b.GoVersion + `",version="` + b.Version + `"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// A deregistered origin's series go away.
	g.WaitIndex(testCtx(t, 10*time.Second), src.DeleteInstance("svc", "o1"))
	resp, err = c.Get("http://" + g.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if m := readAll(t, resp); strings.Contains(m, `origin="o1"`) {
		t.Error("series of a deregistered origin are still exported")
	}
}
