package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/lodestone-kv/lodestone/internal/heapfloor"
	"github.com/lodestone-kv/lodestone/raftlog"
	"github.com/lodestone-kv/lodestone/server"
	"github.com/lodestone-kv/lodestone/tlsutil"
)

type serverOptions struct {
	cfg            server.Config
	configFiles    []string
	initialCluster string
	logLevel       string
	logFormat      string
	faultHooks     bool
	faultDiskDelay time.Duration
	heapFloorMiB   int
	minProcs       int
	aclDefault     string
	dns            dnsOptions
}

// newServerCmd is `lodestone server`. getenv supplies LODESTONE_<KEY>
// (serverconfig.go).
func newServerCmd(getenv func(string) string) *cobra.Command {
	cmd, _ := newServerFlags()
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		// NB: its own flags: the root's client flags have no keys.
		src := serverSource{line: recordCommandLine(cmd.LocalFlags()), getenv: getenv}
		return runServer(cmd.Context(), src, cmd.ErrOrStderr())
	}
	return cmd
}

// newServerFlags is `lodestone server` without its action: its flags,
// bound to the options it returns.
func newServerFlags() (*cobra.Command, *serverOptions) {
	o := &serverOptions{cfg: server.DefaultConfig()}
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a registry node (a Raft member)",
		Long: `Run a registry node. A new cluster starts when every member is given the same
--initial-cluster; a member added to a running cluster (lodestone members add)
starts with --join and an --initial-cluster naming the existing members.

Every flag can also come from LODESTONE_<KEY> or a --config-file (HCL or JSON),
where KEY is the flag's name with '_' for '-' (data_dir, tls_ca_file). The
command line wins over the environment, which wins over the files. SIGHUP
re-reads them and applies what can change live (docs/configuration.md).`,
		Args: cobra.NoArgs,
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.configFiles, configFileFlag, nil, "HCL (.hcl) or JSON (.json) file of flag values; repeat for more (a later file's key wins)")
	f.StringVar(&o.cfg.Name, "name", "", "member name (unique in the cluster)")
	f.StringVar(&o.cfg.DataDir, "data-dir", "", "directory for the Raft log and snapshots")
	f.StringVar(&o.cfg.ListenPeer, "listen-peer", "127.0.0.1:7401", "address for Raft traffic between members")
	f.StringVar(&o.cfg.ListenGRPC, "listen-grpc", "127.0.0.1:7400", "address for the client gRPC API")
	f.StringVar(&o.cfg.ListenHTTP, "listen-http", "127.0.0.1:8500", "address for HTTP: /metrics, /healthz, /readyz")
	f.StringVar(&o.initialCluster, "initial-cluster", "", "members as name=peeraddr,... (default: this member alone, at --advertise-peer or --listen-peer)")
	addAdvertiseFlags(f, &o.cfg)
	f.BoolVar(&o.cfg.Join, "join", false, "join a running cluster that already added this member")
	f.BoolVar(&o.cfg.ACL.Enabled, "acl-enabled", false, "require an ACL token with the right permission for every request (bootstrap one with lodestone acl bootstrap)")
	f.StringVar(&o.aclDefault, "acl-default-policy", "deny", "what a token may do where none of its rules match: deny or allow")
	f.StringVar(&o.cfg.ClusterToken, "cluster-token", "", "with --initial-cluster, makes a new cluster's id unique: give every founding member the same token, and each cluster its own (a one-member cluster without one gets a random id)")
	f.Int64Var(&o.cfg.MaxPeerSnapshotBytes, "max-peer-snapshot-bytes", o.cfg.MaxPeerSnapshotBytes, "largest snapshot a peer may stream to this member (held in memory to be checked); raise it above the state's snapshot size")
	f.IntVar(&o.cfg.MaxPeerSnapshotChunks, "max-peer-snapshot-chunks", o.cfg.MaxPeerSnapshotChunks, "most chunks (1 MiB each from a sender) one peer snapshot stream may have")
	f.IntVar(&o.minProcs, "min-procs", minProcsDefault, "run Go with at least this many Ps (GOMAXPROCS) when the CPU set or quota gives it fewer (0: 2 where the log's fdatasync would block a thread, that is without Linux AIO, else Go's choice; a GOMAXPROCS in the environment wins)")
	f.IntVar(&o.heapFloorMiB, "gc-heap-floor-mib", 256, "let the Go heap grow to this many MiB before a garbage collection, however small the live heap (0: GOGC alone); fewer GC cycles stall fewer writes")
	addTuningFlags(cmd, &o.cfg)
	addHoldFlag(cmd, &o.cfg.RPCHoldTimeout)
	f.DurationVar(&o.cfg.AdmissionMaxRetryHint, "admission-max-retry-hint", o.cfg.AdmissionMaxRetryHint, "longest retry hint an admission refusal carries (gRPC RetryInfo, HTTP Retry-After), 1s to 10m; refusals cut to it are counted")
	f.DurationVar(&o.cfg.AdmissionSetupBurst, "admission-setup-burst", o.cfg.AdmissionSetupBurst, "how much of the admission policy's connection and watch rates is let in at once (at least one), 1ms to 1s; reads and writes let in a second's worth")
	f.DurationVar(&o.cfg.AdmissionMaxSchedDelay, "admission-max-sched-delay", o.cfg.AdmissionMaxSchedDelay, "hold the connections and watch creates the admission policy gates while over 1% of this server's goroutines wait longer than this for a CPU (0: never), 1ms to 1s")
	addCatalogFlags(cmd.Flags(), &o.cfg.Catalog)
	addGossipFlags(f, &o.cfg.Gossip.Pool, "")
	addDNSFlags(f, &o.cfg.DNS, &o.dns, "listen-dns")
	f.DurationVar(&o.cfg.Gossip.ReconcileInterval, "gossip-reconcile-interval", o.cfg.Gossip.ReconcileInterval, "how often the leader re-diffs the gossip pool against the catalog (writes only differences)")
	f.BoolVar(&o.cfg.UnsafeStaleReads, "unsafe-stale-reads", false, "serve linearizable reads without ReadIndex (breaks linearizability; fault-injection tests only)")
	if err := f.MarkHidden("unsafe-stale-reads"); err != nil {
		panic(err) // the flag is defined just above
	}
	f.DurationVar(&o.cfg.SlowLeader.Threshold, "slow-leader-threshold", o.cfg.SlowLeader.Threshold, "a leader whose log writes stay slower than this steps down (0: never)")
	f.DurationVar(&o.cfg.SlowLeader.Window, "slow-leader-window", o.cfg.SlowLeader.Window, "how long log writes must stay slow before the leader steps down")
	f.DurationVar(&o.cfg.SlowLeader.Cooldown, "slow-leader-cooldown", o.cfg.SlowLeader.Cooldown, "how long a node that stepped down for slowness does not campaign")
	f.BoolVar(&o.faultHooks, "fault-hooks", false, "serve fault-injection hooks under /debug/faults/ (tests and chaos only)")
	f.DurationVar(&o.faultDiskDelay, "fault-disk-delay", 0, "with --fault-hooks: delay every log write by this much from the start")
	for _, name := range []string{"fault-hooks", "fault-disk-delay"} {
		if err := f.MarkHidden(name); err != nil {
			panic(err) // defined just above
		}
	}
	addServerTLSFlags(f, &o.cfg)
	addLogFlags(cmd, &o.logLevel, &o.logFormat)
	return cmd, o
}

// addAdvertiseFlags exposes the addresses a member publishes, for a
// member that listens on a wildcard or behind NAT (containers, pods).
func addAdvertiseFlags(f *pflag.FlagSet, cfg *server.Config) {
	f.StringVar(&cfg.AdvertiseGRPC, "advertise-grpc", "", "host:port clients are told to reach the gRPC API at (default: the --listen-grpc address)")
	f.StringVar(&cfg.AdvertiseHTTP, "advertise-http", "", "host:port clients are told to reach HTTP at (default: the --listen-http address)")
	f.StringVar(&cfg.AdvertisePeer, "advertise-peer", "", "host:port the other members reach this one at; must match this member's --initial-cluster entry (default: that entry, or --listen-peer)")
}

// addServerTLSFlags exposes server.TLSConfig.
func addServerTLSFlags(f *pflag.FlagSet, cfg *server.Config) {
	t := &cfg.TLS
	f.StringVar(&t.CAFile, "tls-ca-file", "", "CA bundle that verifies peers and client certificates; with --tls-cert-file and --tls-key-file turns on TLS on every port")
	f.StringVar(&t.CertFile, "tls-cert-file", "", "certificate the gRPC, HTTP (and, by default, peer) ports serve (lodestone tls cert create --server)")
	f.StringVar(&t.KeyFile, "tls-key-file", "", "key of --tls-cert-file")
	f.BoolVar(&t.VerifyIncomingGRPC, "tls-verify-incoming-grpc", false, "require a client certificate from the CA on the gRPC port (otherwise one is optional, and verified if given)")
	f.BoolVar(&t.VerifyIncomingHTTP, "tls-verify-incoming-http", false, "require a client certificate from the CA on the HTTP port")
	f.StringVar(&t.PeerCertFile, "tls-peer-cert-file", "", "certificate for the peer port and dials to peers (default --tls-cert-file); peers always need one")
	f.StringVar(&t.PeerKeyFile, "tls-peer-key-file", "", "key of --tls-peer-cert-file")
	f.StringVar(&t.PeerServerName, "tls-peer-server-name", "server."+tlsutil.DefaultDomain, "name every member's peer certificate must carry")
	f.DurationVar(&t.ReloadInterval, "tls-reload-interval", time.Second, "how often the TLS files are checked for changes (negative: only on SIGHUP)")
	f.BoolVar(&cfg.InsecurePlaintext, "insecure-plaintext", false, "allow listening without TLS on addresses other than loopback (anyone who reaches them can read and write the registry)")
}

// addTuningFlags exposes the limits and timings every node shares.
func addTuningFlags(cmd *cobra.Command, cfg *server.Config) {
	f := cmd.Flags()
	f.DurationVar(&cfg.TickInterval, "tick-interval", cfg.TickInterval, "Raft tick")
	f.IntVar(&cfg.ElectionTicks, "election-ticks", cfg.ElectionTicks, "election timeout in ticks")
	f.Uint64Var(&cfg.SnapshotEntries, "snapshot-entries", cfg.SnapshotEntries, "applied entries between snapshots")
	f.Int64Var(&cfg.RaftLogCacheBytes, "raft-log-cache-bytes", cfg.RaftLogCacheBytes, "bytes of recent Raft entries kept in memory to feed followers; one further behind is fed from the log's file")
	f.Uint64Var(&cfg.SnapshotBytes, "snapshot-bytes", cfg.SnapshotBytes, "applied entry bytes that also trigger a snapshot, once they reach the last snapshot's size too (default 256 MiB; 0: --snapshot-entries alone)")
	f.Uint64Var(&cfg.ReadyApplyLag, "ready-apply-lag", cfg.ReadyApplyLag, "once caught up, stay ready (/readyz, systemd READY) while applying at most this many committed entries")
	f.Uint64Var(&cfg.CatchUpEntries, "catch-up-entries", cfg.CatchUpEntries, "entries kept behind a snapshot for lagging followers")
	f.Uint64Var(&cfg.AutoPromoteLag, "auto-promote-lag", cfg.AutoPromoteLag, "as leader, promote a learner added to become a voter once it is within this many entries of the leader's log and was heard from lately")
	f.IntVar(&cfg.Limits.MaxKeyBytes, "max-key-bytes", cfg.Limits.MaxKeyBytes, "largest key accepted")
	f.IntVar(&cfg.Limits.MaxValueBytes, "max-value-bytes", cfg.Limits.MaxValueBytes, "largest value accepted")
	f.IntVar(&cfg.Limits.MaxTxnOps, "max-txn-ops", cfg.Limits.MaxTxnOps, "most operations in one transaction, and keys in one GetMany")
	f.IntVar(&cfg.Limits.MaxRangeLimit, "max-range-keys", cfg.Limits.MaxRangeLimit, "most keys in one range answer")
	f.IntVar(&cfg.MaxRequestBytes, "max-request-bytes", cfg.MaxRequestBytes, "largest gRPC request accepted")
	f.IntVar(&cfg.MaxConnections, "max-connections", cfg.MaxConnections, "most concurrent client connections on the gRPC listener")
	f.IntVar(&cfg.MaxHTTPConnections, "max-http-connections", cfg.MaxHTTPConnections, "most concurrent connections on the HTTP listener (a Consul client holds one per blocking query); more wait to be accepted")
	f.IntVar(&cfg.MaxHTTPConnectionsPerClient, "max-http-connections-per-client", cfg.MaxHTTPConnectionsPerClient, "most concurrent HTTP connections from one source IP, parked blocking queries included; more are closed at once (-1: no cap)")
	f.IntVar(&cfg.MaxGRPCConnectionsPerClient, "max-grpc-connections-per-client", cfg.MaxGRPCConnectionsPerClient, "most concurrent gRPC connections from one source IP; more are closed at once (-1: no cap)")
	f.Var((*prefixList)(&cfg.ConnectionLimitExempt), "connection-limit-exempt", "source networks (CIDR, comma-separated) the per-client connection caps skip; loopback is not exempt unless listed")
	f.DurationVar(&cfg.HTTPIdleTimeout, "http-idle-timeout", cfg.HTTPIdleTimeout, "close an HTTP keep-alive connection that sent no request for this long")
	f.IntVar(&cfg.MaxTxnRequestBytes, "max-txn-request-bytes", cfg.MaxTxnRequestBytes, "largest Consul API /v1/txn request body (413 above)")
	f.IntVar(&cfg.MaxRangeResponseBytes, "max-range-response-bytes", cfg.MaxRangeResponseBytes, "most key and value bytes in one range answer (gRPC: sets more; Consul API recursive GET: 413)")
	f.IntVar(&cfg.MaxWatchesPerStream, "max-watches-per-stream", cfg.MaxWatchesPerStream, "most watches on one Watch stream")
	f.IntVar(&cfg.MaxWatchesPerConnection, "max-watches-per-connection", cfg.MaxWatchesPerConnection, "most watches over all streams of one client connection")
	f.DurationVar(&cfg.CommitNoticeHold, "commit-notice-hold", cfg.CommitNoticeHold, "how long the leader may hold an entry-less commit append for the next append to the same follower (0: send at once)")
	f.DurationVar(&cfg.LearnerAppendHold, "learner-append-hold", cfg.LearnerAppendHold, "how long the leader may hold appends to a learner to send them as one (a learner is in no quorum; it applies up to this much later; 0: send at once)")
	f.DurationVar(&cfg.WatchDeliveryInterval, "watch-delivery-interval", cfg.WatchDeliveryInterval, "grid watch deliveries are aligned to: at most one message per stream per interval (0: send at once)")
	f.DurationVar(&cfg.WatchBusyDeliveryInterval, "watch-busy-delivery-interval", cfg.WatchBusyDeliveryInterval, "coarser grid for a watch stream that sent less than this long ago, so a stream fed by every write sends less often (0 or at most --watch-delivery-interval: off)")
	f.IntVar(&cfg.Watch.RetainEvents, "watch-history-events", cfg.Watch.RetainEvents, "most watch events kept for watchers that resume from an older index; one further behind is told its index was compacted and reloads")
	f.Int64Var(&cfg.Watch.RetainBytes, "watch-history-bytes", cfg.Watch.RetainBytes, "most bytes of watch events kept for resuming watchers (each event's key, value and previous value, plus about 128 B)")
	f.Uint32Var(&cfg.MaxStreamsPerConnection, "max-streams-per-connection", cfg.MaxStreamsPerConnection, "most concurrent requests per client connection")
	f.IntVar(&cfg.GRPCStreamWorkers, "grpc-stream-workers", cfg.GRPCStreamWorkers, "goroutines kept to run gRPC calls, so their grown stacks are reused; a call finding all busy gets its own (0: the default, -1: a goroutine per call)")
	f.BoolVar(&cfg.NoParking, "no-parking", cfg.NoParking, "serve waiting Consul blocking queries on a goroutine pair each, as net/http does, instead of parking them (more memory and GC work per query)")
	f.DurationVar(&cfg.PollProbeInterval, "poll-probe-interval", cfg.PollProbeInterval, "how often to measure how late this server notices network input (lodestone_runtime_poll_delay_seconds; 0: off)")
	f.BoolVar(&cfg.EnablePprof, "enable-pprof", cfg.EnablePprof, "serve Go's profiler under /debug/pprof/ on the HTTP listener")
	f.BoolVar(&cfg.UI, "ui", cfg.UI, "serve the web UI under /ui/ on the HTTP listener (--ui=false: off)")
}

// addHoldFlag is --rpc-hold-timeout, on lodestone server and dev.
func addHoldFlag(cmd *cobra.Command, d *time.Duration) {
	cmd.Flags().DurationVar(d, "rpc-hold-timeout", server.DefaultConfig().RPCHoldTimeout,
		"how long a request that finds no leader (an election, a start) waits for one before it fails (0: fail at once; Consul's rpc_hold_timeout)")
}

func addLogFlags(cmd *cobra.Command, level, format *string) {
	cmd.Flags().StringVar(level, "log-level", "info", "debug, info, warn or error")
	cmd.Flags().StringVar(format, "log-format", "text", "text or json")
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	lv, err := parseLogLevel(level)
	if err != nil {
		return nil, err
	}
	return newLevelLogger(w, lv, format)
}

func parseLogLevel(level string) (slog.Level, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return 0, fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
	}
	return lv, nil
}

// newLevelLogger logs at level, which a *slog.LevelVar lets change.
func newLevelLogger(w io.Writer, level slog.Leveler, format string) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format %q: use text or json", format)
	}
}

func runServer(ctx context.Context, src serverSource, stderr io.Writer) error {
	r, err := src.resolve()
	if err != nil {
		return err
	}
	level := new(slog.LevelVar)
	level.Set(r.level)
	logger, err := newLevelLogger(stderr, level, r.opts.logFormat)
	if err != nil {
		return err
	}
	cfg := r.cfg
	cfg.Logger = logger
	floor := r.opts.minProcs
	if floor == 0 {
		parks := raftlog.DatasyncParks(cfg.DataDir)
		floor = autoMinProcs(parks)
		logger.Info("chose the floor of GOMAXPROCS", "log_datasync_parks", parks, "min_procs", floor)
	}
	raiseProcs(floor, os.Getenv("GOMAXPROCS"), logger)
	if mib := r.opts.heapFloorMiB; mib > 0 {
		defer heapfloor.Start(uint64(mib) << 20)()
		logger.Info("garbage collection waits for a heap floor", "floor_mib", mib)
	}
	rl := &reloader{src: src, started: r, applied: flagValues(r.flags), level: level, logger: logger}
	return serve(ctx, cfg, nil, rl.attach)
}

// serveUntilDone runs a server until ctx ends or the server stops by
// itself. alongside, if set, runs once the server serves, with a context
// that ends before the server closes; its error (other than the context's)
// stops the server too.
func serveUntilDone(ctx context.Context, cfg server.Config, alongside func(context.Context, *server.Server) error) error {
	return serve(ctx, cfg, alongside, nil)
}

// serve is serveUntilDone; onHUP, if set, is called once the server
// serves and returns what each SIGHUP runs from then on, instead of the
// TLS reload alone.
func serve(ctx context.Context, cfg server.Config, alongside func(context.Context, *server.Server) error,
	onHUP func(*server.Server) func() error) error {
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}
	srv.Start()
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	sd := newSDNotifier(srv, cfg.Logger) // systemd Type=notify (sdnotify.go)
	switch {
	case onHUP != nil:
		defer reloadOnHUP(actx, sd.reloading(onHUP(srv)))()
	case srv.TLSEnabled():
		// NB: only with TLS: otherwise SIGHUP keeps its default (exit).
		stop := reloadOnHUP(actx, sd.reloading(srv.ReloadTLS))
		defer stop()
	}
	// NB: after SIGHUP is handled: READY=1 allows a reload.
	sd.start(actx)
	var alongC chan error // nil (never ready) without alongside
	if alongside != nil {
		alongC = make(chan error, 1)
		go func() { alongC <- alongside(actx, srv) }()
	}
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-srv.Done():
	case runErr = <-alongC:
		alongC = nil
	}
	cancel()
	sd.stopping()
	if alongC != nil {
		if err := <-alongC; err != nil && runErr == nil && !errors.Is(err, context.Canceled) {
			runErr = err
		}
	}
	if err := srv.Close(); err != nil && runErr == nil {
		runErr = fmt.Errorf("shut down: %w", err)
	}
	return runErr
}

// prefixList is a flag of comma-separated CIDR networks.
type prefixList []netip.Prefix

func (l *prefixList) String() string { return strings.Join(l.GetSlice(), ",") }

func (l *prefixList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("%q is not a CIDR network such as 10.0.0.0/8: %v", s, err)
		}
		*l = append(*l, p.Masked())
	}
	return nil
}

func (l *prefixList) Type() string { return "cidrs" }

// Append, Replace and GetSlice make it a pflag.SliceValue, which a
// configuration file's list fills.
func (l *prefixList) Append(v string) error { return l.Set(v) }

func (l *prefixList) Replace(vs []string) error {
	var next prefixList
	for _, v := range vs {
		if err := next.Set(v); err != nil {
			return err
		}
	}
	*l = next
	return nil
}

func (l *prefixList) GetSlice() []string {
	out := make([]string, len(*l))
	for i, p := range *l {
		out[i] = p.String()
	}
	return out
}
