package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/internal/member"
	"github.com/lodestone-kv/lodestone/peer"
	"github.com/lodestone-kv/lodestone/raftlog"
	"github.com/lodestone-kv/lodestone/raftnode"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// Config configures one registry node. The zero value is not usable: start
// from DefaultConfig and set Name, DataDir and the listen addresses.
type Config struct {
	// Name identifies the member; its Raft id is derived from it (MemberID).
	Name string
	// DataDir holds the Raft log, hard state and snapshots.
	DataDir string

	// ListenPeer, ListenGRPC and ListenHTTP are host:port addresses. Port 0
	// picks a free port (tests); the port got is then advertised, and an
	// InitialCluster entry for this member with port 0 takes it too.
	ListenPeer string
	ListenGRPC string
	ListenHTTP string

	// AdvertiseGRPC and AdvertiseHTTP are the host:port addresses this
	// member publishes in the membership for clients (advertise.go).
	// Empty: the listen address, with the port bound. Set them when
	// listening on a wildcard (0.0.0.0) or behind NAT, as in containers.
	AdvertiseGRPC string
	AdvertiseHTTP string
	// AdvertisePeer is this member's peer address as the others reach it.
	// It must match this member's InitialCluster entry when that lists
	// it; empty means that entry (advertise.go).
	AdvertisePeer string

	// InitialCluster lists every member of a new cluster as name=peeraddr.
	// When Join is false and the data dir is empty, the node bootstraps a
	// new cluster from it. When Join is true the node joins a running
	// cluster that already added it with AddMember; InitialCluster then
	// tells it where the existing members are.
	InitialCluster map[string]string
	Join           bool
	// ClusterToken goes into the id of a cluster bootstrapped from
	// InitialCluster (peer/doc.go): every founding member must have the
	// same, and two clusters with the same member list should not. Empty
	// is allowed; a one-member cluster then gets a random id.
	ClusterToken string

	// MaxPeerSnapshotBytes bounds one snapshot a peer streams to this
	// member, which holds it in memory and decodes it to check it before
	// Raft sees it. It must exceed the state's snapshot size, or followers
	// that need a snapshot never catch up (the leader logs each refusal,
	// lodestone_peer_refused_total{reason="snapshot_oversize"} counts
	// them). Default 2 GiB.
	MaxPeerSnapshotBytes int64
	// MaxPeerSnapshotChunks bounds the chunks of one such stream (senders
	// send 1 MiB each). Default 4096; at least MaxPeerSnapshotBytes/1 MiB+2.
	MaxPeerSnapshotChunks int

	// TickInterval is one Raft tick. Default 100ms. Lower reacts faster to
	// a dead leader and costs more heartbeats.
	TickInterval time.Duration
	// ElectionTicks is the election timeout in ticks (default 10, so 1s).
	// It must be larger than HeartbeatTicks; a larger value rides out
	// longer pauses at the cost of slower fail-over.
	ElectionTicks int
	// HeartbeatTicks is the leader heartbeat interval in ticks (default 1).
	HeartbeatTicks int
	// CommitNoticeHold is how long the leader may hold the entry-less
	// append that tells a follower of a new commit, so the next append to
	// that follower carries the news instead (transport.go explains).
	// Default 2ms: followers apply, serve reads and wake watchers up to
	// that much later, and each single write costs half the Raft messages.
	// 0 sends every notice at once.
	CommitNoticeHold time.Duration
	// LearnerAppendHold is how long the leader may hold appends to a
	// learner so that several go out as one (peer/appendhold.go). Default
	// 10ms: a learner is in no quorum, so no write waits for it, and at
	// 1,000 single writes/s it takes one append, one log write and one
	// acknowledgement per hold instead of per write, on its side and the
	// leader's. A learner applies, wakes blocking queries and serves
	// reads up to that much later. 0 sends every append at once.
	LearnerAppendHold time.Duration

	// SnapshotEntries is how many applied entries trigger a state-machine
	// snapshot and log truncation. Default 100000 (etcd's --snapshot-count):
	// about 30 MB of log at 256-byte values, replayed in about a second on
	// restart. Smaller keeps the log and restart replay short, but each
	// snapshot encodes the whole state: at 10000, snapshots took about 15%
	// of the CPU of BenchmarkPut64 (a store of 30k keys) and set the tail
	// latency of writes.
	SnapshotEntries uint64
	// SnapshotBytes also triggers a snapshot once the entries applied
	// since the last one hold this many bytes and at least as many as that
	// snapshot had, so a restart of a state written by large batches
	// restores a snapshot and replays a short log instead of the whole
	// history. 0 turns it off (SnapshotEntries alone); otherwise at least
	// MinSnapshotBytes. Default 256 MiB: without it a state written in
	// 64-put transactions never reached SnapshotEntries, and a restart
	// replayed its whole history; a lower floor snapshots a fast-growing
	// state of large values more often than its writes can spare.
	SnapshotBytes uint64
	// RaftLogCacheBytes bounds the bytes of recent Raft entries the log
	// keeps in memory to feed followers without reading its file
	// (raftlog.Options.CacheBytes; lodestone_raftlog_cached_entries counts
	// them). A follower further behind than the cache holds is fed from
	// raft.db. At least MinRaftLogCacheBytes. Default 16 MiB.
	RaftLogCacheBytes int64
	// CatchUpEntries is how many entries are kept behind a snapshot so a
	// slightly lagging follower catches up by log rather than by snapshot.
	// Default 5000.
	CatchUpEntries uint64
	// AutoPromoteLag is how far behind the leader's last index a learner
	// added to be promoted may be when the leader promotes it to voter
	// (it must also have been heard from within a few heartbeats).
	// Default 64 entries.
	AutoPromoteLag uint64
	// ReadyApplyLag is how far this member's applied index may trail the
	// commit index it knows while it stays ready (Ready, /readyz), once it
	// has first caught up. A member applies each entry just after it
	// commits, so under writes a gap of a few entries is normal; without
	// this slack a busy member's readiness would flap. Before its first
	// catch-up a member is ready only once it has applied the commit
	// index it knew when it first saw a leader. Default 1000 entries.
	ReadyApplyLag uint64

	// MaxBatchProposals caps how many proposals share one Ready (and so one
	// fsync). Default 1024.
	MaxBatchProposals int
	// MaxRequestBytes bounds one gRPC request. Default 4 MiB. It must exceed
	// Limits.MaxValueBytes plus the key and framing.
	MaxRequestBytes int
	// MaxConnections bounds concurrent client connections on the gRPC
	// listener. Default 10000; 0 means the default.
	MaxConnections int
	// MaxHTTPConnections bounds concurrent connections on the HTTP
	// listener (the Consul API, /metrics): a Consul client holds one per
	// blocking query. At the limit, new connections wait to be accepted.
	// Default 20000; 0 means the default.
	MaxHTTPConnections int
	// MaxGRPCConnectionsPerClient bounds the gRPC listener's connections
	// from one source IP; one more is closed at once and counted in
	// lodestone_connections_refused_total{listener="grpc"}. Default 200
	// (Consul's http_max_conns_per_client): a gRPC client multiplexes
	// every call over one connection per server, so 200 leaves room for
	// many processes behind one NAT address. 0 means the default, -1
	// turns it off. It protects other clients only while it is below
	// MaxConnections.
	MaxGRPCConnectionsPerClient int
	// MaxHTTPConnectionsPerClient bounds the HTTP listener's connections
	// from one source IP, parked blocking queries included; one more is
	// closed at once and counted in
	// lodestone_connections_refused_total{listener="http"}. Default 200,
	// as Consul's http_max_conns_per_client. 0 means the default, -1 turns
	// it off. It protects other clients only while it is below
	// MaxHTTPConnections.
	MaxHTTPConnectionsPerClient int
	// ConnectionLimitExempt lists the source networks the per-client caps
	// skip (as Consul's limits, loopback is not exempt unless listed).
	ConnectionLimitExempt []netip.Prefix
	// HTTPIdleTimeout closes an HTTP keep-alive connection that sent no
	// request for this long, whether the http.Server or httppark holds
	// it; a connection waiting on a blocking query is not idle. Default
	// 120s: above the 90s IdleConnTimeout of Go's transport, which
	// Consul's api client uses, so such clients retire an idle connection
	// before the server closes it under a request they are sending.
	HTTPIdleTimeout time.Duration
	// MaxTxnRequestBytes bounds the body of a Consul API /v1/txn request,
	// refused with 413 when longer. Default 512 KiB, as Consul's
	// txn_max_req_len. Every other HTTP body is bounded too
	// (consulapi.Config.MaxBodyBytes).
	MaxTxnRequestBytes int
	// MaxRangeResponseBytes bounds the keys and values of one range
	// answer: a gRPC Range stops before the entry that would pass it and
	// sets more (the client pages with start_after; one entry is always
	// sent), and a Consul API recursive or ?keys GET over it is refused
	// with 413. Default 4 MiB less 64 KiB, so a Range answer with its
	// framing fits the 4 MiB a stock gRPC client accepts.
	MaxRangeResponseBytes int
	// MaxStreamsPerConnection bounds concurrent RPCs per client connection.
	// Default 1000.
	MaxStreamsPerConnection uint32
	// GRPCStreamWorkers is how many long-lived goroutines run the gRPC
	// calls (grpc.NumStreamWorkers). A worker keeps the stack its calls
	// grew, where a goroutine per call grows a fresh one each time; a call
	// that finds every worker busy gets a goroutine of its own, as without
	// workers. 0 means the default, DefaultGRPCStreamWorkers; -1 turns the
	// workers off. At most MaxGRPCStreamWorkers.
	GRPCStreamWorkers int

	// Limits bounds keys, values and transactions.
	Limits store.Limits

	// Watch configures the fan-out hub behind watches and blocking reads
	// (shards, retained history, per-watcher buffer).
	Watch watch.Config
	// MaxWatchesPerStream bounds the watches one Watch stream carries.
	// Default 10000.
	MaxWatchesPerStream int
	// MaxWatchesPerConnection bounds the watches of one client connection
	// over all its streams. Default 100000.
	MaxWatchesPerConnection int
	// WatchDeliveryInterval is the grid a watch stream's deliveries are
	// aligned to: each stream sends at most one message per interval, and
	// the streams of a connection send at the same instants, so gRPC writes
	// them in one system call. It adds up to one interval of delivery lag.
	// Zero sends each batch at once. Default 5ms; at most 1s.
	WatchDeliveryInterval time.Duration
	// WatchBusyDeliveryInterval is the coarser grid of a busy stream, one
	// that sent less than this long ago: a stream fed by every write (a
	// prefix watch under steady writes) then sends one message per busy
	// interval, while a stream that sends now and then keeps the fine
	// grid's lag. Under 110k events/s on one member, a busy grid halved
	// the fan-out's CPU against 5ms alone; 10ms cost no more per delivery
	// than 20ms and halved the lag. Zero, or at most
	// WatchDeliveryInterval, turns it off. Default 10ms; at most 1s.
	WatchBusyDeliveryInterval time.Duration
	// MaxBlockingWait caps (and is the default for) how long a blocking
	// read waits for a change. Default 5m, as Consul.
	MaxBlockingWait time.Duration
	// RPCHoldTimeout is how long a read or write that finds no leader
	// waits for one before it fails as Unavailable (Consul HTTP: 500 No
	// cluster leader); see hold.go. Default 7s, as Consul's
	// rpc_hold_timeout. Zero fails at once.
	RPCHoldTimeout time.Duration
	// AdmissionMaxRetryHint is the longest retry hint an admission
	// refusal carries (gRPC RetryInfo, HTTP Retry-After): a burst of
	// refusals books slots one token apart, and a slot further ahead
	// than this is cut to it (counted in
	// lodestone_admission_retry_hints_capped_total). Default 30s; between
	// 1s and 10m.
	AdmissionMaxRetryHint time.Duration
	// AdmissionSetupBurst is how much of its rate the admission bucket of
	// new client connections, and the one of watch creates, let in at
	// once (at least one): setting either up costs a server far more
	// than a read, and a second's worth at a restart queued the Raft
	// loop behind the setup. Reads and writes hold a second's worth.
	// Default 50ms; between 1ms and 1s.
	AdmissionSetupBurst time.Duration
	// AdmissionMaxSchedDelay holds the connections and watch creates the
	// admission policy gates while this server is short of CPU: while
	// over 1% of its goroutines waited longer than this for a processor
	// in the latest 10 ms (lodestone_admission_overloaded), new
	// connections wait in the listen backlog and watch creates are
	// refused, one of each let through every 250 ms. Default 10ms;
	// 0 turns it off, else between 1ms and 1s.
	AdmissionMaxSchedDelay time.Duration
	// NoParking keeps every waiting Consul blocking query on its own
	// goroutines, as net/http serves it, instead of parking it without
	// one (server/httppark): an escape hatch, and the comparison
	// make bench-blocking draws.
	NoParking bool

	// Catalog tunes the catalog, sessions and the agent role of this
	// server (CatalogConfig).
	Catalog CatalogConfig

	// DNS serves Consul's DNS interface (dns.go); off by default.
	DNS DNSConfig

	// Gossip joins the server to the gossip pool when Gossip.Pool.BindAddr
	// is set; its leader then reconciles pool membership into the catalog
	// (gossip.go). Default: off.
	Gossip GossipConfig

	// SlowLeader moves leadership off a leader whose disk is slow
	// (raftnode.SlowLeaderConfig).
	SlowLeader raftnode.SlowLeaderConfig
	// Faults are fault-injection hooks for tests and the chaos harness;
	// nil (always, in production) means none.
	Faults *raftnode.Faults

	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger

	// UnsafeStaleReads serves linearizable reads from local state without
	// ReadIndex. It breaks linearizability on purpose, so the chaos harness
	// can prove that it detects a violation. Never set it in production.
	UnsafeStaleReads bool

	// PollProbeInterval is how often the server measures how late it
	// notices network input (pollprobe.go,
	// lodestone_runtime_poll_delay_seconds). Zero turns the probe off.
	// Default 100ms; at most 1m.
	PollProbeInterval time.Duration

	// EnablePprof serves Go's profiler under /debug/pprof/ on the HTTP
	// listener. Default off: a profile costs CPU on a live node and the
	// endpoints reveal internals, so turn it on while investigating.
	EnablePprof bool

	// UI serves the web UI under /ui/ on the HTTP listener (server/ui).
	// Default on; with ACLs on it asks for a token and shows only what
	// the token may read.
	UI bool

	// ACL turns on token authorization for every API (gRPC, HTTP, pprof,
	// fault hooks) and says what a token gets where no rule of its
	// policies matches. Default off, as Consul's; docs/security.md says
	// what an open server exposes.
	ACL acl.Config
	// TLS turns on TLS for every listener and peer dial (tls.go).
	TLS TLSConfig
	// InsecurePlaintext lets a server without TLS listen on addresses
	// other than loopback. Without it such a server refuses to start:
	// anyone on the network could read and write the registry.
	InsecurePlaintext bool

	// StartTimeout bounds how long Start waits for listeners and the first
	// Ready. Default 10s.
	StartTimeout time.Duration
}

// DefaultGRPCStreamWorkers covers the calls a busy member has waiting at
// once: a linearizable read holds its worker through its quorum round, so
// a pool the size of GOMAXPROCS would be busy at a few dozen clients and
// most calls would pay for a fresh stack again. An idle worker costs only
// its stack.
const DefaultGRPCStreamWorkers = 256

// MaxGRPCStreamWorkers bounds GRPCStreamWorkers: the workers start with
// the server and hold their stacks for its life.
const MaxGRPCStreamWorkers = 1 << 16

// MinRaftLogCacheBytes is the smallest RaftLogCacheBytes: a few batched
// appends, so replication to a follower that keeps up never reads disk.
const MinRaftLogCacheBytes = 1 << 20

// MinSnapshotBytes is the smallest SnapshotBytes other than 0: below it a
// busy server would encode its whole state every few writes.
const MinSnapshotBytes = 1 << 20

// DefaultConfig returns the production defaults; each value is explained on
// its field.
func DefaultConfig() Config {
	return Config{
		TickInterval:                100 * time.Millisecond,
		ElectionTicks:               10,
		HeartbeatTicks:              1,
		CommitNoticeHold:            2 * time.Millisecond,
		LearnerAppendHold:           10 * time.Millisecond,
		SnapshotEntries:             100000,
		SnapshotBytes:               256 << 20,
		RaftLogCacheBytes:           raftlog.DefaultCacheBytes,
		CatchUpEntries:              5000,
		AutoPromoteLag:              64,
		ReadyApplyLag:               1000,
		MaxBatchProposals:           1024,
		MaxRequestBytes:             4 << 20,
		MaxConnections:              10000,
		MaxHTTPConnections:          20000,
		MaxStreamsPerConnection:     1000,
		GRPCStreamWorkers:           DefaultGRPCStreamWorkers,
		MaxGRPCConnectionsPerClient: 200,
		MaxHTTPConnectionsPerClient: 200,
		HTTPIdleTimeout:             120 * time.Second,
		MaxTxnRequestBytes:          512 << 10,
		MaxRangeResponseBytes:       4<<20 - 64<<10,
		Limits:                      store.DefaultLimits(),
		Watch:                       watch.DefaultConfig(),
		MaxWatchesPerStream:         10000,
		MaxWatchesPerConnection:     100000,
		WatchDeliveryInterval:       5 * time.Millisecond,
		WatchBusyDeliveryInterval:   10 * time.Millisecond,
		MaxBlockingWait:             5 * time.Minute,
		RPCHoldTimeout:              7 * time.Second,
		AdmissionMaxRetryHint:       30 * time.Second,
		AdmissionSetupBurst:         50 * time.Millisecond,
		AdmissionMaxSchedDelay:      10 * time.Millisecond,
		SlowLeader:                  raftnode.DefaultSlowLeaderConfig(),
		Catalog:                     DefaultCatalogConfig(),
		StartTimeout:                10 * time.Second,
		Gossip:                      DefaultGossipConfig(),
		DNS:                         DefaultDNSConfig(),
		PollProbeInterval:           100 * time.Millisecond,
		UI:                          true,
		MaxPeerSnapshotBytes:        peer.DefaultMaxSnapshotBytes,
		MaxPeerSnapshotChunks:       peer.DefaultMaxSnapshotChunks,
	}
}

// watchFlags names the flags that set watch.Config's fields, so a bad
// value is reported by the name the operator gave it.
var watchFlags = map[string]string{"RetainEvents": "watch-history-events", "RetainBytes": "watch-history-bytes"}

// Validate checks the configuration and returns a *ConfigError naming the
// first bad field.
func (c *Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &ConfigError{Field: field, Err: fmt.Errorf(format, args...)}
	}
	if c.Name == "" {
		return bad("name", "must not be empty")
	}
	if strings.ContainsAny(c.Name, "=, \t\n") {
		return bad("name", "%q must not contain '=', ',' or spaces", c.Name)
	}
	if c.ACL.DefaultPolicy != acl.AccessUnset && c.ACL.DefaultPolicy != acl.AccessDeny && c.ACL.DefaultPolicy != acl.AccessWrite {
		return bad("acl default policy", "is %v; it must be deny or allow", c.ACL.DefaultPolicy)
	}
	if c.DataDir == "" {
		return bad("data-dir", "must not be empty")
	}
	for field, addr := range map[string]string{"listen-peer": c.ListenPeer, "listen-grpc": c.ListenGRPC, "listen-http": c.ListenHTTP} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return bad(field, "%q is not host:port: %v", addr, err)
		}
	}
	if len(c.InitialCluster) == 0 {
		return bad("initial-cluster", "must list at least this member as name=peeraddr")
	}
	if !c.Join {
		if _, ok := c.InitialCluster[c.Name]; !ok {
			return bad("initial-cluster", "does not list this member %q", c.Name)
		}
	}
	ids := map[uint64]string{}
	for name, addr := range c.InitialCluster {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return bad("initial-cluster", "member %q address %q is not host:port", name, addr)
		}
		id := member.ID(name)
		if other, dup := ids[id]; dup {
			return bad("initial-cluster", "members %q and %q hash to the same id; rename one", name, other)
		}
		ids[id] = name
	}
	if err := c.validateAdvertise(); err != nil {
		return err
	}
	if c.TickInterval <= 0 {
		return bad("tick-interval", "must be positive")
	}
	if c.MaxPeerSnapshotBytes <= 0 {
		return bad("max-peer-snapshot-bytes", "must be positive, got %d", c.MaxPeerSnapshotBytes)
	}
	if need := c.MaxPeerSnapshotBytes/peer.SnapshotChunkSize + 2; int64(c.MaxPeerSnapshotChunks) < need {
		return bad("max-peer-snapshot-chunks", "must be at least %d to carry max-peer-snapshot-bytes (%d) in 1 MiB chunks, got %d", need, c.MaxPeerSnapshotBytes, c.MaxPeerSnapshotChunks)
	}
	if c.HeartbeatTicks <= 0 || c.ElectionTicks <= c.HeartbeatTicks {
		return bad("election-ticks", "must be larger than heartbeat-ticks (%d), got %d", c.HeartbeatTicks, c.ElectionTicks)
	}
	heartbeat := c.TickInterval * time.Duration(c.HeartbeatTicks)
	for _, h := range []struct {
		flag string
		d    time.Duration
	}{{"commit-notice-hold", c.CommitNoticeHold}, {"learner-append-hold", c.LearnerAppendHold}} {
		if h.d < 0 || h.d >= heartbeat {
			return bad(h.flag, "must be at least 0 and below the heartbeat interval (%v), got %v", heartbeat, h.d)
		}
	}
	if c.SnapshotEntries == 0 {
		return bad("snapshot-entries", "must be positive")
	}
	if c.RaftLogCacheBytes < MinRaftLogCacheBytes {
		return bad("raft-log-cache-bytes", "must be at least %d, got %d", MinRaftLogCacheBytes, c.RaftLogCacheBytes)
	}
	if c.SnapshotBytes != 0 && c.SnapshotBytes < MinSnapshotBytes {
		return bad("snapshot-bytes", "must be 0 (off) or at least %d, got %d", MinSnapshotBytes, c.SnapshotBytes)
	}
	if c.MaxBatchProposals <= 0 {
		return bad("max-batch-proposals", "must be positive")
	}
	if c.MaxWatchesPerStream <= 0 || c.MaxWatchesPerConnection < c.MaxWatchesPerStream {
		return bad("max-watches-per-stream", "must be positive and at most max-watches-per-connection (%d), got %d", c.MaxWatchesPerConnection, c.MaxWatchesPerStream)
	}
	if c.WatchDeliveryInterval < 0 || c.WatchDeliveryInterval > time.Second {
		return bad("watch-delivery-interval", "must be between 0 (send at once) and 1s, got %v", c.WatchDeliveryInterval)
	}
	if c.WatchBusyDeliveryInterval < 0 || c.WatchBusyDeliveryInterval > time.Second {
		return bad("watch-busy-delivery-interval", "must be between 0 (off) and 1s, got %v", c.WatchBusyDeliveryInterval)
	}
	if c.PollProbeInterval < 0 || c.PollProbeInterval > time.Minute {
		return bad("poll-probe-interval", "must be between 0 (off) and 1m, got %v", c.PollProbeInterval)
	}
	if c.GRPCStreamWorkers < -1 || c.GRPCStreamWorkers > MaxGRPCStreamWorkers {
		return bad("grpc-stream-workers", "must be between -1 (off) and %d (0 means the default, %d), got %d", MaxGRPCStreamWorkers, DefaultGRPCStreamWorkers, c.GRPCStreamWorkers)
	}
	if c.MaxBlockingWait <= 0 {
		return bad("max-blocking-wait", "must be positive")
	}
	if c.RPCHoldTimeout < 0 || c.RPCHoldTimeout > 10*time.Minute {
		return bad("rpc-hold-timeout", "must be between 0 (fail at once) and 10m, got %v", c.RPCHoldTimeout)
	}
	if c.AdmissionMaxRetryHint < time.Second || c.AdmissionMaxRetryHint > 10*time.Minute {
		return bad("admission-max-retry-hint", "must be between 1s and 10m, got %v", c.AdmissionMaxRetryHint)
	}
	if c.AdmissionSetupBurst < time.Millisecond || c.AdmissionSetupBurst > time.Second {
		return bad("admission-setup-burst", "must be between 1ms and 1s, got %v", c.AdmissionSetupBurst)
	}
	if d := c.AdmissionMaxSchedDelay; d != 0 && (d < time.Millisecond || d > time.Second) {
		return bad("admission-max-sched-delay", "must be 0 (off) or between 1ms and 1s, got %v", d)
	}
	if err := c.validateTLS(); err != nil {
		return err
	}
	if err := c.Catalog.validate(); err != nil {
		return err
	}
	if err := c.DNS.validate(); err != nil {
		return err
	}
	if err := c.SlowLeader.Validate(); err != nil {
		return &ConfigError{Field: "slow-leader", Err: err}
	}
	if err := c.Watch.Validate(); err != nil {
		var we *watch.ConfigError
		if errors.As(err, &we) && watchFlags[we.Field] != "" {
			return bad(watchFlags[we.Field], "%s (0: the default)", we.Reason)
		}
		return &ConfigError{Field: "watch", Err: err}
	}
	if err := c.Limits.Validate(); err != nil {
		return &ConfigError{Field: "limits", Err: err}
	}
	if err := c.Gossip.validate(c.Name); err != nil {
		return err
	}
	if c.HTTPIdleTimeout < 0 {
		return bad("http-idle-timeout", "must not be negative, got %v", c.HTTPIdleTimeout)
	}
	if c.MaxTxnRequestBytes < 0 {
		return bad("max-txn-request-bytes", "must not be negative, got %d", c.MaxTxnRequestBytes)
	}
	if c.MaxRangeResponseBytes != 0 && c.MaxRangeResponseBytes < 64<<10 {
		return bad("max-range-response-bytes", "must be at least 64 KiB (0 means the default), got %d", c.MaxRangeResponseBytes)
	}
	if c.MaxRequestBytes < c.Limits.MaxValueBytes+c.Limits.MaxKeyBytes+1024 {
		return bad("max-request-bytes", "%d is too small for values of %d bytes and keys of %d bytes", c.MaxRequestBytes, c.Limits.MaxValueBytes, c.Limits.MaxKeyBytes)
	}
	return nil
}
