// Command drill rehearses the worst day: a three-node cluster with data,
// watchers and clients loses every node at once, comes back, and every
// client reconnects at the same moment. It measures how long until the
// cluster serves again (restore), until every client has been served and
// every watcher has resumed (full service), and the commit latency p99 of
// the servers in two windows:
//
//   - steady: after every client has been served and every watcher is at
//     the ticker's index, and the cluster is idle of catch-up (every
//     member has applied the leader's commit index and no watch stream
//     opened for a second), for --steady;
//   - ramp: from the restart until full service, on the restarted
//     servers' counters since their start: the reconnect storm, through
//     the admission ramp when the run has one. (A request that finds no
//     leader yet waits in the server's hold, outside the commit latency.)
//
// It does this --reps times for each mode (ramp on, ramp off, interleaved
// so load drift hits both alike) on a fresh cluster each time, the servers
// pinned to --server-cpus and the drill's clients and watchers, a child
// process of their own (child.go), to --client-cpus, and
// prints one DRILL line per run and, at the end, one summary line per
// mode with medians and spreads (least..greatest):
//
//	DRILL rep=<n> ramp=<r> restore=<s> full_service=<s> steady_commit_p99=<ms> commit_p99_during_ramp=<ms> ratio=<x> ...
//	DRILL summary ramp=<r> reps=<n> steady_commit_p99=<med>ms(<min>..<max>) steady_spread=<max/min> ... target=...
//
// While a window runs, a line reports each second in which a server
// committed slowly (over --slow), beside what else that server did in
// that second (raftlog checkpoints, slow saves, GC cycles, CPU, how long
// its goroutines waited runnable), so a slow tail has timestamps and
// suspects. A probe beside the servers' data fdatasyncs a block of its own
// ten times a second (diskprobe.go): each window's worst is on the DRILL
// line (steady_disk_worst, ramp_disk_worst, in ms) and each slow second's
// on its line, so a stall of the shared device, which raises every
// member's commits at once whatever they do, is told from the servers'
// own. With --pprof (and --trace) it saves CPU profiles (and
// execution traces) of every server.
//
// Run it with `make drill`. Targets: full service under 5 minutes; the
// slowest rep's steady p99 at most 2x the fastest's; with the ramp, commit
// p99 during the storm at most 3x the steady p99 in every rep.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/internal/cpuset"
)

type options struct {
	binary                 string
	clients, watchers      int
	keys                   int
	interval               time.Duration
	steady, settle         time.Duration
	reads, writes, watches uint64
	connections            uint64
	ramp                   float64
	mode                   string
	limit                  time.Duration
	reps                   int
	serverCPUs, clientCPUs string
	drillCPUs              string
	servePopulation        bool
	endpoints              string
	slow                   time.Duration
	keep                   bool
	pprof                  string
	logLevel               string
	rampProfile            time.Duration
	trace                  bool
}

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "bin/lodestone", "the lodestone binary to run the servers with")
	flag.IntVar(&o.clients, "clients", 2000, "clients, one connection each, each reading (and now and then writing) once per --interval")
	flag.IntVar(&o.watchers, "watchers", 1000, "watchers (on as many of the clients)")
	flag.IntVar(&o.keys, "keys", 1000, "keys written before the drill")
	flag.DurationVar(&o.interval, "interval", 5*time.Second, "each client's request interval (2,000 clients at 5s: 400 requests/s)")
	flag.DurationVar(&o.steady, "steady", 30*time.Second, "the steady window: how long to measure before the outage")
	flag.DurationVar(&o.settle, "settle", 5*time.Second, "after every client and watcher is served, wait this long before checking the cluster is idle of catch-up")
	flag.Uint64Var(&o.reads, "reads", 3000, "admission limit: reads per second per server")
	flag.Uint64Var(&o.writes, "writes", 400, "admission limit: writes per second per server")
	flag.Uint64Var(&o.watches, "watches", 100, "admission limit: new watch streams per second per server")
	flag.Uint64Var(&o.connections, "connections", 1400, "admission limit: new client connections accepted per second per server (0: unpaced)")
	flag.Float64Var(&o.ramp, "ramp", 25, "admission ramp, percent per minute")
	flag.StringVar(&o.mode, "mode", "both", "ramp, noramp or both")
	flag.DurationVar(&o.limit, "limit", 5*time.Minute, "give up on full service after this long")
	flag.IntVar(&o.reps, "reps", 3, "repetitions of each mode; medians and spreads are reported (use an odd number)")
	flag.StringVar(&o.serverCPUs, "server-cpus", "1", `CPU list (taskset -c) of every server; "" = unpinned`)
	flag.StringVar(&o.clientCPUs, "client-cpus", "0", `CPU list of the drill's clients and watchers (a child process of their own); "" = unpinned`)
	flag.StringVar(&o.drillCPUs, "drill-cpus", "", `CPU list of the drill's own clock, scrapes and readiness polls; "" = unpinned (it is light, and unpinned no busy core starves it)`)
	flag.BoolVar(&o.servePopulation, "serve-population", false, "internal: be the child process that runs the clients and watchers (see child.go)")
	flag.StringVar(&o.endpoints, "endpoints", "", "internal, with -serve-population: the servers' gRPC addresses, comma-separated")
	flag.DurationVar(&o.slow, "slow", 50*time.Millisecond, "report each second in which a server committed slower than this")
	flag.BoolVar(&o.keep, "keep", false, "keep each run's data dirs and server logs (path printed)")
	flag.StringVar(&o.logLevel, "server-log-level", "warn", "the servers' --log-level (their logs are in each run's dir: see --keep)")
	flag.StringVar(&o.pprof, "pprof", "", "save CPU profiles of every server over the steady window and the first --ramp-profile of the ramp into this directory (a profiled run's figures are not the drill's)")
	flag.DurationVar(&o.rampProfile, "ramp-profile", 20*time.Second, "with --pprof: how much of the ramp, from the restart, to profile")
	flag.BoolVar(&o.trace, "trace", false, "with --pprof: also save an execution trace of every server over the first --ramp-profile of the ramp (go tool trace; -pprof=sched, sync)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.servePopulation {
		if err := runPopulation(ctx, o); err != nil {
			fmt.Fprintln(os.Stderr, "drill population: "+err.Error())
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "drill: "+err.Error())
		os.Exit(1)
	}
}

// runPopulation is the child process: pinned to --client-cpus, it runs
// the clients and watchers and answers the parent on stdin and stdout.
func runPopulation(ctx context.Context, o options) error {
	if o.clientCPUs != "" {
		if err := cpuset.PinSelf(o.clientCPUs); err != nil {
			return fmt.Errorf("--client-cpus: %w", err)
		}
	}
	eps := strings.Split(o.endpoints, ",")
	if o.endpoints == "" {
		return errors.New("-serve-population needs -endpoints")
	}
	return servePopulation(ctx, o, eps, os.Stdin, os.Stdout)
}

func run(ctx context.Context, o options, out io.Writer) error {
	bin, err := filepath.Abs(o.binary)
	if err != nil {
		return err
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("--binary %s: %w (run 'make build' first)", o.binary, err)
	}
	var modes []bool
	switch o.mode {
	case "both":
		modes = []bool{true, false}
	case "ramp":
		modes = []bool{true}
	case "noramp":
		modes = []bool{false}
	default:
		return fmt.Errorf("--mode %q: use ramp, noramp or both", o.mode)
	}
	if o.reps < 1 {
		return fmt.Errorf("--reps %d: at least 1", o.reps)
	}
	if o.pprof != "" {
		if err := os.MkdirAll(o.pprof, 0o755); err != nil {
			return fmt.Errorf("--pprof: %w", err)
		}
	}
	if o.serverCPUs != "" {
		if _, err := cpuset.Parse(o.serverCPUs); err != nil {
			return fmt.Errorf("--server-cpus: %w", err)
		}
	}
	if o.clientCPUs != "" {
		if _, err := cpuset.Parse(o.clientCPUs); err != nil {
			return fmt.Errorf("--client-cpus: %w", err)
		}
	}
	if o.drillCPUs != "" {
		if err := cpuset.PinSelf(o.drillCPUs); err != nil {
			return fmt.Errorf("--drill-cpus: %w", err)
		}
	}
	fmt.Fprintf(out, "drill: %d clients, %d watchers, %d keys, %d reps, %d CPUs; servers on CPUs %q, clients and watchers (a child process) on CPUs %q, the drill itself on CPUs %q (GOMAXPROCS %d)\n",
		o.clients, o.watchers, o.keys, o.reps, runtime.NumCPU(), o.serverCPUs, o.clientCPUs, o.drillCPUs, runtime.GOMAXPROCS(0))
	results := map[bool][]result{}
	var lines []string
	for rep := 1; rep <= o.reps; rep++ {
		for _, ramp := range modes {
			res, err := drill(ctx, bin, o, ramp, rep, out)
			if err != nil {
				return err
			}
			results[ramp] = append(results[ramp], res)
			lines = append(lines, res.line(o))
			fmt.Fprintln(out, res.line(o))
		}
	}
	fmt.Fprintln(out, "---")
	for _, l := range lines {
		fmt.Fprintln(out, l)
	}
	for _, ramp := range modes {
		fmt.Fprintln(out, summary(o, ramp, results[ramp]))
	}
	return nil
}

// window is what the servers did over one measured window.
type window struct {
	dur     time.Duration
	commits float64
	p99     float64 // seconds
	saveP99 float64 // seconds: the raftlog's Save (append and fsync), beside the commit p99
	cpu     float64 // server CPU seconds, all three
	// rejectsBy is the requests admission control refused, by
	// refusalClasses.
	rejectsBy [len(refusalClasses)]float64
	// heldConns, heldWatches are the setups servers held while short of
	// CPU (--admission-max-sched-delay).
	heldConns, heldWatches float64
	conns                  float64 // client gRPC connections open at the end, all servers
	fleet                  float64 // the clients' and watchers' process CPU seconds
	placement              string  // watch streams per server at the end, the leader starred
	diskWorst              float64 // seconds: the disk probe's longest fdatasync
}

// rejects is the requests admission control refused, every class.
func (w window) rejects() float64 {
	var t float64
	for _, n := range w.rejectsBy {
		t += n
	}
	return t
}

func (w window) fleetPerSec() float64 { return w.fleet / max(w.dur.Seconds(), 1e-9) }

// fleetCPU is the population process's CPU seconds so far, 0 if unknown.
func fleetCPU(p *population) float64 {
	d, err := p.cpu()
	if err != nil {
		return 0
	}
	return d.Seconds()
}

func (w window) cpuPerSec() float64 { return w.cpu / max(w.dur.Seconds(), 1e-9) }

type result struct {
	rep                   int
	ramp                  bool
	restore, fullService  time.Duration
	steady, storm         window
	clientsOK, watchersOK int
	complete              bool
	idle                  bool // the steady window began idle of catch-up
}

func rampName(o options, ramp bool) string {
	if ramp {
		return fmt.Sprintf("%g%%/min", o.ramp)
	}
	return "off"
}

func (r result) ratio() float64 {
	if r.steady.p99 <= 0 {
		return 0
	}
	return r.storm.p99 / r.steady.p99
}

func (r result) line(o options) string {
	full := fmt.Sprintf("%.1f", r.fullService.Seconds())
	if !r.complete {
		full = fmt.Sprintf(">%.0f", o.limit.Seconds())
	}
	idle := "yes"
	if !r.idle {
		idle = "no"
	}
	return fmt.Sprintf("DRILL rep=%d ramp=%s idle=%s restore=%.1f full_service=%s steady_commit_p99=%.1f commit_p99_during_ramp=%.1f ratio=%.2f "+
		"steady_save_p99=%.1f ramp_save_p99=%.1f steady_disk_worst=%.1f ramp_disk_worst=%.1f steady_commits=%.0f/%.0fs ramp_commits=%.0f/%.0fs server_cpu_steady=%.2fs/s server_cpu_ramp=%.1fs(%.2fs/s) ramp_refusals=%.0f(read:%.0f,write:%.0f,watch:%.0f) ramp_held=connections:%.0f,watches:%.0f conns_steady=%.0f conns_after=%.0f fleet_cpu_steady=%.2fs/s fleet_cpu_ramp=%.2fs/s clients_served=%d/%d watchers_resumed=%d/%d steady_watch_streams=%s",
		r.rep, rampName(o, r.ramp), idle, r.restore.Seconds(), full, r.steady.p99*1000, r.storm.p99*1000, r.ratio(), r.steady.saveP99*1000, r.storm.saveP99*1000,
		r.steady.diskWorst*1000, r.storm.diskWorst*1000, r.steady.commits, r.steady.dur.Seconds(), r.storm.commits, r.storm.dur.Seconds(), r.steady.cpuPerSec(), r.storm.cpu, r.storm.cpuPerSec(), r.storm.rejects(), r.storm.rejectsBy[0], r.storm.rejectsBy[1], r.storm.rejectsBy[2], r.storm.heldConns, r.storm.heldWatches, r.steady.conns, r.storm.conns, r.steady.fleetPerSec(), r.storm.fleetPerSec(),
		r.clientsOK, o.clients, r.watchersOK, o.watchers, r.steady.placement)
}

// summary is one mode's medians and spreads over its reps, and whether
// each target was met.
func summary(o options, ramp bool, rs []result) string {
	var steady, storm, ratio, full, disk []float64
	complete := true
	for _, r := range rs {
		steady = append(steady, r.steady.p99*1000)
		disk = append(disk, r.steady.diskWorst*1000)
		storm = append(storm, r.storm.p99*1000)
		ratio = append(ratio, r.ratio())
		full = append(full, r.fullService.Seconds())
		complete = complete && r.complete
	}
	st, sm, ra, fu, dw := spreadOf(steady), spreadOf(storm), spreadOf(ratio), spreadOf(full), spreadOf(disk)
	steadySpread := st.max / st.min
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "missed"
	}
	fullOK := complete && fu.max < 300
	return fmt.Sprintf("DRILL summary ramp=%s reps=%d steady_commit_p99=%.1fms(%.1f..%.1f) steady_spread=%.2f target=<=2 %s steady_disk_worst=%.1fms(%.1f..%.1f) "+
		"commit_p99_during_ramp=%.1fms(%.1f..%.1f) ratio=%.2f(%.2f..%.2f) target=<=3 %s full_service=%.1fs(%.1f..%.1f) target=<300 %s",
		rampName(o, ramp), len(rs), st.median, st.min, st.max, steadySpread, met(steadySpread <= 2), dw.median, dw.min, dw.max,
		sm.median, sm.min, sm.max, ra.median, ra.min, ra.max, met(ra.max <= 3),
		fu.median, fu.min, fu.max, met(fullOK))
}

// --- one run ------------------------------------------------------------------

func drill(ctx context.Context, bin string, o options, ramp bool, rep int, log io.Writer) (res result, err error) {
	res.ramp, res.rep = ramp, rep
	dir, err := os.MkdirTemp("", "lodestone-drill-")
	if err != nil {
		return res, err
	}
	if o.keep {
		fmt.Fprintf(log, "drill: rep %d keeps %s\n", rep, dir)
	} else {
		defer os.RemoveAll(dir)
	}
	c, err := newCluster(bin, dir, o.serverCPUs, o.logLevel)
	if err != nil {
		return res, err
	}
	defer c.kill(syscall.SIGKILL)
	if c.probe, err = startDiskProbe(dir, probeEvery); err != nil {
		return res, err
	}
	defer c.probe.close()
	if err := c.start(); err != nil {
		return res, err
	}
	if err := c.waitReady(ctx, time.Minute, log); err != nil {
		return res, err
	}
	admin, err := client.New(client.Config{Endpoints: c.endpoints(), RequestTimeout: 10 * time.Second})
	if err != nil {
		return res, err
	}
	defer admin.Close()
	if err := seed(ctx, admin, o.keys); err != nil {
		return res, err
	}
	fmt.Fprintf(log, "drill rep %d (ramp %s): cluster up with %d keys (HTTP %s %s %s); starting %d clients and %d watchers\n",
		rep, rampName(o, ramp), o.keys, c.servers[0].http, c.servers[1].http, c.servers[2].http, o.clients, o.watchers)

	pop, err := startPopulation(c.endpoints(), o)
	if err != nil {
		return res, err
	}
	defer pop.stop()
	// The ticker writes the key every watcher follows.
	tctx, tcancel := context.WithCancel(ctx)
	var tickIndex atomic.Uint64
	var twg sync.WaitGroup
	twg.Add(1)
	go func() {
		defer twg.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for n := 0; tctx.Err() == nil; n++ {
			rctx, cancel := context.WithTimeout(tctx, 2*time.Second)
			if resp, err := admin.Put(rctx, "drill/tick/now", []byte(strconv.Itoa(n))); err == nil {
				tickIndex.Store(resp.GetKv().GetModifyIndex())
			}
			cancel()
			select {
			case <-tctx.Done():
			case <-t.C:
			}
		}
	}()
	defer func() { tcancel(); twg.Wait() }()

	// Steady state: every client and watcher served, then idle of
	// catch-up, then measure.
	warm := time.Now()
	if _, err := waitServed(ctx, pop, warm, tickIndex.Load()+1, o, 2*time.Minute, log); err != nil {
		return res, fmt.Errorf("steady state never reached: %w", err)
	}
	if err := sleep(ctx, o.settle); err != nil {
		return res, err
	}
	idle, err := waitIdle(ctx, c, time.Minute)
	if err != nil {
		return res, err
	}
	res.idle = idle
	if !idle {
		fmt.Fprintln(log, "drill: the cluster was not idle of catch-up within 1m; measuring the steady window anyway (idle=no)")
	}
	mw := startWindow(c, o, "steady", false, log)
	fleet0 := fleetCPU(pop)
	waitProfile := func() {}
	if o.pprof != "" {
		waitProfile = profileWindow(c, cpuProfile, o.pprof, profileTag(rep, ramp, "steady"), o.steady-time.Second, log)
	}
	if err := sleep(ctx, o.steady); err != nil {
		return res, err
	}
	res.steady = mw.end()
	res.steady.fleet = fleetCPU(pop) - fleet0
	waitProfile()
	fmt.Fprintf(log, "drill: steady commit p99 %.1fms over %.0f commits; killing every server\n", res.steady.p99*1000, res.steady.commits)

	if ramp {
		// NB: set before the outage: the policy is in the replicated state,
		// and each restarted server ramps up again from its own start, so
		// it holds the storm back from the first request on.
		pol := &lodestonepb.AdmissionPolicy{Enabled: true, Reads: o.reads, Writes: o.writes, Watches: o.watches, Connections: o.connections, RampPercentPerMin: o.ramp}
		set, err := admin.SetAdmission(ctx, pol)
		if err != nil {
			return res, fmt.Errorf("set admission: %w", err)
		}
		// An operator sets the policy ahead of an outage, not in its last
		// millisecond: killed right after the commit, no member may have
		// persisted that the policy's entry is committed, and the
		// restarted servers would admit the storm until their new leader
		// commits it again. So wait until every member applied a tick
		// written after it.
		if err := waitApplied(ctx, c, set.GetIndex(), &tickIndex, 30*time.Second); err != nil {
			return res, fmt.Errorf("admission policy at index %d: %w", set.GetIndex(), err)
		}
	}
	// The outage: every node dies at once; clients keep trying.
	lastIndex := tickIndex.Load()
	c.kill(syscall.SIGKILL)
	if err := sleep(ctx, 3*time.Second); err != nil {
		return res, err
	}
	restartAt := time.Now()
	if err := c.start(); err != nil {
		return res, err
	}
	fmt.Fprintf(log, "drill: %s every server started again in %.1fs\n", restartAt.UTC().Format("15:04:05.000"), time.Since(restartAt).Seconds())
	// The ramp window counts from the servers' start: a busy machine can
	// delay the drill's own readiness polls past the storm itself.
	mw = startWindow(c, o, "ramp", true, log)
	fleet0 = fleetCPU(pop)
	if o.pprof != "" {
		defer profileWindow(c, cpuProfile, o.pprof, profileTag(rep, ramp, "ramp"), o.rampProfile, log)()
		if o.trace {
			defer profileWindow(c, execTrace, o.pprof, profileTag(rep, ramp, "ramp"), o.rampProfile, log)()
		}
	}
	if err := c.waitReady(ctx, 2*time.Minute, log); err != nil {
		return res, err
	}
	res.restore = time.Since(restartAt)
	fmt.Fprintf(log, "drill: cluster back after %.1fs; waiting for every client and watcher\n", res.restore.Seconds())
	full, err := waitServed(ctx, pop, restartAt, lastIndex+1, o, o.limit, log)
	res.complete = err == nil
	res.fullService = full
	res.storm = mw.end()
	res.storm.fleet = fleetCPU(pop) - fleet0
	res.clientsOK, res.watchersOK, _ = pop.served(restartAt, lastIndex+1)
	if ramp {
		_, _ = admin.SetAdmission(ctx, &lodestonepb.AdmissionPolicy{})
	}
	return res, ctx.Err()
}

// profileTag names a run's profiles: r1-rampon-steady, r2-rampoff-ramp.
func profileTag(rep int, ramp bool, window string) string {
	mode := "rampoff"
	if ramp {
		mode = "rampon"
	}
	return fmt.Sprintf("r%d-%s-%s", rep, mode, window)
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func seed(ctx context.Context, c *client.Client, keys int) error {
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	next := atomic.Int64{}
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= keys {
					return
				}
				if _, err := c.Put(ctx, fmt.Sprintf("drill/key/%d", i), []byte(strings.Repeat("v", 100))); err != nil {
					errs <- fmt.Errorf("seed key %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// waitServed polls until every client was served after t and every
// watcher reached index, reporting progress every few seconds.
func waitServed(ctx context.Context, p *population, t time.Time, index uint64, o options, limit time.Duration, log io.Writer) (time.Duration, error) {
	deadline := time.Now().Add(limit)
	lastReport := time.Now()
	for {
		cl, wa, err := p.served(t, index)
		if err != nil {
			return time.Since(t), err
		}
		if cl == o.clients && wa == o.watchers {
			return time.Since(t), nil
		}
		if time.Since(lastReport) > 5*time.Second {
			fmt.Fprintf(log, "drill: %.0fs: %d/%d clients served, %d/%d watchers resumed\n", time.Since(t).Seconds(), cl, o.clients, wa, o.watchers)
			lastReport = time.Now()
		}
		if time.Now().After(deadline) {
			return time.Since(t), errors.New("not every client and watcher was served in time")
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return time.Since(t), err
		}
	}
}
