package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// pin applies -client-cpus to this process and returns the sentence the
// output uses to state the pinning. Server pinning (-server-cpus) is applied
// by harness.Start through taskset, identically for both systems.
func pin() (string, error) {
	servers := "every server process ran unpinned"
	if *flagServerCPUs != "" {
		if _, err := parseCPUs(*flagServerCPUs); err != nil {
			return "", fmt.Errorf("-server-cpus: %w", err)
		}
		servers = fmt.Sprintf("every server process of every system ran under the same `taskset -c %s`", *flagServerCPUs)
	}
	client := "the load generator ran unpinned"
	if *flagClientCPUs != "" {
		set, err := parseCPUs(*flagClientCPUs)
		if err != nil {
			return "", fmt.Errorf("-client-cpus: %w", err)
		}
		if err := pinSelf(set); err != nil {
			return "", fmt.Errorf("pin load generator to CPUs %s: %w", *flagClientCPUs, err)
		}
		client = fmt.Sprintf("the load generator (watchbench) was pinned to CPU list %s (GOMAXPROCS=%d)", *flagClientCPUs, runtime.GOMAXPROCS(0))
	}
	return fmt.Sprintf("%s; %s; machine has %d CPUs", servers, client, runtime.NumCPU()), nil
}

// parseCPUs parses a taskset-style list such as "0", "0,1" or "0-3".
func parseCPUs(s string) (unix.CPUSet, error) {
	var set unix.CPUSet
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
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

// pinSelf sets the affinity of every thread of this process. NB: Linux
// affinity is per thread; threads the runtime starts later are cloned from
// one of these and inherit the mask, so pinning them all once is enough.
func pinSelf(set unix.CPUSet) error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			return fmt.Errorf("thread %d: %w", tid, err)
		}
	}
	runtime.GOMAXPROCS(set.Count())
	return nil
}
