// Command kvbench runs the same put workload against a three-process
// Lodestone cluster and a three-process etcd cluster on this machine and
// prints one BENCH line per comparison (see bench/README.md, "How
// benchmarks report"). Run it from bench/:
//
//	cd bench && go run ./cmd/kvbench [-reps 3] [-duration 8s] [-clients 1,64] [-secure=false]
//
// Besides the plain-text runs at each client count it runs both systems
// secured (TLS with client certificates on every port, access control on)
// at 64 clients, in the same repetitions, unless -secure=false.
package main

import (
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
	flagReps       = flag.Int("reps", 3, "repetitions per system and client count; medians are reported")
	flagDuration   = flag.Duration("duration", 8*time.Second, "measured window of each run")
	flagWarmup     = flag.Duration("warmup", 2*time.Second, "warm-up before each measured window (ops run, not counted)")
	flagClients    = flag.String("clients", "1,64", "comma-separated client counts")
	flagValueSize  = flag.Int("value-size", 256, "bytes per put value")
	flagPerConn    = flag.Int("clients-per-conn", 8, "clients sharing one gRPC connection to the leader (same for both systems)")
	flagServerCPUs = flag.String("server-cpus", "1", `taskset CPU list for every server process of both systems ("" = no pinning)`)
	flagClientCPUs = flag.String("client-cpus", "0", `CPU list the load generator pins itself to ("" = no pinning)`)
	flagSystems    = flag.String("systems", "lodestone,etcd", "systems to run; BENCH lines need both")
	flagWorkDir    = flag.String("work-dir", "", "where binaries and data dirs go (default: the system temp dir)")
	flagRoot       = flag.String("root", "..", "the lodestone module root, relative to bench/")
	flagKeep       = flag.Bool("keep", false, "keep binaries, data dirs and server logs after the run")
	flagPprof      = flag.String("pprof", "", "directory for CPU and allocation profiles of every Lodestone server over each run's measured window (SYSTEM-cN-rREP-ROLE.pprof, .allocs-base.pprof and .allocs.pprof; ROLE leader, f1, f2); runs Lodestone with --enable-pprof and fetches them over TLS with the management token on a secure run, so a profiled run's figures are not the benchmark's")
	flagSecure     = flag.Bool("secure", true, fmt.Sprintf("also run each system secured (mutual TLS on every port, Lodestone ACLs / etcd auth) at %d clients", secureClients))
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
	if *flagReps < 1 || *flagPerConn < 1 || *flagValueSize < 1 {
		return fmt.Errorf("-reps, -clients-per-conn and -value-size must be >= 1")
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
	if *flagSecure {
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

	samples := map[string]map[int][]sample{}
	for _, s := range append(slices.Clone(systems), secured...) {
		samples[s.name] = map[int][]sample{}
	}
	steps := schedule(clientCounts, len(systems), len(secured))
	for rep := range *flagReps {
		for si, st := range steps {
			var order []system
			for _, i := range st.systems {
				order = append(order, systems[i])
			}
			for _, i := range st.secured {
				order = append(order, secured[i])
			}
			if (rep+si)%2 == 1 { // alternate who goes first to spread machine noise
				slices.Reverse(order)
			}
			n := st.clients
			for _, sys := range order {
				res, note, err := runOnce(ctx, sys, tmp, n, fmt.Sprintf("%s-c%d-r%d", sys.name, n, rep+1))
				if err != nil {
					return fmt.Errorf("rep %d, %d clients: %w", rep+1, n, err)
				}
				smp := sample{throughput: res.Throughput(), p99: harness.Millis(res.Percentile(99))}
				samples[sys.name][n] = append(samples[sys.name][n], smp)
				fmt.Printf("run rep=%d/%d clients=%d system=%s throughput=%sops/s p50=%sms p99=%sms ops=%d errors=%d%s\n",
					rep+1, *flagReps, n, sys.name, harness.FormatValue(smp.throughput),
					harness.FormatValue(harness.Millis(res.Percentile(50))), harness.FormatValue(smp.p99),
					res.Ops(), res.Errors, note)
			}
		}
	}

	fmt.Printf("setup: 3-node clusters, 3 processes each on 127.0.0.1 loopback, fsync on, one cluster running at a time, fresh data dirs per run; "+
		"puts of %d-byte values to distinct keys, sent to the leader, %d clients per gRPC connection; %d reps x %s (after %s warm-up), medians shown\n",
		*flagValueSize, *flagPerConn, *flagReps, *flagDuration, *flagWarmup)
	if len(secured) > 0 {
		fmt.Printf("secure: %d clients, same workload and connections; one CA and ECDSA P-256 certificates for both systems, TLS on client and peer ports "+
			"with a client certificate required on every port; lodestone: --tls-verify-incoming-grpc/-http, --acl-enabled --acl-default-policy deny, "+
			"the bench's token has only key_prefix %q { policy = \"write\" }; etcd: client/peer TLS with client-cert auth, gRPC-only client port, "+
			"auth enabled (root user, simple tokens), the bench logs in per connection as a user whose role has readwrite on %s*\n",
			secureClients, benchPrefix, benchPrefix)
	}
	fmt.Printf("pinning: %s\n", pinning)

	lode, peer := samples["lodestone"], samples[peerName]
	if lode == nil || peer == nil {
		fmt.Println("no BENCH lines: they compare lodestone with etcd, and -systems ran only", *flagSystems)
		return nil
	}
	med := func(ss []sample, f func(sample) float64) float64 {
		var xs []float64
		for _, s := range ss {
			xs = append(xs, f(s))
		}
		return harness.Median(xs)
	}
	th := func(s sample) float64 { return s.throughput }
	lat := func(s sample) float64 { return s.p99 }
	for _, n := range clientCounts {
		tput, p99 := targets(n)
		fmt.Println(harness.Line{Name: fmt.Sprintf("put-%dclients-throughput", n), Unit: "ops/s",
			Lodestone: med(lode[n], th), PeerName: peerName, Peer: med(peer[n], th), Op: ">=", Target: tput})
		fmt.Println(harness.Line{Name: fmt.Sprintf("put-%dclients-p99", n), Unit: "ms",
			Lodestone: med(lode[n], lat), PeerName: peerName, Peer: med(peer[n], lat), Op: "<=", Target: p99})
	}
	if len(secured) == 0 {
		return nil
	}
	lodeSec, peerSec := samples["lodestone"+secureSuffix][secureClients], samples[peerName+secureSuffix][secureClients]
	for _, l := range secureLines(med(lodeSec, th), med(peerSec, th), med(lode[secureClients], th)) {
		fmt.Println(l)
	}
	return nil
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

// runOnce starts a fresh cluster of sys, drives n clients against its
// leader and stops it. note flags anything a reader should know about the
// run (errors, a leader change).
func runOnce(ctx context.Context, sys system, workDir string, n int, name string) (_ harness.Result, note string, err error) {
	logf("starting %s cluster for %d clients", sys.name, n)
	c, err := startCluster(ctx, sys, workDir, *flagServerCPUs)
	if err != nil {
		return harness.Result{}, "", err
	}
	defer func() {
		if serr := c.stop(); serr != nil && err == nil {
			err = fmt.Errorf("stop %s: %w", sys.name, serr)
		}
	}()

	nconn := (n + *flagPerConn - 1) / *flagPerConn
	puts := make([]func(context.Context, []byte, []byte) error, nconn)
	for i := range nconn {
		conn, err := c.connect(ctx, c.leader)
		if err != nil {
			return harness.Result{}, "", err
		}
		defer conn.Close()
		puts[i] = sys.put(conn)
	}
	values := make([][]byte, n)
	for i := range values {
		values[i] = make([]byte, *flagValueSize)
		rand.Read(values[i])
	}

	logf("driving %s: %d clients over %d connections to leader %s for %s + %s warm-up",
		sys.name, n, nconn, c.leader, *flagDuration, *flagWarmup)
	cpu0 := c.cpuTime()
	self0, selfErr := harness.CPUTime(os.Getpid())
	prof := c.profile(ctx, *flagWarmup, *flagDuration, *flagPprof, name)
	res, err := harness.Drive(ctx, harness.DriveConfig{Clients: n, Warmup: *flagWarmup, Duration: *flagDuration},
		func(ctx context.Context, client, seq int) error {
			key := fmt.Appendf(nil, "kvbench/%03d/%09d", client, seq)
			return puts[client%nconn](ctx, key, values[client])
		})
	if perr := prof(); perr != nil && err == nil {
		err = fmt.Errorf("profile %s: %w", sys.name, perr)
	}
	if err != nil {
		return harness.Result{}, "", err
	}
	// NB: wall-clock throughput on a shared machine swings with the
	// neighbours; the servers' CPU time per put barely does. The window
	// includes the warm-up, so divide by the ops the warm-up ran too, at
	// the measured rate.
	if cpu := c.cpuTime() - cpu0; cpu > 0 && res.Throughput() > 0 {
		ops := res.Throughput() * (*flagWarmup + *flagDuration).Seconds()
		note += fmt.Sprintf(" server-cpu=%.0fus/op", float64(cpu.Microseconds())/ops)
		// NB: the load generator has a core of its own, shared with the
		// machine's other work; near a core per second it, not the
		// servers, bounds the throughput (TLS costs it too).
		if self1, err := harness.CPUTime(os.Getpid()); err == nil && selfErr == nil {
			wall := (*flagWarmup + *flagDuration).Seconds()
			note += fmt.Sprintf(" client-cpu=%.0fus/op (%.2f cores)", float64((self1-self0).Microseconds())/ops, (self1-self0).Seconds()/wall)
		}
	}
	logf("stopping %s", sys.name)
	if res.Ops() == 0 {
		return res, "", fmt.Errorf("%s acknowledged no puts (first error: %v)%s", sys.name, res.FirstErr, c.logTails())
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

var started = time.Now()

// logf writes a progress line to stderr, stamped with seconds since start.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "kvbench: %5.1fs "+format+"\n", append([]any{time.Since(started).Seconds()}, args...)...)
}
