package server

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
)

// The semaphore test re-runs this test binary as helper processes
// (TestSemaphoreHelperProcess), each a holder of one slot of a semaphore
// of limit 2.
const (
	semHelperAddr   = "LODESTONE_TEST_SEM_ADDR" // a member's HTTP address
	semPrefix       = "sem/job"
	semLimit        = 2
	semHelperOutput = "HELD"
)

// TestSemaphoreHelperProcess is not a test: it is the body of a helper
// process and skips unless semHelperAddr is set. It acquires a slot of
// the semaphore, prints HELD, holds it until its standard input closes,
// then releases it.
func TestSemaphoreHelperProcess(t *testing.T) {
	addr := os.Getenv(semHelperAddr)
	if addr == "" {
		t.Skip("helper process for the cross-process semaphore test")
	}
	// NB: the verdict is the exit code; exiting here skips the leak check,
	// which would trip on the client's session renewal goroutine.
	defer func() {
		code := 0
		if t.Failed() {
			code = 1
		}
		os.Exit(code)
	}()
	cfg := consul.DefaultConfig()
	cfg.Address = addr
	cfg.HttpClient = &http.Client{Transport: &http.Transport{}}
	cl, err := consul.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sem, err := cl.SemaphoreOpts(&consul.SemaphoreOptions{Prefix: semPrefix, Limit: semLimit, SessionTTL: "15s"})
	if err != nil {
		t.Fatal(err)
	}
	lost, err := sem.Acquire(nil)
	if err != nil || lost == nil {
		t.Fatalf("acquire: %v", err)
	}
	fmt.Println(semHelperOutput)
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	select {
	case <-done:
	case <-lost:
		t.Fatal("lost the slot while holding it")
	}
	if err := sem.Release(); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// semHolder is one helper process: lines carries what it prints, stdin
// closes to make it release.
type semHolder struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	held  chan struct{}
	out   *strings.Builder
}

func startSemHolder(t *testing.T, addr string) *semHolder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSemaphoreHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), semHelperAddr+"="+addr)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	h := &semHolder{cmd: cmd, stdin: stdin, held: make(chan struct{}), out: &strings.Builder{}}
	cmd.Stderr = h.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == semHelperOutput {
				close(h.held)
			}
		}
	}()
	t.Cleanup(func() {
		h.stdin.Close()
		if h.cmd.ProcessState == nil {
			h.cmd.Process.Kill()
			h.cmd.Wait()
		}
	})
	return h
}

func (h *semHolder) holds() bool {
	select {
	case <-h.held:
		return true
	default:
		return false
	}
}

// semLock reads the semaphore's lock key: its limit and its holders.
func semLock(t *testing.T, cl *consul.Client) (limit int, holders map[string]bool, contenders int) {
	t.Helper()
	pairs, _, err := cl.KV().List(semPrefix+"/", &consul.QueryOptions{RequireConsistent: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pairs {
		if strings.HasSuffix(p.Key, "/.lock") {
			var lock struct {
				Limit   int
				Holders map[string]bool
			}
			if err := json.Unmarshal(p.Value, &lock); err != nil {
				t.Fatalf("semaphore lock %q: %v", p.Value, err)
			}
			limit, holders = lock.Limit, lock.Holders
		} else if p.Session != "" {
			contenders++
		}
	}
	return limit, holders, contenders
}

// The official client's api.Semaphore with limit 2 admits exactly two of
// three processes, each on its own member; when a holder releases, the
// third is admitted.
func TestConsulSemaphoreAdmitsTwoOfThreeProcesses(t *testing.T) {
	c := newTestCluster(t, 3)
	c.waitLeader()
	cl := consulClient(t, c, c.names[0])
	var holders []*semHolder
	for _, name := range c.names {
		holders = append(holders, startSemHolder(t, c.servers[name].HTTPAddr()))
	}
	// Wait until all three contend and two hold.
	waitFor(t, 20*time.Second, func() bool {
		limit, in, contenders := semLock(t, cl)
		return limit == semLimit && len(in) == semLimit && contenders == 3
	})
	waitFor(t, 10*time.Second, func() bool {
		n := 0
		for _, h := range holders {
			if h.holds() {
				n++
			}
		}
		return n == semLimit
	})
	// The lock key names two holders and three contend: the third cannot
	// hold a slot, whatever it prints later.
	var waiting *semHolder
	var holding []*semHolder
	for _, h := range holders {
		if h.holds() {
			holding = append(holding, h)
		} else {
			waiting = h
		}
	}
	if waiting == nil || len(holding) != semLimit {
		t.Fatalf("%d holders, want exactly %d", len(holding), semLimit)
	}
	if _, in, _ := semLock(t, cl); len(in) != semLimit {
		t.Fatalf("lock key holders %v, want %d", in, semLimit)
	}
	if waiting.holds() {
		t.Fatalf("a third process holds a slot of a semaphore of limit %d", semLimit)
	}
	// One releases: the waiting process is admitted, still two hold.
	holding[0].stdin.Close()
	if err := holding[0].cmd.Wait(); err != nil {
		t.Fatalf("released holder: %v\n%s", err, holding[0].out)
	}
	select {
	case <-waiting.held:
	case <-time.After(20 * time.Second):
		t.Fatalf("the waiting process was not admitted after a release\n%s", waiting.out)
	}
	waitFor(t, 10*time.Second, func() bool {
		_, in, contenders := semLock(t, cl)
		return len(in) == semLimit && contenders == 2
	})
	for _, h := range []*semHolder{holding[1], waiting} {
		h.stdin.Close()
		if err := h.cmd.Wait(); err != nil {
			t.Fatalf("holder: %v\n%s", err, h.out)
		}
	}
	waitFor(t, 10*time.Second, func() bool {
		_, in, contenders := semLock(t, cl)
		return len(in) == 0 && contenders == 0
	})
}
