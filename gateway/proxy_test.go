package gateway_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/gateway"
	"github.com/lodestone-kv/lodestone/gateway/gatewaytest"
)

// TestRoutesByHostAndPath: file routes and registry routes, host and
// prefix matching, strip_prefix, X-Forwarded-For, 404 and 503.
func TestRoutesByHostAndPath(t *testing.T) {
	web := startOrigin(t, nameHandler("web"), false)
	api := startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Seen-For", r.Header.Get("X-Forwarded-For"))
		w.Header().Set("X-Seen-Host", r.Host)
		nameHandler("api").ServeHTTP(w, r)
	}), false)

	dir := t.TempDir()
	file := filepath.Join(dir, "routes.json")
	os.WriteFile(file, []byte(`{"routes": [{"name": "web", "path_prefix": "/", "service": "web"}]}`), 0o644)

	src := gatewaytest.NewSource()
	src.PutInstance(web.instance("web", "w1", nil))
	src.PutInstance(api.instance("api", "a1", nil))
	src.PutRoute(gateway.Route{Name: "api", Host: "api.example.com", PathPrefix: "/v1/", Service: "api", StripPrefix: true})
	idx := src.PutRoute(gateway.Route{Name: "ghost", PathPrefix: "/ghost", Service: "nobody"})
	cfg := testConfig(t, src)
	cfg.RoutesFile = file
	g := startGateway(t, cfg)
	if err := g.WaitIndex(testCtx(t, 10*time.Second), idx); err != nil {
		t.Fatal(err)
	}
	c := httpClient(t)

	for _, tc := range []struct {
		host, path string
		status     int
		body       string
	}{
		{"example.com", "/hello", 200, "web /hello"},
		{"api.example.com", "/v1/users", 200, "api /users"},
		{"API.EXAMPLE.COM:8080", "/v1/", 200, "api /"},
		{"api.example.com", "/v2/users", 200, "web /v2/users"},
		{"example.com", "/ghost/x", 503, ""},
	} {
		resp, body := get(t, c, g, tc.host, tc.path)
		if resp.StatusCode != tc.status || (tc.body != "" && body != tc.body) {
			t.Errorf("%s%s = %d %q, want %d %q", tc.host, tc.path, resp.StatusCode, body, tc.status, tc.body)
		}
		if tc.status == 503 && resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s%s: 503 without Retry-After", tc.host, tc.path)
		}
		if strings.HasPrefix(body, "api") {
			if got := resp.Header.Get("X-Seen-For"); got != "127.0.0.1" {
				t.Errorf("origin saw X-Forwarded-For %q, want 127.0.0.1", got)
			}
			if got := resp.Header.Get("X-Seen-Host"); !strings.EqualFold(got, tc.host) {
				t.Errorf("origin saw Host %q, want the client's %q", got, tc.host)
			}
		}
	}

	// Once the ghost route is gone its prefix falls through to "/".
	g.WaitIndex(testCtx(t, 10*time.Second), src.DeleteRoute("ghost"))
	if _, body := get(t, c, g, "example.com", "/ghost/x"); body != "web /ghost/x" {
		t.Errorf("after deleting the ghost route: %q, want web", body)
	}
}

// TestRouteChangeNeedsNoRestart: a route written to the registry moves
// traffic at once; deleting it falls back to the next route, then 404.
func TestRouteChangeNeedsNoRestart(t *testing.T) {
	a := startOrigin(t, nameHandler("a"), false)
	b := startOrigin(t, nameHandler("b"), false)
	src := gatewaytest.NewSource()
	src.PutInstance(a.instance("a", "a1", nil))
	idx := src.PutInstance(b.instance("b", "b1", nil))
	g := startGateway(t, testConfig(t, src))
	c := httpClient(t)
	ctx := testCtx(t, 10*time.Second)
	g.WaitIndex(ctx, idx)

	if resp, _ := get(t, c, g, "x", "/p"); resp.StatusCode != 404 {
		t.Fatalf("no route: status %d, want 404", resp.StatusCode)
	}
	g.WaitIndex(ctx, src.PutRoute(gateway.Route{Name: "r", PathPrefix: "/", Service: "a"}))
	if _, body := get(t, c, g, "x", "/p"); body != "a /p" {
		t.Fatalf("body %q, want a", body)
	}
	g.WaitIndex(ctx, src.PutRoute(gateway.Route{Name: "r", PathPrefix: "/", Service: "b"}))
	if _, body := get(t, c, g, "x", "/p"); body != "b /p" {
		t.Fatalf("after the route moved: body %q, want b", body)
	}
	g.WaitIndex(ctx, src.DeleteRoute("r"))
	if resp, _ := get(t, c, g, "x", "/p"); resp.StatusCode != 404 {
		t.Fatalf("after the route was deleted: status %d, want 404", resp.StatusCode)
	}
}

// TestTimeoutsPerAttempt: connect, response-header and idle timeouts are
// enforced on every attempt, against an address that never accepts, a
// listener that never answers and origins that answer slowly (the Riot
// failure: a configured connect timeout silently not applied).
func TestTimeoutsPerAttempt(t *testing.T) {
	const (
		connect = 200 * time.Millisecond
		header  = 300 * time.Millisecond
		idle    = 300 * time.Millisecond
	)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	slowHeader := startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}), false)
	stallBody := startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10")
		w.Write([]byte("12345"))
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}), false)
	// Slow but steady: 10 chunks 100ms apart (1s in all, more than idle).
	trickle := startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := range 10 {
			if i > 0 {
				time.Sleep(100 * time.Millisecond) // the origin's pace, not a test wait
			}
			w.Write([]byte{'0' + byte(i)})
			w.(http.Flusher).Flush()
		}
	}), false)
	bhHost, bhPort := blackhole(t)
	silentHost, silentPort := silentListener(t)

	src := gatewaytest.NewSource()
	src.PutInstance(gateway.Instance{Service: "blackhole", ID: "b", Address: bhHost, Port: bhPort, Healthy: true})
	src.PutInstance(gateway.Instance{Service: "silent", ID: "s", Address: silentHost, Port: silentPort, Healthy: true})
	src.PutInstance(slowHeader.instance("slowheader", "h", nil))
	src.PutInstance(stallBody.instance("stall", "st", nil))
	src.PutInstance(trickle.instance("trickle", "tr", nil))
	var idx uint64
	for _, s := range []string{"blackhole", "silent", "slowheader", "stall", "trickle"} {
		idx = src.PutRoute(gateway.Route{Name: s, PathPrefix: "/" + s, Service: s})
	}
	cfg := testConfig(t, src)
	cfg.ConnectTimeout, cfg.ResponseHeaderTimeout, cfg.IdleTimeout = connect, header, idle
	cfg.MaxRetries = 0 // one attempt each: the timing below is per attempt
	g := startGateway(t, cfg)
	g.WaitIndex(testCtx(t, 10*time.Second), idx)
	c := httpClient(t)

	for _, tc := range []struct {
		path     string
		status   int
		min, max time.Duration
	}{
		// Upper bounds are loose for a loaded machine; a timeout that was
		// not applied would take minutes (TCP SYN retries) or forever.
		{"/blackhole", 502, connect, connect + 2*time.Second},
		{"/silent", 504, header, header + 2*time.Second},
		{"/slowheader", 504, header, header + 2*time.Second},
	} {
		start := time.Now()
		resp, _ := get(t, c, g, "x", tc.path)
		took := time.Since(start)
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d, want %d", tc.path, resp.StatusCode, tc.status)
		}
		if took < tc.min || took > tc.max {
			t.Errorf("%s: answered after %v, want within [%v, %v]", tc.path, took, tc.min, tc.max)
		}
	}

	// A body that stalls past the idle timeout is cut off: the client gets
	// an error (a truncated body, or no response if nothing was flushed
	// yet; Go's client then retries the GET once) after about the idle
	// timeout, never a hang.
	start := time.Now()
	req, _ := http.NewRequest("GET", "http://"+g.Addr()+"/stall", nil)
	resp, err := c.Do(req)
	if err == nil {
		buf := make([]byte, 100)
		var n int
		n, err = readFull(resp.Body, buf)
		resp.Body.Close()
		if err == nil || n > 5 {
			t.Errorf("stalled body: read %d bytes, err %v; want at most 5 bytes, then an error", n, err)
		}
	}
	if took := time.Since(start); took < idle || took > 2*idle+2*time.Second {
		t.Errorf("stalled body cut after %v (err %v), want about the idle timeout %v (at most twice: one client retry)", took, err, idle)
	}

	// A slow but steady body is not cut: idle is between reads, not total.
	start = time.Now()
	resp2, body := get(t, c, g, "x", "/trickle")
	if resp2.StatusCode != 200 || body != "0123456789" {
		t.Errorf("trickle: %d %q, want 200 0123456789", resp2.StatusCode, body)
	}
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Errorf("trickle took %v; the origin's pacing did not apply", took)
	}
}

// TestHeaderTimeoutOnReusedConnection: the response-header timeout holds
// in full for an attempt on a pooled connection that has just served
// another request (fast-path connections keep a deadline across requests
// when it still suits: never one that ends the attempt early).
func TestHeaderTimeoutOnReusedConnection(t *testing.T) {
	const header = 300 * time.Millisecond
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	o := startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stall" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		io.WriteString(w, "quick")
	}), false)
	src := fakeWithRoute("svc")
	idx := src.PutInstance(o.instance("svc", "o", nil))
	cfg := testConfig(t, src)
	cfg.Shards, cfg.Replication = 1, 1
	cfg.ResponseHeaderTimeout = header
	cfg.MaxRetries = 0 // one attempt: the timing below is that attempt's
	g := startGateway(t, cfg)
	g.WaitIndex(testCtx(t, 10*time.Second), idx)
	c := httpClient(t)
	for i := range 5 {
		if resp, body := get(t, c, g, "x", "/quick"); resp.StatusCode != 200 || body != "quick" {
			t.Fatalf("quick request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	start := time.Now()
	resp, _ := get(t, c, g, "x", "/stall")
	took := time.Since(start)
	if resp.StatusCode != 504 {
		t.Errorf("stalled request: status %d, want 504", resp.StatusCode)
	}
	if took < header || took > header+2*time.Second {
		t.Errorf("stalled request answered after %v, want within [%v, %v]", took, header, header+2*time.Second)
	}
	if got := o.conns.Load(); got != 1 {
		t.Errorf("origin connections = %d, want 1 (the stalled attempt reused the quick ones' connection)", got)
	}
}

func readFull(r interface{ Read([]byte) (int, error) }, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// TestRetriesAndEjection: idempotent requests that hit a failing origin
// are retried on another; the failing origin is ejected after a run of
// failures and gets no more traffic; a POST with a body is never retried.
func TestRetriesAndEjection(t *testing.T) {
	bad := startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}), false)
	good1 := startOrigin(t, nameHandler("good"), false)
	good2 := startOrigin(t, nameHandler("good"), false)
	bhHost, bhPort := blackhole(t)
	src := fakeWithRoute("svc")
	src.PutInstance(bad.instance("svc", "bad", nil))
	src.PutInstance(good1.instance("svc", "g1", nil))
	src.PutInstance(good2.instance("svc", "g2", nil))
	idx := src.PutInstance(gateway.Instance{Service: "svc", ID: "hole", Address: bhHost, Port: bhPort, Healthy: true})
	clk := gatewaytest.NewClock(time.Unix(1000, 0))
	cfg := testConfig(t, src)
	cfg.Clock = clk
	cfg.Shards, cfg.Replication = 1, 1
	cfg.Outlier.Consecutive = 3
	cfg.Outlier.MaxEjectedPercent = 50
	g := startGateway(t, cfg)
	g.WaitIndex(testCtx(t, 10*time.Second), idx)
	c := httpClient(t)

	for i := range 40 {
		resp, body := get(t, c, g, "x", "/r")
		if resp.StatusCode != 200 || body != "good /r" {
			t.Fatalf("request %d: %d %q, want 200 from a good origin (retried)", i, resp.StatusCode, body)
		}
	}
	st := g.Stats()
	if st.Ejections != 2 {
		t.Errorf("ejections = %d, want 2 (the 503 origin and the blackhole)", st.Ejections)
	}
	if st.Retries == 0 {
		t.Error("no retries counted")
	}
	badBefore := bad.reqs.Load()
	for range 20 {
		get(t, c, g, "x", "/r")
	}
	if got := bad.reqs.Load() - badBefore; got != 0 {
		t.Errorf("ejected origin got %d requests", got)
	}

	// After the ejection time the bad origin is tried again.
	clk.Advance(cfg.Outlier.BaseEjection + time.Second)
	for range 20 {
		get(t, c, g, "x", "/r")
	}
	if bad.reqs.Load() == badBefore {
		t.Error("the ejection never ended")
	}

	// POST with a body: never retried, so the bad origin's 503 can reach
	// the client (sooner or later P2C sends one there).
	saw503 := false
	for range 200 {
		clk.Advance(time.Hour) // keep everyone un-ejected
		resp, err := c.Post("http://"+g.Addr()+"/r", "text/plain", strings.NewReader("body"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 503 {
			saw503 = true
			break
		}
	}
	if !saw503 {
		t.Error("a POST with a body was retried (or never reached the failing origin)")
	}
}

// TestHeadersSameOnBothPaths: the HTTP/1.1 fast path (a GET) and the
// Transport path (a POST with a body) forward the same headers: end-to-end
// ones kept, hop-by-hop ones and those named in Connection dropped,
// X-Forwarded-* appended, "Te: trailers" kept (the same answer two ways).
func TestHeadersSameOnBothPaths(t *testing.T) {
	o := startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		h := r.Header.Clone()
		h.Del("Content-Length")
		h.Set("Host", r.Host)
		h.Set("X-Path", r.URL.RequestURI())
		json.NewEncoder(w).Encode(h)
	}), false)
	g, _ := gatewayTo(t, o, "o")
	c := httpClient(t)
	seen := map[string]http.Header{}
	for _, method := range []string{"GET", "POST"} {
		var body io.Reader
		if method == "POST" {
			body = strings.NewReader("payload")
		}
		req, _ := http.NewRequest(method, "http://"+g.Addr()+"/p/a%2Fb?q=1", body)
		req.Host = "site.example"
		req.Header.Set("Connection", "keep-alive, X-Drop")
		req.Header.Set("X-Drop", "1")
		req.Header.Set("Keep-Alive", "timeout=5")
		req.Header.Set("Proxy-Authorization", "secret")
		req.Header.Set("X-Keep", "1")
		req.Header.Set("Te", "trailers")
		req.Header.Set("X-Forwarded-For", "1.2.3.4")
		req.Header.Set("User-Agent", "test-agent")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var h http.Header
		if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		seen[method] = h
	}
	for method, h := range seen {
		for _, k := range []string{"X-Drop", "Keep-Alive", "Proxy-Authorization", "Connection"} {
			if v := h.Get(k); v != "" {
				t.Errorf("%s: origin got hop-by-hop %s: %q", method, k, v)
			}
		}
		for k, want := range map[string]string{
			"X-Keep": "1", "Te": "trailers", "X-Forwarded-For": "1.2.3.4, 127.0.0.1", "X-Forwarded-Proto": "http",
			"X-Forwarded-Host": "site.example", "Host": "site.example", "User-Agent": "test-agent", "X-Path": "/p/a%2Fb?q=1",
		} {
			if got := h.Get(k); got != want {
				t.Errorf("%s: origin got %s %q, want %q", method, k, got, want)
			}
		}
	}
	get, post := seen["GET"], seen["POST"]
	post.Del("Content-Type")
	if len(get) != len(post) {
		t.Errorf("fast path forwarded %v, Transport path %v", get, post)
	}
}

// TestResponseHeadersSameOnBothPaths: a response's header reaches the
// client the same through the HTTP/1.1 fast path (a GET on a client
// connection of the fast path, whose plain answers are rendered from
// their fields) and through the Transport path (a POST with a body):
// end-to-end fields kept with every value, hop-by-hop ones and those
// named in Connection dropped, a missing Content-Type sniffed.
func TestResponseHeadersSameOnBothPaths(t *testing.T) {
	o := startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		h := w.Header()
		h["Content-Type"] = nil // NB: no sniffing at the origin
		h.Add("Set-Cookie", "a=1")
		h.Add("Set-Cookie", "b=2")
		h.Set("X-End", "kept")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("Proxy-Authenticate", "Basic")
		if r.URL.Query().Get("conn") != "" {
			h.Set("Connection", "X-Drop")
			h.Set("X-Drop", "1")
		}
		io.WriteString(w, "<html><body>hi</body></html>")
	}), false)
	g, _ := gatewayTo(t, o, "o")
	c := httpClient(t)
	for _, query := range []string{"", "?conn=1"} {
		seen := map[string]http.Header{}
		for _, method := range []string{"GET", "POST"} {
			var body io.Reader
			if method == "POST" {
				body = strings.NewReader("payload")
			}
			req, _ := http.NewRequest(method, "http://"+g.Addr()+"/r"+query, body)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if b := readAll(t, resp); b != "<html><body>hi</body></html>" {
				t.Fatalf("%s %s: body %q", method, query, b)
			}
			h := resp.Header
			for _, k := range []string{"Keep-Alive", "Proxy-Authenticate", "X-Drop"} {
				if v := h.Get(k); v != "" {
					t.Errorf("%s %s: client got hop-by-hop %s: %q", method, query, k, v)
				}
			}
			if got := h["Set-Cookie"]; len(got) != 2 || got[0] != "a=1" || got[1] != "b=2" {
				t.Errorf("%s %s: Set-Cookie %q, want [a=1 b=2]", method, query, got)
			}
			if got := h.Get("X-End"); got != "kept" {
				t.Errorf("%s %s: X-End %q, want kept", method, query, got)
			}
			if got := h.Get("Content-Type"); got != "text/html; charset=utf-8" {
				t.Errorf("%s %s: Content-Type %q, want the sniffed text/html; charset=utf-8", method, query, got)
			}
			if h.Get("Date") == "" || h.Get("Content-Length") != "28" {
				t.Errorf("%s %s: Date %q, Content-Length %q", method, query, h.Get("Date"), h.Get("Content-Length"))
			}
			seen[method] = h
		}
		if get, post := seen["GET"], seen["POST"]; len(get) != len(post) {
			t.Errorf("%s: fast path answered %v, Transport path %v", query, get, post)
		}
	}
}
