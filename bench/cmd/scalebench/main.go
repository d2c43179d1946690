// Command scalebench loads a large state into a three-process Lodestone
// cluster and a three-process etcd cluster on this machine and compares
// what the state costs: each member's resident memory, the snapshot size,
// and how long a member takes from process start to serving a
// linearizable read after a restart of one member and of all three. It
// prints one BENCH line per comparison (bench/README.md, "How benchmarks
// report"). Run it from bench/:
//
//	cd bench && go run ./cmd/scalebench [-keys 1000000] [-value-size 256] [-reps 3]
//
// Then, on Lodestone alone (etcd has no catalog), a catalog of -catalog-nodes
// nodes with -catalog-instances service instances registered through the
// Consul HTTP API, reported as FIGURE lines without a ratio.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

var (
	flagKeys           = flag.Int("keys", 1_000_000, "keys loaded into each system")
	flagValueSize      = flag.Int("value-size", 256, "bytes per value")
	flagBatch          = flag.Int("batch", 64, "puts per load transaction (Lodestone's and Consul's default maximum is 64)")
	flagWriters        = flag.Int("writers", 16, "concurrent load clients, one connection each")
	flagReps           = flag.Int("reps", 3, "restarts of one member, and of all three, per system; medians are reported")
	flagCatalogNodes   = flag.Int("catalog-nodes", 10_000, "nodes of the Lodestone catalog phase (0: skip the phase)")
	flagCatalogInst    = flag.Int("catalog-instances", 100_000, "service instances of the catalog phase, spread evenly over the nodes")
	flagSystems        = flag.String("systems", "lodestone,etcd", "systems to run; BENCH lines need both")
	flagServerCPUs     = flag.String("server-cpus", "1", `taskset CPU list for every server process of both systems ("" = no pinning)`)
	flagClientCPUs     = flag.String("client-cpus", "0", `CPU list the load generator pins itself to ("" = no pinning)`)
	flagWorkDir        = flag.String("work-dir", "", "where binaries and data dirs go (default: the system temp dir)")
	flagRoot           = flag.String("root", "..", "the lodestone module root, relative to bench/")
	flagKeep           = flag.Bool("keep", false, "keep binaries, data dirs and server logs after the run")
	flagPprof          = flag.String("pprof", "", "directory for each member's heap profile at the settle (SYSTEM-LOAD-ROLE.heap.pprof), both systems")
	flagRSSWindow      = flag.Duration("rss-window", 30*time.Second, "after the settle, how long to overwrite loaded keys while sampling RSS for the memory line (0: the settled RSS is the line, as before 2026-11-29)")
	flagRSSWriteRate   = flag.Int("rss-write-rate", 2000, "keys a second overwritten during -rss-window, in transactions of -batch")
	flagSettleTimeout  = flag.Duration("settle-timeout", 60*time.Second, "longest wait for the members' RSS to stop moving after the forced GC")
	flagLodestoneArgs  = flag.String("lodestone-args", "", "extra flags for every Lodestone member, space-separated (e.g. \"--snapshot-entries 5000\"), to weigh a setting; a run with them is not the benchmark's")
	flagRestartTimeout = flag.Duration("restart-timeout", 5*time.Minute, "longest wait for a restarted member to serve a read")
)

const peerName = "etcd"

// Targets of the issue: memory per member at most 0.7x etcd's, restart to
// serving at most 0.5x etcd's time.
const (
	rssTarget     = 0.7
	restartTarget = 0.5
)

func main() {
	harness.Main("scalebench", "servers stopped and temp dirs removed", run)
}

var logf = harness.NewLogf("scalebench")

func checkFlags() error {
	switch {
	case *flagKeys < 1 || *flagValueSize < 1 || *flagBatch < 1 || *flagWriters < 1 || *flagReps < 1:
		return errors.New("-keys, -value-size, -batch, -writers and -reps must be >= 1")
	case *flagCatalogNodes < 0 || (*flagCatalogNodes > 0 && *flagCatalogInst < *flagCatalogNodes):
		return errors.New("-catalog-nodes must be >= 0 and -catalog-instances at least -catalog-nodes")
	case *flagSettleTimeout <= 0 || *flagRestartTimeout <= 0:
		return errors.New("-settle-timeout and -restart-timeout must be > 0")
	case *flagRSSWindow < 0 || *flagRSSWriteRate < 1:
		return errors.New("-rss-window must be >= 0 and -rss-write-rate >= 1")
	}
	return nil
}

func run(ctx context.Context) error {
	if err := checkFlags(); err != nil {
		return err
	}
	if err := ensureDir(*flagPprof); err != nil {
		return err
	}
	root, err := filepath.Abs(*flagRoot)
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "lodestone")); err != nil {
		return fmt.Errorf("%w (run from bench/: cd bench && go run ./cmd/scalebench, or set -root)", err)
	}
	tmp, err := os.MkdirTemp(*flagWorkDir, "scalebench-")
	if err != nil {
		return fmt.Errorf("make temp dir: %w", err)
	}
	if *flagKeep {
		logf("keeping binaries, data and logs in %s", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}

	var systems []system
	for name := range strings.SplitSeq(*flagSystems, ",") {
		switch name = strings.TrimSpace(name); name {
		case "lodestone":
			bin := filepath.Join(tmp, "lodestone")
			if err := harness.GoBuild(ctx, logf, root, bin, "./cmd/lodestone"); err != nil {
				return err
			}
			systems = append(systems, lodestoneSystem(bin, strings.Fields(*flagLodestoneArgs)))
		case peerName:
			bin := filepath.Join(tmp, "etcdnode")
			if err := harness.GoBuild(ctx, logf, ".", bin, "./cmd/etcdnode"); err != nil {
				return err
			}
			systems = append(systems, etcdSystem(bin))
		default:
			return fmt.Errorf("-systems: unknown system %q (want lodestone, etcd)", name)
		}
	}
	pinning, err := harness.Pinning("scalebench", *flagServerCPUs, *flagClientCPUs)
	if err != nil {
		return err
	}
	logf("%s", pinning)

	keys := loadSpec{keys: *flagKeys, size: *flagValueSize, batch: *flagBatch, writers: *flagWriters}
	results := map[string]measured{}
	for _, sys := range systems {
		m, err := runSystem(ctx, sys, tmp, keys)
		if err != nil {
			return err
		}
		results[sys.name] = m
	}
	var catalog *measured
	cat := loadSpec{nodes: *flagCatalogNodes, instances: *flagCatalogInst, writers: *flagWriters}
	if i := slices.IndexFunc(systems, func(s system) bool { return s.name == "lodestone" }); *flagCatalogNodes > 0 && i >= 0 {
		m, err := runSystem(ctx, systems[i], tmp, cat)
		if err != nil {
			return err
		}
		catalog = &m
	}

	fmt.Printf("setup: 3-node clusters, 3 processes each on 127.0.0.1 loopback, fsync on, each system's defaults otherwise, one cluster at a time; "+
		"load: %s to the leader; RSS: one forced GC per member through the same call on both (GET /debug/pprof/heap?gc=1, runtime.GC), "+
		"then /proc/PID/statm sampled each %s until every member's moved under 1%% over %d samples (at most %s), then for %s while one client overwrites loaded keys at %d a second "+
		"(transactions of %d, the values they were loaded with): the line is the mean of the samples of the window, averaged over the three members (the settled RSS and the window's peak are FIGUREs); "+
		"snapshot: bytes of each system's operator snapshot stream from the leader (Lodestone Admin.SaveSnapshot, etcd Maintenance.Snapshot); "+
		"restart-one: SIGTERM of a follower, start, time from its process start to its first linearizable read of the last key loaded "+
		"(fresh connection per attempt, every %s); restart-all: the three stopped, started together, time until each has served one, the slowest; %d reps, medians\n",
		keys, settleEvery, settleSamples, *flagSettleTimeout, *flagRSSWindow, *flagRSSWriteRate, *flagBatch, pollInterval, *flagReps)
	fmt.Printf("pinning: %s\n", pinning)
	lode, okL := results["lodestone"]
	peer, okP := results[peerName]
	if okL && okP {
		for _, l := range lines(keys.label(), lode, peer) {
			fmt.Println(l)
		}
		fmt.Println(figure(fmt.Sprintf("scale-%s-snapshot-size", keys.label()), "MiB",
			[]string{"lodestone", peerName}, []float64{mib(lode.snapshot), mib(peer.snapshot)}))
		for _, f := range rssFigures(keys.label(), lode, peer) {
			fmt.Println(f)
		}
		for _, f := range cpuFigures(keys.label(), lode, peer) {
			fmt.Println(f)
		}
		fmt.Println(figure(fmt.Sprintf("scale-%s-data-dir-per-member", keys.label()), "MiB",
			[]string{"lodestone", peerName}, []float64{mib(mean(lode.data)), mib(mean(peer.data))}))
	} else {
		fmt.Println("no BENCH lines: they compare lodestone with etcd, and -systems ran only", *flagSystems)
	}
	if catalog != nil {
		for _, l := range catalogFigures(cat.label(), *catalog) {
			fmt.Println(l)
		}
	}
	return nil
}

// runSystem starts a fresh cluster of sys, loads it with spec, measures it
// and stops it.
func runSystem(ctx context.Context, sys system, tmp string, spec loadSpec) (measured, error) {
	logf("%s: starting a cluster for %s", sys.name, spec)
	c, err := startCluster(ctx, sys, tmp, *flagServerCPUs)
	if err != nil {
		return measured{}, err
	}
	m, err := measure(ctx, c, spec, spec.label())
	if serr := c.stop(); serr != nil && err == nil {
		err = serr
	}
	if err != nil {
		return measured{}, fmt.Errorf("%s, %s: %w", sys.name, spec.label(), err)
	}
	return m, nil
}

// lines are the BENCH lines of one key load.
func lines(label string, lode, peer measured) []harness.Line {
	return []harness.Line{
		{Name: "scale-" + label + "-rss-per-member", Unit: "MiB", Lodestone: mib(int64(lode.rssPerMember())),
			PeerName: peerName, Peer: mib(int64(peer.rssPerMember())), Op: "<=", Target: rssTarget},
		{Name: "scale-" + label + "-restart-one", Unit: "s", Lodestone: harness.Median(secondsOf(lode.restartOne)),
			PeerName: peerName, Peer: harness.Median(secondsOf(peer.restartOne)), Op: "<=", Target: restartTarget},
		{Name: "scale-" + label + "-restart-all", Unit: "s", Lodestone: harness.Median(secondsOf(lode.restartAll)),
			PeerName: peerName, Peer: harness.Median(secondsOf(peer.restartAll)), Op: "<=", Target: restartTarget},
	}
}

// rssFigures are the RSS figures beside the line's, each the mean over the
// three members: after the settle, and each member's highest sample in
// the write window.
func rssFigures(label string, lode, peer measured) []string {
	names := []string{"lodestone", peerName}
	out := []string{figure("scale-"+label+"-rss-settled", "MiB", names, []float64{mib(mean(lode.rss)), mib(mean(peer.rss))})}
	if lode.writes.peak != nil && peer.writes.peak != nil {
		out = append(out, figure("scale-"+label+"-rss-peak-under-writes", "MiB", names,
			[]float64{mib(mean(lode.writes.peak)), mib(mean(peer.writes.peak))}))
	}
	return out
}

// cpuFigures are the CPU time the restarted members used until they
// served: restart-one the member's, restart-all the three's together
// (medians over the reps). They back the wall-clock lines on a busy
// machine, where waiting for a core inflates the wall time.
func cpuFigures(label string, lode, peer measured) []string {
	names := []string{"lodestone", peerName}
	return []string{
		figure("scale-"+label+"-restart-one-cpu", "s", names,
			[]float64{harness.Median(secondsOf(lode.restartOneCPU)), harness.Median(secondsOf(peer.restartOneCPU))}),
		figure("scale-"+label+"-restart-all-cpu", "s", names,
			[]float64{harness.Median(secondsOf(lode.restartAllCPU)), harness.Median(secondsOf(peer.restartAllCPU))}),
	}
}

// catalogFigures are the Lodestone-only figures of the catalog load.
func catalogFigures(label string, m measured) []string {
	one := []string{"lodestone"}
	return []string{
		figure("scale-"+label+"-rss-per-member", "MiB", one, []float64{m.rssPerMember() / (1 << 20)}),
		figure("scale-"+label+"-snapshot-size", "MiB", one, []float64{mib(m.snapshot)}),
		figure("scale-"+label+"-restart-one", "s", one, []float64{harness.Median(secondsOf(m.restartOne))}),
		figure("scale-"+label+"-restart-all", "s", one, []float64{harness.Median(secondsOf(m.restartAll))}),
		figure("scale-"+label+"-restart-one-cpu", "s", one, []float64{harness.Median(secondsOf(m.restartOneCPU))}),
		figure("scale-"+label+"-restart-all-cpu", "s", one, []float64{harness.Median(secondsOf(m.restartAllCPU))}),
		figure("scale-"+label+"-load", "s", one, []float64{m.load.Seconds()}),
	}
}

// figure is a reported figure without a target:
//
//	FIGURE <name> <system>=<value><unit> ... [ratio=<first/second>]
func figure(name, unit string, names []string, values []float64) string {
	s := "FIGURE " + name
	for i, n := range names {
		s += fmt.Sprintf(" %s=%s%s", n, harness.FormatValue(values[i]), unit)
	}
	if len(values) == 2 && values[1] != 0 {
		s += fmt.Sprintf(" ratio=%.2f", values[0]/values[1])
	}
	return s
}

func mean(xs []int64) int64 {
	var sum int64
	for _, x := range xs {
		sum += x
	}
	return sum / int64(max(len(xs), 1))
}
