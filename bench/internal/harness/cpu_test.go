package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/cpuset"
	"golang.org/x/sys/unix"
)

// CPUTime counts in clock ticks (10ms), so the test burns CPU until a
// tick shows, and fails only if 2s of spinning never shows one.
func TestCPUTime(t *testing.T) {
	start := time.Now()
	x := 0
	for {
		for i := range 1_000_000 {
			x += i
		}
		d, err := CPUTime(os.Getpid())
		if err != nil {
			t.Fatalf("CPUTime(self): %v", err)
		}
		if d > 0 {
			return
		}
		if time.Since(start) > 2*time.Second {
			t.Fatalf("CPUTime(self) = %v after 2s of spinning (x=%d)", d, x)
		}
	}
}

// Repin moves a running process, every thread of it, to another CPU list.
func TestRepin(t *testing.T) {
	p, err := Start("sleeper", "sleep", []string{"60"}, filepath.Join(t.TempDir(), "sleeper.log"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := p.Stop(5 * time.Second); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	if err := cpuset.Pin(p.Pid(), "0"); err != nil {
		t.Fatalf("cpuset.Pin(%d, 0): %v", p.Pid(), err)
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", p.Pid(), task.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "Cpus_allowed_list:\t0\n") {
			t.Errorf("thread %s after Repin to CPU 0:\n%s", task.Name(), b)
		}
	}
	if err := cpuset.Pin(p.Pid(), "x"); err == nil {
		t.Error("Repin to CPU list \"x\" succeeded")
	}
}

func TestCoreBusy(t *testing.T) {
	before, err := parseCPUTicks(`cpu  300 0 300 300 0 0 0 0 0 0
cpu0 100 0 100 100 0 0 0 0 0 0
cpu1 200 0 200 200 0 0 0 0 0 0
intr 1 2 3
`)
	if err != nil {
		t.Fatal(err)
	}
	// Over the interval cpu1 was busy 96 of 100 ticks: 42 user, 40
	// system, 12 softirq, 2 steal, then 3 idle and 1 iowait. cpu0 was idle.
	after, err := parseCPUTicks(`cpu  340 0 340 400 1 0 12 2 5 0
cpu0 100 0 100 200 0 0 0 0 0 0
cpu1 242 0 240 203 1 0 12 2 5 0
`)
	if err != nil {
		t.Fatal(err)
	}
	var one, both unix.CPUSet
	one.Set(1)
	both.Set(0)
	both.Set(1)
	if got, want := CoreBusy(before, after, one), "96%(kernel=52%)"; got != want {
		t.Errorf("cpu 1: got %s, want %s", got, want)
	}
	if got, want := CoreBusy(before, after, both), "48%(kernel=26%)"; got != want {
		t.Errorf("cpus 0-1: got %s, want %s", got, want)
	}
	if _, err := parseCPUTicks("cpu0 1 2 x 4 5 6 7 8\n"); err == nil {
		t.Error("a bad field parsed")
	}
	if _, err := ReadCPUTicks(); err != nil {
		t.Errorf("this machine's /proc/stat: %v", err)
	}
}
