// Package runbooks_test runs every command of the operator runbooks in
// docs/runbooks/ against real lodestone processes (docs/architecture.md,
// "Every runbook command runs in a test").
package runbooks_test

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/testnet"

	"go.uber.org/goleak"

	"github.com/lodestone-kv/lodestone/tools/runbooks"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A runbook's ```sh blocks carry a phase; before a block runs, the
// harness brings the processes into that state:
//
//	live         the three servers run (started or restarted as needed)
//	quorum-lost  n2 and n3 were killed (kill -9); n1 runs alone
//	stopped      every server stopped (SIGTERM); a gateway keeps running
//	start        each line is a long-running process to start in the
//	             background; the harness waits until it serves
//	after        no change: run against whatever runs now
//	secure-live  the three servers run with TLS on every port (client
//	             certificates required on gRPC and HTTP) and ACLs on with
//	             default deny; see secureEnv for what the commands get
//
// A runbook that uses secure-live is a secure runbook: its cluster is the
// secure one from its first block to its last, so it may not also use
// live, quorum-lost or start (whose commands assume plain text).
//
// A command exits 0 unless its line ends with "# exits N".
var phases = []string{"live", "quorum-lost", "stopped", "start", "after", "secure-live"}

// Metrics that exist only once they have a labelled child: they are
// registered but absent from /metrics until the first event.
var labelledOnly = map[string]bool{
	"lodestone_watch_watchers_cut_total": true, // first cut
	"gateway_requests_total":             true, // first proxied request
	// A gateway's per-route, per-service and per-origin series: none
	// until the table holds a route or a service.
	"gateway_retries_total":                   true,
	"gateway_origins_ejected":                 true,
	"gateway_ejections_total":                 true,
	"gateway_origin_requests_total":           true,
	"gateway_origin_request_duration_seconds": true,
}

func freeAddr(t *testing.T) string { return testnet.FreeAddr(t) }

type proc struct {
	cmd    *exec.Cmd
	done   chan struct{}
	stderr bytes.Buffer
	http   string // its HTTP (or admin) address, for readiness and metrics
}

type ran struct{ line, stdout, stderr string }

type harness struct {
	t       *testing.T
	bin     string
	env     map[string]string
	names   []string
	procs   map[string]*proc
	outputs []ran
	bodies  [][]byte // /metrics scraped along the way
	started bool

	// secure: the runbook uses secure-live; get then speaks HTTPS with the
	// CA and the client certificate for readiness checks and scrapes.
	secure bool
}

// scheme is how the harness reaches the servers' HTTP ports.
func (h *harness) scheme() string {
	if h.secure {
		return "https://"
	}
	return "http://"
}

func (h *harness) environ() []string {
	out := os.Environ()
	for k, v := range h.env {
		out = append(out, k+"="+v)
	}
	return append(out, "PATH="+filepath.Dir(h.bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
}

func (h *harness) run(line string) {
	h.t.Helper()
	cmd := exec.Command("sh", "-c", line)
	cmd.Env = h.environ()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		h.t.Fatalf("%s: %v", line, err)
	}
	if want := runbooks.ExpectedExit(line); code != want {
		h.t.Fatalf("%s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", line, code, want, stdout.String(), stderr.String())
	}
	h.outputs = append(h.outputs, ran{line, stdout.String(), stderr.String()})
	h.t.Logf("$ %s\n%s%s", line, stdout.String(), stderr.String())
}

// start runs args as a background process under key.
func (h *harness) start(key, httpAddr string, args ...string) {
	h.t.Helper()
	if p := h.procs[key]; p != nil {
		h.t.Fatalf("%s is already running", key)
	}
	p := &proc{cmd: exec.Command(h.bin, args...), done: make(chan struct{}), http: httpAddr}
	p.cmd.Env = h.environ()
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		h.t.Fatalf("start %s: %v", key, err)
	}
	go func() {
		defer close(p.done)
		_ = p.cmd.Wait()
	}()
	h.procs[key] = p
}

func (h *harness) stop(key string, sig syscall.Signal) {
	p := h.procs[key]
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		h.t.Errorf("%s did not stop within 30s of %v", key, sig)
	}
	delete(h.procs, key)
}

// waitHTTP polls url until it answers 200 or the deadline passes.
func (h *harness) waitHTTP(key, url string, d time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(d)
	for {
		resp, err := h.get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if p := h.procs[key]; p != nil {
			select {
			case <-p.done:
				h.t.Fatalf("%s exited: %s", key, p.stderr.String())
			default:
			}
		}
		if time.Now().After(deadline) {
			stderr := ""
			if p := h.procs[key]; p != nil {
				stderr = p.stderr.String()
			}
			h.t.Fatalf("%s not ready at %s within %v (%v); stderr:\n%s", key, url, d, err, stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (h *harness) startServer(name string) {
	up := strings.ToUpper(name)
	p := func(k string) string { return h.env[up+"_"+k] }
	args := []string{"server", "--name", name, "--data-dir", p("DATA_DIR"), "--listen-peer", p("PEER"),
		"--listen-grpc", p("GRPC"), "--listen-http", p("HTTP"), "--initial-cluster", h.env["INITIAL_CLUSTER"], "--log-level", "warn"}
	if h.secure {
		dir := h.env["CERT_DIR"]
		args = append(args, "--cluster-token", "runbook",
			"--tls-ca-file", filepath.Join(dir, "lodestone-ca.pem"),
			"--tls-cert-file", filepath.Join(dir, "server-"+name+".pem"), "--tls-key-file", filepath.Join(dir, "server-"+name+"-key.pem"),
			"--tls-verify-incoming-grpc", "--tls-verify-incoming-http",
			"--acl-enabled", "--acl-default-policy", "deny")
	}
	h.start(name, p("HTTP"), args...)
	// The runbook's kill -HUP needs the process of the moment.
	h.env[up+"_PID"] = fmt.Sprint(h.procs[name].cmd.Process.Pid)
}

// enter brings the processes into phase.
func (h *harness) enter(phase string) {
	h.t.Helper()
	if h.secure {
		switch phase {
		case "live", "quorum-lost", "start":
			h.t.Fatalf("sh block with phase %q in a secure runbook: use secure-live, stopped or after", phase)
		case "after":
			phase = "secure-live"
			if h.started {
				return
			}
		}
	} else if phase == "secure-live" {
		h.t.Fatal("secure-live in a runbook the harness did not set up as secure")
	}
	switch phase {
	case "secure-live":
		for _, n := range h.names {
			if h.procs[n] == nil {
				h.startServer(n)
			}
		}
		for _, n := range h.names {
			h.waitHTTP(n, "https://"+h.procs[n].http+"/readyz", 60*time.Second)
		}
		if !h.started {
			h.started = true
			h.bootstrapACL()
			for i := range 20 {
				h.run(fmt.Sprintf("lodestone kv put runbook/key%d value%d", i, i))
			}
		}
	case "live":
		for _, n := range h.names {
			if h.procs[n] == nil {
				h.startServer(n)
			}
		}
		for _, n := range h.names {
			h.waitHTTP(n, "http://"+h.procs[n].http+"/readyz", 60*time.Second)
		}
		if !h.started {
			h.started = true
			for i := range 20 {
				h.run(fmt.Sprintf("lodestone kv put runbook/key%d value%d", i, i))
			}
		}
		if h.procs["gateway"] != nil {
			h.waitGatewayConnected()
		}
	case "quorum-lost":
		h.enter("live")
		h.stop("n2", syscall.SIGKILL)
		h.stop("n3", syscall.SIGKILL)
	case "stopped":
		if !h.started {
			h.enter(map[bool]string{false: "live", true: "secure-live"}[h.secure])
		}
		for key := range h.procs {
			if key != "gateway" {
				h.stop(key, syscall.SIGTERM)
			}
		}
	case "start", "after":
		if !h.started {
			h.enter("live")
		}
	default:
		h.t.Fatalf("sh block with phase %q: use one of %v", phase, phases)
	}
}

// waitGatewayConnected polls the gateway's /routes until it is connected.
func (h *harness) waitGatewayConnected() {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(h.env["GATEWAY_ADMIN"] + "/routes")
		if err == nil {
			var v struct {
				Connected bool `json:"connected"`
			}
			err = json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			if err == nil && v.Connected {
				return
			}
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("gateway not connected to the registry within 30s (%v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startLine starts one line of a `start` block and returns a func that
// waits until it serves (the lines of a block start together: a server
// is ready only once a quorum runs).
func (h *harness) startLine(line string) (wait func()) {
	h.t.Helper()
	fields := strings.Fields(os.Expand(line, func(k string) string { return h.env[k] }))
	for i := range fields {
		fields[i] = strings.Trim(fields[i], `"`)
	}
	if len(fields) < 2 || fields[0] != "lodestone" {
		h.t.Fatalf("start line %q does not run lodestone", line)
	}
	flag := func(name string) string {
		if i := slices.Index(fields, name); i >= 0 && i+1 < len(fields) {
			return fields[i+1]
		}
		return ""
	}
	switch fields[1] {
	case "server":
		key, httpAddr := flag("--name"), flag("--listen-http")
		h.start(key, httpAddr, append(fields[1:], "--log-level", "warn")...)
		wait = func() { h.waitHTTP(key, "http://"+httpAddr+"/readyz", 60*time.Second) }
	case "gateway":
		h.start("gateway", flag("--admin"), append(fields[1:], "--log-level", "warn")...)
		wait = func() {
			h.waitHTTP("gateway", "http://"+flag("--admin")+"/healthz", 60*time.Second)
			h.waitGatewayConnected()
		}
	default:
		h.t.Fatalf("start line %q: only server and gateway are long-running", line)
	}
	h.outputs = append(h.outputs, ran{line: line})
	h.t.Logf("$ %s &", line)
	return wait
}

func (h *harness) scrape() {
	for key, p := range h.procs {
		get := h.get
		scheme := h.scheme()
		if key == "gateway" {
			get, scheme = http.Get, "http://" // its admin port: no TLS in these runbooks
		}
		resp, err := get(scheme + p.http + "/metrics")
		if err != nil {
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			h.bodies = append(h.bodies, b)
		}
	}
}

// secureEnv makes the secure cluster's credentials with the built binary,
// as an operator would, and sets what the commands of a secure runbook
// get: CERT_DIR (the CA, its key, server-nN.pem and client-ops.pem with
// their keys, as lodestone tls names them), LODESTONE_CACERT,
// LODESTONE_CLIENT_CERT and LODESTONE_CLIENT_KEY (the ops client
// certificate), LODESTONE_HTTP_ADDR (n1's https:// address), METRICS_URL
// (n1's /metrics over HTTPS), LEAKED_TOKEN (a fresh secret no token has
// yet, for a runbook to rehearse a leak with) and, once the servers run,
// NN_PID and LODESTONE_TOKEN (the bootstrap management token).
//
// Server certificates are issued for 30 days, so that a rotation to the
// default 365 shows in the served expiry.
func (h *harness) secureEnv(dir string) {
	h.t.Helper()
	pki := filepath.Join(dir, "pki")
	ca, caKey := filepath.Join(pki, "lodestone-ca.pem"), filepath.Join(pki, "lodestone-ca-key.pem")
	h.env["CERT_DIR"] = pki
	h.mustRun("tls", "ca", "create", "--dir", pki)
	for _, n := range h.names {
		h.mustRun("tls", "cert", "create", "--server", "--node", n, "--days", "30", "--dir", pki, "--ca", ca, "--key", caKey)
	}
	h.mustRun("tls", "cert", "create", "--client", "--node", "ops", "--dir", pki, "--ca", ca, "--key", caKey)
	h.env["LODESTONE_CACERT"] = ca
	h.env["LODESTONE_CLIENT_CERT"] = filepath.Join(pki, "client-ops.pem")
	h.env["LODESTONE_CLIENT_KEY"] = filepath.Join(pki, "client-ops-key.pem")
	h.env["LODESTONE_HTTP_ADDR"] = "https://" + h.env["N1_HTTP"]
	h.env["METRICS_URL"] = "https://" + h.env["N1_HTTP"] + "/metrics"
	h.env["LEAKED_TOKEN"] = newSecret(h.t)
}

// get fetches url: over HTTPS in a secure runbook, presenting the ops
// client certificate and trusting the CA file, both read at each call so
// that a runbook that rotates them does not leave the harness behind.
func (h *harness) get(url string) (*http.Response, error) {
	if !h.secure {
		return http.Get(url)
	}
	pem, err := os.ReadFile(h.env["LODESTONE_CACERT"])
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no certificate in %s", h.env["LODESTONE_CACERT"])
	}
	cert, err := tls.LoadX509KeyPair(h.env["LODESTONE_CLIENT_CERT"], h.env["LODESTONE_CLIENT_KEY"])
	if err != nil {
		return nil, err
	}
	tr := &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{cert}}}
	defer tr.CloseIdleConnections()
	return (&http.Client{Timeout: 10 * time.Second, Transport: tr}).Get(url)
}

// mustRun runs the built binary with args, outside any runbook.
func (h *harness) mustRun(args ...string) string {
	h.t.Helper()
	cmd := exec.Command(h.bin, args...)
	cmd.Env = h.environ()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		h.t.Fatalf("lodestone %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// bootstrapACL creates the first management token and hands it to every
// later command as LODESTONE_TOKEN. Readiness means a leader is known, but
// the bootstrap may still meet an election: it is retried until a leader
// takes it, and given up on if one already did (a retry after an answer
// that was lost on the way).
func (h *harness) bootstrapACL() {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		cmd := exec.Command(h.bin, "acl", "bootstrap", "--format", "json")
		cmd.Env = h.environ()
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if err == nil {
			var tok struct{ SecretID string }
			if err := json.Unmarshal(stdout.Bytes(), &tok); err != nil || tok.SecretID == "" {
				h.t.Fatalf("lodestone acl bootstrap printed %q (%v)", stdout.String(), err)
			}
			h.env["LODESTONE_TOKEN"] = tok.SecretID
			h.t.Logf("$ lodestone acl bootstrap  # management token in LODESTONE_TOKEN")
			return
		}
		if strings.Contains(stderr.String(), "no longer allowed") || time.Now().After(deadline) {
			h.t.Fatalf("lodestone acl bootstrap: %v\n%s", err, stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// newSecret returns a random version 4 UUID, the form of a token secret.
func newSecret(t *testing.T) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// TestRunbooks runs each runbook in docs/runbooks/ (but raft-log-bloat.md,
// which tools/compact tests) against its own fresh three-node cluster of
// real processes.
func TestRunbooks(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the binary and runs clusters of processes")
	}
	bin := filepath.Join(t.TempDir(), "lodestone")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/lodestone-kv/lodestone/cmd/lodestone").CombinedOutput(); err != nil {
		t.Fatalf("build lodestone: %v\n%s", err, out)
	}
	for _, name := range []string{"slow-leader", "watch-overload", "quorum-loss", "restore-from-snapshot", "return-to-service", "gateway-cut-off", "origin-ejections", "rotate-credentials"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel() // each has its own processes and ports
			runRunbook(t, bin, "../../docs/runbooks/"+name+".md")
		})
	}
}

func runRunbook(t *testing.T, bin, path string) {
	md, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blocks, textBlocks, metrics := runbooks.Parse(string(md), regexp.MustCompile("`((?:lodestone|gateway)_[a-z0-9_]+)"))
	var texts []string
	for _, tb := range textBlocks {
		texts = append(texts, tb...)
	}
	if len(blocks) < 2 || len(metrics) < 2 {
		t.Fatalf("%s parsed to %d sh blocks and %d metrics: parser out of date?", path, len(blocks), len(metrics))
	}
	dir := t.TempDir()
	h := &harness{t: t, bin: bin, env: map[string]string{}, names: []string{"n1", "n2", "n3"}, procs: map[string]*proc{}}
	for _, b := range blocks {
		h.secure = h.secure || b.Phase == "secure-live"
	}
	var initial, endpoints []string
	for _, n := range h.names {
		up := strings.ToUpper(n)
		h.env[up+"_DATA_DIR"] = filepath.Join(dir, n)
		h.env[up+"_PEER"], h.env[up+"_GRPC"], h.env[up+"_HTTP"] = freeAddr(t), freeAddr(t), freeAddr(t)
		initial = append(initial, n+"="+h.env[up+"_PEER"])
		endpoints = append(endpoints, h.env[up+"_GRPC"])
	}
	gwAdmin := freeAddr(t)
	for k, v := range map[string]string{
		"INITIAL_CLUSTER": strings.Join(initial, ","), "LODESTONE_ENDPOINTS": strings.Join(endpoints, ","),
		"NAME": "n1", "DATA_DIR": h.env["N1_DATA_DIR"], "PEER_ADDR": h.env["N1_PEER"], "GRPC_ADDR": h.env["N1_GRPC"],
		"HTTP_ADDR": h.env["N1_HTTP"], "METRICS_URL": "http://" + h.env["N1_HTTP"] + "/metrics",
		"SNAPSHOT": filepath.Join(dir, "backup.snap"), "NEW_DATA_DIR": filepath.Join(dir, "new"),
		"NEW_PEER": freeAddr(t), "NEW_GRPC": freeAddr(t), "NEW_HTTP": freeAddr(t),
		"GATEWAY_LISTEN": freeAddr(t), "GATEWAY_ADMIN_ADDR": gwAdmin, "GATEWAY_ADMIN": "http://" + gwAdmin,
		"GATEWAY_STATE": filepath.Join(dir, "gateway"),
	} {
		h.env[k] = v
	}
	if h.secure {
		h.secureEnv(dir)
	}
	t.Cleanup(func() {
		for key, p := range h.procs {
			h.stop(key, syscall.SIGTERM)
			if t.Failed() {
				t.Logf("%s stderr:\n%s", key, p.stderr.String())
			}
		}
	})

	for _, b := range blocks {
		h.enter(b.Phase)
		var waits []func()
		for _, l := range b.Lines {
			if b.Phase == "start" {
				waits = append(waits, h.startLine(l))
			} else {
				h.run(l)
			}
		}
		for _, w := range waits {
			w()
		}
		h.scrape()
	}
	for _, m := range metrics {
		if labelledOnly[m] {
			continue
		}
		found := false
		for _, b := range h.bodies {
			found = found || bytes.Contains(b, []byte("# TYPE "+m+" "))
		}
		if !found {
			t.Errorf("the runbook names metric %s, which no process's /metrics had", m)
		}
	}
	// The sample outputs' row labels appear in what the commands printed.
	label := regexp.MustCompile(`^([A-Z][A-Z-]*(?: [A-Z][A-Z-]*)*)\s{2,}`)
	for _, line := range texts {
		want := ""
		if m := label.FindStringSubmatch(line); m != nil {
			want = m[1]
		} else if i := strings.Index(line, ":"); strings.HasPrefix(line, "will ") && i > 0 {
			want = line[:min(i, 12)]
		}
		if want == "" {
			continue
		}
		found := false
		for _, o := range h.outputs {
			found = found || strings.Contains(o.stdout, want) || strings.Contains(o.stderr, want)
		}
		if !found {
			t.Errorf("the runbook shows %q, which no command printed", want)
		}
	}
}
