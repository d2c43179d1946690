// Command kvbench runs the same workloads against a three-process
// Lodestone cluster and a three-process etcd cluster on this machine and
// prints one BENCH line per comparison (see bench/README.md, "How
// benchmarks report"). Run it from bench/:
//
//	cd bench && go run ./cmd/kvbench [-reps 3] [-workloads all] [-clients 1,64] [-secure=false]
//
// The workloads (-workloads selects groups of them): puts at each -clients
// count, each system also secured (TLS with client certificates on every
// port, access control on) at 64 clients unless -secure=false; 64 KiB
// puts; and, on one cluster preloaded with 10,000 keys, linearizable gets
// at 1 and 64 clients, stale (etcd: serializable) gets, 100-key ranges, a
// 90/10 get/put mix at 64 clients and the same mix from 1,000 clients over
// 100 connections.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

var (
	flagReps         = flag.Int("reps", 3, "repetitions of every workload per system; medians are reported")
	flagDuration     = flag.Duration("duration", 8*time.Second, "measured window of each put run (puts and 64 KiB puts)")
	flagWarmup       = flag.Duration("warmup", 2*time.Second, "warm-up before each put run's window (ops run, not counted)")
	flagClients      = flag.String("clients", "1,64", "comma-separated client counts")
	flagValueSize    = flag.Int("value-size", 256, "bytes per value of the puts, the preloaded keys and the mix's puts (not the 64 KiB puts)")
	flagPerConn      = flag.Int("clients-per-conn", 8, "clients sharing one gRPC connection to the leader (same for both systems)")
	flagServerCPUs   = flag.String("server-cpus", "1", `taskset CPU list for every server process of both systems ("" = no pinning)`)
	flagClientCPUs   = flag.String("client-cpus", "0", `CPU list the load generator pins itself to ("" = no pinning)`)
	flagSystems      = flag.String("systems", "lodestone,etcd", "systems to run; BENCH lines need both")
	flagWorkDir      = flag.String("work-dir", "", "where binaries and data dirs go (default: the system temp dir)")
	flagRoot         = flag.String("root", "..", "the lodestone module root, relative to bench/")
	flagKeep         = flag.Bool("keep", false, "keep binaries, data dirs and server logs after the run")
	flagPprof        = flag.String("pprof", "", "directory for CPU and allocation profiles of every Lodestone server over each run's measured window (SYSTEM-WORKLOAD-rREP-ROLE.pprof, .allocs-base.pprof and .allocs.pprof; ROLE leader, f1, f2); runs Lodestone with --enable-pprof and fetches them over TLS with the management token on a secure run, so a profiled run's figures are not the benchmark's")
	flagWorkloads    = flag.String("workloads", "all", "workloads to run: all, or a comma-separated list of "+strings.Join(groups, ", ")+" (bench/README.md says what each is)")
	flagReadWarmup   = flag.Duration("read-warmup", 1*time.Second, "warm-up before each read workload's window (get, stale, range, mix, clients1000)")
	flagReadDuration = flag.Duration("read-duration", 5*time.Second, "measured window of each read workload (they run back to back on one preloaded cluster)")
	flagSecure       = flag.Bool("secure", true, fmt.Sprintf("also run each system secured (mutual TLS on every port, Lodestone ACLs / etcd auth) at %d clients", secureClients))
)

// secureClients is the client count of the secure runs.
const secureClients = 64

const peerName = "etcd"

// targets are the ratios Lodestone must reach, keyed by client count; the
// 64-client throughput target comes from the issue, the rest say "at least
// as good as etcd".
func targets(clients int) (throughput, p99 float64) {
	if clients >= 64 {
		return 1.5, 1.0
	}
	return 1.0, 1.0
}

func main() {
	harness.Main("kvbench", "servers stopped and temp dirs removed", run)
}

// sample is what one run contributes to the medians.
type sample struct {
	throughput float64 // ops/s
	p99        float64 // ms
}

func run(ctx context.Context) error {
	clientCounts, err := parseInts(*flagClients)
	if err != nil {
		return fmt.Errorf("-clients: %w", err)
	}
	selected, err := parseWorkloads(*flagWorkloads)
	if err != nil {
		return fmt.Errorf("-workloads: %w", err)
	}
	if *flagReps < 1 || *flagPerConn < 1 || *flagValueSize < 1 {
		return fmt.Errorf("-reps, -clients-per-conn and -value-size must be >= 1")
	}
	if *flagDuration <= 0 || *flagReadDuration <= 0 || *flagWarmup < 0 || *flagReadWarmup < 0 {
		return fmt.Errorf("-duration and -read-duration must be > 0, -warmup and -read-warmup >= 0")
	}
	root, err := filepath.Abs(*flagRoot)
	if err != nil {
		return err
	}
	if err := checkModule(root, "github.com/lodestone-kv/lodestone"); err != nil {
		return fmt.Errorf("%w (run from bench/: cd bench && go run ./cmd/kvbench, or set -root)", err)
	}
	if err := checkModule(".", "github.com/lodestone-kv/lodestone/bench"); err != nil {
		return fmt.Errorf("%w (run from bench/: cd bench && go run ./cmd/kvbench)", err)
	}

	tmp, err := os.MkdirTemp(*flagWorkDir, "kvbench-")
	if err != nil {
		return fmt.Errorf("make temp dir: %w", err)
	}
	if *flagKeep {
		logf("keeping binaries, data and logs in %s", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}

	var sec *secureFiles
	if *flagSecure && selected["put"] { // only the puts run secured
		dir := filepath.Join(tmp, "tls")
		var names []string
		for i := range members {
			names = append(names, memberName(i))
		}
		if sec, err = newSecureFiles(dir, names); err != nil {
			return fmt.Errorf("issue certificates: %w", err)
		}
	}

	var systems, secured []system
	for _, name := range strings.Split(*flagSystems, ",") {
		switch name = strings.TrimSpace(name); name {
		case "lodestone":
			bin := filepath.Join(tmp, "lodestone")
			if err := harness.GoBuild(ctx, logf, root, bin, "./cmd/lodestone"); err != nil {
				return err
			}
			systems = append(systems, lodestoneSystem(bin, nil))
			if sec != nil {
				secured = append(secured, lodestoneSystem(bin, sec))
			}
		case "etcd":
			bin := filepath.Join(tmp, "etcdnode")
			if err := harness.GoBuild(ctx, logf, ".", bin, "./cmd/etcdnode"); err != nil {
				return err
			}
			systems = append(systems, etcdSystem(bin, nil))
			if sec != nil {
				secured = append(secured, etcdSystem(bin, sec))
			}
		default:
			return fmt.Errorf("-systems: unknown system %q (want lodestone, etcd)", name)
		}
	}

	pinning, err := harness.Pinning("kvbench", *flagServerCPUs, *flagClientCPUs)
	if err != nil {
		return err
	}
	logf("%s", pinning)

	phases := plan(selected, clientCounts, systems, secured)
	samples := map[string]map[string][]sample{}
	for _, s := range append(slices.Clone(systems), secured...) {
		samples[s.name] = map[string][]sample{}
	}
	for rep := range *flagReps {
		for pi, ph := range phases {
			order := slices.Clone(ph.systems)
			if (rep+pi)%2 == 1 { // alternate who goes first to spread machine noise
				slices.Reverse(order)
			}
			for _, sys := range order {
				if err := runPhase(ctx, sys, ph, tmp, rep, samples[sys.name]); err != nil {
					return fmt.Errorf("rep %d: %w", rep+1, err)
				}
			}
		}
	}

	printSetup(phases, len(secured) > 0, pinning)
	lode, peer := samples["lodestone"], samples[peerName]
	if lode == nil || peer == nil {
		fmt.Println("no BENCH lines: they compare lodestone with etcd, and -systems ran only", *flagSystems)
		return nil
	}
	// The put lines come first and the secure ones right after them, as
	// before the other workloads existed.
	var puts, others []harness.Line
	for _, ph := range phases {
		for _, w := range ph.workloads {
			if len(lode[w.name]) == 0 || len(peer[w.name]) == 0 {
				continue // a secure-only step
			}
			if w.group == "put" {
				puts = append(puts, w.lines(lode[w.name], peer[w.name])...)
			} else {
				others = append(others, w.lines(lode[w.name], peer[w.name])...)
			}
		}
	}
	if len(secured) > 0 {
		sw := putWorkload(secureClients).name
		th := func(s sample) float64 { return s.throughput }
		puts = append(puts, secureLines(medianOf(samples["lodestone"+secureSuffix][sw], th),
			medianOf(samples[peerName+secureSuffix][sw], th), medianOf(lode[sw], th))...)
	}
	for _, l := range append(puts, others...) {
		fmt.Println(l)
	}
	return nil
}

// printSetup states how the runs were made, before the verdicts.
func printSetup(phases []phase, secure bool, pinning string) {
	fmt.Printf("setup: 3-node clusters, 3 processes each on 127.0.0.1 loopback, fsync on, one cluster running at a time, every op sent to the leader "+
		"through Lodestone's Go client (one per connection; it coalesces concurrent gets into GetMany) or etcd's generated stub on a plain grpc-go connection; a fresh cluster per put run; the read workloads share one fresh cluster "+
		"per system and rep, preloaded with %d keys of %d bytes (kvbench/pre/00000-%05d, 64 writers) and run on it in the order below; "+
		"%d reps, puts %s after %s warm-up, read workloads %s after %s warm-up; medians shown\n",
		preloadKeys, *flagValueSize, preloadKeys-1, *flagReps, *flagDuration, *flagWarmup, *flagReadDuration, *flagReadWarmup)
	for _, ph := range phases {
		for _, w := range ph.workloads {
			fmt.Println(w.describe(*flagPerConn, *flagValueSize))
		}
	}
	if secure {
		fmt.Printf("secure: %d clients, same workload and connections; one CA and ECDSA P-256 certificates for both systems, TLS on client and peer ports "+
			"with a client certificate required on every port; lodestone: --tls-verify-incoming-grpc/-http, --acl-enabled --acl-default-policy deny, "+
			"the bench's token has only key_prefix %q { policy = \"write\" }; etcd: client/peer TLS with client-cert auth, gRPC-only client port, "+
			"auth enabled (root user, simple tokens), the bench logs in per connection as a user whose role has readwrite on %s*\n",
			secureClients, benchPrefix, benchPrefix)
	}
	fmt.Printf("pinning: %s\n", pinning)
}

// phase is one kind of cluster life in a repetition: each of its systems
// in turn gets a fresh cluster (preloaded when a workload reads) and runs
// the workloads on it in order.
type phase struct {
	systems   []system
	workloads []workload
}

func (p phase) preloaded() bool { return slices.ContainsFunc(p.workloads, workload.preloaded) }

// plan lays out one repetition from the selected workload groups: the
// puts (schedule's steps, secured systems beside the plain ones at
// secureClients), then the 64 KiB puts, then the read workloads on one
// preloaded cluster.
func plan(selected map[string]bool, clientCounts []int, plain, secured []system) []phase {
	var phases []phase
	if selected["put"] {
		for _, st := range schedule(clientCounts, len(plain), len(secured)) {
			var ph phase
			for _, i := range st.systems {
				ph.systems = append(ph.systems, plain[i])
			}
			for _, i := range st.secured {
				ph.systems = append(ph.systems, secured[i])
			}
			ph.workloads = []workload{putWorkload(st.clients)}
			phases = append(phases, ph)
		}
	}
	if selected[bigPutWorkload.group] {
		phases = append(phases, phase{systems: plain, workloads: []workload{bigPutWorkload}})
	}
	reads := phase{systems: plain}
	for _, w := range readWorkloads {
		if selected[w.group] {
			reads.workloads = append(reads.workloads, w)
		}
	}
	if len(reads.workloads) > 0 {
		phases = append(phases, reads)
	}
	return phases
}

// step is one client count of a repetition: the plain systems (indexes
// into the plain list) and the secure ones (into the secured list) that
// run at it.
type step struct {
	clients          int
	systems, secured []int
}

// schedule lays out one repetition: every plain system at every client
// count, and the secured systems at secureClients, in the same step as the
// plain ones when that count is among clientCounts (so a secure run and
// its plain twin sit close in time), else in a step of their own at the
// end.
func schedule(clientCounts []int, plain, secured int) []step {
	var steps []step
	seq := func(n int) []int {
		var xs []int
		for i := range n {
			xs = append(xs, i)
		}
		return xs
	}
	placed := secured == 0
	for _, n := range clientCounts {
		st := step{clients: n, systems: seq(plain)}
		if n == secureClients && !placed {
			st.secured, placed = seq(secured), true
		}
		steps = append(steps, st)
	}
	if !placed {
		steps = append(steps, step{clients: secureClients, secured: seq(secured)})
	}
	return steps
}

// secureLines are the verdicts of the secure runs: secured Lodestone
// against secured etcd, and secured Lodestone against its own plain-text
// figure from the same run (left out when -clients did not run it).
func secureLines(lodeSec, peerSec, lodePlain float64) []harness.Line {
	lines := []harness.Line{{Name: fmt.Sprintf("put-%dclients-throughput-secure", secureClients), Unit: "ops/s",
		Lodestone: lodeSec, PeerName: peerName, Peer: peerSec, Op: ">=", Target: 1.5}}
	if !math.IsNaN(lodePlain) {
		lines = append(lines, harness.Line{Name: fmt.Sprintf("put-%dclients-secure-vs-plain", secureClients), Unit: "ops/s",
			LodestoneName: "lodestone-secure", Lodestone: lodeSec, PeerName: "lodestone-plain", Peer: lodePlain, Op: ">=", Target: 0.9})
	}
	return lines
}

// runPhase starts a fresh cluster of sys, preloads it if a workload reads,
// runs ph's workloads on it in order, adds each one's sample to samples
// (keyed by workload name) and prints its run line, and stops the cluster.
func runPhase(ctx context.Context, sys system, ph phase, workDir string, rep int, samples map[string][]sample) (err error) {
	logf("starting %s cluster for %s", sys.name, ph.workloads[0].name)
	c, err := startClusterRetrying(ctx, sys, workDir, *flagServerCPUs)
	if err != nil {
		return err
	}
	defer func() {
		if serr := c.stop(); serr != nil && err == nil {
			err = fmt.Errorf("stop %s: %w", sys.name, serr)
		}
	}()
	if ph.preloaded() {
		logf("preloading %s with %d keys", sys.name, preloadKeys)
		t0 := time.Now()
		if err := c.preload(ctx, *flagValueSize); err != nil {
			return fmt.Errorf("%s: %w", sys.name, err)
		}
		logf("preloaded %s in %.1fs", sys.name, time.Since(t0).Seconds())
	}
	for _, w := range ph.workloads {
		res, note, err := runWorkload(ctx, c, w, fmt.Sprintf("%s-%s-r%d", sys.name, w.name, rep+1))
		if err != nil {
			return fmt.Errorf("%s: %w", w.name, err)
		}
		smp := sample{throughput: res.Throughput(), p99: harness.Millis(res.Percentile(99))}
		samples[w.name] = append(samples[w.name], smp)
		fmt.Printf("run rep=%d/%d workload=%s clients=%d system=%s throughput=%sops/s p50=%sms p99=%sms ops=%d errors=%d%s\n",
			rep+1, *flagReps, w.name, w.clients, sys.name, harness.FormatValue(smp.throughput),
			harness.FormatValue(harness.Millis(res.Percentile(50))), harness.FormatValue(smp.p99),
			res.Ops(), res.Errors, note)
	}
	return nil
}

// window is w's warm-up and measured window: the read workloads run back
// to back on a cluster the preload has already warmed, so theirs are
// shorter.
func window(w workload) (warmup, dur time.Duration) {
	if w.preloaded() {
		return *flagReadWarmup, *flagReadDuration
	}
	return *flagWarmup, *flagDuration
}

// runWorkload drives w's clients against c's leader on connections of
// their own. note flags anything a reader should know about the run
// (errors, a leader change) and gives the CPU per op.
func runWorkload(ctx context.Context, c *cluster, w workload, name string) (_ harness.Result, note string, err error) {
	nconn := w.connections(*flagPerConn)
	conns := make([]connOps, nconn)
	for i := range nconn {
		var err error
		if conns[i], err = c.sys.ops(ctx, c); err != nil {
			return harness.Result{}, "", err
		}
		defer conns[i].close()
	}
	values := make([][]byte, w.clients)
	for i := range values {
		values[i] = make([]byte, cmp.Or(w.valueSize, *flagValueSize))
		rand.Read(values[i])
	}

	warmup, dur := window(w)
	logf("driving %s %s: %d clients over %d connections to leader %s for %s + %s warm-up",
		c.sys.name, w.name, w.clients, nconn, c.leader, dur, warmup)
	cpu0 := c.cpuTime()
	self0, selfErr := harness.CPUTime(os.Getpid())
	roundsNote := c.startReadRounds(ctx)
	prof := c.profile(ctx, warmup, dur, *flagPprof, name)
	classes, class := w.classes()
	res, err := harness.Drive(ctx, harness.DriveConfig{Clients: w.clients, Warmup: warmup, Duration: dur, Classes: classes, Class: class},
		w.op(conns, values, *flagValueSize))
	if perr := prof(); perr != nil && err == nil {
		err = fmt.Errorf("profile %s: %w", c.sys.name, perr)
	}
	if err != nil {
		return harness.Result{}, "", err
	}
	if classes == 2 {
		note += fmt.Sprintf(" get-p99=%sms put-p99=%sms", harness.FormatValue(harness.Millis(harness.Percentile(res.ByClass[0], 99))),
			harness.FormatValue(harness.Millis(harness.Percentile(res.ByClass[1], 99))))
	}
	// NB: wall-clock throughput on a shared machine swings with the
	// neighbours; the servers' CPU time per op barely does. The window
	// includes the warm-up, so divide by the ops the warm-up ran too, at
	// the measured rate.
	if cpu := c.cpuTime() - cpu0; cpu > 0 && res.Throughput() > 0 {
		ops := res.Throughput() * (warmup + dur).Seconds()
		note += fmt.Sprintf(" server-cpu=%.0fus/op", float64(cpu.Microseconds())/ops)
		// NB: the load generator has a core of its own, shared with the
		// machine's other work; near a core per second it, not the
		// servers, bounds the throughput (TLS costs it too).
		if self1, err := harness.CPUTime(os.Getpid()); err == nil && selfErr == nil {
			wall := (warmup + dur).Seconds()
			note += fmt.Sprintf(" client-cpu=%.0fus/op (%.2f cores)", float64((self1-self0).Microseconds())/ops, (self1-self0).Seconds()/wall)
		}
	}
	note += roundsNote((warmup + dur).Seconds())
	if res.Ops() == 0 {
		return res, "", fmt.Errorf("%s acknowledged no ops (first error: %v)%s", c.sys.name, res.FirstErr, c.logTails())
	}
	if res.Errors > 0 {
		note += fmt.Sprintf(" first-error=%q", res.FirstErr.Error())
	}
	if now, err := c.waitLeader(ctx, 5*time.Second); err != nil || now != c.leader {
		note += fmt.Sprintf(" leader-changed(was %s, now %s, %v)", c.leader, now, err)
	}
	return res, note, nil
}

// checkModule fails unless dir/go.mod declares module mod.
func checkModule(dir, mod string) error {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return fmt.Errorf("find %s: %w", mod, err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	if strings.TrimSpace(first) != "module "+mod {
		return fmt.Errorf("%s/go.mod is not module %s", dir, mod)
	}
	return nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

var logf = harness.NewLogf("kvbench")
