package ui

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// browser is an HTTP client with a cookie jar against one UI.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func serve(t *testing.T, f *fake) *browser {
	u, err := New(f, Config{})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	u.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: srv.URL, c: &http.Client{Jar: jar, Timeout: 10 * time.Second}}
}

func (b *browser) get(path string) (int, string) {
	b.t.Helper()
	resp, err := b.c.Get(b.base + path)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// post sends a form with the CSRF token of the page at from.
func (b *browser) post(from, path string, form url.Values) (int, string) {
	b.t.Helper()
	_, page := b.get(from)
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		b.t.Fatalf("no CSRF token on %s", from)
	}
	form.Set("csrf", m[1])
	resp, err := b.c.PostForm(b.base+path, form)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func mustContain(t *testing.T, what, body string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(body, w) {
			t.Fatalf("%s lacks %q:\n%s", what, w, body)
		}
	}
}

func TestEveryPageRendersItsData(t *testing.T) {
	f := newFake(t)
	f.put("app/greeting", "hello")
	f.put("app/db/url", "postgres://db")
	f.apply(&lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: &lodestonepb.CatalogRegisterRequest{
		Node:    &lodestonepb.Node{Name: "web-1", Address: "10.0.0.5"},
		Service: &lodestonepb.Service{Id: "web-1", Name: "web", Port: 80, Tags: []string{"v2"}},
		Checks:  []*lodestonepb.Check{{CheckId: "alive", Name: "alive", Status: lodestonepb.HealthStatus_HEALTH_CRITICAL, Output: "connection refused", ServiceId: "web-1"}},
	}}})
	commit := prometheus.NewHistogram(prometheus.HistogramOpts{Name: mCommitLatency, Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)})
	commit.Observe(0.004)
	term := prometheus.NewGauge(prometheus.GaugeOpts{Name: mTerm})
	term.Set(3)
	f.reg.MustRegister(commit, term)
	b := serve(t, f)
	for _, c := range []struct {
		path  string
		wants []string
	}{
		{"/ui/cluster", []string{`data-member="n1"`, "this member", "Admission control", `data-stream="/ui/events/cluster"`}},
		{"/ui/raftlog", []string{`data-member="n1"`, "rotation threshold"}},
		{"/ui/watches", []string{`data-member="n1"`, "Watchers per shard"}},
		{"/ui/services", []string{`data-service="web"`, "1 critical", `data-node="web-1"`}},
		{"/ui/services?tag=v2", []string{`data-service="web"`}},
		{"/ui/services/web", []string{`data-instance="web-1"`, "connection refused"}},
		{"/ui/nodes/web-1", []string{`data-check="alive"`, "connection refused"}},
		{"/ui/kv?prefix=app/", []string{`data-key="app/greeting"`, `data-key="app/db/"`, "1 keys"}},
		{"/ui/kv/edit?key=app/greeting", []string{"hello", `id="kv-modify"`}},
		{"/ui/sessions", []string{"0 sessions"}},
	} {
		code, body := b.get(c.path)
		if code != http.StatusOK {
			t.Fatalf("%s: %d\n%s", c.path, code, body)
		}
		mustContain(t, c.path, body, c.wants...)
	}
	if code, body := b.get("/ui/services?tag=nope"); code != 200 || strings.Contains(body, `data-service="web"`) {
		t.Fatalf("tag filter kept a service without the tag: %d", code)
	}
	if code, body := b.get("/ui/services?state=passing"); code != 200 || strings.Contains(body, `data-service="web"`) {
		t.Fatalf("state filter kept a service with no passing instance: %d", code)
	}
	if code, body := b.get("/ui/services?state=bogus"); code != http.StatusBadRequest || !strings.Contains(body, "use passing, warning or critical") {
		t.Fatalf("a bad state: %d %s", code, body)
	}
	if code, _ := b.get("/ui/nodes/nope"); code != http.StatusNotFound {
		t.Fatalf("an unknown node: %d, want 404", code)
	}
}

func TestSecurityHeadersAndNoInlineScript(t *testing.T) {
	b := serve(t, newFake(t))
	resp, err := b.c.Get(b.base + "/ui/cluster")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
		t.Fatalf("CSP %q", csp)
	}
	if resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Fatal("no X-Frame-Options DENY")
	}
	if regexp.MustCompile(`<script>|<script [^>]*>[^<]`).Match(body) || strings.Contains(string(body), "style=") || strings.Contains(string(body), " on") && regexp.MustCompile(` on[a-z]+=`).Match(body) {
		t.Fatalf("inline script, style or handler in the page:\n%s", body)
	}
	if code, js := b.get("/ui/static/live.js"); code != 200 || !strings.Contains(js, "EventSource") {
		t.Fatalf("live.js: %d", code)
	}
}

func TestKVEditWithCASRefusesAStaleEdit(t *testing.T) {
	f := newFake(t)
	idx := f.put("app/config", "v1")
	b := serve(t, f)
	edit := "/ui/kv/edit?key=app/config"
	// An edit from the page as loaded succeeds.
	code, body := b.post(edit, "/ui/kv/put", url.Values{"key": {"app/config"}, "value": {"v2\r\nline2"}, "cas": {strconv.FormatUint(idx, 10)}})
	if code != http.StatusOK || !strings.Contains(body, "Saved at index") {
		t.Fatalf("edit: %d\n%s", code, body)
	}
	kv, _ := f.st.Get([]byte("app/config"))
	if string(kv.Value) != "v2\nline2" {
		t.Fatalf("stored %q, want the textarea's CRLF as LF", kv.Value)
	}
	// A second edit still carrying the first index is refused and changes nothing.
	code, body = b.post(edit, "/ui/kv/put", url.Values{"key": {"app/config"}, "value": {"stale"}, "cas": {strconv.FormatUint(idx, 10)}})
	if code != http.StatusConflict {
		t.Fatalf("stale edit: %d, want 409\n%s", code, body)
	}
	mustContain(t, "stale edit", body, "Not saved", "changed since you loaded it", "stale")
	if kv, _ := f.st.Get([]byte("app/config")); string(kv.Value) != "v2\nline2" {
		t.Fatalf("a refused edit wrote %q", kv.Value)
	}
	// Create refuses a key that exists (cas 0).
	if code, _ := b.post(edit, "/ui/kv/put", url.Values{"key": {"app/config"}, "value": {"x"}, "cas": {"0"}}); code != http.StatusConflict {
		t.Fatalf("create over an existing key: %d, want 409", code)
	}
	// Delete with the current index.
	cur, _ := f.st.Get([]byte("app/config"))
	code, body = b.post(edit, "/ui/kv/delete", url.Values{"key": {"app/config"}, "cas": {strconv.FormatUint(cur.ModifyIndex, 10)}})
	if code != http.StatusOK || !strings.Contains(body, `Deleted &#34;app/config&#34;`) {
		t.Fatalf("delete: %d\n%s", code, body)
	}
	if kv, _ := f.st.Get([]byte("app/config")); kv != nil {
		t.Fatal("not deleted")
	}
	if code, body := b.post(edit, "/ui/kv/put", url.Values{"key": {""}, "value": {"x"}, "cas": {"0"}}); code != http.StatusBadRequest || !strings.Contains(body, "the key is empty") {
		t.Fatalf("empty key: %d %s", code, body)
	}
}

func TestFormsWithoutTheCSRFTokenAreRefused(t *testing.T) {
	f := newFake(t)
	f.put("app/config", "v1")
	b := serve(t, f)
	b.get("/ui/kv") // a session cookie, but no token in the form
	resp, err := b.c.PostForm(b.base+"/ui/kv/put", url.Values{"key": {"app/config"}, "value": {"evil"}, "cas": {"0"}})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "CSRF") {
		t.Fatalf("no token: %d %s", resp.StatusCode, body)
	}
	if f.writes != 0 {
		t.Fatalf("%d writes from a form without its token", f.writes)
	}
}

func TestRestrictedTokenSeesOnlyItsKeys(t *testing.T) {
	f := newFake(t)
	f.aclOn = true
	f.token(t, "app-secret", `key_prefix "app/" { policy = "write" }`)
	f.put("app/mine", "1")
	f.put("ops/secret", "2")
	b := serve(t, f)
	// Without a login every page goes to the login form.
	code, body := b.get("/ui/kv")
	if code != 200 || !strings.Contains(body, "Token secret") {
		t.Fatalf("no login: %d\n%s", code, body)
	}
	if code, body := b.post("/ui/login", "/ui/login", url.Values{"token": {"wrong"}, "next": {"/ui/kv"}}); code != http.StatusForbidden || !strings.Contains(body, "ACL not found") {
		t.Fatalf("a token nobody issued: %d %s", code, body)
	}
	if code, _ := b.post("/ui/login", "/ui/login", url.Values{"token": {"app-secret"}, "next": {"/ui/kv"}}); code != 200 {
		t.Fatalf("login: %d", code)
	}
	_, body = b.get("/ui/kv")
	mustContain(t, "restricted /ui/kv", body, `data-key="app/"`, "token acc-app-")
	if strings.Contains(body, "ops/") {
		t.Fatalf("a restricted token sees ops/:\n%s", body)
	}
	if code, body := b.get("/ui/kv/edit?key=ops/secret"); code != http.StatusForbidden || strings.Contains(body, ">2<") {
		t.Fatalf("reading ops/secret: %d\n%s", code, body)
	}
	code, body = b.post("/ui/kv/edit?key=app/mine", "/ui/kv/put", url.Values{"key": {"ops/new"}, "value": {"x"}, "cas": {"0"}})
	if code != http.StatusForbidden || !strings.Contains(body, "Permission denied") {
		t.Fatalf("write outside its prefix: %d\n%s", code, body)
	}
	if kv, _ := f.st.Get([]byte("ops/new")); kv != nil {
		t.Fatal("a denied write was applied")
	}
	// A revoked token sends the browser back to the login page.
	delete(f.tokens, "app-secret")
	if _, body := b.get("/ui/kv"); !strings.Contains(body, "no longer exists") {
		t.Fatalf("revoked token:\n%s", body)
	}
}

// events reads a stream's html events into a channel.
func events(t *testing.T, b *browser, path string) <-chan string {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", b.base+path, nil)
	resp, err := b.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan string, 16)
	go func() {
		defer resp.Body.Close()
		defer close(out)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		var ev, data string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev = line[7:]
			case strings.HasPrefix(line, "data: "):
				data += line[6:] + "\n"
			case line == "":
				if ev != "" {
					out <- ev + ":" + data
				}
				ev, data = "", ""
			}
		}
	}()
	return out
}

func next(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case e, ok := <-ch:
		if !ok {
			t.Fatal("stream ended")
		}
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}
	return ""
}

func TestKVStreamFollowsTheBlockingIndex(t *testing.T) {
	f := newFake(t)
	f.put("app/a", "1")
	b := serve(t, f)
	ch := events(t, b, "/ui/events/kv?prefix=app/")
	if e := next(t, ch); !strings.Contains(e, `data-key="app/a"`) {
		t.Fatalf("first event %q", e)
	}
	f.put("other/x", "ignored")
	f.put("app/b", "2")
	e := next(t, ch)
	if !strings.Contains(e, `data-key="app/b"`) {
		t.Fatalf("event after a write under the prefix: %q", e)
	}
}

func TestRaftLogPageWarnsOfBloatWithTheRunbookCommand(t *testing.T) {
	f := newFake(t)
	set := func(name string, v float64) {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name})
		g.Set(v)
		f.reg.MustRegister(g)
	}
	set(mLogFile, 4<<30)
	set(mLogFreeBytes, 3.5*(1<<30))
	set(mLogLive, 0.5*(1<<30))
	set(mLogFreePages, 900000)
	b := serve(t, f)
	_, body := b.get("/ui/raftlog")
	mustContain(t, "raftlog", body, `data-warning="n1"`, "past the rotation threshold", "4.0 GiB",
		"lodestone compact --inspect --data-dir /var/lib/lodestone", "docs/runbooks/raft-log-bloat.md")
	// A second member that does not answer is shown unreachable, not left out.
	f.member(2, "n2", "127.0.0.1:2")
	_, body = b.get("/ui/cluster")
	mustContain(t, "cluster", body, `data-member="n2" data-role="unreachable"`, "connection refused")
}
