// Command consulbench runs the same Consul HTTP API workloads against a
// three-server Consul cluster (v1.16.3, built by internal/consulpeer) and
// a three-member Lodestone cluster on this machine, and prints one BENCH
// line per comparison (bench/README.md, "How benchmarks report"). Run it
// from bench/:
//
//	cd bench && go run ./cmd/consulbench [-reps 3] [-duration 8s]
//
// Per rep and system, on a fresh cluster: KV puts of 256-byte values from
// 64 clients, each on a keep-alive connection of its own to the leader;
// then default-mode KV gets of preloaded keys the same way; then catalog
// registrations (a node with one service instance). Runs alternate which
// system goes first.
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/consulpeer"
	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

var (
	flagReps       = flag.Int("reps", 3, "repetitions; medians are reported (use an odd number)")
	flagDuration   = flag.Duration("duration", 8*time.Second, "measured window of each workload")
	flagWarmup     = flag.Duration("warmup", 2*time.Second, "warm-up before each workload's window (ops run, not counted)")
	flagClients    = flag.Int("clients", 64, "closed-loop clients, each on a keep-alive HTTP/1.1 connection of its own")
	flagValueSize  = flag.Int("value-size", 256, "bytes per KV value (puts and the preloaded get keys)")
	flagGetKeys    = flag.Int("get-keys", 1000, "keys preloaded for the gets")
	flagServerCPUs = flag.String("server-cpus", "1", `taskset CPU list for every server process of both systems ("" = no pinning)`)
	flagClientCPUs = flag.String("client-cpus", "0", `CPU list the load generator pins itself to ("" = no pinning)`)
	flagSystems    = flag.String("systems", "lodestone,consul", "systems to run; BENCH lines need both")
	flagConsul     = flag.String("consul", "", "a consul binary to use instead of the cached build (it must report "+consulpeer.Version+")")
	flagWorkDir    = flag.String("work-dir", "", "where binaries and data dirs go (default: the system temp dir)")
	flagRoot       = flag.String("root", "..", "the lodestone module root, relative to bench/")
	flagKeep       = flag.Bool("keep", false, "keep binaries, data dirs and server logs after the run")
	flagWorkloads  = flag.String("workloads", "all", "workloads to run, in their fixed order: all, or a comma-separated list of kv-put, kv-get, catalog-register")
	flagWindows    = flag.Duration("windows", 0, "if > 0, print each workload's p99 per window of this length as well (a stall shows as one slow window; a uniform tail as none)")
	flagPprof      = flag.String("pprof", "", "directory for CPU and allocation profiles of every server of both systems over each window (ROLE-SYSTEM-WORKLOAD-rREP.pprof, .allocs-base.pprof, .allocs.pprof; Consul runs with enable_debug for it); a profiled run's figures are not the benchmark's")
)

// The targets (issue 40, "Done when"): Lodestone against a
// 3-server Consul through the Consul HTTP API.
const (
	targetPutThroughput      = 3.0
	targetPutP99             = 0.25
	targetGetThroughput      = 2.0
	targetRegisterThroughput = 2.0
)

const peerName = "consul"

func main() {
	harness.Main("consulbench", "servers stopped and temp dirs removed", run)
}

// sample is what one workload run contributes to the medians.
type sample struct {
	throughput float64 // ops/s
	p99        float64 // ms
	serverCPU  float64 // the servers' CPU time per op, us
}

func run(ctx context.Context) error {
	if err := checkFlags(); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(*flagWorkDir, "consulbench-")
	if err != nil {
		return fmt.Errorf("make temp dir: %w", err)
	}
	if *flagKeep {
		logf("keeping binaries, data and logs in %s", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	systems, err := buildSystems(ctx, tmp)
	if err != nil {
		return err
	}
	pinning, err := harness.Pinning("consulbench", *flagServerCPUs, *flagClientCPUs)
	if err != nil {
		return err
	}
	logf("%s", pinning)
	load := harness.LoadAvg()

	samples := map[string]map[string][]sample{}
	for _, s := range systems {
		samples[s.name] = map[string][]sample{}
	}
	for rep := range *flagReps {
		for i := range systems {
			sys := systems[(i+rep)%len(systems)] // alternate who goes first
			if err := runSystem(ctx, sys, tmp, rep, samples[sys.name]); err != nil {
				return fmt.Errorf("rep %d: %s: %w", rep+1, sys.name, err)
			}
		}
	}

	fmt.Printf("setup: per rep and system a fresh cluster of 3 server processes on 127.0.0.1 (consul %s: agent -server -bootstrap-expect 3, not dev mode, "+
		"Raft on disk with its default fsync, DNS and gRPC off; lodestone: `lodestone server`, fsync on), both at -log-level %s; one cluster running at a time; "+
		"%d reps, each workload %s after %s warm-up, in the order below on the same cluster; medians shown\n",
		consulpeer.Version, logLevel, *flagReps, *flagDuration, *flagWarmup)
	fmt.Println(describe(*flagClients, *flagValueSize, *flagGetKeys))
	fmt.Printf("pinning: %s\n", pinning)
	fmt.Printf("machine: load average %s before, %s after (shared with other work; the per-op CPU figures on the run lines are steadier than the rates)\n", load, harness.LoadAvg())
	lode, peer := samples["lodestone"], samples[peerName]
	if lode == nil || peer == nil {
		fmt.Println("no BENCH lines: they compare lodestone with consul, and -systems ran only", *flagSystems)
		return nil
	}
	for _, w := range selected {
		fmt.Println(cpuLine(w, lode[w.name], peer[w.name]))
	}
	for _, l := range lines(lode, peer) {
		fmt.Println(l)
	}
	return nil
}

// cpuLine sets the servers' CPU per op of both systems side by side: on a
// machine shared with other work the rates swing with the neighbours,
// this much less. No target: the BENCH lines are on the rates.
func cpuLine(w workload, lode, peer []sample) string {
	cpu := func(s sample) float64 { return s.serverCPU }
	l, p := medianOf(lode, cpu), medianOf(peer, cpu)
	return fmt.Sprintf("cpu: %s server-cpu per op, medians: lodestone=%sus consul=%sus (consul/lodestone %.2f); no target", w.name, harness.FormatValue(l), harness.FormatValue(p), p/l)
}

func checkFlags() error {
	if *flagReps < 1 || *flagClients < 1 || *flagValueSize < 1 || *flagGetKeys < 1 {
		return fmt.Errorf("-reps, -clients, -value-size and -get-keys must be >= 1")
	}
	if *flagDuration <= 0 || *flagWarmup < 0 {
		return fmt.Errorf("-duration must be > 0 and -warmup >= 0")
	}
	var err error
	selected, err = selectWorkloads(*flagWorkloads)
	return err
}

// selected are the workloads -workloads picked, in their fixed order.
var selected []workload

func selectWorkloads(list string) ([]workload, error) {
	if list == "all" {
		return workloads, nil
	}
	want := map[string]bool{}
	for name := range strings.SplitSeq(list, ",") {
		name = strings.TrimSpace(name)
		if !slices.ContainsFunc(workloads, func(w workload) bool { return w.name == name }) {
			return nil, fmt.Errorf("-workloads: unknown workload %q (want all, or some of kv-put, kv-get, catalog-register)", name)
		}
		want[name] = true
	}
	var out []workload
	for _, w := range workloads {
		if want[w.name] {
			out = append(out, w)
		}
	}
	return out, nil
}

// buildSystems builds (or finds) each system of -systems.
func buildSystems(ctx context.Context, tmp string) ([]system, error) {
	var systems []system
	for name := range strings.SplitSeq(*flagSystems, ",") {
		switch name = strings.TrimSpace(name); name {
		case "lodestone":
			root, err := filepath.Abs(*flagRoot)
			if err != nil {
				return nil, err
			}
			bin := filepath.Join(tmp, "lodestone")
			if err := harness.GoBuild(ctx, logf, root, bin, "./cmd/lodestone"); err != nil {
				return nil, fmt.Errorf("%w (run from bench/: cd bench && go run ./cmd/consulbench, or set -root)", err)
			}
			systems = append(systems, lodestoneSystem(bin))
		case "consul":
			bin, err := consulBinary(ctx)
			if err != nil {
				return nil, err
			}
			systems = append(systems, consulSystem(bin))
		default:
			return nil, fmt.Errorf("-systems: unknown system %q (want lodestone, consul)", name)
		}
	}
	return systems, nil
}

// consulBinary is -consul, checked, or the cached build (built now when
// missing).
func consulBinary(ctx context.Context) (string, error) {
	if *flagConsul == "" {
		return consulpeer.Binary(ctx, logf)
	}
	if err := consulpeer.CheckVersion(ctx, *flagConsul); err != nil {
		return "", fmt.Errorf("-consul: %w", err)
	}
	return *flagConsul, nil
}

// lines are the verdicts, in the order.
func lines(lode, peer map[string][]sample) []harness.Line {
	th := func(s sample) float64 { return s.throughput }
	p99 := func(s sample) float64 { return s.p99 }
	line := func(name, unit string, w workload, f func(sample) float64, op string, target float64) harness.Line {
		return harness.Line{Name: name, Unit: unit, Lodestone: medianOf(lode[w.name], f), PeerName: peerName,
			Peer: medianOf(peer[w.name], f), Op: op, Target: target}
	}
	all := []struct {
		w workload
		l harness.Line
	}{
		{putWorkload, line("consul-kv-put-throughput", "ops/s", putWorkload, th, ">=", targetPutThroughput)},
		{putWorkload, line("consul-kv-put-p99", "ms", putWorkload, p99, "<=", targetPutP99)},
		{getWorkload, line("consul-kv-get-throughput", "ops/s", getWorkload, th, ">=", targetGetThroughput)},
		{registerWorkload, line("consul-catalog-register-throughput", "ops/s", registerWorkload, th, ">=", targetRegisterThroughput)},
	}
	// A workload -workloads left out has no line.
	var out []harness.Line
	for _, x := range all {
		if len(lode[x.w.name]) > 0 && len(peer[x.w.name]) > 0 {
			out = append(out, x.l)
		}
	}
	return out
}

func medianOf(ss []sample, f func(sample) float64) float64 {
	xs := make([]float64, len(ss))
	for i, s := range ss {
		xs[i] = f(s)
	}
	return harness.Median(xs)
}

// runSystem starts a fresh cluster of sys, runs the workloads on it in
// order (preloading the get keys before the gets), adds each one's sample
// and prints its run line, and stops the cluster.
func runSystem(ctx context.Context, sys system, workDir string, rep int, samples map[string][]sample) (err error) {
	logf("rep %d: starting a %s cluster", rep+1, sys.name)
	t0 := time.Now()
	c, err := sys.start(ctx, workDir)
	if err != nil {
		return err
	}
	logf("%s: leader %s after %.1fs", sys.name, c.leaderURL(), time.Since(t0).Seconds())
	defer func() {
		serr := c.stop()
		switch {
		case serr == nil || err != nil:
		case sys.name != "lodestone":
			// NB: a peer slow to stop (Consul once took over 10 s after
			// SIGTERM) was killed after its workloads ran; failing the run
			// there threw away every rep's measurements.
			logf("%s: stop: %v (its measurements stand)", sys.name, serr)
		default:
			err = fmt.Errorf("stop: %w", serr)
		}
	}()
	for _, w := range selected {
		if w.name == getWorkload.name {
			value := make([]byte, *flagValueSize)
			rand.Read(value)
			t0 := time.Now()
			if err := preload(ctx, c.leaderURL(), *flagGetKeys, value); err != nil {
				return fmt.Errorf("preload: %w%s", err, c.logTails())
			}
			logf("%s: preloaded %d keys in %.1fs", sys.name, *flagGetKeys, time.Since(t0).Seconds())
		}
		res, cpu, note, err := runWorkload(ctx, c, w, fmt.Sprintf("%s-%s-r%d", sys.name, w.name, rep+1))
		if err != nil {
			return fmt.Errorf("%s: %w", w.name, err)
		}
		s := sample{throughput: res.Throughput(), p99: harness.Millis(res.Percentile(99)), serverCPU: cpu}
		samples[w.name] = append(samples[w.name], s)
		fmt.Printf("run rep=%d/%d workload=%s clients=%d system=%s throughput=%sops/s p50=%sms p99=%sms ops=%d errors=%d%s\n",
			rep+1, *flagReps, w.name, *flagClients, sys.name, harness.FormatValue(s.throughput),
			harness.FormatValue(harness.Millis(res.Percentile(50))), harness.FormatValue(s.p99), res.Ops(), res.Errors, note)
	}
	return nil
}

// runWorkload drives w's clients against c's leader. note gives the
// servers' and the load generator's CPU per op, and flags errors.
func runWorkload(ctx context.Context, c *cluster, w workload, name string) (_ harness.Result, serverCPU float64, note string, err error) {
	cs := newConns(*flagClients, c.leaderURL())
	defer cs.close()
	values := make([][]byte, *flagClients)
	for i := range values {
		values[i] = make([]byte, *flagValueSize)
		rand.Read(values[i])
	}
	logf("driving %s %s: %d clients to leader %s for %s + %s warm-up", c.system, w.name, *flagClients, c.leaderURL(), *flagDuration, *flagWarmup)
	urls, roles := c.metricsURLs(), c.roles()
	gcs := harness.StartGCCount(ctx, urls, roles)
	gcCPU := harness.StartGCCPU(ctx, urls, roles)
	slow := harness.StartSlowLogWrites(ctx, urls, roles)
	snaps := harness.StartCounter(ctx, urls, roles, "lodestone_snapshots_total")
	waits := harness.StartCounter(ctx, urls, roles, "lodestone_raftlog_checkpoint_waits_total")
	deferrals := harness.StartCounter(ctx, urls, roles, "lodestone_raftlog_checkpoint_deferrals_total")
	leaders := harness.StartCounter(ctx, urls, roles, "lodestone_leader_changes_total")
	cpu0 := c.cpuTime()
	self0, selfErr := harness.CPUTime(os.Getpid())
	prof := harness.WaitAll()
	if c.profiles {
		prof = profileAfter(ctx, c, *flagWarmup, *flagDuration, name)
	}
	cfg := harness.DriveConfig{Clients: *flagClients, Warmup: *flagWarmup, Duration: *flagDuration}
	if *flagWindows > 0 {
		cfg.Classes, cfg.Class = windowClasses(time.Now().Add(*flagWarmup), *flagDuration, *flagWindows)
	}
	res, err := harness.Drive(ctx, cfg, w.op(cs, values, *flagValueSize, *flagGetKeys))
	if perr := prof(); perr != nil && err == nil {
		err = fmt.Errorf("profile: %w", perr)
	}
	if err != nil {
		return res, 0, "", err
	}
	if res.Ops() == 0 {
		return res, 0, "", fmt.Errorf("%s acknowledged no ops (first error: %v)%s", c.system, res.FirstErr, c.logTails())
	}
	// NB: the window includes the warm-up, so divide by the ops the
	// warm-up ran too, at the measured rate.
	ops := res.Throughput() * (*flagWarmup + *flagDuration).Seconds()
	serverCPU = float64((c.cpuTime() - cpu0).Microseconds()) / ops
	note += fmt.Sprintf(" server-cpu=%.0fus/op", serverCPU)
	if self1, err := harness.CPUTime(os.Getpid()); err == nil && selfErr == nil {
		wall := (*flagWarmup + *flagDuration).Seconds()
		note += fmt.Sprintf(" client-cpu=%.0fus/op (%.2f cores)", float64((self1-self0).Microseconds())/ops, (self1-self0).Seconds()/wall)
	}
	// NB: what can make a put's tail, per server: a GC cycle, a log write
	// over 12.8 ms, a snapshot, a log write that waited for a checkpoint
	// (or went on in a due epoch instead), a leader change. Consul exports
	// none of them.
	for _, f := range []struct {
		name  string
		count func() string
	}{{"gc", gcs}, {"gc-cpu-ms", gcCPU}, {"slow-log-writes", slow}, {"snapshots", snaps},
		{"checkpoint-waits", waits}, {"checkpoint-deferrals", deferrals}, {"leader-changes", leaders}} {
		if v := f.count(); v != "" {
			note += fmt.Sprintf(" %s=%s", f.name, v)
		}
	}
	if len(res.ByClass) > 0 {
		note += " window-p99s=" + windowP99s(res.ByClass)
	}
	if res.Errors > 0 {
		note += fmt.Sprintf(" first-error=%q", res.FirstErr.Error())
	}
	if err := c.checkAlive(); err != nil {
		return res, 0, "", fmt.Errorf("%w%s", err, c.logTails())
	}
	return res, serverCPU, note, nil
}

// windowClasses splits a window of dur from from into windows of length
// each, as harness.Drive's classes: an op falls in the window it
// completed in (Drive calls Class when an op completes).
func windowClasses(from time.Time, dur, each time.Duration) (int, func(client, seq int) int) {
	n := int((dur + each - 1) / each)
	return n, func(int, int) int {
		return min(max(int(time.Since(from)/each), 0), n-1)
	}
}

// windowP99s formats each window's p99 in ms, comma-separated.
func windowP99s(byWindow [][]time.Duration) string {
	out := make([]string, len(byWindow))
	for i, lat := range byWindow { // NB: Drive sorts each class
		out[i] = harness.FormatValue(harness.Millis(harness.Percentile(lat, 99)))
	}
	return strings.Join(out, ",")
}

// profileAfter waits out the warm-up, then profiles every member over
// the window (harness.ProfileAll); the returned func waits for it.
func profileAfter(ctx context.Context, c *cluster, warmup, dur time.Duration, name string) func() error {
	done := make(chan error, 1)
	go func() {
		select {
		case <-ctx.Done():
			done <- ctx.Err()
		case <-time.After(warmup):
			done <- harness.ProfileAll(ctx, c.https, c.roles(), dur, *flagPprof, name)()
		}
	}()
	return func() error { return <-done }
}

// logf writes a progress line to stderr, stamped with seconds since start.
var logf = harness.NewLogf("consulbench")
