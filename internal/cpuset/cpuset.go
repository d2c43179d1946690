// Package cpuset pins processes to CPUs by taskset-style lists ("0",
// "0,1", "0-3"), for the programs that measure Lodestone against its
// peers: the benchmarks and the drill pin servers and load generators
// apart so that one does not take the other's core.
package cpuset

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Parse parses a taskset-style CPU list such as "0", "0,1" or "0-3".
func Parse(s string) (unix.CPUSet, error) {
	var set unix.CPUSet
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return set, fmt.Errorf("bad CPU list %q", s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return set, fmt.Errorf("bad CPU list %q", s)
			}
		}
		for cpu := a; cpu <= b; cpu++ {
			set.Set(cpu)
		}
	}
	return set, nil
}

// PinSelf pins every thread of this process to the CPU list cpus and sets
// GOMAXPROCS to its size.
func PinSelf(cpus string) error {
	if err := pinTasks("/proc/self/task", cpus); err != nil {
		return err
	}
	set, _ := Parse(cpus) // pinTasks parsed it
	runtime.GOMAXPROCS(set.Count())
	return nil
}

// Pin moves every thread of the running process pid to the CPU list
// cpus, for a benchmark that learns only after start which member plays
// which role. A Go server keeps the GOMAXPROCS it read at start.
func Pin(pid int, cpus string) error {
	return pinTasks(fmt.Sprintf("/proc/%d/task", pid), cpus)
}

// pinTasks pins each thread listed in dir (a /proc/PID/task). NB: Linux
// affinity is per thread; threads a Go runtime starts later are cloned
// from one of these and inherit the mask. A thread cloned during the
// pass may inherit the old mask, so passes repeat until one finds no
// thread it had not pinned.
func pinTasks(dir, cpus string) error {
	set, err := Parse(cpus)
	if err != nil {
		return err
	}
	pinned := map[int]bool{}
	for {
		tasks, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		fresh := 0
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil || pinned[tid] {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil {
				return fmt.Errorf("pin thread %d to CPUs %s: %w", tid, cpus, err)
			}
			pinned[tid] = true
			fresh++
		}
		if fresh == 0 {
			return nil
		}
	}
}
