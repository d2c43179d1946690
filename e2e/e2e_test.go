// Package e2e runs the lodestone binary as real processes: a dev node driven
// by the CLI, and a three-node cluster whose leader is killed with SIGKILL.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/testnet"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lodestone-e2e-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: temp dir:", err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "lodestone")
	build := exec.Command("go", "build", "-o", binary, "github.com/lodestone-kv/lodestone/cmd/lodestone")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: build lodestone:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := 0
	if err := goleak.Find(); err == nil {
		code = m.Run()
		if err := goleak.Find(); err != nil && code == 0 {
			fmt.Fprintln(os.Stderr, "e2e: goroutine leak:", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func freeAddr(t *testing.T) string { return testnet.FreeAddr(t) }

// proc is one lodestone process; Cleanup kills it if the test did not.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func start(t *testing.T, name, logDir string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("log file: %v", err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("--- %s log (last 3000 bytes) ---\n%s", name, tail(b, 3000))
			}
		}
	})
	return p
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			t.Errorf("%s exited with %v after SIGTERM", p.name, p.err)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("%s did not exit within 15s of SIGTERM", p.name)
		p.kill()
	}
}

// waitReady polls /readyz until it answers 200 or the deadline passes.
func waitReady(t *testing.T, httpAddr string, within time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		resp, err := client.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s not ready within %v", httpAddr, within)
}

func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("lodestone %s: %v: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

// The README's promise: lodestone dev serves, and the CLI puts and gets.
func TestDevNodeServesCLI(t *testing.T) {
	dir := t.TempDir()
	grpcAddr, httpAddr := freeAddr(t), freeAddr(t)
	gwAddr, gwAdmin := freeAddr(t), freeAddr(t)
	p := start(t, "dev", dir, "dev", "--data-dir", filepath.Join(dir, "data"),
		"--grpc", grpcAddr, "--http", httpAddr, "--peer", freeAddr(t),
		"--gateway", gwAddr, "--gateway-admin", gwAdmin)
	waitReady(t, httpAddr, 20*time.Second)
	waitReady(t, gwAdmin, 20*time.Second)

	// The gateway in front of the demo service spreads requests over both
	// demo instances.
	seen := map[string]int{}
	hc := &http.Client{Timeout: 5 * time.Second}
	for range 20 {
		resp, err := hc.Get("http://" + gwAddr + "/")
		if err != nil {
			t.Fatalf("GET through the dev gateway: %v", err)
		}
		var body struct {
			Instance string `json:"instance"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET through the dev gateway: status %d, decode %v", resp.StatusCode, err)
		}
		seen[body.Instance]++
	}
	if len(seen) != 2 || seen["demo-1"] == 0 || seen["demo-2"] == 0 {
		t.Fatalf("20 requests through the dev gateway reached %v, want both demo-1 and demo-2", seen)
	}

	if _, err := runCLI(t, "--endpoints", grpcAddr, "kv", "put", "greeting", "hello"); err != nil {
		t.Fatal(err)
	}
	out, err := runCLI(t, "--endpoints", grpcAddr, "kv", "get", "greeting")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := out, "hello\n"; got != want {
		t.Fatalf("kv get greeting printed %q, want %q", got, want)
	}
	_, err = runCLI(t, "--endpoints", grpcAddr, "kv", "get", "missing")
	if err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("kv get of a missing key: %v, want a not-found error", err)
	}
	p.stop(t)
}

type node struct {
	name, peer, grpc, http, dir string
	p                           *proc
}

func startCluster(t *testing.T, logDir string, names ...string) []*node {
	t.Helper()
	var nodes []*node
	var initial []string
	for _, n := range names {
		nd := &node{name: n, peer: freeAddr(t), grpc: freeAddr(t), http: freeAddr(t), dir: filepath.Join(logDir, n)}
		nodes = append(nodes, nd)
		initial = append(initial, n+"="+nd.peer)
	}
	for _, nd := range nodes {
		nd.start(t, logDir, strings.Join(initial, ","))
	}
	for _, nd := range nodes {
		waitReady(t, nd.http, 30*time.Second)
	}
	return nodes
}

func (nd *node) start(t *testing.T, logDir, initial string) {
	nd.p = start(t, nd.name, logDir, "server", "--name", nd.name, "--data-dir", nd.dir,
		"--listen-peer", nd.peer, "--listen-grpc", nd.grpc, "--listen-http", nd.http,
		"--initial-cluster", initial)
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func status(ctx context.Context, conn *grpc.ClientConn) (*lodestonepb.StatusResponse, error) {
	return lodestonepb.NewClusterClient(conn).Status(ctx, &lodestonepb.StatusRequest{})
}

// SIGKILL of the leader: a new leader within twice the election timeout,
// and every acknowledged write is still there (docs/architecture.md,
// "Nothing acknowledged is ever lost").
func TestKillLeaderLosesNoAcknowledgedWrite(t *testing.T) {
	dir := t.TempDir()
	nodes := startCluster(t, dir, "a", "b", "c")
	conns := map[string]*grpc.ClientConn{}
	for _, nd := range nodes {
		conns[nd.name] = dial(t, nd.grpc)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leader := findLeader(t, ctx, nodes, conns, "")

	// Writers spread over every member; each records what was acknowledged.
	var mu sync.Mutex
	acked := map[string]string{}
	writeCtx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		nd := nodes[w%len(nodes)]
		kv := lodestonepb.NewKVClient(conns[nd.name])
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; writeCtx.Err() == nil; i++ {
				key, val := fmt.Sprintf("w%d/%06d", w, i), fmt.Sprintf("v%d", i)
				cctx, ccancel := context.WithTimeout(writeCtx, 2*time.Second)
				_, err := kv.Put(cctx, &lodestonepb.PutRequest{Key: []byte(key), Value: []byte(val)})
				ccancel()
				if err == nil {
					mu.Lock()
					acked[key] = val
					mu.Unlock()
				}
			}
		}()
	}
	waitAcked := func(n int) {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			mu.Lock()
			got := len(acked)
			mu.Unlock()
			if got >= n {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("writers did not reach %d acknowledged writes", n)
	}
	waitAcked(200)

	killed := time.Now()
	leader.p.kill()
	electionTimeout := time.Second // server defaults: 10 ticks of 100ms
	newLeader := findLeader(t, ctx, nodes, conns, leader.name)
	took := time.Since(killed)
	t.Logf("new leader %s %v after SIGKILL of %s", newLeader.name, took, leader.name)
	if took > 2*electionTimeout {
		t.Errorf("new leader after %v; want within twice the election timeout (%v)", took, 2*electionTimeout)
	}
	mu.Lock()
	before := len(acked)
	mu.Unlock()
	waitAcked(before + 200)
	stopWriters()
	wg.Wait()

	// The killed member comes back and catches up.
	var initial []string
	for _, nd := range nodes {
		initial = append(initial, nd.name+"="+nd.peer)
	}
	t.Logf("restarting %s (grpc %s)", leader.name, leader.grpc)
	leader.start(t, dir, strings.Join(initial, ","))
	waitReady(t, leader.http, 30*time.Second)

	for _, nd := range nodes {
		kv := lodestonepb.NewKVClient(conns[nd.name])
		missing := 0
		for key, val := range acked {
			resp, err := kv.Get(ctx, &lodestonepb.GetRequest{Key: []byte(key)}, grpc.WaitForReady(true))
			if err != nil {
				t.Fatalf("read %s on %s: %v", key, nd.name, err)
			}
			if resp.Kv == nil || string(resp.Kv.Value) != val {
				missing++
			}
		}
		if missing > 0 {
			t.Errorf("%s: %d of %d acknowledged writes missing or wrong", nd.name, missing, len(acked))
		}
	}
	t.Logf("%d acknowledged writes verified on all members", len(acked))
	for _, nd := range nodes {
		nd.p.stop(t)
	}
}

// findLeader waits until every running member but `except` names the same
// leader, which is not `except`.
func findLeader(t *testing.T, ctx context.Context, nodes []*node, conns map[string]*grpc.ClientConn, except string) *node {
	t.Helper()
	for ctx.Err() == nil {
		var lead uint64
		agreed := true
		for _, nd := range nodes {
			if nd.name == except {
				continue
			}
			sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			st, err := status(sctx, conns[nd.name])
			cancel()
			if err != nil || st.LeaderId == 0 || (lead != 0 && st.LeaderId != lead) || st.LeaderName == except {
				agreed = false
				break
			}
			lead = st.LeaderId
		}
		if agreed && lead != 0 {
			for _, nd := range nodes {
				sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				st, err := status(sctx, conns[nd.name])
				cancel()
				if err == nil && st.Self.GetId() == lead {
					return nd
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no agreed leader other than %q", except)
	return nil
}
