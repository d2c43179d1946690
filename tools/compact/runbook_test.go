package compact_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/testnet"

	"github.com/lodestone-kv/lodestone/tools/runbooks"
)

const runbookPath = "../../docs/runbooks/raft-log-bloat.md"

func freeAddr(t *testing.T) string { return testnet.FreeAddr(t) }

// ran is one runbook command and what it printed.
type ran struct {
	line           string
	stdout, stderr string
}

// TestRunbookRaftLogBloat runs every command of the raft-log-bloat runbook
// (docs/architecture.md, "Every runbook command runs in a test"): it builds the
// lodestone binary, starts `lodestone dev` on free ports, runs the `sh live`
// blocks against it, checks that every metric the runbook names is on its
// /metrics, stops it, and runs the `sh stopped` blocks on its data dir. Each
// command must exit as the runbook says (0 unless marked "# exits N"), and
// the row labels of the sample outputs must appear in what the commands
// actually printed.
func TestRunbookRaftLogBloat(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds the binary and runs a node")
	}
	md, err := os.ReadFile(runbookPath)
	if err != nil {
		t.Fatal(err)
	}
	// Blocks are `sh live` (against a running node) or `sh stopped` (against
	// the node's data dir after it stopped).
	blocks, texts, metrics := runbooks.Parse(string(md), regexp.MustCompile("`(lodestone_[a-z0-9_]+)`"))
	phases := map[string]int{}
	lodestoneCmds := 0
	for _, b := range blocks {
		if b.Phase != "live" && b.Phase != "stopped" {
			t.Fatalf("sh block with phase %q: mark every block `sh live` or `sh stopped`", b.Phase)
		}
		phases[b.Phase]++
		for _, l := range b.Lines {
			if strings.HasPrefix(l, "lodestone ") {
				lodestoneCmds++
			}
		}
	}
	if phases["live"] == 0 || phases["stopped"] == 0 || lodestoneCmds < 5 || len(metrics) < 10 {
		t.Fatalf("runbook parsed to %d live and %d stopped blocks, %d lodestone commands, %d metrics: parser out of date?",
			phases["live"], phases["stopped"], lodestoneCmds, len(metrics))
	}

	binDir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(binDir, "lodestone"), "github.com/lodestone-kv/lodestone/cmd/lodestone")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build lodestone: %v\n%s", err, out)
	}
	dataDir := filepath.Join(t.TempDir(), "node")
	grpcAddr, httpAddr, peerAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	env := append(os.Environ(),
		"PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"),
		"DATA_DIR="+dataDir,
		"LODESTONE_ENDPOINTS="+grpcAddr,
		"METRICS_URL=http://"+httpAddr+"/metrics",
	)
	var outputs []ran
	run := func(line string) {
		t.Helper()
		cmd := exec.Command("sh", "-c", line)
		cmd.Env = env
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		if want := runbooks.ExpectedExit(line); code != want {
			t.Fatalf("%s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", line, code, want, stdout.String(), stderr.String())
		}
		outputs = append(outputs, ran{line, stdout.String(), stderr.String()})
		t.Logf("$ %s\n%s%s", line, stdout.String(), stderr.String())
	}

	// A real node, with some writes in its log.
	dev := exec.Command(filepath.Join(binDir, "lodestone"), "dev", "--data-dir", dataDir,
		"--grpc", grpcAddr, "--http", httpAddr, "--peer", peerAddr, "--log-level", "warn",
		// NB: the runbook needs the registry alone; the gateway's and DNS's
		// default ports may be held by whatever else runs on the host.
		"--no-gateway", "--dns", "")
	dev.Env = env
	devOut, err := dev.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var devErr bytes.Buffer
	dev.Stderr = &devErr
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	ready, drained := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(drained)
		sc := bufio.NewScanner(devOut)
		signaled := false
		for sc.Scan() {
			if !signaled && strings.Contains(sc.Text(), "lodestone dev is running") {
				close(ready)
				signaled = true
			}
		}
		if !signaled {
			close(ready)
		}
	}()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		_ = dev.Process.Signal(syscall.SIGTERM)
		timer := time.AfterFunc(30*time.Second, func() { _ = dev.Process.Kill() })
		<-drained
		err := dev.Wait()
		timer.Stop()
		if err != nil {
			t.Errorf("lodestone dev exited with %v; stderr:\n%s", err, devErr.String())
		}
	}
	t.Cleanup(stop)
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		t.Fatalf("lodestone dev did not start; stderr:\n%s", devErr.String())
	}
	// NB: the node prints its banner before it elects itself; /readyz says
	// when it has a leader. Polled with a deadline: another process's state.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("lodestone dev never became ready (%v); stderr:\n%s", err, devErr.String())
		}
	}
	for i := range 20 {
		run("lodestone kv put runbook/key" + strconv.Itoa(i) + " value" + strconv.Itoa(i))
	}

	for _, b := range blocks {
		if b.Phase == "live" {
			for _, l := range b.Lines {
				run(l)
			}
		}
	}
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range metrics {
		if !bytes.Contains(body, []byte("# TYPE "+m+" ")) {
			t.Errorf("the runbook names metric %s, which the node's /metrics does not have", m)
		}
	}

	stop()
	for _, b := range blocks {
		if b.Phase == "stopped" {
			for _, l := range b.Lines {
				run(l)
			}
		}
	}

	// The sample outputs show what the commands print.
	label := regexp.MustCompile(`^([A-Z][A-Z-]*(?: [A-Z][A-Z-]*)*)\s{2,}`)
	for _, text := range texts {
		for _, line := range text {
			var want string
			switch {
			case strings.HasPrefix(line, "lodestone: "):
				// An error line: the same sentence, with our data dir.
				want = strings.ReplaceAll(line, "/var/lib/lodestone", dataDir)
			default:
				m := label.FindStringSubmatch(line)
				if m == nil {
					continue
				}
				want = m[1]
			}
			found := false
			for _, o := range outputs {
				found = found || strings.Contains(o.stdout, want) || strings.Contains(o.stderr, want)
			}
			if !found {
				t.Errorf("the runbook shows %q, which no command printed", want)
			}
		}
	}
}
