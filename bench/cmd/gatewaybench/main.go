// Command gatewaybench sends the same HTTP load (wrk) to the same origin
// directly, through the Lodestone gateway, through nginx (one worker,
// upstream keep-alive), through HAProxy (one thread) and through a plain
// httputil.ReverseProxy, each proxy pinned to one core with the load
// generator and the origin on the other, and prints BENCH lines for
// requests/s and the latency each proxy adds (see bench/README.md, "How
// benchmarks report"). Run it from bench/ (or `make bench-gateway`):
//
//	cd bench && go run ./cmd/gatewaybench [-reps 3] [-duration 10s]
//
// Every process is started and stopped by the program; nginx and HAProxy
// configs are generated into a temp dir. Needs wrk, nginx and haproxy on
// PATH (Debian: apt-get install wrk nginx-light haproxy) and taskset.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/bench/internal/harness"
	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/gateway"
	"github.com/lodestone-kv/lodestone/internal/cpuset"
	"github.com/lodestone-kv/lodestone/server"
)

var (
	flagRole       = flag.String("role", "", "internal: run as origin, gateway or reverseproxy (the benchmark starts itself in these roles)")
	flagReps       = flag.Int("reps", 5, "repetitions; medians are reported (use an odd number)")
	flagDuration   = flag.Duration("duration", 10*time.Second, "measured window of each wrk run (whole seconds)")
	flagSlices     = flag.Int("slices", 5, "slices the throughput run is cut into, taken by the systems in turn (-duration/-slices whole seconds each)")
	flagWarmup     = flag.Duration("warmup", 2*time.Second, "wrk warm-up before each system's measured runs")
	flagConns      = flag.Int("conns", 64, "wrk connections of the throughput run")
	flagLatConns   = flag.Int("latency-conns", 16, "wrk connections of the paced latency run")
	flagPacing     = flag.Int("pacing-ms", 4, "pause (ms) each connection of the latency run takes between requests (wrk delay()), so that run stays below every system's saturation")
	flagBody       = flag.Int("body", 64, "origin response body bytes")
	flagProxyCPUs  = flag.String("proxy-cpus", "1", `taskset CPU list for every proxy ("" = unpinned)`)
	flagClientCPUs = flag.String("client-cpus", "0", `CPU list for wrk, the origin, the registry and this program ("" = unpinned)`)
	flagSystems    = flag.String("systems", "direct,lodestone,nginx,haproxy", "systems to run (also: reverseproxy); BENCH lines need direct, lodestone and the peer")
	flagShapes     = flag.String("shapes", "small,64k,newconn,churn", "loads to run: small (keep-alive, -body bytes), 64k (64 KiB responses), newconn (a new connection per request), churn (small, the gateway alone, with and without registry churn)")
	flagChurnRate  = flag.Int("churn-rate", 1000, "registry changes per second in the churn shape's churn slices")
	flagChurnLive  = flag.Int("churn-live", 200, "churned instances registered at a time beside the origin's own (each lives about churn-live/(churn-rate/2) seconds)")
	flagChurnConc  = flag.Int("churn-workers", 32, "registry changes in flight at once in the churn slices")
	flagWorkDir    = flag.String("work-dir", "", "where configs and logs go (default: the system temp dir)")
	flagKeep       = flag.Bool("keep", false, "keep configs and logs after the run")
)

// addedFloorMS is the least added latency reported: wrk's resolution.
const addedFloorMS = 0.001

func main() {
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: cd bench && go run ./cmd/gatewaybench [flags]\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *flagRole != "" {
		if err := runRole(*flagRole, flag.Args()); err != nil {
			fmt.Fprintf(os.Stderr, "gatewaybench %s: %v\n", *flagRole, err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		if errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "gatewaybench: interrupted; every process stopped")
		} else {
			fmt.Fprintf(os.Stderr, "gatewaybench: %v\n", err)
		}
		os.Exit(1)
	}
}

var logf = harness.NewLogf("gatewaybench")

// measurement is one system's numbers in one repetition.
type measurement struct {
	rps              float64 // throughput run
	satP50, satP99   float64 // ms, throughput run (at saturation)
	p50, p99         float64 // ms, paced latency run
	pacedRPS         float64
	proxyCPU         float64 // share of one core the proxy used in the throughput run; -1 if none
	cpuPerReq        float64 // µs of the proxy's CPU time per request of the throughput run; -1 if none
	originPerReq     float64 // µs of the origin's CPU time per request of the throughput run; -1 if unknown
	clientCPU        float64 // busy share of the -client-cpus cores in the throughput run; -1 if unknown
	opensPerSec      float64 // TCP connections the machine opened a second in the throughput run; -1 if unknown
	errors, non2xx   int64
	satErrs, satNon2 int64
}

type env struct {
	tmp, self string
	origin    string // host:port
	originPID int
	registry  string
	sh        shape // the shape being measured
	procs     []*harness.Proc
}

func run(ctx context.Context) error {
	if *flagReps < 1 || *flagDuration < time.Second {
		return fmt.Errorf("-reps must be >= 1 and -duration >= 1s")
	}
	if *flagSlices < 1 || int(flagDuration.Seconds()) / *flagSlices < 1 {
		return fmt.Errorf("-slices must be >= 1 and at most -duration in seconds")
	}
	shapes, err := shapesFromFlag(*flagShapes)
	if err != nil {
		return err
	}
	systems := strings.Split(*flagSystems, ",")
	for _, s := range systems {
		switch s {
		case "direct", "lodestone", "nginx", "haproxy", "reverseproxy":
		default:
			return fmt.Errorf("-systems: unknown system %q", s)
		}
	}
	need := map[string]string{"wrk": "wrk", "taskset": "util-linux"}
	if slices.Contains(systems, "nginx") {
		need["nginx"] = "nginx-light"
	}
	if slices.Contains(systems, "haproxy") {
		need["haproxy"] = "haproxy"
	}
	for bin, pkg := range need {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%s not found on PATH: install it (Debian: apt-get install %s)", bin, pkg)
		}
	}
	if slices.ContainsFunc(shapes, func(sh shape) bool { return sh.churn }) && !slices.Contains(systems, "lodestone") {
		return fmt.Errorf("-shapes churn needs the lodestone system")
	}
	if *flagClientCPUs != "" {
		if err := cpuset.PinSelf(*flagClientCPUs); err != nil {
			return fmt.Errorf("-client-cpus: %w", err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(*flagWorkDir, "gatewaybench-")
	if err != nil {
		return err
	}
	if *flagKeep {
		logf("keeping configs and logs in %s", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	e := &env{tmp: tmp, self: self}
	defer func() { harness.StopAll(e.procs, 10*time.Second) }()
	for i := range shapes {
		if err := shapes[i].writeScripts(tmp, *flagPacing); err != nil {
			return err
		}
	}

	// The origin, beside wrk.
	ports, err := harness.FreePorts(1)
	if err != nil {
		return err
	}
	e.origin = fmt.Sprintf("127.0.0.1:%d", ports[0])
	p, err := harness.Start("origin", self, []string{"-role=origin", "--", "-listen=" + e.origin, fmt.Sprintf("-body=%d", *flagBody)},
		filepath.Join(tmp, "origin.log"), *flagClientCPUs)
	if err != nil {
		return err
	}
	e.procs = append(e.procs, p)
	e.originPID = p.Pid()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = waitServing(wctx, "http://"+e.origin+"/", *flagBody)
	cancel()
	if err != nil {
		return fmt.Errorf("origin: %w\n%s", err, p.LogTail(2000))
	}

	// The registry the gateway watches: an in-process single-node server
	// on the load generator's core, idle during the measured runs.
	if slices.Contains(systems, "lodestone") {
		srv, err := startRegistry(tmp)
		if err != nil {
			return err
		}
		defer srv.Close()
		e.registry = srv.GRPCAddr()
		if err := registerOrigin(ctx, e.registry, e.origin); err != nil {
			return err
		}
	}

	printSetup()
	for _, sh := range shapes {
		e.sh = sh
		if sh.churn {
			if err := e.runChurn(ctx); err != nil {
				return fmt.Errorf("shape churn: %w", err)
			}
			continue
		}
		results := map[string][]measurement{}
		for rep := range *flagReps {
			order := slices.Clone(systems)
			// Rotate the order each repetition to spread machine noise.
			for range rep % len(order) {
				order = append(order[1:], order[0])
			}
			logf("shape %s rep %d/%d: %s", sh.name, rep+1, *flagReps, strings.Join(order, ", "))
			ms, err := e.measureRep(ctx, order)
			if err != nil {
				return fmt.Errorf("shape %s: %w", sh.name, err)
			}
			for i, sys := range order {
				m := ms[i]
				results[sys] = append(results[sys], m)
				fmt.Printf("run shape=%s rep=%d/%d system=%s rps=%.0f sat_p50=%.3fms sat_p99=%.3fms paced_rps=%.0f paced_p50=%.3fms paced_p99=%.3fms proxy_cpu=%s proxy_us_per_req=%s origin_us_per_req=%s client_cpu=%s errors=%d non2xx=%d\n",
					sh.name, rep+1, *flagReps, sys, m.rps, m.satP50, m.satP99, m.pacedRPS, m.p50, m.p99, cpuString(m.proxyCPU), usString(m.cpuPerReq), usString(m.originPerReq), cpuString(m.clientCPU), m.errors+m.satErrs, m.non2xx+m.satNon2)
			}
		}
		report(sh, results, systems)
	}
	return nil
}

func usString(us float64) string {
	if us < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fus", us)
}

func rateString(r float64) string {
	if r < 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", r)
}

// errNoClientCPUs: the load generator is not pinned, its cores unknown.
var errNoClientCPUs = errors.New("no -client-cpus")

func cpuString(c float64) string {
	if c < 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*c)
}

// sysRun is one system through one repetition: its target, its process
// (nil for direct) and what its throughput slices added up to.
type sysRun struct {
	sys, target string
	proc        *harness.Proc
	requests    int64
	wrkTime     time.Duration // the slices' durations as wrk measured them
	cpu, wall   time.Duration // the proxy's CPU time and the wall time over the slices
	cpuOK       bool
	originCPU   time.Duration // the origin's CPU time over the slices
	originOK    bool
	busy, total uint64 // the client cores' busy and total ticks over the slices
	coreOK      bool
	opens       uint64 // TCP active opens on the machine over the slices
	opensOK     bool
	p50s, p99s  []float64 // ms, per slice
	errs, non2  int64
}

// measureRep starts every system in order, warms each up, runs the
// throughput run as -slices slices taken in turn (system after system,
// the first one rotating each slice), stops them all, then runs each
// system's paced latency run with that system alone (pacedRun). NB:
// every system is loaded in the same few seconds. Run one after another
// for 10 s each, the systems met different phases of the host's speed:
// on the shared two-core VM the CPU cost of a request (wrk's, the
// origin's and the proxy's alike) moves by up to 1.5x within a minute:
// the same nginx, loaded in back-to-back 3 s runs, gave 0.84-1.05 of
// its own requests/s.
func (e *env) measureRep(ctx context.Context, order []string) ([]measurement, error) {
	runs := make([]*sysRun, 0, len(order))
	defer func() {
		for _, r := range runs {
			if r.proc != nil {
				r.proc.Stop(10 * time.Second)
			}
		}
	}()
	for _, sys := range order {
		target, proc, err := e.startSystem(ctx, sys)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sys, err)
		}
		runs = append(runs, &sysRun{sys: sys, target: target, proc: proc})
	}
	for _, r := range runs {
		if _, err := runWrk(ctx, *flagClientCPUs, r.target, e.sh.flat, *flagConns, max(*flagWarmup, time.Second)); err != nil {
			return nil, fmt.Errorf("%s: %w", r.sys, err)
		}
	}
	slice := time.Duration(int(flagDuration.Seconds()) / *flagSlices) * time.Second
	for i := range *flagSlices {
		for j := range runs {
			r := runs[(i+j)%len(runs)]
			if err := e.satSlice(ctx, r, slice); err != nil {
				return nil, fmt.Errorf("%s: %w", r.sys, err)
			}
		}
	}
	for _, r := range runs {
		if exited, werr := procExited(r.proc); exited {
			return nil, fmt.Errorf("%s exited during the run: %v\n%s", r.sys, werr, r.proc.LogTail(2000))
		}
		if r.proc != nil {
			r.proc.Stop(10 * time.Second)
			r.proc = nil
		}
	}
	ms := make([]measurement, len(runs))
	for i, r := range runs {
		var paced wrkResult
		if e.sh.paced {
			var err error
			if paced, err = e.pacedRun(ctx, r.sys); err != nil {
				return nil, fmt.Errorf("%s: %w", r.sys, err)
			}
		}
		m := r.measurement()
		m.pacedRPS, m.p50, m.p99 = paced.rps, harness.Millis(paced.p50), harness.Millis(paced.p99)
		m.errors, m.non2xx = paced.errors, paced.non2xx
		ms[i] = m
	}
	return ms, nil
}

// measurement is what r's throughput slices add up to.
func (r *sysRun) measurement() measurement {
	m := measurement{proxyCPU: -1, cpuPerReq: -1, originPerReq: -1, clientCPU: -1, opensPerSec: -1}
	if r.wrkTime > 0 {
		m.rps = float64(r.requests) / r.wrkTime.Seconds()
	}
	m.satP50, m.satP99 = harness.Median(r.p50s), harness.Median(r.p99s)
	m.satErrs, m.satNon2 = r.errs, r.non2
	if r.cpuOK && r.wall > 0 {
		m.proxyCPU = float64(r.cpu) / float64(r.wall)
	}
	if r.cpuOK && r.requests > 0 {
		m.cpuPerReq = float64(r.cpu.Microseconds()) / float64(r.requests)
	}
	if r.originOK && r.requests > 0 {
		m.originPerReq = float64(r.originCPU.Microseconds()) / float64(r.requests)
	}
	if r.coreOK && r.total > 0 {
		m.clientCPU = float64(r.busy) / float64(r.total)
	}
	if r.opensOK && r.wrkTime > 0 {
		m.opensPerSec = float64(r.opens) / r.wrkTime.Seconds()
	}
	return m
}

// pacedRun starts sys alone, warms it up, runs the paced latency run
// against it and stops it. NB: alone, as before the throughput slices:
// idle proxies still wake now and then on the proxy core (timers), which
// a 99th percentile can show.
func (e *env) pacedRun(ctx context.Context, sys string) (wrkResult, error) {
	target, proc, err := e.startSystem(ctx, sys)
	if err != nil {
		return wrkResult{}, err
	}
	if proc != nil {
		defer proc.Stop(10 * time.Second)
	}
	if _, err := runWrk(ctx, *flagClientCPUs, target, e.sh.flat, *flagConns, max(*flagWarmup, time.Second)); err != nil {
		return wrkResult{}, err
	}
	paced, err := runWrk(ctx, *flagClientCPUs, target, e.sh.pacedScript, *flagLatConns, *flagDuration)
	if err != nil {
		return wrkResult{}, err
	}
	if exited, werr := procExited(proc); exited {
		return wrkResult{}, fmt.Errorf("exited during the run: %v\n%s", werr, proc.LogTail(2000))
	}
	return paced, nil
}

// satSlice runs one throughput slice of d against r and adds it to r.
func (e *env) satSlice(ctx context.Context, r *sysRun, d time.Duration) error {
	var cpu0 time.Duration
	var cpuErr error = errors.New("no process")
	if r.proc != nil {
		cpu0, cpuErr = harness.CPUTime(r.proc.Pid())
	}
	origin0, originErr := harness.CPUTime(e.originPID)
	var busy0, total0 uint64
	var coreErr error = errNoClientCPUs
	if *flagClientCPUs != "" {
		busy0, total0, coreErr = coreTimes(*flagClientCPUs)
	}
	opens0, opensErr := tcpActiveOpens()
	start := time.Now()
	sat, err := runWrk(ctx, *flagClientCPUs, r.target, e.sh.flat, *flagConns, d)
	if err != nil {
		return err
	}
	wall := time.Since(start)
	if cpuErr == nil {
		if cpu1, err := harness.CPUTime(r.proc.Pid()); err == nil {
			r.cpu += cpu1 - cpu0
			r.wall += wall
			r.cpuOK = true
		}
	}
	if originErr == nil {
		if origin1, err := harness.CPUTime(e.originPID); err == nil {
			r.originCPU += origin1 - origin0
			r.originOK = true
		}
	}
	if coreErr == nil {
		if busy1, total1, err := coreTimes(*flagClientCPUs); err == nil && total1 > total0 {
			r.busy += busy1 - busy0
			r.total += total1 - total0
			r.coreOK = true
		}
	}
	if opensErr == nil {
		if opens1, err := tcpActiveOpens(); err == nil {
			r.opens += opens1 - opens0
			r.opensOK = true
		}
	}
	r.requests += sat.requests
	r.wrkTime += sat.duration
	r.p50s = append(r.p50s, harness.Millis(sat.p50))
	r.p99s = append(r.p99s, harness.Millis(sat.p99))
	r.errs += sat.errors
	r.non2 += sat.non2xx
	return nil
}

func procExited(p *harness.Proc) (bool, error) {
	if p == nil {
		return false, nil
	}
	return p.Exited()
}

// startSystem starts sys pinned to the proxy CPUs and returns the URL to
// load and its process (nil for direct).
func (e *env) startSystem(ctx context.Context, sys string) (string, *harness.Proc, error) {
	if sys == "direct" {
		return "http://" + e.origin + e.sh.path, nil, nil
	}
	ports, err := harness.FreePorts(2)
	if err != nil {
		return "", nil, err
	}
	listen := fmt.Sprintf("127.0.0.1:%d", ports[0])
	dir := filepath.Join(e.tmp, sys)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	var bin string
	var args []string
	switch sys {
	case "lodestone":
		bin, args = e.self, []string{"-role=gateway", "--", "-registry=" + e.registry, "-listen=" + listen, fmt.Sprintf("-admin=127.0.0.1:%d", ports[1])}
	case "reverseproxy":
		bin, args = e.self, []string{"-role=reverseproxy", "--", "-listen=" + listen, "-origin=" + e.origin}
	case "nginx":
		conf, err := nginxConfig(dir, listen, e.origin)
		if err != nil {
			return "", nil, err
		}
		bin, args = "nginx", []string{"-p", dir, "-c", conf}
	case "haproxy":
		conf, err := haproxyConfig(dir, listen, e.origin)
		if err != nil {
			return "", nil, err
		}
		bin, args = "haproxy", []string{"-db", "-f", conf}
	}
	p, err := harness.Start(sys, bin, args, filepath.Join(dir, sys+".log"), *flagProxyCPUs)
	if err != nil {
		return "", nil, err
	}
	target := "http://" + listen + e.sh.path
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = waitServing(wctx, target, e.sh.bodySize())
	cancel()
	if err != nil {
		p.Stop(5 * time.Second)
		return "", nil, fmt.Errorf("%w\n%s", err, p.LogTail(2000))
	}
	return target, p, nil
}

// startRegistry runs a single-node Lodestone registry in this process.
func startRegistry(tmp string) (*server.Server, error) {
	ports, err := harness.FreePorts(1)
	if err != nil {
		return nil, err
	}
	peer := fmt.Sprintf("127.0.0.1:%d", ports[0])
	cfg := server.DefaultConfig()
	cfg.Name = "bench"
	cfg.DataDir = filepath.Join(tmp, "registry")
	cfg.ListenPeer, cfg.ListenGRPC, cfg.ListenHTTP = peer, "127.0.0.1:0", "127.0.0.1:0"
	cfg.InitialCluster = map[string]string{"bench": peer}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := server.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("registry: %w", err)
	}
	srv.Start()
	return srv, nil
}

// registerOrigin registers the origin in the catalog as the one passing
// instance of service "bench" (the gateway's default instance source) and
// routes every path to it, as an operator would with `lodestone catalog
// register` and `lodestone kv put`.
func registerOrigin(ctx context.Context, registry, origin string) error {
	c, err := client.New(client.Config{Endpoints: []string{registry}})
	if err != nil {
		return err
	}
	defer c.Close()
	src, err := gateway.NewKVSource(c, gateway.DefaultKVSourceConfig())
	if err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(origin)
	if err != nil {
		return err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return fmt.Errorf("origin port %q: %w", port, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := src.PutRoute(ctx, gateway.Route{Name: "bench", PathPrefix: "/", Service: "bench"}); err != nil {
		return fmt.Errorf("register route: %w", err)
	}
	if _, err := c.Register(ctx, &lodestonepb.CatalogRegisterRequest{
		Node:    &lodestonepb.Node{Name: "bench-origin", Address: host},
		Service: &lodestonepb.Service{Id: "origin", Name: "bench", Address: host, Port: uint32(p)},
		Checks: []*lodestonepb.Check{{CheckId: "origin", Name: "origin alive", ServiceId: "origin",
			Status: lodestonepb.HealthStatus_HEALTH_PASSING}},
	}); err != nil {
		return fmt.Errorf("register origin in the catalog: %w", err)
	}
	return nil
}
