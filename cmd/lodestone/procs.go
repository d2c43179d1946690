package main

import (
	"fmt"
	"log/slog"
	"runtime"
)

// A server runs Go with at least --min-procs Ps (GOMAXPROCS), even when
// its CPU set or quota gives Go fewer. Why: the log's fdatasync is a
// blocking system call, taken several hundred times a second under
// writes. With one P, the goroutine in it holds the P, and until the
// runtime hands the P to another thread no request is read, no commit
// is answered and no network input is noticed. A second P lets the
// process go on during every fsync; the two share the CPU the kernel
// allows. Measured on the Consul API puts with every server pinned to
// one CPU (figures in the commit that added it): more puts per second
// and a lower p99 with 2 Ps than with 1.

// minProcsDefault is --min-procs's default.
const minProcsDefault = 2

// raiseProcs raises GOMAXPROCS to floor when Go chose fewer and the
// environment did not set it (an explicit GOMAXPROCS wins), and logs it.
func raiseProcs(floor int, env string, logger *slog.Logger) {
	now := runtime.GOMAXPROCS(0)
	if to := procsFor(now, floor, env); to != now {
		runtime.GOMAXPROCS(to)
		logger.Info("raised GOMAXPROCS so a log fsync never holds the only P", "from", now, "to", to, "cpus", runtime.NumCPU())
	}
}

// procsFor is how many Ps a server runs with: at least floor unless env
// (the GOMAXPROCS variable) sets the number.
func procsFor(current, floor int, env string) int {
	if env != "" || current >= floor {
		return current
	}
	return floor
}

func checkMinProcs(n int) error {
	if n < 0 || n > 256 {
		return fmt.Errorf("--min-procs %d: use 0 (Go's choice) or 1 to 256", n)
	}
	return nil
}
