// Command chaos is Lodestone's Jepsen-style harness: it runs a real cluster
// with each node in its own network namespace, drives client workloads
// from the root namespace, injects faults on a schedule (partitions, kill
// -9, SIGSTOP, packet loss, delay, membership changes), then heals, checks
// the history (linearizability, counter bounds, durability, watch
// integrity) and writes a report under chaos/runs/<id>/.
//
//	go run ./chaos --smoke            # ~60 s, two faults of every kind (CI)
//	go run ./chaos --smoke --plaintext  # the same without TLS and ACLs
//	go run ./chaos --smoke --no-hostile # without the hostile client
//	go run ./chaos                    # 10 min, every kind >= 20 times
//	go run ./chaos check chaos/runs/ID  # re-check a saved history
//	go run ./chaos cleanup            # remove a crashed run's namespaces
//
// The cluster runs with TLS (client certificates on every port) and ACLs
// (default deny; the workloads hold a token limited to their keys) unless
// --plaintext is given; the campaign first proves that clients without a
// certificate or token are refused (chaos/README.md, "Security").
//
// It needs root, iproute2 and iptables. The last line of a campaign is
// `CHAOS ops=<n> faults=<n> anomalies=<n>`; the exit code is 1 when any
// anomaly was found, 2 when the harness itself failed, 130 when
// interrupted.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/lodestone-kv/lodestone/chaos/check"
	"github.com/lodestone-kv/lodestone/chaos/history"
	"github.com/lodestone-kv/lodestone/chaos/nemesis"
	"github.com/lodestone-kv/lodestone/chaos/netns"
	"github.com/lodestone-kv/lodestone/chaos/report"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, " ") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "check":
			return runCheck(args[1:], stdout, stderr)
		case "cleanup":
			if err := netns.Cleanup(ctx, slog.New(slog.NewTextHandler(stderr, nil))); err != nil {
				fmt.Fprintf(stderr, "chaos: cleanup: %v\n", err)
				return 2
			}
			return 0
		}
	}
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	full := Full()
	smoke := fs.Bool("smoke", false, "the ~60 s CI campaign (3 nodes, two faults of every kind)")
	nodes := fs.Int("nodes", full.Nodes, "cluster size: 3 or 5")
	duration := fs.Duration("duration", 0, "how long the fault schedule runs (default 10m, 45s with --smoke)")
	perKind := fs.Int("per-kind", 0, "faults of each kind (default 22, 2 with --smoke)")
	kinds := fs.String("kinds", "all", "fault kinds, comma-separated: "+strings.Join(nemesis.AllKinds, ","))
	seed := fs.Uint64("seed", 0, "random seed (0: from the clock; printed in the report)")
	binary := fs.String("binary", "", "lodestone binary (default: build ./cmd/lodestone into the run dir)")
	runsDir := fs.String("runs-dir", "", "where run directories go (default chaos/runs in the module)")
	var serverArgs stringList
	fs.Var(&serverArgs, "server-arg", "extra `lodestone server` flag, repeatable (e.g. --server-arg=--unsafe-stale-reads)")
	unsafeStale := fs.Bool("unsafe-stale-reads", false, "start servers with the hidden --unsafe-stale-reads (the harness must then report anomalies)")
	clientStale := fs.Bool("client-stale-reads", false, "self-test: workloads read with STALE consistency (anomalies expected)")
	plaintext := fs.Bool("plaintext", false, "run the cluster without TLS and ACLs (default: TLS with client certificates on every port, ACLs on, the workloads with a token of their own)")
	noHostile := fs.Bool("no-hostile", false, "do not run the hostile client (by default it abuses every node's connection, body and watch limits beside the checked workloads, from its own address)")
	expect := fs.Bool("expect-anomalies", false, "exit 0 only if anomalies were found (for unsafe-mode runs)")
	tick := fs.Duration("tick-interval", full.TickInterval, "server Raft tick")
	elect := fs.Int("election-ticks", full.ElectionTicks, "server election timeout in ticks")
	think := fs.Duration("think", full.Think, "pause between one worker's operations")
	watchers := fs.Int("watchers", full.Watchers, "watch consumers")
	logLevel := fs.String("log-level", "warn", "harness log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg := full
	if *smoke {
		cfg = Smoke()
	}
	cfg.Nodes = *nodes
	if *duration > 0 {
		cfg.Duration = *duration
	}
	if *perKind > 0 {
		cfg.PerKind = *perKind
	}
	var err error
	if cfg.Kinds, err = nemesis.ParseKinds(*kinds); err != nil {
		fmt.Fprintf(stderr, "chaos: --kinds: %v\n", err)
		return 2
	}
	cfg.Seed, cfg.Binary, cfg.ServerArgs = *seed, *binary, serverArgs
	if *unsafeStale {
		cfg.ServerArgs = append(cfg.ServerArgs, "--unsafe-stale-reads")
	}
	cfg.StaleReads = *clientStale
	cfg.Plaintext = *plaintext
	cfg.Hostile = !*noHostile
	cfg.TickInterval, cfg.ElectionTicks, cfg.Think, cfg.Watchers = *tick, *elect, *think, *watchers
	cfg.Command = "chaos " + strings.Join(args, " ")
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "chaos: --log-level %q: use debug, info, warn or error\n", *logLevel)
		return 2
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv}))
	cfg.RunsDir = *runsDir
	if cfg.RunsDir == "" {
		root, err := moduleRoot()
		if err != nil {
			fmt.Fprintf(stderr, "chaos: %v\n", err)
			return 2
		}
		cfg.RunsDir = filepath.Join(root, "chaos", "runs")
	}
	if !strings.Contains(cfg.Command, "--seed") {
		cfg.Seed = uint64(time.Now().UnixNano())
		cfg.Command += fmt.Sprintf(" --seed %d", cfg.Seed)
	}

	o, err := Run(ctx, cfg, stdout)
	if o != nil {
		fmt.Fprintln(stdout)
		o.Summary.WriteText(stdout)
		fmt.Fprintf(stdout, "report: %s\n", o.Dir)
		fmt.Fprintln(stdout, o.Summary.Line())
	}
	switch {
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(stderr, "chaos: interrupted; everything it made was removed")
		return 130
	case err != nil:
		fmt.Fprintf(stderr, "chaos: %v\n", err)
		if o == nil {
			fmt.Fprintln(stdout, "CHAOS ops=0 faults=0 anomalies=0 error=1")
		}
		return 2
	}
	return exitCode(o.Summary.Anomalies, *expect, stderr)
}

func exitCode(anomalies int, expect bool, stderr io.Writer) int {
	switch {
	case expect && anomalies == 0:
		fmt.Fprintln(stderr, "chaos: expected anomalies (unsafe mode) but found none: the harness missed them")
		return 1
	case expect:
		return 0
	case anomalies > 0:
		return 1
	}
	return 0
}

// runCheck re-runs the checkers on a saved run directory.
func runCheck(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("chaos check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", time.Minute, "porcupine timeout per key")
	expect := fs.Bool("expect-anomalies", false, "exit 0 only if anomalies were found")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: chaos check [--timeout D] RUN_DIR")
		return 2
	}
	dir := fs.Arg(0)
	h, err := history.Load(dir)
	if err != nil {
		fmt.Fprintf(stderr, "chaos check: load %s: %v\n", dir, err)
		return 2
	}
	results := Check(h, dir, *timeout)
	sum := report.Build(report.Meta{ID: filepath.Base(dir), Command: "chaos check " + dir}, h, results, check.Availability(h))
	sum.WriteText(stdout)
	fmt.Fprintln(stdout, sum.Line())
	return exitCode(sum.Anomalies, *expect, stderr)
}
