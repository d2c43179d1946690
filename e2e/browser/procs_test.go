package browser

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/testnet"
)

// proc is one lodestone process; the test's cleanup kills it.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

func start(t *testing.T, name, logDir string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("--- %s log (end) ---\n%s", name, b)
			}
		}
	})
	return p
}

// kill sends SIGKILL and waits until the process is gone.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// waitOK polls url until it answers 200.
func waitOK(t *testing.T, url string, within time.Duration) {
	t.Helper()
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if resp, err := c.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s did not answer 200 within %v", url, within)
}

type member struct {
	name, peer, grpc, http string
	p                      *proc
}

// startCluster runs three servers with ACLs on (default deny).
func startCluster(t *testing.T, dir string) []*member {
	t.Helper()
	var ms []*member
	var initial []string
	for _, n := range []string{"n1", "n2", "n3"} {
		m := &member{name: n, peer: testnet.FreeAddr(t), grpc: testnet.FreeAddr(t), http: testnet.FreeAddr(t)}
		ms = append(ms, m)
		initial = append(initial, n+"="+m.peer)
	}
	for _, m := range ms {
		m.p = start(t, m.name, dir, "server", "--name", m.name, "--data-dir", filepath.Join(dir, m.name),
			"--listen-peer", m.peer, "--listen-grpc", m.grpc, "--listen-http", m.http, "--listen-dns", "",
			"--initial-cluster", strings.Join(initial, ","), "--acl-enabled", "--acl-default-policy", "deny")
	}
	for _, m := range ms {
		waitOK(t, "http://"+m.http+"/readyz", 30*time.Second)
	}
	return ms
}
