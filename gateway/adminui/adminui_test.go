package adminui

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

type fakeSource struct {
	snap  Snapshot
	token string
	reg   *prometheus.Registry
}

func (f *fakeSource) Snapshot() Snapshot                                   { return f.snap }
func (f *fakeSource) Changed() <-chan struct{}                             { return make(chan struct{}) }
func (f *fakeSource) Metrics(context.Context) ([]*dto.MetricFamily, error) { return f.reg.Gather() }
func (f *fakeSource) TokenRequired() bool                                  { return f.token != "" }
func (f *fakeSource) CheckToken(s string) bool                             { return s == f.token }

func start(t *testing.T, src *fakeSource) (*http.Client, string) {
	u, err := New(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	u.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Timeout: 10 * time.Second}, srv.URL
}

func fetch(t *testing.T, c *http.Client, req func() (*http.Response, error)) (int, string) {
	t.Helper()
	resp, err := req()
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestPageShowsOriginsEjectionAndStaleness(t *testing.T) {
	reg := prometheus.NewRegistry()
	shed := prometheus.NewCounterVec(prometheus.CounterOpts{Name: mShed}, []string{"reason"})
	shed.WithLabelValues("overload").Add(7)
	reg.MustRegister(shed)
	src := &fakeSource{reg: reg, snap: Snapshot{Index: 42, Connected: false, Staleness: 95 * time.Second, Shards: 16,
		Routes: []Route{{Name: "web", PathPrefix: "/", Service: "web", From: "registry"}},
		Services: []Service{{Name: "web", Subsets: 2, Replication: 8, Origins: []Origin{
			{ID: "web-1", Addr: "10.0.0.1:80", Protocol: "http", Subset: 0, InFlight: 3},
			{ID: "web-2", Addr: "10.0.0.2:80", Protocol: "http", Subset: 1, EjectedUntil: time.Now().Add(time.Minute)},
		}}}}}
	c, base := start(t, src)
	code, body := fetch(t, c, func() (*http.Response, error) { return c.Get(base + "/ui/") })
	if code != 200 {
		t.Fatalf("%d\n%s", code, body)
	}
	for _, want := range []string{`id="feed-stale"`, "Cut off from the registry for 1m35s", `data-route="web"`,
		`data-origin="web-1"`, "in rotation", `data-origin="web-2"`, "ejected", "2 subsets, each held by 8 of 16 shards", "overload"} {
		if !strings.Contains(body, want) {
			t.Fatalf("page lacks %q:\n%s", want, body)
		}
	}
}

func TestAdminTokenGuardsTheUI(t *testing.T) {
	src := &fakeSource{reg: prometheus.NewRegistry(), token: "s3cret"}
	c, base := start(t, src)
	code, body := fetch(t, c, func() (*http.Response, error) { return c.Get(base + "/ui/") })
	if code != 200 || !strings.Contains(body, "Admin token") || strings.Contains(body, "Registry feed") {
		t.Fatalf("without the token: %d\n%s", code, body)
	}
	csrf := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(body)[1]
	code, _ = fetch(t, c, func() (*http.Response, error) {
		return c.PostForm(base+"/ui/login", url.Values{"csrf": {csrf}, "token": {"wrong"}})
	})
	if code != http.StatusForbidden {
		t.Fatalf("a wrong token: %d, want 403", code)
	}
	code, body = fetch(t, c, func() (*http.Response, error) {
		return c.PostForm(base+"/ui/login", url.Values{"csrf": {csrf}, "token": {"s3cret"}})
	})
	if code != 200 || !strings.Contains(body, "Registry feed") {
		t.Fatalf("with the token: %d\n%s", code, body)
	}
	resp, err := http.Get(base + "/ui/events")
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4096)
	n, _ := io.ReadAtLeast(resp.Body, b, 1)
	for !strings.Contains(string(b[:n]), "event: stop") && n < len(b) {
		m, err := resp.Body.Read(b[n:])
		n += m // NB: the last bytes may come with io.EOF
		if err != nil {
			break
		}
	}
	resp.Body.Close()
	if !strings.Contains(string(b[:n]), "event: stop") {
		t.Fatalf("the stream without the token: %q", b[:n])
	}
}
