package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/lodestone-kv/lodestone/internal/testnet"
	"github.com/lodestone-kv/lodestone/server"
	"github.com/lodestone-kv/lodestone/server/servertest"
)

// notifySocket is the service manager's end of sd_notify: a unixgram
// socket whose datagrams arrive, split into lines, on msgs.
type notifySocket struct {
	path string
	msgs chan []string
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	s := &notifySocket{path: path, msgs: make(chan []string, 256)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			s.msgs <- strings.Split(string(buf[:n]), "\n")
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	return s
}

// until reads datagrams until one has the line want and returns every
// line read, that one's included.
func (s *notifySocket) until(t *testing.T, want string, within time.Duration) []string {
	t.Helper()
	var seen []string
	deadline := time.After(within)
	for {
		select {
		case m := <-s.msgs:
			seen = append(seen, m...)
			if slices.Contains(m, want) {
				return seen
			}
		case <-deadline:
			t.Fatalf("no %q within %v; got %q", want, within, seen)
		}
	}
}

// TestServerNotifiesSystemd runs a real `lodestone server` as systemd
// would for Type=notify: member a of a two-member cluster, b started only
// once a has campaigned in vain. a must say it waits for a leader, send
// READY=1 only once b gave it a quorum (and /readyz agrees), wrap a SIGHUP
// reload in RELOADING=1 and READY=1, ping the watchdog, and send
// STOPPING=1 on SIGTERM. The same process shows its stamped build on
// lodestone status, /v1/agent/self and /metrics.
func TestServerNotifiesSystemd(t *testing.T) {
	t.Parallel()
	bin := stampedBinary(t)
	dir := createTLSFiles(t)
	caFile := filepath.Join(dir, "lodestone-ca.pem")
	sock := listenNotify(t)

	type member struct{ name, peer, grpc, http string }
	a := member{"a", testnet.FreeAddr(t), testnet.FreeAddr(t), testnet.FreeAddr(t)}
	b := member{"b", testnet.FreeAddr(t), testnet.FreeAddr(t), testnet.FreeAddr(t)}
	start := func(m member, env ...string) *exec.Cmd {
		cmd := exec.Command(bin, "server", "--name", m.name, "--data-dir", t.TempDir(),
			"--listen-peer", m.peer, "--listen-grpc", m.grpc, "--listen-http", m.http,
			"--initial-cluster", "a="+a.peer+",b="+b.peer, "--cluster-token", "notify-test",
			"--tick-interval", "20ms",
			"--tls-ca-file", caFile,
			"--tls-cert-file", filepath.Join(dir, "server-n1.pem"), "--tls-key-file", filepath.Join(dir, "server-n1-key.pem"),
			"--tls-reload-interval", "-1s")
		cmd.Env = append(os.Environ(), env...)
		var logs syncWriter
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
			if t.Failed() {
				t.Logf("server %s:\n%s", m.name, logs.String())
			}
		})
		return cmd
	}
	// NB: no WATCHDOG_PID: the child's pid is not known before it starts.
	srvA := start(a, "NOTIFY_SOCKET="+sock.path, "WATCHDOG_USEC=300000")

	cliEnv := map[string]string{"LODESTONE_CACERT": caFile}
	status := func(m member) jsonStatus {
		t.Helper()
		r := cli(t, cliEnv, "", "--endpoints", m.grpc, "--timeout", "2s", "status", "-o", "json")
		var out []jsonStatus
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil || len(out) != 1 {
			return jsonStatus{Error: r.stderr}
		}
		return out[0]
	}
	// a campaigns (pre-vote) and cannot win without b.
	for deadline := time.Now().Add(15 * time.Second); status(a).RaftState != "precandidate"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a never campaigned: %+v", status(a))
		}
	}
	seen := sock.until(t, "STATUS=waiting for a leader", 5*time.Second)
	drain := func() {
		for {
			select {
			case m := <-sock.msgs:
				seen = append(seen, m...)
			default:
				return
			}
		}
	}
	drain()
	if slices.Contains(seen, "READY=1") {
		t.Fatalf("READY=1 before a had a leader: %q", seen)
	}

	ca, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	defer tr.CloseIdleConnections()
	httpc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	readyz := func() int {
		resp, err := httpc.Get("https://" + a.http + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := readyz(); code != http.StatusServiceUnavailable {
		t.Fatalf("a without a quorum: /readyz %d, want 503", code)
	}

	start(b)
	seen = sock.until(t, "READY=1", 20*time.Second)
	if code := readyz(); code != http.StatusOK {
		t.Errorf("a sent READY=1, but /readyz says %d", code)
	}
	if !slices.Contains(seen, "STATUS=serving") {
		t.Errorf("no STATUS=serving with READY=1: %q", seen)
	}
	sock.until(t, "WATCHDOG=1", 5*time.Second)

	// The stamped build, as the running server shows it.
	if st := status(a); st.Version != stampVersion {
		t.Errorf("lodestone status version %q, want %q (%+v)", st.Version, stampVersion, st)
	}
	ccfg := consul.DefaultConfig()
	ccfg.Address, ccfg.Scheme, ccfg.HttpClient = a.http, "https", httpc
	cl, err := consul.NewClient(ccfg)
	if err != nil {
		t.Fatal(err)
	}
	self, err := cl.Agent().Self()
	if err != nil {
		t.Fatalf("agent/self: %v", err)
	}
	if c := self["Config"]; c["Version"] != stampVersion || c["Revision"] != stampCommit || c["BuildDate"] != stampDate {
		t.Errorf("agent/self Config %v, want version %s revision %s build date %s", c, stampVersion, stampCommit, stampDate)
	}
	resp, err := httpc.Get("https://" + a.http + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if want := `lodestone_build_info{commit="` + stampCommit + `",goversion="` + runtime.Version() + `",version="` + stampVersion + `"} 1`; !strings.Contains(string(metrics), want+"\n") {
		t.Errorf("/metrics has no line %q", want)
	}

	// A reload: RELOADING=1 (with the monotonic time systemd asks for),
	// then READY=1 once done.
	drain()
	if err := srvA.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	seen = sock.until(t, "READY=1", 10*time.Second)
	at := slices.Index(seen, "RELOADING=1")
	if at < 0 || !slices.ContainsFunc(seen[at:], func(l string) bool { return strings.HasPrefix(l, "MONOTONIC_USEC=") }) {
		t.Errorf("SIGHUP sent %q, want RELOADING=1 and MONOTONIC_USEC= before READY=1", seen)
	}

	if err := srvA.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sock.until(t, "STOPPING=1", 10*time.Second)
	if err := srvA.Wait(); err != nil {
		t.Errorf("a after SIGTERM: %v", err)
	}
}

// TestGatewayNotifiesSystemd: a real `lodestone gateway` started before
// its registry says it waits for a routing table, sends READY=1 only once
// the registry runs and /readyz agrees, and STOPPING=1 on SIGTERM.
func TestGatewayNotifiesSystemd(t *testing.T) {
	t.Parallel()
	bin := stampedBinary(t)
	sock := listenNotify(t)
	registry, admin := testnet.FreeAddr(t), testnet.FreeAddr(t)
	cmd := exec.Command(bin, "gateway", "--registry", registry, "--listen", testnet.FreeAddr(t), "--admin", admin)
	cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+sock.path)
	var logs syncWriter
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Logf("gateway:\n%s", logs.String())
		}
	})
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	httpc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	readyz := func() int {
		resp, err := httpc.Get("http://" + admin + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	seen := sock.until(t, "STATUS=waiting for a routing table", 10*time.Second)
	if slices.Contains(seen, "READY=1") {
		t.Fatalf("READY=1 without a registry: %q", seen)
	}
	if code := readyz(); code != http.StatusServiceUnavailable {
		t.Fatalf("gateway without a registry: /readyz %d, want 503", code)
	}

	servertest.Start(t, func(c *server.Config) { c.ListenGRPC = registry })
	sock.until(t, "READY=1", 20*time.Second)
	if code := readyz(); code != http.StatusOK {
		t.Errorf("the gateway sent READY=1, but /readyz says %d", code)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sock.until(t, "STOPPING=1", 10*time.Second)
	if err := cmd.Wait(); err != nil {
		t.Errorf("gateway after SIGTERM: %v", err)
	}
}
