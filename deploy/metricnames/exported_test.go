package metricnames

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/lodestone-kv/lodestone/deploy/internal/binary"
	"github.com/lodestone-kv/lodestone/internal/testnet"
)

// TestEveryQueriedMetricIsExported runs what a deployment runs, from the
// built binary: three servers with TLS (client certificates required on
// HTTP, as prometheus.yml expects), ACLs with default deny and gossip, an
// agent with a service and its check, and a gateway routing to it with a
// TLS admin port. It drives the traffic that creates lazily made series
// (a write, a blocking query, proxied requests, an ACL refusal, a TLS
// reload), scrapes every process as prometheus.yml says to, and fails if
// a dashboard panel, a dashboard variable or a rule reads a metric none of
// them exports and no recording rule writes.
func TestEveryQueriedMetricIsExported(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three servers, an agent and a gateway")
	}
	refs, recorded := queriedNames(t)
	d := newDeployment(t)
	d.start()
	d.traffic()

	// Lazily made series appear within moments of the traffic: scrape
	// until nothing is missing or the deadline passes.
	var missing []Ref
	deadline := time.Now().Add(30 * time.Second)
	for {
		exported := d.scrapeAll()
		missing = Missing(refs, exported, recorded, PrometheusMade)
		if len(missing) == 0 {
			t.Logf("all %d names the dashboards and rules query are served or recorded", distinct(refs))
			// The check fails as it must: a misspelled name in a copy of
			// a dashboard is reported against the same scrape.
			d.checkMisspellingCaught(exported, recorded)
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	var lines []string
	for _, m := range missing {
		lines = append(lines, fmt.Sprintf("%s (%s)", m.Name, m.Where))
	}
	slices.Sort(lines)
	t.Errorf("%d queried metrics are exported by no process and written by no recording rule:\n%s",
		len(missing), strings.Join(slices.Compact(lines), "\n"))
}

func distinct(refs []Ref) int {
	seen := map[string]bool{}
	for _, r := range refs {
		seen[r.Name] = true
	}
	return len(seen)
}

// queriedNames reads every dashboard and rule file: the names they query,
// and the names recording rules write.
func queriedNames(t *testing.T) ([]Ref, map[string]bool) {
	t.Helper()
	var refs []Ref
	recorded := map[string]bool{}
	dashboards, _ := filepath.Glob("../grafana/*.json")
	rules := []string{"../prometheus/recording.yml", "../prometheus/alerts.yml"}
	if len(dashboards) < 4 {
		t.Fatalf("found dashboards %v, want the four of deploy/grafana", dashboards)
	}
	for _, f := range dashboards {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r, err := InDashboard(filepath.Base(f), b)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, r...)
	}
	for _, f := range rules {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r, rec, err := InRules(filepath.Base(f), b)
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, r...)
		for _, n := range rec {
			recorded[n] = true
		}
	}
	return refs, recorded
}

func (d *deployment) checkMisspellingCaught(exported, recorded map[string]bool) {
	t := d.t
	orig, err := os.ReadFile("../grafana/raft-log.json")
	if err != nil {
		t.Fatal(err)
	}
	const right, wrong = "lodestone_raftlog_free_pages", "lodestone_raftlog_freepages"
	typo := strings.Replace(string(orig), right, wrong, 1)
	refs, err := InDashboard("raft-log.json", []byte(typo))
	if err != nil {
		t.Fatal(err)
	}
	m := Missing(refs, exported, recorded, PrometheusMade)
	if len(m) != 1 || m[0].Name != wrong {
		t.Errorf("a copy of raft-log.json reading %s instead of %s: missing %v, want just %s", wrong, right, m, wrong)
	}
}

// deployment is the processes of a small production-like installation.
type deployment struct {
	t       *testing.T
	bin     string
	dir     string
	token   string
	servers []server
	env     []string // the CLI's: endpoints, CA, token

	agentHTTP, gatewayListen, gatewayAdmin string
	origin                                 *httptest.Server

	serverScrape, gatewayScrape *http.Client
	procs                       []*process
}

type server struct{ name, peer, grpc, http, gossip string }

func newDeployment(t *testing.T) *deployment {
	d := &deployment{t: t, bin: lodestoneBinary(t), dir: t.TempDir(), token: "3f1c6a52-8d1e-4b0e-9a51-2c7a1b9e0d44"}
	for i := 1; i <= 3; i++ {
		d.servers = append(d.servers, server{
			name: fmt.Sprintf("n%d", i), peer: testnet.FreeAddr(t), grpc: testnet.FreeAddr(t),
			http: testnet.FreeAddr(t), gossip: testnet.FreeAddrOn(t, "127.0.0.1", true),
		})
	}
	d.agentHTTP, d.gatewayListen, d.gatewayAdmin = testnet.FreeAddr(t), testnet.FreeAddr(t), testnet.FreeAddr(t)
	t.Cleanup(d.stop)
	return d
}

func (d *deployment) path(name string) string { return filepath.Join(d.dir, name) }

// run runs a lodestone command to completion with the CLI's environment.
func (d *deployment) run(args ...string) string {
	d.t.Helper()
	cmd := exec.Command(d.bin, args...)
	cmd.Env = append(os.Environ(), d.env...)
	cmd.Dir = d.dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		d.t.Fatalf("lodestone %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String()
}

func (d *deployment) start() {
	t := d.t
	d.run("tls", "ca", "create", "--dir", d.dir)
	for _, s := range d.servers {
		d.run("tls", "cert", "create", "--server", "--node", s.name, "--dir", d.dir)
	}
	d.run("tls", "cert", "create", "--server", "--node", "gateway", "--dir", d.dir)
	d.run("tls", "cert", "create", "--client", "--node", "prometheus", "--dir", d.dir)
	d.run("tls", "cert", "create", "--client", "--node", "ops", "--dir", d.dir)
	if err := os.WriteFile(d.path("token"), []byte(d.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var endpoints, initial []string
	for _, s := range d.servers {
		endpoints = append(endpoints, s.grpc)
		initial = append(initial, s.name+"="+s.peer)
	}
	d.env = []string{"LODESTONE_ENDPOINTS=" + strings.Join(endpoints, ","), "LODESTONE_CACERT=" + d.path("lodestone-ca.pem"),
		"LODESTONE_TOKEN=", "LODESTONE_TOKEN_FILE=", "CONSUL_HTTP_TOKEN=", "CONSUL_HTTP_TOKEN_FILE=",
		"LODESTONE_HTTP_ADDR=https://" + d.servers[0].http,
		"LODESTONE_CLIENT_CERT=" + d.path("client-ops.pem"), "LODESTONE_CLIENT_KEY=" + d.path("client-ops-key.pem")}
	d.serverScrape = d.scrapeClient("lodestone")
	d.gatewayScrape = d.scrapeClient("lodestone-gateway")

	for _, s := range d.servers {
		d.spawn(s.name, "server", "--name", s.name, "--data-dir", d.path("data-"+s.name),
			"--listen-peer", s.peer, "--listen-grpc", s.grpc, "--listen-http", s.http, "--listen-dns", "",
			"--initial-cluster", strings.Join(initial, ","),
			"--tls-ca-file", d.path("lodestone-ca.pem"), "--tls-cert-file", d.path("server-"+s.name+".pem"),
			"--tls-key-file", d.path("server-"+s.name+"-key.pem"), "--tls-verify-incoming-http",
			"--acl-enabled", "--acl-default-policy", "deny",
			"--gossip-listen", s.gossip, "--gossip-join", d.servers[0].gossip, "--log-level", "warn")
	}
	for _, s := range d.servers {
		d.waitOK(d.serverScrape, "https://"+s.http+"/healthz")
	}
	// Bootstrapped without a token (none exists yet); every later command
	// and process uses the management token it made.
	d.run("acl", "bootstrap", d.path("token"), "--wait", "30s")
	d.env = append(d.env, "LODESTONE_TOKEN_FILE="+d.path("token"))

	d.origin = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	}))
	t.Cleanup(d.origin.Close)
	originPort := d.origin.URL[strings.LastIndex(d.origin.URL, ":")+1:]
	services := fmt.Sprintf(`{"services": [{"ID": "web1", "Name": "web", "Address": "127.0.0.1", "Port": %s,
		"Check": {"HTTP": "%s/health", "Interval": "1s", "Timeout": "1s"}}]}`, originPort, d.origin.URL)
	if err := os.WriteFile(d.path("services.json"), []byte(services), 0o644); err != nil {
		t.Fatal(err)
	}
	d.run("kv", "put", "gateway/routes/web", `{"name": "web", "path_prefix": "/", "service": "web"}`)
	d.spawn("agent", "agent", "--node", "a1", "--gossip-listen", testnet.FreeAddrOn(t, "127.0.0.1", true),
		"--gossip-join", d.servers[0].gossip, "--listen-http", d.agentHTTP, "--config-file", d.path("services.json"),
		"--anti-entropy-interval", "1s", "--log-level", "warn")
	d.spawn("gateway", "gateway", "--listen", d.gatewayListen, "--admin", d.gatewayAdmin,
		"--admin-tls-cert-file", d.path("server-gateway.pem"), "--admin-tls-key-file", d.path("server-gateway-key.pem"),
		"--admin-tls-ca-file", d.path("lodestone-ca.pem"), "--log-level", "warn")
	d.waitOK(http.DefaultClient, "http://"+d.agentHTTP+"/metrics")
	d.waitOK(d.gatewayScrape, "https://"+d.gatewayAdmin+"/healthz")
}

// traffic makes the series that exist only after their first event.
func (d *deployment) traffic() {
	t := d.t
	// Requests through the gateway, once it routes to the instance.
	d.waitOK(http.DefaultClient, "http://"+d.gatewayListen+"/")
	for range 5 {
		d.waitOK(http.DefaultClient, "http://"+d.gatewayListen+"/")
	}
	d.run("kv", "put", "dash/key", "v1")
	// A Consul blocking query, answered when its wait ends.
	api := d.servers[1].http
	resp, err := d.serverScrape.Get("https://" + api + "/v1/kv/dash/key?index=1000000&wait=1s&token=" + d.token)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("blocking query: %s", resp.Status)
	}
	// A token nobody issued: an ACL refusal.
	resp, err = d.serverScrape.Get("https://" + api + "/v1/kv/dash/key?token=00000000-0000-4000-8000-000000000000")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("an unknown token got %s, want 403", resp.Status)
	}
	// A TLS reload.
	for _, p := range d.procs {
		if p.name == "n1" {
			if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// scrapeAll reads every process's /metrics and returns the names served.
func (d *deployment) scrapeAll() map[string]bool {
	all := map[string]bool{}
	get := func(c *http.Client, url string) {
		resp, err := c.Get(url)
		if err != nil {
			d.t.Logf("scrape %s: %v", url, err)
			return
		}
		defer resp.Body.Close()
		names, err := Exported(resp.Body)
		if err != nil {
			d.t.Fatalf("scrape %s: %v", url, err)
		}
		for n := range names {
			all[n] = true
		}
	}
	for _, s := range d.servers {
		get(d.serverScrape, "https://"+s.http+"/metrics")
	}
	get(http.DefaultClient, "http://"+d.agentHTTP+"/metrics")
	get(d.gatewayScrape, "https://"+d.gatewayAdmin+"/metrics")
	return all
}

// scrapeClient is an HTTPS client with the tls_config prometheus.yml gives
// job, its files being the ones this deployment made under their names.
func (d *deployment) scrapeClient(job string) *http.Client {
	t := d.t
	b, err := os.ReadFile("../prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			JobName   string `json:"job_name"`
			Scheme    string `json:"scheme"`
			TLSConfig struct {
				CAFile     string `json:"ca_file"`
				CertFile   string `json:"cert_file"`
				KeyFile    string `json:"key_file"`
				ServerName string `json:"server_name"`
			} `json:"tls_config"`
		} `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	// prometheus.yml's files by base name, as `lodestone tls` names them.
	file := func(p string) string { return d.path(filepath.Base(p)) }
	for _, sc := range cfg.ScrapeConfigs {
		if sc.JobName != job {
			continue
		}
		if sc.Scheme != "https" {
			t.Fatalf("prometheus.yml scrapes job %s over %q, want https", job, sc.Scheme)
		}
		pool := x509.NewCertPool()
		ca, err := os.ReadFile(file(sc.TLSConfig.CAFile))
		if err != nil || !pool.AppendCertsFromPEM(ca) {
			t.Fatalf("job %s: CA %s: %v", job, sc.TLSConfig.CAFile, err)
		}
		cert, err := tls.LoadX509KeyPair(file(sc.TLSConfig.CertFile), file(sc.TLSConfig.KeyFile))
		if err != nil {
			t.Fatalf("job %s: client certificate: %v", job, err)
		}
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: sc.TLSConfig.ServerName,
		}}}
	}
	t.Fatalf("prometheus.yml has no job %s", job)
	return nil
}

// waitOK polls url until it answers 200, for up to 30 s.
func (d *deployment) waitOK(c *http.Client, url string) {
	d.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := c.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			err = fmt.Errorf("%s", resp.Status)
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("%s did not answer 200 within 30s: %v\n%s", url, err, d.logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// process is one long-running lodestone process.
type process struct {
	name   string
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (d *deployment) spawn(name string, args ...string) {
	d.t.Helper()
	cmd := exec.Command(d.bin, args...)
	cmd.Env = append(os.Environ(), d.env...)
	p := &process{name: name, cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stderr, p.stderr
	if err := cmd.Start(); err != nil {
		d.t.Fatalf("start %s: %v", name, err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	d.procs = append(d.procs, p)
}

func (d *deployment) logs() string {
	var b strings.Builder
	for _, p := range d.procs {
		fmt.Fprintf(&b, "--- %s\n%s", p.name, p.stderr.String())
	}
	return b.String()
}

// stop ends the processes, gateway and agent first, then the servers.
func (d *deployment) stop() {
	for _, p := range slices.Backward(d.procs) {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
	}
	if d.t.Failed() {
		d.t.Log(d.logs())
	}
}

func TestMain(m *testing.M) { os.Exit(binary.Main(m)) }

// lodestoneBinary is the binary built from the main module, once.
func lodestoneBinary(t *testing.T) string { return binary.Lodestone(t) }
