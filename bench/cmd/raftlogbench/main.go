// Command raftlogbench measures fsynced 16 KiB append latency of four Raft
// logs — Lodestone's raftlog, hashicorp/raft-boltdb (v1, BoltDB), raft-boltdb
// v2 with default options, and raft-wal — on a fresh file and on a file with
// the shape of the Roblox/Consul outage's (a log that once held gigabytes
// and was truncated to a small live tail, leaving >= 500k free pages), then
// rotates Lodestone's bloated file online while appending, and prints one
// BENCH line per comparison (bench/README.md, "How benchmarks report").
// Run it from bench/:
//
//	cd bench && go run ./cmd/raftlogbench [-reps 3] [-free-pages 550000] [-live-mib 256]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

var (
	flagReps       = flag.Int("reps", 3, "repetitions of every measurement; medians are reported (use an odd number)")
	flagAppends    = flag.Int("appends", 600, "measured rounds per repetition: one append to every store and file each")
	flagMinAppends = flag.Int("min-appends", 200, "rounds measured even when -max-time is up")
	flagMaxTime    = flag.Duration("max-time", 30*time.Second, "time cap on one repetition's rounds (after -min-appends)")
	flagWarmup     = flag.Int("warmup", 20, "appends before each measurement, not counted")
	flagEntrySize  = flag.Int("entry-size", 16<<10, "bytes of data per entry (the outage's appends were 16 KiB)")
	flagLiveMiB    = flag.Int("live-mib", 128, "MiB of entries left in the log after truncation")
	flagFreePages  = flag.Int("free-pages", 1_000_000, "free 4 KiB pages wanted after truncation, like the outage's file (at least 500000); sets how many entries are truncated")
	flagBatch      = flag.Int("build-batch", 512, "entries per append while building the bloated files")
	flagStores     = flag.String("stores", "lodestone,raft-boltdb,raft-boltdb-v2,raft-wal", "stores to run; BENCH lines need all four")
	flagCPUs       = flag.String("cpus", "", `CPU list this process pins itself to, e.g. "1" ("" = no pinning)`)
	flagWorkDir    = flag.String("work-dir", "", "where the log files go (default: the system temp dir); needs ~3 GiB per store plus one copy")
	flagKeep       = flag.Bool("keep", false, "keep the built files after the run")
)

// Targets from the issue.
const (
	targetBloatedVsFresh = 1.2  // Lodestone p99 on the bloated file over its fresh-file p99
	targetVsBoltV1       = 0.1  // at least 10x better than raft-boltdb v1 on the bloated file
	targetVsBoltV2       = 1.0  // no target in the issue: at least as good
	targetVsWAL          = 1.0  // at most raft-wal's latency
	targetRotationP99    = 50.0 // ms: append p99 while the bloated file rotates
	targetRotatedSize    = 1.5  // rotated file size over live data
)

var logf = harness.NewLogf("raftlogbench")

func main() {
	harness.Main("raftlogbench", "temp files removed", run)
}

func run(ctx context.Context) error {
	if *flagReps < 1 || *flagAppends < 1 || *flagEntrySize < 1 || *flagBatch < 1 {
		return errors.New("-reps, -appends, -entry-size and -build-batch must be positive")
	}
	var kinds []storeKind
	for name := range strings.SplitSeq(*flagStores, ",") {
		k, err := kindByName(strings.TrimSpace(name))
		if err != nil {
			return fmt.Errorf("-stores: %w", err)
		}
		kinds = append(kinds, k)
	}
	pinning, err := pin(*flagCPUs)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp(*flagWorkDir, "raftlogbench-")
	if err != nil {
		return err
	}
	if *flagKeep {
		logf("keeping files in %s", work)
	} else {
		defer os.RemoveAll(work)
	}
	data := make([]byte, *flagEntrySize)
	for k := range data {
		data[k] = byte(k*7 + k>>8)
	}
	// NB: bbolt stores a 16 KiB entry in a bit more than four pages (leaf
	// headers, keys, leaves of 3-4 entries): 1 KiB of overhead per entry
	// lands -free-pages just above the target; the build checks it.
	shape := bloatShape{
		live:  uint64(*flagLiveMiB) << 20 / uint64(*flagEntrySize),
		trunc: uint64(*flagFreePages) * 4096 / uint64(*flagEntrySize+1024),
	}
	logf("pinning: %s", pinning)

	// 1. Build one bloated file per store; every later phase reuses it.
	// NB: one at a time: the truncation walks the leaves just written, which
	// are still in the page cache; four builds at once evicted them and the
	// truncations read gigabytes back from disk for minutes.
	built := map[string]buildResult{}
	var rotDirs []string // 3. needs one bloated Lodestone file per repetition
	for _, k := range kinds {
		b, err := buildBloated(ctx, k, filepath.Join(work, k.name, "bloated"), shape, data)
		if err != nil {
			return fmt.Errorf("build %s: %w", k.name, err)
		}
		built[k.name] = b
		if k.name != nameLodestone {
			continue
		}
		// Copy it now, while it is in the page cache, and long before the
		// rotation is measured, so the disk has settled from writing the
		// copies. The last repetition uses the original.
		for rep := range *flagReps {
			dir := b.dir
			if rep < *flagReps-1 {
				dir = filepath.Join(work, fmt.Sprintf("rotate-%d", rep))
				logf("copying lodestone's bloated file for rotation repetition %d", rep+1)
				if err := copyDir(b.dir, dir); err != nil {
					return fmt.Errorf("copy lodestone's bloated file: %w", err)
				}
			}
			rotDirs = append(rotDirs, dir)
		}
	}

	// 2. Append latency on the bloated file and on a fresh one: every store
	// and file open at once, one append each per round, so all see the
	// same machine noise. The bloated stores stay open across repetitions;
	// each repetition gets new fresh ones.
	res := map[string]map[string][]latencies{} // store -> file -> reps
	var bloated []*target
	defer func() {
		for _, t := range bloated {
			_ = t.s.close()
		}
	}()
	for _, k := range kinds {
		res[k.name] = map[string][]latencies{}
		t, err := openTarget(k, fileBloated, built[k.name].dir)
		if err != nil {
			return fmt.Errorf("open %s's bloated file: %w", k.name, err)
		}
		bloated = append(bloated, t)
	}
	for rep := range *flagReps {
		targets := slices.Clone(bloated)
		for _, k := range kinds {
			t, err := openTarget(k, fileFresh, filepath.Join(work, k.name, fmt.Sprintf("fresh-%d", rep)))
			if err != nil {
				return fmt.Errorf("open a fresh %s: %w", k.name, err)
			}
			targets = append(targets, t)
		}
		logf("measuring: repetition %d/%d, %d stores x 2 files, one append each per round", rep+1, *flagReps, len(kinds))
		lats, err := measureRounds(ctx, targets, data)
		for _, t := range targets[len(bloated):] {
			if cerr := t.s.close(); cerr != nil && err == nil {
				err = cerr
			}
		}
		if err != nil {
			return err
		}
		for i, t := range targets {
			res[t.kind.name][t.file] = append(res[t.kind.name][t.file], lats[i])
			fmt.Printf("run rep=%d/%d store=%s file=%s appends=%d p50=%.3fms p99=%.3fms max=%.3fms\n",
				rep+1, *flagReps, t.kind.name, t.file, len(lats[i].sorted), lats[i].p(50), lats[i].p(99), lats[i].p(100))
		}
	}
	for _, t := range bloated {
		if err := t.s.close(); err != nil {
			return fmt.Errorf("close %s's bloated file: %w", t.kind.name, err)
		}
	}
	bloated = nil

	// 2b. Back to back on a fresh file, one store at a time (the order
	// rotating between repetitions), so a store's background work overlaps
	// its own appends and nobody else's.
	b2b := map[string][]latencies{}
	for rep := range *flagReps {
		for k := range kinds {
			kind := kinds[(k+rep)%len(kinds)]
			logf("back to back: repetition %d/%d, %s", rep+1, *flagReps, kind.name)
			lat, err := measureBackToBack(ctx, kind, filepath.Join(work, kind.name, fmt.Sprintf("b2b-%d", rep)), data)
			if err != nil {
				return err
			}
			b2b[kind.name] = append(b2b[kind.name], lat)
			fmt.Printf("run rep=%d/%d store=%s file=fresh back-to-back appends=%d p50=%.3fms p99=%.3fms max=%.3fms\n",
				rep+1, *flagReps, kind.name, len(lat.sorted), lat.p(50), lat.p(99), lat.p(100))
		}
	}

	// 3. Online rotation of Lodestone's bloated file while appending.
	var rot []rotationRun
	for rep, dir := range rotDirs {
		r, err := measureRotation(ctx, dir, data)
		if err != nil {
			return fmt.Errorf("rotation: %w", err)
		}
		rot = append(rot, r)
		fmt.Printf("run rep=%d/%d rotation appends=%d p50=%.3fms p99=%.3fms max=%.3fms pause=%.3fms took=%.2fs file=%s->%s live=%s\n",
			rep+1, *flagReps, len(r.lat.sorted), r.lat.p(50), r.lat.p(99), r.lat.p(100), harness.Millis(r.pause),
			r.took.Seconds(), mib(r.beforeBytes), mib(r.afterBytes), mib(r.liveBytes))
	}

	report(kinds, built, res, b2b, rot, pinning)
	return nil
}

// report prints the summary table, the setup and the BENCH lines.
func report(kinds []storeKind, built map[string]buildResult, res map[string]map[string][]latencies,
	b2b map[string][]latencies, rot []rotationRun, pinning string) {
	fmt.Println()
	fmt.Printf("%-16s %-13s %10s %10s   (medians over %d repetitions)\n", "store", "file", "p50", "p99", *flagReps)
	for _, k := range kinds {
		for _, file := range []string{fileBloated, fileFresh} {
			fmt.Printf("%-16s %-13s %8.3fms %8.3fms\n", k.name, file, median(res[k.name][file], 50), median(res[k.name][file], 99))
		}
		fmt.Printf("%-16s %-13s %8.3fms %8.3fms\n", k.name, "fresh, b2b", median(b2b[k.name], 50), median(b2b[k.name], 99))
	}
	fmt.Println()
	fmt.Printf("setup: %d-byte entries, one entry per fsynced append call (Save / StoreLogs); every store on its bloated and "+
		"a fresh file open at once and appended to in turn, one append each per round, a GC between rounds (untimed), "+
		"%d measured rounds (at least %d, capped at %s) after %d warm-up rounds per repetition; %d repetitions, "+
		"medians of per-repetition percentiles reported; after each append, untimed, the store's background work is waited for "+
		"(Lodestone's checkpoint into raft.db) so it never lands in another store's append. "+
		"Back to back (b2b): each store alone on a fresh file, %d appends after %d untimed, its background work overlapping its own appends\n",
		*flagEntrySize, *flagAppends, *flagMinAppends, *flagMaxTime, *flagWarmup, *flagReps, *flagAppends, *flagWarmup)
	for _, k := range kinds {
		b := built[k.name]
		free := "no freelist"
		if b.freeOK {
			free = fmt.Sprintf("%d free pages", b.freePages)
		}
		fmt.Printf("bloated %s: wrote %d entries (%s), truncated to the last %d: file %s, %s; %s\n",
			k.name, b.entries, mib(b.written), b.live, mib(b.fileBytes), free, k.about)
	}
	fmt.Printf("pinning: %s\n", pinning)

	if len(rot) > 0 {
		var p99s, ratios, pauses []float64
		for _, r := range rot {
			p99s = append(p99s, r.lat.p(99))
			ratios = append(ratios, float64(r.afterBytes)/float64(r.liveBytes))
			pauses = append(pauses, harness.Millis(r.pause))
		}
		fmt.Printf("rotation: a copy of lodestone's bloated file (the last repetition: the file itself) opened with default Options, so the Log's own goroutine "+
			"rotates it (over 50%% free, over 64 MiB) while one writer appends back to back until Stats reports it done; "+
			"median write-lock pause %.2fms\n", harness.Median(pauses))
		defer func() {
			var after, live []float64
			for _, r := range rot {
				after = append(after, float64(r.afterBytes)/(1<<20))
				live = append(live, float64(r.liveBytes)/(1<<20))
			}
			fmt.Println(harness.Line{Name: "raftlog-rotation-append-p99", Unit: "ms", Lodestone: harness.Median(p99s),
				PeerName: "limit", Peer: targetRotationP99, Op: "<=", Target: 1.0})
			fmt.Println(harness.Line{Name: "raftlog-rotated-file-size", Unit: "MiB", Lodestone: harness.Median(after),
				PeerName: "live", Peer: harness.Median(live), Op: "<=", Target: targetRotatedSize})
		}()
	}
	if !hasAll(kinds) {
		fmt.Println("(BENCH lines need all four stores)")
		return
	}
	for _, p := range []float64{50, 99} {
		q := fmt.Sprintf("p%.0f", p)
		lb, lf := median(res[nameLodestone][fileBloated], p), median(res[nameLodestone][fileFresh], p)
		fmt.Println(harness.Line{Name: "raftlog-append-" + q + "-bloated-vs-fresh", Unit: "ms", Lodestone: lb,
			PeerName: "fresh", Peer: lf, Op: "<=", Target: targetBloatedVsFresh})
		fmt.Println(harness.Line{Name: "raftlog-append-" + q + "-bloated-vs-raft-boltdb", Unit: "ms", Lodestone: lb,
			PeerName: nameBoltV1, Peer: median(res[nameBoltV1][fileBloated], p), Op: "<=", Target: targetVsBoltV1})
		fmt.Println(harness.Line{Name: "raftlog-append-" + q + "-bloated-vs-raft-boltdb-v2", Unit: "ms", Lodestone: lb,
			PeerName: nameBoltV2, Peer: median(res[nameBoltV2][fileBloated], p), Op: "<=", Target: targetVsBoltV2})
		fmt.Println(harness.Line{Name: "raftlog-append-" + q + "-bloated-vs-raft-wal", Unit: "ms", Lodestone: lb,
			PeerName: nameWAL, Peer: median(res[nameWAL][fileBloated], p), Op: "<=", Target: targetVsWAL})
		fmt.Println(harness.Line{Name: "raftlog-append-" + q + "-fresh-vs-raft-wal", Unit: "ms", Lodestone: lf,
			PeerName: nameWAL, Peer: median(res[nameWAL][fileFresh], p), Op: "<=", Target: targetVsWAL})
		fmt.Println(harness.Line{Name: "raftlog-append-" + q + "-back-to-back-vs-raft-wal", Unit: "ms",
			Lodestone: median(b2b[nameLodestone], p), PeerName: nameWAL, Peer: median(b2b[nameWAL], p), Op: "<=", Target: targetVsWAL})
	}
}

func hasAll(kinds []storeKind) bool {
	seen := map[string]bool{}
	for _, k := range kinds {
		seen[k.name] = true
	}
	return seen[nameLodestone] && seen[nameBoltV1] && seen[nameBoltV2] && seen[nameWAL]
}

// median is the median over repetitions of each repetition's p-th
// percentile, in milliseconds.
func median(reps []latencies, p float64) float64 {
	var xs []float64
	for _, r := range reps {
		xs = append(xs, r.p(p))
	}
	return harness.Median(xs)
}

func mib(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.2fGiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
}

// pin applies -cpus to every thread of this process and returns the sentence
// the output uses to state the pinning.
func pin(cpus string) (string, error) {
	if cpus == "" {
		return fmt.Sprintf("unpinned: one process runs every store in turn (GOMAXPROCS=%d, machine has %d CPUs)",
			runtime.GOMAXPROCS(0), runtime.NumCPU()), nil
	}
	if err := pinSelf(cpus); err != nil {
		return "", fmt.Errorf("-cpus %s: %w", cpus, err)
	}
	return fmt.Sprintf("this process, which runs every store in turn, was pinned to CPU list %s (GOMAXPROCS=%d, machine has %d CPUs)",
		cpus, runtime.GOMAXPROCS(0), runtime.NumCPU()), nil
}
