package main

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/testnet"
	"github.com/lodestone-kv/lodestone/raftlog"
)

func TestProcsFor(t *testing.T) {
	for _, c := range []struct {
		current, floor int
		env            string
		want           int
	}{
		{1, 2, "", 2},  // one CPU: raised
		{4, 2, "", 4},  // enough already
		{1, 2, "1", 1}, // the operator's GOMAXPROCS wins
		{1, 1, "", 1},  // Go's choice
		{1, autoMinProcs(true), "", 1},
		{1, autoMinProcs(false), "", 2},
	} {
		if got := procsFor(c.current, c.floor, c.env); got != c.want {
			t.Errorf("procsFor(%d, %d, %q) = %d, want %d", c.current, c.floor, c.env, got, c.want)
		}
	}
	for _, bad := range []int{-1, 257} {
		if checkMinProcs(bad) == nil {
			t.Errorf("--min-procs %d accepted", bad)
		}
	}
}

// TestServerOnOneCPUProcs runs a real server confined to one CPU, where
// Go alone would run one P, and reads its GOMAXPROCS off /metrics: by
// default 1 where the log's fdatasync parks (Linux AIO) and 2 where it
// would block the P; 2 with --min-procs 2, unless the environment sets
// GOMAXPROCS=1.
func TestServerOnOneCPUProcs(t *testing.T) {
	t.Parallel()
	taskset, err := exec.LookPath("taskset")
	if err != nil {
		t.Fatalf("this test confines a server to one CPU with taskset (util-linux): %v", err)
	}
	bin := stampedBinary(t)
	gauge := regexp.MustCompile(`(?m)^go_sched_gomaxprocs_threads (\d+)$`)
	procs := func(minProcs string, env ...string) string {
		httpAddr := testnet.FreeAddr(t)
		cmd := exec.Command(taskset, "-c", "0", bin, "server", "--name", "p", "--data-dir", t.TempDir(),
			"--listen-peer", testnet.FreeAddr(t), "--listen-grpc", testnet.FreeAddr(t), "--listen-http", httpAddr, "--listen-dns", "", "--min-procs", minProcs)
		cmd.Env = append(os.Environ(), env...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() {
			cmd.Process.Kill()
			cmd.Wait()
		}()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			resp, err := http.Get("http://" + httpAddr + "/metrics")
			if err != nil {
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if m := gauge.FindSubmatch(body); m != nil {
				return string(m[1])
			}
		}
		t.Fatal("no go_sched_gomaxprocs_threads on /metrics within 20s")
		return ""
	}
	parks := raftlog.DatasyncParks(t.TempDir())
	if got, want := procs("0", "GOMAXPROCS="), strconv.Itoa(autoMinProcs(parks)); got != want {
		t.Errorf("on one CPU, log fdatasync parks %v: GOMAXPROCS %s, want %s", parks, got, want)
	}
	if got := procs("2", "GOMAXPROCS="); got != "2" {
		t.Errorf("on one CPU with --min-procs 2: GOMAXPROCS %s, want 2", got)
	}
	if got := procs("2", "GOMAXPROCS=1"); got != "1" {
		t.Errorf("on one CPU with --min-procs 2 and GOMAXPROCS=1 set: GOMAXPROCS %s, want 1", got)
	}
}
