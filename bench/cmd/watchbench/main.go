// Command watchbench measures watch fan-out on the service-discovery shape
// (docs/architecture.md, "A watch"): a steady stream of writes over many keys
// under one prefix, with 0, 10k and 100k exact-key watchers plus 100
// prefix watchers on one server, for a three-process Lodestone cluster, a
// three-process etcd cluster and a single-channel broadcaster (the Consul
// streaming anti-pattern, bench/internal/broadcast), and prints BENCH lines
// (bench/README.md, "How benchmarks report"; cmd/watchbench/README.md explains
// the phases, the checks and every line). Run it from bench/:
//
//	cd bench && go run ./cmd/watchbench [-reps 3] [-duration 5s]
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/bench/internal/broadcast"
	"github.com/lodestone-kv/lodestone/bench/internal/harness"
	"github.com/lodestone-kv/lodestone/internal/cpuset"
	"github.com/lodestone-kv/lodestone/internal/heapfloor"
)

var (
	flagReps        = flag.Int("reps", 3, "repetitions per system; medians are reported (use an odd number)")
	flagDuration    = flag.Duration("duration", 5*time.Second, "measured write window of each phase")
	flagWarmup      = flag.Duration("warmup", time.Second, "writes before each window (delivered and checked, not timed)")
	flagRate        = flag.Int("rate", 1000, "writes per second (open loop: each write has its intended start time)")
	flagKeys        = flag.Int("keys", 10000, "keys under the prefix disc/")
	flagWatchers    = flag.String("watchers", "10000,100000", "exact-key watcher counts, ascending (a run with none always comes first)")
	flagPrefixes    = flag.Int("prefix-watchers", 100, "watchers of the whole prefix, attached with the streams")
	flagStreams     = flag.Int("streams", 1000, "watch streams the watchers are spread over")
	flagConns       = flag.Int("conns", 10, "gRPC connections the streams are spread over")
	flagWriteConns  = flag.Int("write-conns", 8, "gRPC connections the writes are spread over")
	flagDrain       = flag.Duration("drain", 15*time.Second, "how long after the last write every event must have arrived")
	flagServerCPUs  = flag.String("server-cpus", "1", `taskset CPU list for every server process ("" = no pinning)`)
	flagClientCPUs  = flag.String("client-cpus", "0", `CPU list the load generator pins itself to ("" = no pinning)`)
	flagWatchCPUs   = flag.String("watch-member-cpus", "0", `CPU list the members that serve the watches move to once they are known ("" = stay on -server-cpus: with -writer-cpus "", every server on one core)`)
	flagWriterCPUs  = flag.String("writer-cpus", "1", `CPU list for the writer process ("" = -client-cpus)`)
	flagSystems     = flag.String("systems", "lodestone,etcd,broadcaster", "systems to run; peer comparisons need lodestone and the peer")
	flagWorkDir     = flag.String("work-dir", "", "where binaries and data dirs go (default: the system temp dir)")
	flagRoot        = flag.String("root", "..", "the lodestone module root, relative to bench/")
	flagKeep        = flag.Bool("keep", false, "keep binaries, data dirs and server logs")
	flagLodeArgs    = flag.String("lodestone-args", "", "extra flags for every Lodestone server, space-separated (for experiments, e.g. \"--watch-delivery-interval 0\")")
	flagTrace       = flag.String("trace", "", "directory for execution traces (ROLE-PHASE.trace) of every Lodestone server during every phase, and the phase's writes at or over its p99 with when they were due (writes-PHASE.txt), to find what stalled them; tracing slows the servers, and DIR belongs on tmpfs (/dev/shm/...): traces written to disk are flushed ~30 s later, in a later phase, and stall the servers' fdatasyncs")
	flagPprof       = flag.String("pprof", "", "directory for CPU and allocation profiles (ROLE-PHASE.pprof; ROLE-PHASE.allocs-base.pprof and .allocs.pprof at its start and end, see harness.Profile) of every Lodestone server during every phase, named leader-, f1-, f2- as in the CPU line (the servers always run with --enable-pprof: the memory figure uses it)")
	flagWatchDisk   = flag.Duration("watch-member-disk-delay", 0, "Lodestone only: every log write of the members serving the watches waits this long first (the servers' --fault-hooks), as on a slow disk; 0 = none")
	flagGCBefore    = flag.Bool("gc-before-phase", true, "force a GC cycle on every server before each phase's warm-up, so the cycles in a window are its own allocation's, not the rep's earlier phases' (README, \"Collections\")")
	flagWatchMember = flag.String("watch-member", "follower", `members the watch streams go to: "follower" (one follower, where the Go client puts a three-member cluster's watches), "followers" (the connections spread over both) or "leader"; writes always go to the leader`)

	// The broadcaster's own process runs this binary with these.
	flagServeBroadcaster = flag.Bool("serve-broadcaster", false, "internal: serve the single-channel broadcaster and nothing else")
	flagGRPC             = flag.String("grpc", "", "internal: -serve-broadcaster's gRPC address")
	flagHTTP             = flag.String("http", "", "internal: -serve-broadcaster's metrics address")

	// The writer child runs this binary with these (and -write-conns,
	// -keys): writes come from their own process, see harness.ServeWrites.
	flagServeWriter = flag.Bool("serve-writer", false, "internal: run write phases read from stdin and nothing else")
	flagSystem      = flag.String("system", "", "internal: -serve-writer's system")
	flagTarget      = flag.String("target", "", "internal: -serve-writer's gRPC address")
)

// Targets (the issue "Sharded watch fan-out").
const (
	targetWriteGrowth = 1.10  // write p99 with the most watchers / with none
	budgetLagMS       = 50.0  // delivery lag p99 at the most watchers
	budgetBytes       = 300.0 // live heap per watcher beyond its stream (issue 41)
	// targetLeaderCPU bounds the leader's CPU time per acknowledged write
	// with the most watchers over that with none: watchers on a follower
	// must cost the write path nothing, and CPU time per write does not
	// move with what else runs on the machine as wall-clock p99 does.
	targetLeaderCPU = 1.10
)

func main() {
	harness.Main("watchbench", "servers stopped and temp dirs removed", func(ctx context.Context) error {
		if *flagServeBroadcaster {
			return serveBroadcaster(ctx, *flagGRPC, *flagHTTP)
		}
		if *flagServeWriter {
			return serveWriter(ctx, *flagSystem, *flagTarget)
		}
		defer heapfloor.Start(harness.LoadHeapFloor)()
		return run(ctx)
	})
}

// serveBroadcaster runs the broadcaster until ctx ends.
func serveBroadcaster(ctx context.Context, grpcAddr, httpAddr string) error {
	lis, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		return err
	}
	b := broadcast.New(broadcast.Config{})
	gs := grpc.NewServer()
	lodestonepb.RegisterKVServer(gs, b)
	lodestonepb.RegisterWatchServer(gs, b)
	mux := http.NewServeMux()
	mux.Handle("/metrics", broadcast.MetricsHandler())
	mux.Handle("/debug/pprof/heap", pprof.Handler("heap")) // NB: liveHeap's gc=1
	hs := &http.Server{Addr: httpAddr, Handler: mux}
	errc := make(chan error, 2)
	go func() { errc <- gs.Serve(lis) }()
	go func() { errc <- hs.ListenAndServe() }()
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	hs.Close()
	gs.Stop()
	b.Close()
	return err
}

// serveWriter puts the writes of each phase read from stdin to target over
// -write-conns connections, spread over -keys keys (keyOf), and answers
// with what they measured on stdout.
func serveWriter(ctx context.Context, name, target string) error {
	var sys system
	switch name {
	case "lodestone":
		sys = lodestoneSystem("")
	case "etcd":
		sys = etcdSystem("")
	case "broadcaster":
		sys = broadcasterSystem("")
	default:
		return fmt.Errorf("-system: unknown system %q", name)
	}
	var puts []func(context.Context, []byte, []byte) error
	for range *flagWriteConns {
		c, err := dial(target, sys.dialOptions...)
		if err != nil {
			return err
		}
		defer c.Close()
		puts = append(puts, sys.put(c))
	}
	return harness.ServeWrites(ctx, os.Stdin, os.Stdout, func(ctx context.Context, id byte, seq int) error {
		k := keyOf(seq, *flagKeys)
		return puts[seq%len(puts)](ctx, fmt.Appendf(nil, "disc/svc-%05d", k), encodeValue(id, seq))
	})
}

// sample is what one repetition of one system measured.
type sample struct {
	writeP99 []float64 // ms, per phase: none, then each watcher count
	after    float64   // ms, write p99 of the none-after control phase
	lagP99   []float64 // ms, per watcher count (index 0: streams with prefix watchers only)
	perWatch float64   // bytes per exact watcher at the largest count
	// leaderCPU is the leader's CPU time per acknowledged write (µs) in
	// the none phase, at the largest count and in none-after.
	leaderCPU [3]float64
	expected  int64 // deliveries due at the largest count
	exact     int64 // delivered once, as due
	extra     int64
	dups      int64
}

func run(ctx context.Context) error {
	counts, err := parseInts(*flagWatchers)
	if err != nil || !slices.IsSorted(counts) {
		return fmt.Errorf("-watchers: want ascending positive counts, got %q", *flagWatchers)
	}
	if *flagReps < 1 || *flagRate < 1 || *flagKeys < 1 || *flagStreams < 1 || *flagConns < 1 || *flagPrefixes > maxPrefixes {
		return fmt.Errorf("-reps, -rate, -keys, -streams and -conns must be >= 1, -prefix-watchers <= %d", maxPrefixes)
	}
	if !slices.Contains([]string{"followers", "follower", "leader"}, *flagWatchMember) {
		return fmt.Errorf("-watch-member: want followers, follower or leader, got %q", *flagWatchMember)
	}
	raiseNoFile()
	root, err := filepath.Abs(*flagRoot)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(*flagWorkDir, "watchbench-")
	if err != nil {
		return err
	}
	if *flagKeep {
		logf("keeping binaries, data and logs in %s", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}

	var systems []system
	for _, name := range strings.Split(*flagSystems, ",") {
		switch name = strings.TrimSpace(name); name {
		case "lodestone":
			bin := filepath.Join(tmp, "lodestone")
			if err := harness.GoBuild(ctx, logf, root, bin, "./cmd/lodestone"); err != nil {
				return err
			}
			systems = append(systems, lodestoneSystem(bin))
		case "etcd":
			bin := filepath.Join(tmp, "etcdnode")
			if err := harness.GoBuild(ctx, logf, ".", bin, "./cmd/etcdnode"); err != nil {
				return err
			}
			systems = append(systems, etcdSystem(bin))
		case "broadcaster":
			self, err := os.Executable()
			if err != nil {
				return err
			}
			systems = append(systems, broadcasterSystem(self))
		default:
			return fmt.Errorf("-systems: unknown system %q (want lodestone, etcd, broadcaster)", name)
		}
	}
	pinning, err := harness.Pinning("watchbench", *flagServerCPUs, *flagClientCPUs)
	if err != nil {
		return err
	}
	if pinning, err = harness.Moved(pinning, "the members serving the watches (moved once the leader was known)", "watch-member-cpus", *flagWatchCPUs); err != nil {
		return err
	}
	if pinning, err = harness.Moved(pinning, "the writer process", "writer-cpus", *flagWriterCPUs); err != nil {
		return err
	}
	logf("%s", pinning)

	samples := map[string][]sample{}
	for rep := range *flagReps {
		order := slices.Clone(systems)
		for range rep % len(order) { // rotate who goes first to spread machine noise
			order = append(order[1:], order[0])
		}
		for _, sys := range order {
			s, err := runSystem(ctx, sys, tmp, counts, rep)
			if err != nil {
				return fmt.Errorf("rep %d, %s: %w", rep+1, sys.name, err)
			}
			samples[sys.name] = append(samples[sys.name], s)
		}
	}

	top := counts[len(counts)-1]
	fmt.Printf("setup: per system a fresh deployment per rep (lodestone, etcd: 3 processes, fsync on; broadcaster: 1 process, no replication, no fsync) on 127.0.0.1; "+
		"%d writes/s open loop of %d-byte values over %d keys under disc/ (each key written about once per %ds), sent to the leader over %d connections; "+
		"watchers on the %s (-watch-member; one process for the broadcaster): N exact-key watchers (watcher j on key j mod %d, so a write wakes N/%d of them) plus %d prefix watchers that see every write, "+
		"on %d streams over %d connections; phases with N = none (no streams), 0, %s; %d reps x (%s warm-up + %s window), medians shown; "+
		"write latency from each write's intended start; delivery lag from the write's intended start to the watcher's receipt; "+
		"memory = the watch members' live heap (summed; each the smallest go_memstats_heap_alloc_bytes right after GC cycles, forced through /debug/pprof/heap?gc=1) right after minus right before each attach step (no write in between), summed up to N=%d, over N; servers %s\n",
		*flagRate, valueSize, *flagKeys, *flagKeys / *flagRate, *flagWriteConns, *flagWatchMember, *flagKeys, *flagKeys, *flagPrefixes,
		*flagStreams, *flagConns, strings.Trim(fmt.Sprint(counts), "[]"), *flagReps, *flagWarmup, *flagDuration, top, harness.CollectedNote(*flagGCBefore))
	fmt.Printf("pinning: %s\n", pinning)

	lode := samples["lodestone"]
	if lode == nil {
		fmt.Println("no BENCH lines: they need -systems to include lodestone")
		return nil
	}
	med := func(ss []sample, f func(sample) float64) float64 {
		var xs []float64
		for _, s := range ss {
			xs = append(xs, f(s))
		}
		return harness.Median(xs)
	}
	last := len(counts) // index of the top count in writeP99 (0 is "none")
	wTop := func(s sample) float64 { return s.writeP99[last] }
	baseline := func(ss []sample) (pooled, strict float64) {
		var before, after []float64
		for _, s := range ss {
			before, after = append(before, s.writeP99[0]), append(after, s.after)
		}
		return harness.Baseline(before, after)
	}
	lagTop := func(s sample) float64 { return s.lagP99[len(s.lagP99)-1] }
	growth := func(s sample) float64 { return s.writeP99[last] / ((s.writeP99[0] + s.after) / 2) }
	mem := func(s sample) float64 { return s.perWatch }
	k := countLabel(top)
	var exp, got, extra, dups int64
	for _, s := range lode {
		exp, got, extra, dups = exp+s.expected, got+s.exact, extra+s.extra, dups+s.dups
	}
	fmt.Printf("verify: lodestone at %s watchers over %d reps: %d deliveries due, %d delivered exactly once, %d missing, %d duplicates dropped by the checker, %d extra\n",
		k, len(lode), exp, got, exp-got, dups, extra)

	none, strict := baseline(lode)
	fmt.Println(harness.BaselineNote("lodestone's no-watcher write p99", none, strict, med(lode, wTop)))
	fmt.Println(harness.Line{Name: "watch-write-p99-" + k + "-vs-none", Unit: "ms", Lodestone: med(lode, wTop),
		PeerName: "lodestone-no-watchers", Peer: none, Op: "<=", Target: targetWriteGrowth})
	fmt.Println(harness.Line{Name: "watch-lag-p99-" + k, Unit: "ms", Lodestone: med(lode, lagTop),
		PeerName: "budget", Peer: budgetLagMS, Op: "<=", Target: 1})
	fmt.Println(harness.Line{Name: "watch-delivered-" + k, Unit: "events", Lodestone: float64(got - dups),
		PeerName: "due", Peer: float64(exp), Op: ">=", Target: 1})
	fmt.Println(harness.Line{Name: "watch-memory-per-watcher", Unit: "B", Lodestone: med(lode, mem),
		PeerName: "budget", Peer: budgetBytes, Op: "<=", Target: 1})
	cpuNone := func(s sample) float64 { return (s.leaderCPU[0] + s.leaderCPU[2]) / 2 }
	fmt.Println(harness.Line{Name: "watch-leader-cpu-per-write-" + k + "-vs-none", Unit: "us", Lodestone: med(lode, func(s sample) float64 { return s.leaderCPU[1] }),
		PeerName: "lodestone-no-watchers", Peer: med(lode, cpuNone), Op: "<=", Target: targetLeaderCPU})
	for _, peer := range []string{"broadcaster", "etcd"} {
		ps := samples[peer]
		if ps == nil {
			continue
		}
		fmt.Println(harness.Line{Name: "watch-write-p99-" + k + "-vs-" + peer, Unit: "ms", Lodestone: med(lode, wTop),
			PeerName: peer, Peer: med(ps, wTop), Op: "<=", Target: 1})
		fmt.Println(harness.Line{Name: "watch-write-p99-growth-" + k + "-vs-" + peer, Unit: "x", Lodestone: med(lode, growth),
			PeerName: peer, Peer: med(ps, growth), Op: "<=", Target: 1})
		fmt.Println(harness.Line{Name: "watch-lag-p99-" + k + "-vs-" + peer, Unit: "ms", Lodestone: med(lode, lagTop),
			PeerName: peer, Peer: med(ps, lagTop), Op: "<=", Target: 1})
		fmt.Println(harness.Line{Name: "watch-memory-per-watcher-vs-" + peer, Unit: "B", Lodestone: med(lode, mem),
			PeerName: peer, Peer: med(ps, mem), Op: "<=", Target: 1})
	}
	return nil
}

// runSystem runs every phase on a fresh deployment of sys.
func runSystem(ctx context.Context, sys system, workDir string, counts []int, rep int) (_ sample, err error) {
	logf("rep %d: starting %s", rep+1, sys.name)
	d, err := sys.start(ctx, workDir)
	if err != nil {
		return sample{}, err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w%s", err, d.logTails())
		}
		if serr := d.stop(); serr != nil && err == nil {
			err = fmt.Errorf("stop: %w", serr)
		}
	}()
	if *flagWatchCPUs != "" {
		for _, i := range d.watchers {
			if err := cpuset.Pin(d.procs[i].Pid(), *flagWatchCPUs); err != nil {
				return sample{}, err
			}
		}
	}
	if *flagWatchDisk > 0 && sys.name == "lodestone" {
		if err := d.slowWatchDisks(ctx, *flagWatchDisk); err != nil {
			return sample{}, err
		}
	}
	self, err := os.Executable()
	if err != nil {
		return sample{}, err
	}
	wr, err := harness.StartWriter("writer", self, []string{"-serve-writer", "-system", sys.name, "-target", d.target,
		"-write-conns", strconv.Itoa(*flagWriteConns), "-keys", strconv.Itoa(*flagKeys)},
		filepath.Join(d.dir, "writer.log"), cmp.Or(*flagWriterCPUs, *flagClientCPUs))
	if err != nil {
		return sample{}, err
	}
	defer func() {
		if werr := wr.Stop(); werr != nil && err == nil {
			err = fmt.Errorf("writer: %w", werr)
		}
	}()
	var s sample
	report := func(label string, r phaseResult) {
		note := ""
		if r.errors > 0 {
			note += fmt.Sprintf(" first-error=%q", r.firstErr.Error())
		}
		if !r.drained {
			note += " NOT-DRAINED"
		}
		fmt.Printf("run rep=%d/%d system=%s watchers=%s writes=%d errors=%d write-p50=%sms write-p99=%sms p99-spans=%s p99-stalls=%s lag-p50=%sms lag-p99=%sms due=%d delivered=%d extra=%d dups=%d leader-cpu-per-write=%sus watch-cpu-per-delivery=%sus cpu=%s%s\n",
			rep+1, *flagReps, sys.name, label, r.writes, r.errors,
			harness.FormatValue(harness.Millis(harness.Percentile(r.writeLat, 50))), harness.FormatValue(harness.Millis(harness.Percentile(r.writeLat, 99))), r.tail, r.tail.StallsString(),
			harness.FormatValue(harness.Millis(harness.Percentile(r.lag, 50))), harness.FormatValue(harness.Millis(harness.Percentile(r.lag, 99))),
			r.expected, r.exact, r.extra, r.dups, harness.FormatValue(r.leaderCPUPerWrite), harness.FormatValue(r.watchCPUPerDelivery), r.cpu, note)
	}
	phaseID := byte(1)
	phase := func(w *watchers) (phaseResult, error) {
		if *flagGCBefore {
			if err := harness.CollectAll(ctx, d.memberBases()); err != nil {
				return phaseResult{}, fmt.Errorf("phase %d: %w", phaseID, err)
			}
		}
		cpu := startCPU(d, wr.Proc())
		delays := startDelays(ctx, d)
		gcs := harness.StartGCCount(ctx, d.memberMetrics, d.roles())
		gcCPU := harness.StartGCCPU(ctx, d.memberMetrics, d.roles())
		slow := harness.StartSlowLogWrites(ctx, d.memberMetrics, d.roles())
		label := "none"
		if w != nil {
			label = strconv.Itoa(w.exact)
		}
		name := fmt.Sprintf("rep%d-phase%d-watchers-%s", rep+1, phaseID, label)
		var prof func() error
		if sys.name == "lodestone" {
			dur := *flagWarmup + *flagDuration
			prof = harness.WaitAll(profileMembers(ctx, d, dur, *flagPprof, name), harness.TraceAll(ctx, d.memberBases(), d.roles(), dur, *flagTrace, name))
		}
		leader0, _ := harness.CPUTime(d.procs[d.leader].Pid())
		watch0 := d.watchMembersCPU()
		r, err := runPhase(ctx, phaseID, wr, w, *flagKeys, *flagRate, *flagWarmup, *flagDuration, *flagDrain)
		if leader1, cerr := harness.CPUTime(d.procs[d.leader].Pid()); cerr == nil && r.writes > 0 {
			r.leaderCPUPerWrite = float64(leader1-leader0) / float64(time.Microsecond) / float64(r.writes)
		}
		if r.exact > 0 {
			r.watchCPUPerDelivery = float64(d.watchMembersCPU()-watch0) / float64(time.Microsecond) / float64(r.exact)
		}
		if *flagTrace != "" && sys.name == "lodestone" && err == nil {
			if serr := harness.SaveSlowest(filepath.Join(*flagTrace, "writes-"+name+".txt"), r.tail); serr != nil {
				logf("slowest writes: %v", serr)
			}
		}
		r.cpu = cpu()
		if dl := delays(); dl != "" {
			r.cpu += "," + dl
		}
		if gc := gcs(); gc != "" {
			r.cpu += ",gc-cycles(" + gc + ")"
		}
		if gc := gcCPU(); gc != "" {
			r.cpu += ",gc-cpu-ms(" + gc + ")"
		}
		if sl := slow(); sl != "" {
			r.cpu += ",slow-log-writes(" + sl + ")"
		}
		if prof != nil {
			if perr := prof(); perr != nil {
				logf("profile: %v", perr)
			}
		}
		phaseID++
		if err == nil && r.writes == 0 {
			err = fmt.Errorf("no write was acknowledged (first error: %v)", r.firstErr)
		}
		if err == nil {
			err = d.checkAlive()
		}
		return r, err
	}

	logf("%s: writes, no watchers", sys.name)
	r, err := phase(nil)
	if err != nil {
		return s, err
	}
	report("none", r)
	s.writeP99 = append(s.writeP99, harness.Millis(harness.Percentile(r.writeLat, 99)))
	s.leaderCPU[0] = r.leaderCPUPerWrite

	logf("%s: opening %d streams, %d prefix watchers", sys.name, *flagStreams, *flagPrefixes)
	w, err := openWatchers(ctx, sys, d.watchTargets, *flagConns, *flagStreams, *flagKeys, counts[len(counts)-1])
	if err != nil {
		return s, err
	}
	defer w.close() // idempotent
	if err := w.attach(ctx, 0, *flagPrefixes); err != nil {
		return s, err
	}
	r, err = phase(w)
	if err != nil {
		return s, err
	}
	report("0", r)
	s.lagP99 = append(s.lagP99, harness.Millis(harness.Percentile(r.lag, 99)))

	// Memory per watcher counts only what attaching costs: the live heap
	// right before and right after each attach step, with no write in
	// between, summed over the steps. (Measured across the write phases
	// instead, the retained event log, the store and the Raft log grow
	// with the 12k writes between them: about 50 B per watcher here.)
	var grown float64
	attached := 0
	for _, n := range counts {
		before, err := watchHeap(ctx, d)
		if err != nil {
			return s, err
		}
		logf("%s: attaching watchers up to %d", sys.name, n)
		t0 := time.Now()
		// NB: a mass attach (a fleet re-creating its watches after a
		// failover) can keep the leader from reading its sockets; no write
		// is timed here, so its poll delay is the figure.
		delays := startDelays(ctx, d)
		if err := w.attach(ctx, n, *flagPrefixes); err != nil {
			return s, err
		}
		logf("%s: %d watchers attached in %v %s", sys.name, n, time.Since(t0).Round(time.Millisecond), delays())
		heap, err := watchHeap(ctx, d)
		if err != nil {
			return s, err
		}
		grown += heap - before
		attached = n
		per := grown / float64(attached)
		fmt.Printf("memory rep=%d/%d system=%s watchers=%d live-heap=%.1fMiB before-attach=%.1fMiB per-watcher=%sB\n",
			rep+1, *flagReps, sys.name, n, heap/(1<<20), before/(1<<20), harness.FormatValue(per))
		// NB: the attach leaves the load generator garbage (a million
		// create requests at 1M), and with its 2 GiB heap floor its first
		// cycle came in the next phase, 1.3 s of CPU on the watch
		// member's core while it read the deliveries. Collect it now.
		runtime.GC()
		r, err := phase(w)
		if err != nil {
			return s, err
		}
		report(strconv.Itoa(n), r)
		s.writeP99 = append(s.writeP99, harness.Millis(harness.Percentile(r.writeLat, 99)))
		s.lagP99 = append(s.lagP99, harness.Millis(harness.Percentile(r.lag, 99)))
		s.perWatch = per
		// NB: for information, not the BENCH figure: after the phase's
		// writes every stream has had deliveries, so what a stream keeps
		// between rounds shows, but so does what the writes added to the
		// store, the Raft log and the retained event log (~50 B per
		// watcher at 100k, ~5 B at 1M).
		after, err := watchHeap(ctx, d)
		if err != nil {
			return s, err
		}
		fmt.Printf("memory rep=%d/%d system=%s watchers=%d after-writes live-heap=%.1fMiB per-watcher=%sB\n",
			rep+1, *flagReps, sys.name, n, after/(1<<20), harness.FormatValue((grown+after-heap)/float64(attached)))
		s.leaderCPU[1] = r.leaderCPUPerWrite
		s.expected, s.exact, s.extra, s.dups = r.expected, r.exact, r.extra, r.dups
	}

	// Control: the same writes once every stream is closed again. A
	// baseline that drifted (a bigger log, a snapshot, a noisy neighbour)
	// shows here; the ratio's baseline pools both control phases (see
	// harness.Baseline).
	w.close()
	// NB: the control times writes, not the teardown: let the watch
	// members drop every watcher and collect what they held first (the
	// scrapes drive their GC; see liveHeap).
	heap, err := watchHeap(ctx, d)
	if err != nil {
		return s, err
	}
	logf("%s: streams closed; the watch members' live heap is %.1f MiB", sys.name, heap/(1<<20))
	logf("%s: writes, streams closed again (control)", sys.name)
	if r, err = phase(nil); err != nil {
		return s, err
	}
	report("none-after", r)
	s.after = harness.Millis(harness.Percentile(r.writeLat, 99))
	s.leaderCPU[2] = r.leaderCPUPerWrite
	return s, nil
}

// raiseNoFile lifts the open-file limit to its hard maximum.
func raiseNoFile() {
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl) == nil && rl.Cur < rl.Max {
		rl.Cur = rl.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl)
	}
}

// countLabel names a watcher count in BENCH lines: 100000 is "100k",
// 1000000 is "1m".
func countLabel(n int) string {
	if n >= 1_000_000 && n%1_000_000 == 0 {
		return fmt.Sprintf("%dm", n/1_000_000)
	}
	return fmt.Sprintf("%dk", n/1000)
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

var logf = harness.NewLogf("watchbench")
