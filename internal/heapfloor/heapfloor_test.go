package heapfloor_test

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lodestone-kv/lodestone/internal/heapfloor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name               string
		floor, live, roots uint64
		base, want         int
	}{
		{"small live heap", 512 * mib, 40 * mib, 0, 100, 1180},
		{"roots count", 512 * mib, 40 * mib, 40 * mib, 100, 590},
		{"live at the floor", 512 * mib, 512 * mib, 0, 100, 100},
		{"live above the floor", 512 * mib, 600 * mib, 0, 100, 100},
		{"never below the process's own GOGC", 512 * mib, 300 * mib, 0, 200, 200},
		{"the runtime's minimum heap rules a tiny one", 512 * mib, 1 * mib, 0, 100, 12800},
		{"empty heap", 512 * mib, 0, 0, 100, 12800},
	} {
		if got := heapfloor.Percent(tc.floor, tc.live, tc.roots, tc.base); got != tc.want {
			t.Errorf("%s: Percent(%d, %d, %d, %d) = %d, want %d", tc.name, tc.floor, tc.live, tc.roots, tc.base, got, tc.want)
		}
	}
}

// gc reads the runtime's GOGC and heap goal.
func gc() (percent, goal uint64) {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}

// run starts heapfloor.Run and returns a stop that waits for it.
func run(t *testing.T, floor uint64) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		heapfloor.Run(ctx, floor, time.Millisecond)
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return stop
}

// withGOGC sets GOGC for one test and puts the old one back after it.
func withGOGC(t *testing.T, p int) {
	old := debug.SetGCPercent(p)
	t.Cleanup(func() { debug.SetGCPercent(old) })
}

func TestRunRaisesTheGoalToTheFloorAndRestores(t *testing.T) {
	withGOGC(t, 100)
	const floor = 256 << 20
	stop := run(t, floor)
	runtime.GC()
	// NB: Run retunes within a millisecond of the cycle's end.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, goal := gc(); goal >= floor*9/10 && goal <= floor*11/10 {
			break
		}
		if time.Now().After(deadline) {
			p, goal := gc()
			t.Fatalf("heap goal %d with GOGC %d after 5s, want %d within 10%%", goal, p, floor)
		}
	}
	stop()
	if p, _ := gc(); p != 100 {
		t.Fatalf("GOGC %d after Run returned, want 100 back", p)
	}
}

func TestRunStepsBackWhenTheHeapOutgrowsTheFloor(t *testing.T) {
	withGOGC(t, 100)
	run(t, 16<<20)
	runtime.GC()
	waitGOGC(t, "raised over a tiny heap", func(p uint64) bool { return p > 100 })
	live := make([]byte, 64<<20)
	runtime.GC()
	waitGOGC(t, "back at 100 with 64 MiB live over a 16 MiB floor", func(p uint64) bool { return p == 100 })
	runtime.KeepAlive(live)
}

// waitGOGC waits up to 5s for GOGC to satisfy ok.
func waitGOGC(t *testing.T, what string, ok func(uint64) bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		p, _ := gc()
		if ok(p) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GOGC %d after 5s, want it %s", p, what)
		}
	}
}

func TestRunLeavesGOGCOff(t *testing.T) {
	withGOGC(t, -1)
	// NB: Run returns on its own, without ctx ending, when it has nothing to do.
	heapfloor.Run(context.Background(), 256<<20, time.Millisecond)
	if p := debug.SetGCPercent(-1); p != -1 {
		t.Fatalf("GOGC %d after Run, want it left off", p)
	}
}
