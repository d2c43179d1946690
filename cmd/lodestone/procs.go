package main

import (
	"fmt"
	"log/slog"
	"runtime"
)

// A server on one CPU (a pinned process, or a one-CPU quota, which Go
// reads for GOMAXPROCS) runs one P, unless its log's fdatasync would hold
// that P. The log waits for the disk parked in Go's poller where the
// kernel offers Linux AIO (raftlog.DatasyncParks); there one P is the
// faster setting, with no second thread contending for the CPU on every
// other request. Where it cannot, the fdatasync is a blocking system call,
// taken several hundred times a second under writes, and with one P no
// request is read and no commit answered until the runtime hands the P
// on: such a server runs two Ps. --min-procs sets the floor by hand.
// Figures for both settings are in the commits that made them.

// minProcsDefault is --min-procs's default: automatic.
const minProcsDefault = 0

// autoMinProcs is the floor --min-procs 0 stands for: 2 where the log's
// fdatasync blocks a thread, 1 (Go's choice) where it parks.
func autoMinProcs(datasyncParks bool) int {
	if datasyncParks {
		return 1
	}
	return 2
}

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
		return fmt.Errorf("--min-procs %d: use 0 (automatic) or 1 to 256", n)
	}
	return nil
}
