// Command drill rehearses the worst day: a three-node cluster with data,
// watchers and clients loses every node at once, comes back, and every
// client reconnects at the same moment. It measures how long until the
// cluster serves again (restore), until every client has been served and
// every watcher has resumed (full service), and the commit latency p99 of
// the servers during the reconnect storm, first with an admission ramp and
// then without, and prints one line per run:
//
//	DRILL restore=<s> full_service=<s> commit_p99_during_ramp=<ms> steady_commit_p99=<ms> ratio=<x> ramp=<on|off> ...
//
// Run it with `make drill`. Targets: full service under 5 minutes; with the
// ramp, commit p99 during the storm at most 3x the steady p99.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
)

type options struct {
	binary                 string
	clients, watchers      int
	keys                   int
	interval               time.Duration
	steady                 time.Duration
	reads, writes, watches uint64
	ramp                   float64
	mode                   string
	limit                  time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "bin/lodestone", "the lodestone binary to run the servers with")
	flag.IntVar(&o.clients, "clients", 2000, "clients, one connection each, each reading (and now and then writing) once per --interval")
	flag.IntVar(&o.watchers, "watchers", 1000, "watchers (on as many of the clients)")
	flag.IntVar(&o.keys, "keys", 1000, "keys written before the drill")
	flag.DurationVar(&o.interval, "interval", 5*time.Second, "each client's request interval (2,000 clients at 5s: 400 requests/s)")
	flag.DurationVar(&o.steady, "steady", 10*time.Second, "how long to measure the steady state before the outage")
	flag.Uint64Var(&o.reads, "reads", 3000, "admission limit: reads per second per server")
	flag.Uint64Var(&o.writes, "writes", 400, "admission limit: writes per second per server")
	flag.Uint64Var(&o.watches, "watches", 100, "admission limit: new watch streams per second per server")
	flag.Float64Var(&o.ramp, "ramp", 25, "admission ramp, percent per minute")
	flag.StringVar(&o.mode, "mode", "both", "ramp, noramp or both")
	flag.DurationVar(&o.limit, "limit", 5*time.Minute, "give up on full service after this long")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "drill: "+err.Error())
		os.Exit(1)
	}
}

func run(ctx context.Context, o options, out io.Writer) error {
	bin, err := filepath.Abs(o.binary)
	if err != nil {
		return err
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("--binary %s: %w (run 'make build' first)", o.binary, err)
	}
	var runs []bool
	switch o.mode {
	case "both":
		runs = []bool{true, false}
	case "ramp":
		runs = []bool{true}
	case "noramp":
		runs = []bool{false}
	default:
		return fmt.Errorf("--mode %q: use ramp, noramp or both", o.mode)
	}
	fmt.Fprintf(out, "drill: %d clients, %d watchers, %d keys, %d CPUs, GOMAXPROCS %d, no CPU pinning\n",
		o.clients, o.watchers, o.keys, numCPU(), runtime.GOMAXPROCS(0))
	var lines []string
	for _, ramp := range runs {
		res, err := drill(ctx, bin, o, ramp, out)
		if err != nil {
			return err
		}
		lines = append(lines, res.line(o))
		fmt.Fprintln(out, res.line(o))
	}
	fmt.Fprintln(out, "---")
	for _, l := range lines {
		fmt.Fprintln(out, l)
	}
	return nil
}

type result struct {
	ramp                  bool
	restore, fullService  time.Duration
	stormP99, steadyP99   float64 // seconds
	clientsOK, watchersOK int
	complete              bool
}

func (r result) line(o options) string {
	ramp := "off"
	if r.ramp {
		ramp = fmt.Sprintf("%g%%/min", o.ramp)
	}
	full := fmt.Sprintf("%.1f", r.fullService.Seconds())
	if !r.complete {
		full = fmt.Sprintf(">%.0f", o.limit.Seconds())
	}
	ratio := math.NaN()
	if r.steadyP99 > 0 {
		ratio = r.stormP99 / r.steadyP99
	}
	return fmt.Sprintf("DRILL restore=%.1f full_service=%s commit_p99_during_ramp=%.1f steady_commit_p99=%.1f ratio=%.2f ramp=%s clients_served=%d/%d watchers_resumed=%d/%d",
		r.restore.Seconds(), full, r.stormP99*1000, r.steadyP99*1000, ratio, ramp, r.clientsOK, o.clients, r.watchersOK, o.watchers)
}

// --- the cluster --------------------------------------------------------------

type server struct {
	name, dir, peer, grpc, http string
	cmd                         *exec.Cmd
	done                        chan struct{}
}

type cluster struct {
	bin     string
	servers []*server
	initial string
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func newCluster(bin, dir string) (*cluster, error) {
	c := &cluster{bin: bin}
	var parts []string
	for i := 1; i <= 3; i++ {
		s := &server{name: fmt.Sprintf("n%d", i), dir: filepath.Join(dir, fmt.Sprintf("n%d", i))}
		for _, p := range []*string{&s.peer, &s.grpc, &s.http} {
			a, err := freeAddr()
			if err != nil {
				return nil, err
			}
			*p = a
		}
		c.servers = append(c.servers, s)
		parts = append(parts, s.name+"="+s.peer)
	}
	c.initial = strings.Join(parts, ",")
	return c, nil
}

func (c *cluster) endpoints() []string {
	var eps []string
	for _, s := range c.servers {
		eps = append(eps, s.grpc)
	}
	return eps
}

func (c *cluster) start() error {
	for _, s := range c.servers {
		s.cmd = exec.Command(c.bin, "server", "--name", s.name, "--data-dir", s.dir, "--listen-peer", s.peer,
			"--listen-grpc", s.grpc, "--listen-http", s.http, "--initial-cluster", c.initial, "--log-level", "warn")
		s.cmd.Stderr = os.Stderr
		if err := s.cmd.Start(); err != nil {
			return fmt.Errorf("start %s: %w", s.name, err)
		}
		s.done = make(chan struct{})
		go func(s *server) {
			defer close(s.done)
			_ = s.cmd.Wait()
		}(s)
	}
	return nil
}

func (c *cluster) signal(sig syscall.Signal) {
	for _, s := range c.servers {
		if s.cmd == nil {
			continue
		}
		_ = s.cmd.Process.Signal(sig)
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
		s.cmd = nil
	}
}

// waitReady polls every server's /readyz until all answer 200.
func (c *cluster) waitReady(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		ready := 0
		for _, s := range c.servers {
			resp, err := http.Get("http://" + s.http + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					ready++
				}
			}
		}
		if ready == len(c.servers) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not ready within %v", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// commitHistogram sums lodestone_commit_latency_seconds buckets over the
// servers: upper bound → cumulative count.
func (c *cluster) commitHistogram() map[float64]float64 {
	h := map[float64]float64{}
	for _, s := range c.servers {
		resp, err := http.Get("http://" + s.http + "/metrics")
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			if !strings.HasPrefix(line, `lodestone_commit_latency_seconds_bucket{le="`) {
				continue
			}
			rest := strings.TrimPrefix(line, `lodestone_commit_latency_seconds_bucket{le="`)
			le, count, ok := strings.Cut(rest, `"} `)
			if !ok {
				continue
			}
			bound, err1 := strconv.ParseFloat(le, 64)
			n, err2 := strconv.ParseFloat(count, 64)
			if err1 == nil && err2 == nil {
				h[bound] += n
			}
		}
		resp.Body.Close()
	}
	return h
}

// p99 of the observations between two cumulative histograms, interpolated
// linearly within the bucket that holds it (as Prometheus'
// histogram_quantile does).
func p99(before, after map[float64]float64) float64 {
	var bounds []float64
	for b := range after {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	total := after[math.Inf(1)] - before[math.Inf(1)]
	if total <= 0 {
		return 0
	}
	rank := 0.99 * total
	lower, below := 0.0, 0.0
	for _, b := range bounds {
		n := after[b] - before[b]
		if n >= rank {
			if math.IsInf(b, 1) {
				return lower
			}
			if n == below {
				return b
			}
			return lower + (b-lower)*(rank-below)/(n-below)
		}
		lower, below = b, n
	}
	return lower
}

// --- the population ---------------------------------------------------------

type population struct {
	clients  []*client.Client
	lastOK   []atomic.Int64 // unix nanos of each client's last success
	watchIdx []atomic.Int64 // index of each watcher's last batch
	wg       sync.WaitGroup
	cancel   context.CancelFunc
}

func startPopulation(ctx context.Context, eps []string, o options) (*population, error) {
	ctx, cancel := context.WithCancel(ctx)
	p := &population{cancel: cancel, lastOK: make([]atomic.Int64, o.clients), watchIdx: make([]atomic.Int64, o.watchers)}
	quiet := slog.New(slog.DiscardHandler)
	for range o.clients {
		// Each client lists the servers in its own order, as a fleet's
		// config would: the load is spread, and each fails over.
		order := append([]string(nil), eps...)
		rand.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
		c, err := client.New(client.Config{Endpoints: order, RequestTimeout: 3 * time.Second, BackoffBase: 100 * time.Millisecond, BackoffMax: 2 * time.Second, Logger: quiet})
		if err != nil {
			p.stop()
			return nil, err
		}
		p.clients = append(p.clients, c)
	}
	for i, c := range p.clients {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.clientLoop(ctx, i, c, o)
		}()
		if i < o.watchers {
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.watchLoop(ctx, i, c)
			}()
		}
	}
	return p, nil
}

func (p *population) clientLoop(ctx context.Context, i int, c *client.Client, o options) {
	time.Sleep(time.Duration(rand.Int64N(int64(o.interval))))
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for n := 0; ; n++ {
		var err error
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		if n%10 == 9 {
			_, err = c.Put(rctx, fmt.Sprintf("drill/client/%d", i), []byte(strconv.Itoa(n)))
		} else {
			_, err = c.Get(rctx, fmt.Sprintf("drill/key/%d", rand.IntN(max(o.keys, 1))))
		}
		cancel()
		if err == nil {
			p.lastOK[i].Store(time.Now().UnixNano())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *population) watchLoop(ctx context.Context, i int, c *client.Client) {
	w := c.Watch(ctx, "drill/tick/", client.WatchPrefix(), client.WithProgressNotify())
	defer w.Close()
	for {
		b, err := w.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// The watch ended (compacted or given up): start again.
			w.Close()
			w = c.Watch(ctx, "drill/tick/", client.WatchPrefix(), client.WithProgressNotify())
			continue
		}
		p.watchIdx[i].Store(int64(b.Index))
	}
}

func (p *population) stop() {
	p.cancel()
	p.wg.Wait()
	for _, c := range p.clients {
		c.Close()
	}
}

// served counts clients with a success after t and watchers past index.
func (p *population) served(t time.Time, index uint64) (clients, watchers int) {
	for i := range p.lastOK {
		if p.lastOK[i].Load() > t.UnixNano() {
			clients++
		}
	}
	for i := range p.watchIdx {
		if uint64(p.watchIdx[i].Load()) >= index {
			watchers++
		}
	}
	return clients, watchers
}

// --- one run ------------------------------------------------------------------

func drill(ctx context.Context, bin string, o options, ramp bool, log io.Writer) (res result, err error) {
	res.ramp = ramp
	dir, err := os.MkdirTemp("", "lodestone-drill-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	c, err := newCluster(bin, dir)
	if err != nil {
		return res, err
	}
	defer c.signal(syscall.SIGKILL)
	if err := c.start(); err != nil {
		return res, err
	}
	if err := c.waitReady(ctx, time.Minute); err != nil {
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
	fmt.Fprintf(log, "drill (ramp %v): cluster up with %d keys; starting %d clients and %d watchers\n", ramp, o.keys, o.clients, o.watchers)

	pop, err := startPopulation(ctx, c.endpoints(), o)
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

	// Steady state: every client and watcher served, then measure.
	warm := time.Now()
	if _, err := waitServed(ctx, pop, warm, tickIndex.Load()+1, o, 2*time.Minute, log); err != nil {
		return res, fmt.Errorf("steady state never reached: %w", err)
	}
	h0 := c.commitHistogram()
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(o.steady):
	}
	res.steadyP99 = p99(h0, c.commitHistogram())
	fmt.Fprintf(log, "drill: steady commit p99 %.1fms; killing every server\n", res.steadyP99*1000)

	if ramp {
		// NB: set before the outage: the policy is in the replicated state,
		// and each restarted server ramps up again from its own start, so
		// it holds the storm back from the first request on.
		pol := &lodestonepb.AdmissionPolicy{Enabled: true, Reads: o.reads, Writes: o.writes, Watches: o.watches, RampPercentPerMin: o.ramp}
		if _, err := admin.SetAdmission(ctx, pol); err != nil {
			return res, fmt.Errorf("set admission: %w", err)
		}
	}
	// The outage: every node dies at once; clients keep trying.
	lastIndex := tickIndex.Load()
	c.signal(syscall.SIGKILL)
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(3 * time.Second):
	}
	restartAt := time.Now()
	if err := c.start(); err != nil {
		return res, err
	}
	if err := c.waitReady(ctx, 2*time.Minute); err != nil {
		return res, err
	}
	res.restore = time.Since(restartAt)
	h1 := c.commitHistogram()
	fmt.Fprintf(log, "drill: cluster back after %.1fs; waiting for every client and watcher\n", res.restore.Seconds())
	full, err := waitServed(ctx, pop, restartAt, lastIndex+1, o, o.limit, log)
	res.complete = err == nil
	res.fullService = full
	res.stormP99 = p99(h1, c.commitHistogram())
	res.clientsOK, res.watchersOK = pop.served(restartAt, lastIndex+1)
	if ramp {
		_, _ = admin.SetAdmission(ctx, &lodestonepb.AdmissionPolicy{})
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	return res, nil
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
		cl, wa := p.served(t, index)
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
		select {
		case <-ctx.Done():
			return time.Since(t), ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func numCPU() int { return runtime.NumCPU() }
