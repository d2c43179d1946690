package browser

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	consul "github.com/hashicorp/consul/api"

	"github.com/lodestone-kv/lodestone/gateway/adminui"
	"github.com/lodestone-kv/lodestone/internal/testnet"
	"github.com/lodestone-kv/lodestone/server/ui"
)

// chromiumPath finds Debian's chromium; the tests skip, saying so, only
// when it is missing (CI installs it).
func chromiumPath(t *testing.T) string {
	for _, name := range []string{os.Getenv("LODESTONE_CHROMIUM"), "chromium", "chromium-browser"} {
		if name == "" {
			continue
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium on PATH (apt-get install chromium, or set LODESTONE_CHROMIUM): the browser tests need a real browser")
	return ""
}

// shots is where screenshots go.
func shots(t *testing.T) string {
	dir := os.Getenv("LODESTONE_UI_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// tab is one browser tab with its own cookies.
type tab struct {
	t    *testing.T
	ctx  context.Context
	dir  string
	base string
}

func newBrowser(t *testing.T) context.Context {
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox, chromedp.WindowSize(1360, 900), chromedp.Flag("disable-gpu", true))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	// NB: the browser starts with its first context; tabs with cookies of
	// their own are new browser contexts in it.
	bctx, cancelBrowser := chromedp.NewContext(actx)
	t.Cleanup(cancelBrowser)
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return bctx
}

func newTab(t *testing.T, browser context.Context, dir, base string) *tab {
	ctx, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	// NB: the tab opens with the first action on its context, and closes
	// when the context that action ran on ends: open it on ctx itself, not
	// on a child with a deadline.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	return &tab{t: t, ctx: ctx, dir: dir, base: base}
}

// do runs steps with a deadline.
func (b *tab) do(within time.Duration, steps ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(b.ctx, within)
	defer cancel()
	return chromedp.Do(ctx, steps...)
}

func (b *tab) must(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := b.do(15*time.Second, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// text reads sel's innerText in one script. A live page replaces its
// region's nodes whenever an event arrives; a node found by one call and
// read by the next can be gone in between.
func (b *tab) text(sel string) string {
	b.t.Helper()
	s, err := b.read(sel)
	if err != nil {
		b.t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

func (b *tab) read(sel string) (string, error) {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	js := fmt.Sprintf(`(() => { const e = document.querySelector(%q); return e ? e.innerText : null; })()`, sel)
	s, err := chromedp.Run(ctx, chromedp.Evaluate[*string](js))
	if err != nil {
		return "", err
	}
	if s == nil {
		return "", fmt.Errorf("no element matches %s", sel)
	}
	return *s, nil
}

// has waits up to 10 s for sel's text to hold every want: a live region
// may show the figures of the sample before the one the test waits for.
func (b *tab) has(what, sel string, wants ...string) {
	b.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := b.read(sel)
		missing := ""
		for _, w := range wants {
			if !strings.Contains(got, w) {
				missing = w
				break
			}
		}
		if err == nil && missing == "" {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s lacks %q (%v):\n%s", what, missing, err, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// open loads a page and waits for sel and for its live stream.
func (b *tab) open(path, sel string) {
	b.t.Helper()
	b.must("open "+path, chromedp.Navigate(b.base+path), chromedp.WaitVisible(chromedp.CSS(sel)),
		chromedp.WaitVisible(chromedp.CSS("#live-status.on")))
}

func (b *tab) shot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	// NB: a tab in the background draws nothing, and its capture waits.
	front := func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, tg, page.BringToFront, cdp.Empty{})
		return chromedp.Void{}, err
	}
	if err := chromedp.Do(ctx, front); err != nil {
		b.t.Fatalf("bring %s to front: %v", name, err)
	}
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(b.dir, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

func (b *tab) login(secret, then, sel string) {
	b.t.Helper()
	b.must("login", chromedp.Navigate(b.base+"/ui/login?next="+then), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), secret), chromedp.Submit(chromedp.CSS("#token")),
		chromedp.WaitVisible(chromedp.CSS(sel)))
}

func contains(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Fatalf("%s lacks %q:\n%s", what, w, got)
		}
	}
}

// fixture is the cluster's data: a management and a restricted token,
// keys, a catalog with a failing check, a session holding a lock, and a
// gateway in front of two origins.
type fixture struct {
	mgmt, app string
	api       *consul.Client
	members   []*member
	gwAdmin   string
	gwProxy   string
	gwToken   string
	sessionID string
}

func setup(t *testing.T, dir string) *fixture {
	ms := startCluster(t, dir)
	boot, err := consul.NewClient(&consul.Config{Address: ms[0].http})
	if err != nil {
		t.Fatal(err)
	}
	root, _, err := boot.ACL().Bootstrap()
	if err != nil {
		t.Fatalf("acl bootstrap: %v", err)
	}
	f := &fixture{mgmt: root.SecretID, members: ms}
	f.api, _ = consul.NewClient(&consul.Config{Address: ms[1].http, Token: f.mgmt})
	acls := f.api.ACL()
	if _, _, err := acls.PolicyCreate(&consul.ACLPolicy{Name: "app", Rules: `key_prefix "app/" { policy = "write" }`}, nil); err != nil {
		t.Fatalf("policy: %v", err)
	}
	tok, _, err := acls.TokenCreate(&consul.ACLToken{Description: "app team", Policies: []*consul.ACLTokenPolicyLink{{Name: "app"}}}, nil)
	if err != nil {
		t.Fatalf("token: %v", err)
	}
	f.app = tok.SecretID

	kv := f.api.KV()
	for k, v := range map[string]string{"app/greeting": "hello", "app/db/url": "postgres://db:5432/app", "ops/root-password": "hunter2"} {
		if _, err := kv.Put(&consul.KVPair{Key: k, Value: []byte(v)}, nil); err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
	}
	// Two origins behind the gateway, and a third instance whose check fails.
	var ports []int
	for i := range 2 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "origin %d\n", i) }))
		t.Cleanup(srv.Close)
		ports = append(ports, srv.Listener.Addr().(*net.TCPAddr).Port)
	}
	cat := f.api.Catalog()
	for i, port := range append(ports, 1) {
		status, output := consul.HealthPassing, "HTTP GET /health: 200 OK"
		if i == 2 {
			status, output = consul.HealthCritical, "dial tcp 127.0.0.1:1: connect: connection refused"
		}
		node := fmt.Sprintf("web-%d", i+1)
		if _, err := cat.Register(&consul.CatalogRegistration{Node: node, Address: "127.0.0.1",
			Service: &consul.AgentService{ID: node, Service: "web", Port: port, Tags: []string{"v2"}},
			Check:   &consul.AgentCheck{CheckID: "http", Name: "http", Status: status, ServiceID: node, Output: output}}, nil); err != nil {
			t.Fatalf("register %s: %v", node, err)
		}
	}
	id, _, err := f.api.Session().Create(&consul.SessionEntry{Node: "web-1", Name: "nightly-job", TTL: "60s", Checks: []string{"http"}}, nil)
	if err != nil {
		t.Fatalf("session: %v", err)
	}
	f.sessionID = id
	if ok, _, err := kv.Acquire(&consul.KVPair{Key: "app/jobs/nightly", Value: []byte("web-1"), Session: id}, nil); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if _, err := kv.Put(&consul.KVPair{Key: "gateway/routes/web", Value: []byte(`{"path_prefix": "/", "service": "web"}`)}, nil); err != nil {
		t.Fatal(err)
	}

	f.gwProxy, f.gwAdmin, f.gwToken = testnet.FreeAddr(t), testnet.FreeAddr(t), "gateway-admin-token"
	tokFile := filepath.Join(dir, "admin-token")
	os.WriteFile(tokFile, []byte(f.gwToken+"\n"), 0o600)
	start(t, "gateway", dir, "gateway", "--registry", ms[0].grpc+","+ms[1].grpc+","+ms[2].grpc, "--token", f.mgmt,
		"--listen", f.gwProxy, "--admin", f.gwAdmin, "--admin-token-file", tokFile)
	waitOK(t, "http://"+f.gwAdmin+"/readyz", 20*time.Second)
	c := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for ok := 0; ok < 40 && time.Now().Before(deadline); {
		if resp, err := c.Get("http://" + f.gwProxy + "/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				ok++
			}
		}
	}
	return f
}

func TestBrowserDrivesEveryPage(t *testing.T) {
	browser := newBrowser(t)
	dir := t.TempDir()
	out := shots(t)
	f := setup(t, dir)
	n1 := "http://" + f.members[0].http
	b := newTab(t, browser, out, n1)

	// ACLs are on: the UI asks for a token first.
	b.must("login page", chromedp.Navigate(n1+"/ui/cluster"), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.shot("00-login")
	b.login(f.mgmt, "/ui/cluster", `#members tr[data-member="n3"]`)

	t.Run("cluster", func(t *testing.T) {
		b.open("/ui/cluster", `#members tr[data-member="n3"]`)
		// The leader's append-ack figures arrive with its second sample.
		b.must("leader row", chromedp.WaitVisible(chromedp.CSS(`#members tr[data-role="leader"]`)))
		b.has("members", "#members", "n1", "n2", "n3", "leader", "follower", "this member")
		b.shot("01-cluster")
	})
	t.Run("raftlog", func(t *testing.T) {
		b.open("/ui/raftlog", `#logs tr[data-member="n2"]`)
		b.has("raft log", "#logs", "KiB", "done, 0 failed")
		b.has("raft log", "#live", "No member's raft.db is past the rotation threshold")
		b.shot("02-raftlog")
	})
	t.Run("watches", func(t *testing.T) {
		b.open("/ui/watches", `#watches tr[data-member="n1"]`)
		// The gateway's watch stream is on one of the members.
		streams := 0
		for _, m := range []string{"n1", "n2", "n3"} {
			n, _ := strconv.Atoi(strings.TrimSpace(b.text(`#watches tr[data-member="` + m + `"] td:nth-child(2)`)))
			streams += n
		}
		if streams == 0 {
			t.Fatalf("no member shows the gateway's watch stream:\n%s", b.text("#watches"))
		}
		b.shot("03-watches")
	})
	t.Run("services", func(t *testing.T) {
		b.open("/ui/services", `#services tr[data-service="web"]`)
		b.has("services", `#services tr[data-service="web"]`, "3", "2 passing", "1 critical")
		b.must("filter critical", chromedp.Navigate(n1+"/ui/services?state=critical&name=we"),
			chromedp.WaitVisible(chromedp.CSS(`#nodes tr[data-node="web-3"]`)))
		if nodes := b.text("#nodes"); strings.Contains(nodes, "web-1") {
			t.Fatalf("state=critical kept node web-1, whose check passes:\n%s", nodes)
		}
		b.open("/ui/services", `#services tr[data-service="web"]`)
		b.shot("04-services")
		b.open("/ui/services/web", `#instances tr[data-instance="web-3"]`)
		b.has("service", "#instances", "connection refused", "passing")
		b.shot("05-service")
		b.open("/ui/nodes/web-3", `#checks tr[data-check="http"]`)
		b.has("node", "#checks", "critical", "dial tcp 127.0.0.1:1: connect: connection refused")
		b.shot("06-node")
	})
	t.Run("kv edit is read back through the API", func(t *testing.T) {
		b.open("/ui/kv?prefix=app/", `#keys tr[data-key="app/greeting"]`)
		b.has("kv", "#keys", "db/", "jobs/")
		// A key written elsewhere appears without a reload: the live stream.
		if _, err := f.api.KV().Put(&consul.KVPair{Key: "app/live", Value: []byte("pushed")}, nil); err != nil {
			t.Fatal(err)
		}
		b.must("live key", chromedp.WaitVisible(chromedp.CSS(`#keys tr[data-key="app/live"]`)))
		b.shot("07-kv")
		b.open("/ui/kv/edit?key=app/greeting", "#kv-value")
		b.must("edit", chromedp.SetValue(chromedp.CSS("#kv-value"), "hello from the UI\nline 2"), chromedp.Click(chromedp.CSS("#kv-save")),
			chromedp.WaitVisible(chromedp.CSS(".banner.ok")))
		b.has("saved", ".banner.ok", "Saved at index")
		pair, _, err := f.api.KV().Get("app/greeting", &consul.QueryOptions{RequireConsistent: true})
		if err != nil || pair == nil || string(pair.Value) != "hello from the UI\nline 2" {
			t.Fatalf("read back through the API: %v %v", pair, err)
		}
		b.shot("08-kv-edit")
		// The lock holder is shown on the key it holds.
		b.open("/ui/kv/edit?key=app/jobs/nightly", "#kv-lock")
		b.has("lock", "#kv-lock", f.sessionID, "nightly-job", "web-1")
		// An edit from a page loaded before another write is refused.
		if _, err := f.api.KV().Put(&consul.KVPair{Key: "app/jobs/nightly", Value: []byte("changed"), Session: f.sessionID}, nil); err != nil {
			t.Fatal(err)
		}
		b.must("changed notice", chromedp.WaitVisible(chromedp.CSS("#kv-changed")))
		b.must("stale save", chromedp.SetValue(chromedp.CSS("#kv-value"), "stale"), chromedp.Click(chromedp.CSS("#kv-save")),
			chromedp.WaitVisible(chromedp.CSS(".banner.bad")))
		b.has("stale save", ".banner.bad", "Not saved", "changed since you loaded it")
		if pair, _, _ := f.api.KV().Get("app/jobs/nightly", nil); pair == nil || string(pair.Value) != "changed" {
			t.Fatalf("a stale edit changed the key: %v", pair)
		}
		b.shot("09-kv-stale")
	})
	t.Run("sessions", func(t *testing.T) {
		b.open("/ui/sessions", `#sessions tr[data-session="`+f.sessionID+`"]`)
		b.has("sessions", "#sessions", "nightly-job", "app/jobs/nightly", "1m0s")
		b.shot("10-sessions")
	})
	t.Run("restricted token sees only its keys", func(t *testing.T) {
		r := newTab(t, browser, out, n1)
		r.login(f.app, "/ui/kv", `#keys tr[data-key="app/"]`)
		keys := r.text("#keys")
		if strings.Contains(keys, "ops/") {
			t.Fatalf("the app token sees ops/:\n%s", keys)
		}
		r.shot("11-kv-restricted")
		r.must("forbidden key", chromedp.Navigate(n1+"/ui/kv/edit?key=ops/root-password"), chromedp.WaitVisible(chromedp.CSS(".banner.bad")))
		got := r.text("main")
		contains(t, "forbidden key", got, "Permission denied")
		if strings.Contains(got, "hunter2") {
			t.Fatal("a restricted token read ops/root-password")
		}
	})
	t.Run("gateway", func(t *testing.T) {
		g := newTab(t, browser, out, "http://"+f.gwAdmin)
		g.must("gateway login", chromedp.Navigate(g.base+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")),
			chromedp.SendKeys(chromedp.CSS("#token"), f.gwToken), chromedp.Submit(chromedp.CSS("#token")),
			chromedp.WaitVisible(chromedp.CSS(`#routes tr[data-route="web"]`)), chromedp.WaitVisible(chromedp.CSS("#live-status.on")))
		g.has("gateway", "main", "connected", "web-1", "web-2", "in rotation")
		if strings.Contains(g.text("main"), "web-3") {
			t.Fatal("the gateway routes to web-3, whose check fails")
		}
		// Traffic shows up in the live figures.
		c := &http.Client{Timeout: 2 * time.Second}
		for range 50 {
			if resp, err := c.Get("http://" + f.gwProxy + "/"); err == nil {
				resp.Body.Close()
			}
		}
		// The rate shows once a sample after the traffic meets one before it.
		ctx, cancel := context.WithTimeout(g.ctx, 10*time.Second)
		defer cancel()
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](
			`parseFloat(document.querySelector('#routes tr[data-route="web"] td:nth-child(6)').textContent) > 0`)); err != nil {
			t.Fatalf("the route's requests/s did not rise: %v\n%s", err, g.text("#routes"))
		}
		g.shot("12-gateway")
	})
	t.Run("every metric the pages read is exported", func(t *testing.T) {
		// Each member exports its own share: the leader the append-ack
		// times of its followers.
		body := ""
		for _, m := range f.members {
			r, err := http.Get("http://" + m.http + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body += readAll(r)
		}
		for _, name := range ui.MetricNames {
			if !strings.Contains(body, "\n"+name) {
				t.Errorf("no member exports %s, which the UI reads", name)
			}
		}
		r, err := http.Get("http://" + f.gwAdmin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		gw := readAll(r)
		for _, name := range adminui.MetricNames {
			if !strings.Contains(gw, "\n"+name) {
				t.Errorf("the gateway does not export %s, which its UI reads", name)
			}
		}
	})
	t.Run("SIGKILL shows unreachable within 5s", func(t *testing.T) {
		b.open("/ui/cluster", `#members tr[data-member="n3"][data-role]`)
		if role := b.text(`#members tr[data-member="n3"] td:nth-child(3)`); strings.Contains(role, "unreachable") {
			t.Fatalf("n3 unreachable before the kill: %s", role)
		}
		killed := time.Now()
		f.members[2].p.kill()
		if err := b.do(5*time.Second, chromedp.WaitVisible(chromedp.CSS(`#members tr[data-member="n3"][data-role="unreachable"]`))); err != nil {
			t.Fatalf("n3 not shown unreachable within 5s of SIGKILL: %v", err)
		}
		t.Logf("n3 shown unreachable %v after SIGKILL", time.Since(killed).Round(time.Millisecond))
		b.shot("13-cluster-member-killed")
	})
}

func readAll(resp *http.Response) string {
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
