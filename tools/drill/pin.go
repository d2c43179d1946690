package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// parseCPUs parses a taskset-style CPU list such as "0", "0,1" or "0-3".
func parseCPUs(s string) (unix.CPUSet, error) {
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

// pinSelf pins every thread of the drill to cpus and sets GOMAXPROCS to
// their number. NB: affinity is per thread and a new thread inherits its
// creator's, so passes repeat until one finds no thread not yet pinned.
func pinSelf(cpus string) error {
	set, err := parseCPUs(cpus)
	if err != nil {
		return err
	}
	pinned := map[int]bool{}
	for {
		tasks, err := os.ReadDir("/proc/self/task")
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
			runtime.GOMAXPROCS(set.Count())
			return nil
		}
	}
}
