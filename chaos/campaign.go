package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lodestone-kv/lodestone/chaos/check"
	"github.com/lodestone-kv/lodestone/chaos/cluster"
	"github.com/lodestone-kv/lodestone/chaos/history"
	"github.com/lodestone-kv/lodestone/chaos/hostile"
	"github.com/lodestone-kv/lodestone/chaos/nemesis"
	"github.com/lodestone-kv/lodestone/chaos/netns"
	"github.com/lodestone-kv/lodestone/chaos/report"
	"github.com/lodestone-kv/lodestone/chaos/workload"
	"github.com/lodestone-kv/lodestone/internal/ctxtime"
)

// Config is one campaign.
type Config struct {
	// Nodes is the cluster size (3 or 5).
	Nodes int
	// Duration is how long the nemesis schedule runs (setup, heal and
	// checks come on top).
	Duration time.Duration
	// Kinds and PerKind: every kind is injected PerKind times.
	Kinds   []string
	PerKind int
	Seed    uint64
	// Binary is the lodestone executable; "" builds ./cmd/lodestone into
	// the run directory.
	Binary string
	// RunsDir receives one directory per run.
	RunsDir string
	// ServerArgs are extra `lodestone server` flags (e.g. the hidden
	// --unsafe-stale-reads).
	ServerArgs []string
	// TickInterval and ElectionTicks tune every node.
	TickInterval  time.Duration
	ElectionTicks int
	// Plaintext runs the cluster without TLS and ACLs, for comparison;
	// by default every port speaks TLS with client certificates and the
	// workloads carry a token limited to what they do
	// (workload.ACLRules).
	Plaintext bool
	// Hostile runs the hostile client (chaos/hostile) beside the checked
	// workloads for the whole campaign, from its own source address
	// (netns.HostileIP) with its own certificate and token.
	Hostile bool
	// StaleReads makes the workloads read with STALE consistency (a
	// self-test: the checkers must report anomalies).
	StaleReads bool
	// Workers per workload; Watchers is the number of watch consumers;
	// LockWorkers is the number of lock clients, each with its session.
	RegisterWorkers, CounterWorkers, SetWorkers, Watchers, LockWorkers int
	// Think is each worker's pause between operations.
	Think time.Duration
	// OpTimeout bounds one client operation.
	OpTimeout time.Duration
	// CheckTimeout bounds porcupine per key.
	CheckTimeout time.Duration
	// Command is how this campaign was started, for the report.
	Command string
	Logger  *slog.Logger
}

// Smoke is the ~60 s CI campaign: 3 nodes, two faults of every kind.
func Smoke() Config {
	c := Full()
	c.Duration, c.PerKind = 50*time.Second, 2
	return c
}

// Full is the 10-minute campaign: every kind at least 22 times.
func Full() Config {
	return Config{
		Nodes: 3, Duration: 10 * time.Minute, Kinds: nemesis.AllKinds, PerKind: 22,
		TickInterval: 50 * time.Millisecond, ElectionTicks: 10,
		RegisterWorkers: 6, CounterWorkers: 2, SetWorkers: 1, Watchers: 2, LockWorkers: 3, Hostile: true,
		Think: 10 * time.Millisecond, OpTimeout: 2 * time.Second, CheckTimeout: 60 * time.Second,
	}
}

// hostileLimits are the limits every campaign's servers run with (also
// without the hostile client, so runs compare): the per-client
// connection caps and watch limits are set low so the hostile client
// reaches them with little load; the byte and op caps are the defaults.
// The checked clients use two gRPC connections per node (the workloads'
// and the harness's), one watch per stream, and one HTTP connection at
// a time.
var hostileLimits = hostile.Limits{
	GRPCConnsPerClient: 16, HTTPConnsPerClient: 16, WatchesPerStream: 64, WatchesPerConn: 256,
	TxnRequestBytes: 512 << 10, ValueBytes: 512 << 10, TxnOps: 64, RequestBytes: 4 << 20,
}

// HostileRules is the hostile client's ACL policy: its own prefix, no
// more, so its abuse is authenticated but narrow.
const HostileRules = `key_prefix "hostile/" { policy = "write" }
`

func limitArgs(l hostile.Limits) []string {
	return []string{
		"--max-grpc-connections-per-client", fmt.Sprint(l.GRPCConnsPerClient),
		"--max-http-connections-per-client", fmt.Sprint(l.HTTPConnsPerClient),
		"--max-watches-per-stream", fmt.Sprint(l.WatchesPerStream),
		"--max-watches-per-connection", fmt.Sprint(l.WatchesPerConn),
		"--max-txn-request-bytes", fmt.Sprint(l.TxnRequestBytes),
		"--max-value-bytes", fmt.Sprint(l.ValueBytes),
		"--max-txn-ops", fmt.Sprint(l.TxnOps),
		"--max-request-bytes", fmt.Sprint(l.RequestBytes),
	}
}

// Outcome is what a campaign found.
type Outcome struct {
	Dir     string
	Summary report.Summary
}

// Run executes one campaign: network, cluster, workloads and nemesis, heal,
// final reads, checks, report. It removes everything it made before it
// returns, also when ctx is canceled (the outcome is then marked
// interrupted).
func Run(ctx context.Context, cfg Config, out io.Writer) (*Outcome, error) {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Nodes < 3 || cfg.Nodes > 9 {
		return nil, fmt.Errorf("--nodes %d: use 3 or 5 (at most 9)", cfg.Nodes)
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())
	}
	if err := netns.Available(); err != nil {
		return nil, err
	}
	unlock, err := netns.Lock(ctx, 15*time.Minute)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := netns.Cleanup(ctx, logger); err != nil {
		return nil, fmt.Errorf("clean up a previous run: %w", err)
	}

	id := fmt.Sprintf("%s-%d", time.Now().UTC().Format("20060102T150405Z"), cfg.Seed%100000)
	dir := filepath.Join(cfg.RunsDir, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create run dir: %w", err)
	}
	fmt.Fprintf(out, "chaos: run %s (seed %d) in %s\n", id, cfg.Seed, dir)
	if cfg.Binary == "" {
		cfg.Binary = filepath.Join(dir, "lodestone")
		fmt.Fprintf(out, "chaos: building lodestone\n")
		if err := buildBinary(ctx, cfg.Binary); err != nil {
			return nil, err
		}
	}
	serverArgs := append([]string{
		"--tick-interval", cfg.TickInterval.String(), "--election-ticks", fmt.Sprint(cfg.ElectionTicks),
		// Snapshots and log truncation happen during the campaign, so
		// restarted and new members catch up by snapshot too.
		"--snapshot-entries", "2000", "--catch-up-entries", "500",
		// The slow-disk-kill fault sets a log-write delay through them.
		"--fault-hooks",
	}, append(limitArgs(hostileLimits), cfg.ServerArgs...)...)

	h := history.New()
	interrupted := false
	// Everything below is torn down by these defers, in reverse order,
	// with contexts of their own: an interrupt must still clean up.
	nw, err := netns.Setup(ctx, logger)
	if err != nil {
		cleanupNet(logger)
		return nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := nw.Close(cctx); err != nil {
			logger.Error("remove network", "err", err)
		}
	}()
	fmt.Fprintf(out, "chaos: starting %d nodes\n", cfg.Nodes)
	c, err := cluster.Start(ctx, nw, cluster.Options{
		Binary: cfg.Binary, Dir: dir, Nodes: cfg.Nodes, ServerArgs: serverArgs,
		DialOptions: workload.DialOptions(), Logger: logger,
		Plaintext: cfg.Plaintext, WorkloadRules: workload.ACLRules, ClusterToken: "chaos-" + id,
		HostileRules: HostileRules,
	})
	if err != nil {
		return nil, fmt.Errorf("start cluster: %w", err)
	}
	closeCluster := sync.OnceValue(c.Close)
	defer closeCluster()
	security, err := proveSecurity(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("security check: %w", err)
	}
	fmt.Fprintf(out, "chaos: security: %s\n", security)
	hostileCl, stopHostile := startHostile(c, cfg.Hostile, logger)
	defer stopHostile()
	if hostileCl != nil {
		fmt.Fprintf(out, "chaos: hostile client on every node from %s\n", netns.HostileIP)
	}

	env := &workload.Env{H: h, Nodes: c.Nodes, Logger: logger, OpTimeout: cfg.OpTimeout, Think: cfg.Think,
		StaleReads: cfg.StaleReads, Seed: cfg.Seed}
	// The extension point for more workloads: add it here and its checker
	// in Check.
	workloads := []workload.Workload{
		&workload.Register{Workers: cfg.RegisterWorkers, ActiveKeys: 2 * cfg.RegisterWorkers, MaxOpsPerKey: 200, MaxInfoPerKey: 4},
		&workload.Counter{Workers: cfg.CounterWorkers},
		&workload.Set{Workers: cfg.SetWorkers},
	}
	if cfg.LockWorkers > 0 {
		// Fewer keys than clients, so they contend; TTL at the server's
		// minimum, so an abandoned session expires within the smoke run.
		workloads = append(workloads, &workload.Lock{Workers: cfg.LockWorkers, ActiveKeys: 2, MaxOpsPerKey: 200, MaxInfoPerKey: 4,
			TTL: 10 * time.Second, LockDelay: time.Second, MaxHold: 500 * time.Millisecond})
	}
	watch := &workload.Watch{Watchers: cfg.Watchers}

	// Goroutines: the leader monitor, the watchers and the workloads,
	// each stopped by its own cancel and awaited by its own WaitGroup.
	monCtx, stopMon := context.WithCancel(context.Background())
	var monWG sync.WaitGroup
	monWG.Add(1)
	go func() { defer monWG.Done(); monitorLeaders(monCtx, c, h) }()
	defer func() { stopMon(); monWG.Wait() }()

	watchCtx, stopWatch := context.WithCancel(ctx)
	var watchWG sync.WaitGroup
	if cfg.Watchers > 0 {
		watchWG.Add(1)
		go func() {
			defer watchWG.Done()
			if err := watch.Run(watchCtx, env); err != nil && watchCtx.Err() == nil {
				h.Note("watch: %v", err)
			}
		}()
	}
	defer func() { stopWatch(); watchWG.Wait() }()

	wlCtx, stopWL := context.WithCancel(ctx)
	var wlWG sync.WaitGroup
	for _, w := range workloads {
		wlWG.Add(1)
		go func() {
			defer wlWG.Done()
			if err := w.Run(wlCtx, env); err != nil && wlCtx.Err() == nil {
				h.Note("%s workload: %v", w.Name(), err)
			}
		}()
	}
	stopWorkloads := sync.OnceFunc(func() { stopWL(); wlWG.Wait() })
	defer stopWorkloads()

	plan := nemesis.Plan(cfg.Kinds, cfg.PerKind, cfg.Duration, cfg.Seed)
	fmt.Fprintf(out, "chaos: %d faults planned over %v: %s\n", len(plan), cfg.Duration, strings.Join(nemesis.Counts(plan), " "))
	nem := &nemesis.Nemesis{C: c, Net: nw, H: h, Logger: logger, Seed: cfg.Seed}
	_ = ctxtime.Sleep(ctx, 2*time.Second) // a calm start, the baseline for availability
	if err := nem.Run(ctx, plan, time.Now().Add(cfg.Duration*3/2+30*time.Second)); err != nil && ctx.Err() == nil {
		h.Note("nemesis: %v", err)
	}
	interrupted = ctx.Err() != nil

	// Final heal, then a calm period with the workloads still running, so
	// the history shows recovery.
	fmt.Fprintf(out, "chaos: healing\n")
	hctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	if err := nem.HealAll(hctx); err != nil {
		h.Note("final heal: %v", err)
	}
	cancel()
	if !interrupted {
		_ = ctxtime.Sleep(ctx, 3*time.Second)
	}
	stopWorkloads()

	// Final reads: linearizable per workload, then the whole prefix from
	// the leader and from every replica.
	fctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, w := range workloads {
		if err := w.Final(fctx, env); err != nil {
			h.Note("%s final: %v", w.Name(), err)
		}
	}
	fin := workload.ReadFinal(fctx, env, c)
	h.SetFinal(fin)
	if cfg.Watchers > 0 && fin.Complete && !watch.Disabled() {
		deadline := time.Now().Add(20 * time.Second)
		for !watch.CaughtUp(fin.Index) && time.Now().Before(deadline) && fctx.Err() == nil {
			_ = ctxtime.Sleep(fctx, 100*time.Millisecond)
		}
		if !watch.CaughtUp(fin.Index) {
			h.Note("watch: watchers had not caught up to the final index %d within 20s", fin.Index)
		}
	}
	if watch.Disabled() {
		h.Note("watch: the server does not serve Watch; watch checker skipped")
	}
	stopHostile()
	stopWatch()
	watchWG.Wait()
	stopMon()
	monWG.Wait()
	if err := closeCluster(); err != nil {
		h.Note("stop cluster: %v", err)
	}

	// Check and report.
	fmt.Fprintf(out, "chaos: checking %d operations\n", len(h.Ops))
	if err := h.Save(dir); err != nil {
		return nil, fmt.Errorf("save history: %w", err)
	}
	results := Check(h, dir, cfg.CheckTimeout)
	sum := report.Build(report.Meta{
		ID: id, Seed: cfg.Seed, Nodes: cfg.Nodes, Duration: cfg.Duration.String(), Binary: cfg.Binary,
		ServerArgs: serverArgs, Security: security, StaleReads: cfg.StaleReads, Command: cfg.Command, Interrupted: interrupted,
		Hostile: map[bool]string{true: "on", false: "off (--no-hostile)"}[cfg.Hostile],
	}, h, results, check.Availability(h))
	if hostileCl != nil {
		hs := hostileCl.Summary()
		sum.Hostile = &hs
		fmt.Fprintf(out, "chaos: hostile: %s\n", hs.Head())
		for _, l := range hs.Lines() {
			fmt.Fprintf(out, "chaos: hostile:   %s\n", l)
		}
	}
	if err := report.Write(dir, sum, h); err != nil {
		return nil, err
	}
	o := &Outcome{Dir: dir, Summary: sum}
	if interrupted {
		return o, ctx.Err()
	}
	return o, nil
}

// startHostile starts the hostile client against every node slot (on
// means cfg.Hostile); stop ends it and waits until every connection and
// goroutine it made is gone, and may be called more than once.
func startHostile(c *cluster.Cluster, on bool, logger *slog.Logger) (*hostile.Client, func()) {
	if !on {
		return nil, func() {}
	}
	hc := hostile.Config{LocalIP: netns.HostileIP, Prefix: "hostile/", Forbidden: check.Prefix + "hostile-may-not-read",
		Limits: hostileLimits, Logger: logger}
	if sec := c.Security(); sec != nil {
		hc.TLS, hc.Token = sec.HostileTLS(), sec.Hostile
	}
	for _, n := range c.Nodes {
		hc.Targets = append(hc.Targets, hostile.Target{Name: n.Name(),
			GRPCAddr: net.JoinHostPort(n.IP, strconv.Itoa(netns.GRPCPort)), HTTPAddr: net.JoinHostPort(n.IP, strconv.Itoa(netns.HTTPPort))})
	}
	cl := hostile.New(hc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); cl.Run(ctx) }()
	return cl, sync.OnceFunc(func() { cancel(); <-done })
}

// Check runs every checker on a history; visualizations go to dir.
func Check(h *history.History, dir string, timeout time.Duration) []check.Result {
	var out []check.Result
	for _, ch := range check.All(check.LinearOptions{Timeout: timeout, VisualizeDir: dir}) {
		out = append(out, ch.Check(h))
	}
	return append(out, check.Lock(h, timeout))
}

// monitorLeaders asks every running node for its status every 100ms.
func monitorLeaders(ctx context.Context, c *cluster.Cluster, h *history.History) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for i := 0; i < 10_000_000; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var wg sync.WaitGroup
		for _, n := range c.Nodes {
			if !n.Running() {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
				if st, err := c.Status(sctx, n); err == nil {
					h.RecordLeader(history.LeaderObs{T: h.Now(), Node: n.Name(), Leader: st.LeaderId, Term: st.Term})
				}
			}()
		}
		wg.Wait()
	}
}

func cleanupNet(logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := netns.Cleanup(ctx, logger); err != nil {
		logger.Error("remove network", "err", err)
	}
}

// buildBinary builds ./cmd/lodestone of the module that holds the working
// directory.
func buildBinary(ctx context.Context, out string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/lodestone")
	cmd.Dir = root
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("build lodestone: %w: %s", err, b)
	}
	return nil
}

const modulePath = "github.com/lodestone-kv/lodestone"

// moduleRoot walks up from the working directory to Lodestone's go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for i := 0; i < 64; i++ {
		if f, err := os.Open(filepath.Join(dir, "go.mod")); err == nil {
			sc := bufio.NewScanner(f)
			first := ""
			if sc.Scan() {
				first = strings.TrimSpace(sc.Text())
			}
			f.Close()
			if first == "module "+modulePath {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return "", errors.New("not inside the lodestone module; pass --binary and --runs-dir")
}
