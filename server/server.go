package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/gossip"
	"github.com/lodestone-kv/lodestone/internal/buildinfo"
	"github.com/lodestone-kv/lodestone/internal/grpcopt"
	"github.com/lodestone-kv/lodestone/internal/member"
	"github.com/lodestone-kv/lodestone/internal/token"
	"github.com/lodestone-kv/lodestone/peer"
	"github.com/lodestone-kv/lodestone/raftlog"
	"github.com/lodestone-kv/lodestone/raftnode"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/server/dnsapi"
	"github.com/lodestone-kv/lodestone/server/httppark"
	"github.com/lodestone-kv/lodestone/server/localagent"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/store/valuefile"
	"github.com/lodestone-kv/lodestone/watch"
)

// Server is one registry node: the Raft node, the client gRPC listener, the
// peer listener (Raft streams and the peer gRPC API, split by peerMux) and
// the HTTP listener (metrics, health).
type Server struct {
	*core // what the services share (core.go)

	peerPort *peer.Port
	kv       *kvService
	adm      *admission // admission.go
	// gossip is the pool member and leader reconciler; nil without
	// Config.Gossip (gossip.go).
	gossip *serverGossip
	// park holds waiting Consul blocking queries (nil with NoParking).
	park *httppark.Lot
	// local runs what /v1/agent registers on this server (agent.go).
	local *localagent.Agent
	// values is the store's value file, closed last.
	values *valuefile.File
	// left: this server left the cluster on request (agent.go).
	left atomic.Bool
	// httpConns and grpcConns limit the client listeners' connections.
	httpConns, grpcConns *connLimit

	tls                       *serverTLS // nil without TLS (tls.go)
	peerLis, grpcLis, httpLis net.Listener
	// dnsLis are the DNS sockets from New until Start hands them to dns
	// (dns.go); both nil without DNS.
	dnsLis  *dnsapi.Listeners
	dns     *dnsapi.Server
	grpcSrv *grpc.Server
	httpSrv *http.Server
	// Mux is the HTTP handler tree; other components add their routes.
	Mux *http.ServeMux

	cancel context.CancelFunc
	wg     sync.WaitGroup
	errC   chan error

	closeOnce sync.Once
	closeErr  error
}

// New opens the node's data and binds its listeners; Start serves.
func New(cfg Config) (_ *Server, retErr error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("node", cfg.Name)
	values, err := openValues(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			values.Close()
		}
	}()
	s := &Server{core: &core{cfg: cfg, logger: logger, metrics: newMetrics(), store: store.NewWithValues(values)},
		Mux: http.NewServeMux(), errC: make(chan error, 4), values: values}
	registerValueMetrics(s.metrics.reg, s.store)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	live := cfg.Live()
	s.liveCfg.Store(&live)
	s.kv = &kvService{s: s.core}

	listen := func(addr string) net.Listener {
		if err != nil {
			return nil
		}
		var l net.Listener
		l, err = net.Listen("tcp", addr)
		if err != nil {
			err = fmt.Errorf("listen on %s: %w", addr, err)
		}
		return l
	}
	s.peerLis = listen(cfg.ListenPeer)
	s.grpcLis = listen(cfg.ListenGRPC)
	s.httpLis = listen(cfg.ListenHTTP)
	if err == nil {
		s.dnsLis, err = s.listenDNS()
	}
	if err == nil {
		s.tls, err = openTLS(s.core)
	}
	if err != nil {
		s.closeListeners()
		return nil, err
	}
	// NB: the cluster id derives from --initial-cluster as every founding
	// member was given it, before the rewrite below.
	founding := maps.Clone(cfg.InitialCluster)
	s.peerLis = s.tls.peerListener(s.peerLis)
	// NB: a copy: the caller's map stays as given.
	cfg.InitialCluster = maps.Clone(cfg.InitialCluster)
	if entry, ok := cfg.InitialCluster[cfg.Name]; ok {
		cfg.InitialCluster[cfg.Name] = selfPeerEntry(entry, s.peerLis.Addr())
	}
	s.cfg = cfg
	s.peerAddr, s.grpcAddr, s.httpAddr = s.peerLis.Addr().String(), s.grpcLis.Addr().String(), s.httpLis.Addr().String()
	s.advertiseGRPC = advertisedAddr(cfg.AdvertiseGRPC, s.grpcLis.Addr(), "advertise-grpc", logger)
	s.advertiseHTTP = advertisedAddr(cfg.AdvertiseHTTP, s.httpLis.Addr(), "advertise-http", logger)
	wcfg := cfg.Watch
	if wcfg.Logger == nil {
		wcfg.Logger = logger.With("component", "watch")
	}
	s.hub, err = watch.New(wcfg)
	if err != nil {
		s.closeListeners()
		return nil, fmt.Errorf("start watch hub: %w", err)
	}
	s.metrics.reg.MustRegister(s.hub)
	if err := s.openRaft(founding); err != nil {
		s.closeListeners()
		return nil, errors.Join(err, s.hub.Close())
	}
	s.adm = newAdmission(s.store, s.metrics.reg, cfg.AdmissionMaxRetryHint, cfg.AdmissionSetupBurst, cfg.AdmissionMaxSchedDelay)
	s.authz = newAuthz(acl.NewResolver(s.store, cfg.ACL), s.store,
		func(ctx context.Context) error { return s.raft.LeaderRead(ctx, time.Now()) }, s.metrics.reg)
	s.sessionMetrics = newSessionMetrics(s.metrics.reg, s.store)
	s.holdMetrics = newHoldMetrics(s.metrics.reg)
	if s.local, err = s.openLocalAgent(); err != nil {
		s.closeListeners()
		s.raft.Stop()
		return nil, errors.Join(err, s.transport.Close(), s.log.Close(), s.hub.Close())
	}
	return s, nil
}

// openValues opens the store's value file in dataDir (store/valuefile):
// the values live there, in the page cache, instead of on the Go heap. It
// is rebuilt from the snapshot and the log at every start.
func openValues(dataDir string) (*valuefile.File, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	v, err := valuefile.Open(filepath.Join(dataDir, "values"))
	if err != nil {
		return nil, fmt.Errorf("open value file: %w", err)
	}
	return v, nil
}

// openRaft opens the Raft log and wires the Raft node to the peer
// transport: the node sends through the transport, and the transport
// feeds it what arrives. founding is InitialCluster as configured.
func (s *Server) openRaft(founding map[string]string) error {
	lg, err := raftlog.Open(filepath.Join(s.cfg.DataDir, "raft"), raftlog.Options{Logger: s.logger, CacheBytes: s.cfg.RaftLogCacheBytes})
	if err != nil {
		return fmt.Errorf("open raft log: %w", err)
	}
	fresh, err := logIsEmpty(lg)
	if err != nil {
		return errors.Join(err, lg.Close())
	}
	id := member.ID(s.cfg.Name)
	s.transport = peer.NewTransport(peer.Config{Self: id, CommitNoticeHold: s.cfg.CommitNoticeHold, LearnerAppendHold: s.cfg.LearnerAppendHold,
		OnLearn:          s.learnCluster,
		MaxSnapshotBytes: s.cfg.MaxPeerSnapshotBytes, MaxSnapshotChunks: s.cfg.MaxPeerSnapshotChunks,
		Logger: s.logger.With("component", "transport"), Registerer: s.metrics.reg, TLS: s.tls.dialConfig()})
	s.raft, err = raftnode.New(raftnode.Config{
		ID: id, Log: lg, Store: s.store, Hub: s.hub, Sender: s.transport,
		InitialCluster: s.cfg.InitialCluster, Join: s.cfg.Join,
		TickInterval: s.cfg.TickInterval, ElectionTicks: s.cfg.ElectionTicks, HeartbeatTicks: s.cfg.HeartbeatTicks,
		SnapshotEntries: s.cfg.SnapshotEntries, SnapshotBytes: s.cfg.SnapshotBytes, CatchUpEntries: s.cfg.CatchUpEntries, MaxBatchProposals: s.cfg.MaxBatchProposals,
		SlowLeader: s.cfg.SlowLeader, Faults: s.cfg.Faults, LeaderIndex: s.transport.AskLeaderIndex,
		LeaderChangeWait: s.cfg.RPCHoldTimeout, // NB: a write in flight at an election is held too (hold.go)
		Logger:           s.logger, Registerer: s.metrics.reg,
	})
	if err == nil {
		// NB: after New restored the data dir's snapshot, which names its
		// cluster, and before anything is written or served.
		err = s.settleCluster(fresh, founding)
	}
	if err != nil {
		return errors.Join(err, s.transport.Close(), lg.Close())
	}
	s.transport.SetNode(s.raft)
	s.log = lg
	s.metrics.reg.MustRegister(raftlog.NewCollector(lg))
	return nil
}

func (s *Server) closeListeners() {
	for _, l := range []net.Listener{s.peerLis, s.grpcLis, s.httpLis} {
		if l != nil {
			l.Close()
		}
	}
	if s.dnsLis != nil {
		s.dnsLis.Close()
		s.dnsLis = nil
	}
}

// PeerAddr, GRPCAddr and HTTPAddr are the bound listener addresses.
func (s *Server) PeerAddr() string { return s.peerAddr }
func (s *Server) GRPCAddr() string { return s.grpcAddr }
func (s *Server) HTTPAddr() string { return s.httpAddr }

// AdvertisedGRPC and AdvertisedHTTP are the client addresses this member
// publishes in the membership (Config.AdvertiseGRPC, AdvertiseHTTP).
func (s *Server) AdvertisedGRPC() string { return s.advertiseGRPC }
func (s *Server) AdvertisedHTTP() string { return s.advertiseHTTP }

// GossipAddr is the gossip pool address, or "" without gossip.
func (s *Server) GossipAddr() string {
	if s.gossip == nil {
		return ""
	}
	return s.gossip.pool.Addr()
}

// GossipMembers is this server's view of the pool (nil without gossip).
func (s *Server) GossipMembers() []gossip.Member {
	if s.gossip == nil {
		return nil
	}
	return s.gossip.pool.Members()
}

// ID is this member's Raft id.
func (s *Server) ID() uint64 { return s.raft.ID() }

// Registry is the server's Prometheus registry.
func (s *Server) Registry() *prometheus.Registry { return s.metrics.reg }

// Store is the replicated state machine, for read-only use by components
// that live in the same process.
func (s *Server) Store() *store.Store { return s.store }

// Start begins serving; it returns at once. Done reports when the server
// stops by itself (removed from the cluster or a fatal disk error).
func (s *Server) Start() {
	s.grpcSrv = grpc.NewServer(append(append(s.tls.grpcOptions(), grpcopt.ServerOptions()...),
		grpc.MaxRecvMsgSize(s.cfg.MaxRequestBytes),
		grpc.MaxConcurrentStreams(s.cfg.MaxStreamsPerConnection),
		grpc.NumStreamWorkers(streamWorkers(s.cfg.GRPCStreamWorkers)),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// NB: authorization before admission, so a caller without rights
		// spends none of the admitted budget.
		grpc.ChainUnaryInterceptor(s.countRequests, s.authz.unary, s.adm.unary),
		grpc.ChainStreamInterceptor(s.authz.stream, s.adm.stream),
	)...)
	lodestonepb.RegisterKVServer(s.grpcSrv, s.kv)
	lodestonepb.RegisterClusterServer(s.grpcSrv, &clusterService{s: s.core})
	lodestonepb.RegisterWatchServer(s.grpcSrv, &watchService{s: s.core})
	lodestonepb.RegisterAdminServer(s.grpcSrv, &adminService{s: s.core, adm: s.adm})
	s.routeFaults(s.Mux)
	lodestonepb.RegisterCatalogServer(s.grpcSrv, &catalogService{s: s.core})
	lodestonepb.RegisterSessionServer(s.grpcSrv, &sessionService{s: s.core})

	s.routeHTTP(s.Mux)
	if err := s.routeUI(s.Mux); err != nil {
		s.errC <- fmt.Errorf("web ui: %w", err)
	}
	def := DefaultConfig()
	s.httpConns = newConnLimit(s.httpLis, positiveOr(s.cfg.MaxHTTPConnections, def.MaxHTTPConnections), s.metrics.refusedConns.WithLabelValues("http", "per_client"))
	s.grpcConns = newConnLimit(s.grpcLis, positiveOr(s.cfg.MaxConnections, def.MaxConnections), s.metrics.refusedConns.WithLabelValues("grpc", "per_client"))
	s.grpcConns.pace = s.adm.paceAccept
	s.applyConnCaps(s.live())
	s.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "lodestone_http_connections", Help: "Open connections on the HTTP listener (at most --max-http-connections).",
	}, func() float64 { return float64(s.httpConns.Open()) }))
	s.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "lodestone_grpc_connections", Help: "Open client connections on the gRPC listener (at most --max-connections).",
	}, func() float64 { return float64(s.grpcConns.Open()) }))
	httpLis := s.tls.httpListener(s.httpConns)
	// NB: the mux until the Consul API below takes the KV reads ahead of it.
	routes := &lateHandler{h: s.Mux}
	handler := s.adm.http(s.limitBodies(routes))
	idle := cmp.Or(s.cfg.HTTPIdleTimeout, def.HTTPIdleTimeout)
	if !s.cfg.NoParking {
		// NB: resumed requests skip admission: they were admitted once.
		// They keep only the request headers ResumeHeaders names: the
		// Consul API reads only the token's. One it reads must be listed.
		// NB: an answered connection quiet for NextRequestWait goes back
		// to the http.Server, which closes it after ReadHeaderTimeout: both
		// within the idle timeout.
		s.park = httppark.New(httppark.Config{Hub: s.hub, Handler: handler, Resume: s.Mux, Context: s.ctx,
			NextRequestWait: min(time.Second, idle),
			ResumeHeaders:   []string{token.Header, "Authorization"},
			Logger:          s.logger.With("component", "httppark")})
		s.metrics.reg.MustRegister(s.park)
		httpLis = s.park.Wrap(httpLis)
	}
	consul := consulapi.New(consulBackend{s: s.core, local: s.local, membership: membership{s}}, consulapi.Config{
		MaxWait: s.cfg.MaxBlockingWait, Logger: s.logger.With("component", "consulapi"),
		InFlight: s.sessionMetrics.blocking.WithLabelValues("http"), Park: s.park, Denied: s.authz.denied,
		Refused: s.metrics.refused,
	})
	consul.Register(s.Mux)
	routes.h = consul.KVReads(s.Mux)
	// NB: requests run under the server's context, so Close ends blocking
	// queries at once instead of Shutdown waiting out their wait.
	// NB: a connection that never sent a request is idle too.
	s.httpSrv = &http.Server{Handler: handler, ReadHeaderTimeout: min(10*time.Second, idle), IdleTimeout: idle,
		BaseContext: func(net.Listener) context.Context { return s.ctx }}

	if err := s.raft.Start(); err != nil {
		s.errC <- fmt.Errorf("start raft: %w", err)
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.adm.replay(s.ctx, s.raft)
	}()
	if g, err := openGossip(s.core); err != nil {
		s.errC <- err // NB: a pool that cannot bind stops the server through Done
	} else if g != nil {
		s.gossip = g
		g.start(s.ctx)
	}
	s.local.Start()
	s.peerPort = peer.NewPort(s.peerLis, s.transport, s.raft, s.store.Members, s.logger.With("component", "transport"))
	s.serve("peer grpc", s.peerPort.Serve)
	s.serve("client grpc", func() error { return s.grpcSrv.Serve(s.grpcConns) })
	s.serve("http", func() error {
		if err := s.httpSrv.Serve(httpLis); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	s.startDNS()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.publishSelf()
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.runSessionTTL()
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.runAutoPromote()
	}()
	s.startPollProbe()
	s.tls.watch(s.ctx, s.cfg.TLS.ReloadInterval, &s.wg)
	s.logger.Info("server started", "tls", s.tls != nil, "peer", s.PeerAddr(), "grpc", s.GRPCAddr(), "http", s.HTTPAddr(), "dns", s.DNSAddr(),
		"advertise_grpc", s.advertiseGRPC, "advertise_http", s.advertiseHTTP, "id", fmt.Sprintf("%x", s.raft.ID()),
		"version", buildinfo.Get().Version)
}

// perClient is a listener's per-client cap from its configured value n
// (0: def, negative: none) and its global cap; it warns when the cap
// cannot keep one client from taking every connection.
func (s *Server) perClient(listener string, n, global, def, defGlobal int) int {
	if n == 0 {
		n = def
	}
	if global = positiveOr(global, defGlobal); n >= global {
		s.logger.Warn("per-client connection cap is not below the listener's cap: one client can hold every connection",
			"listener", listener, "per_client", n, "max", global)
	}
	return n
}

// startPollProbe runs the poll probe (pollprobe.go) until the server
// closes. A probe that cannot start or fails is logged, not fatal: it only
// measures.
func (s *Server) startPollProbe() {
	if s.cfg.PollProbeInterval <= 0 {
		return
	}
	p, err := newPollProbe(s.metrics.pollDelay)
	if err != nil {
		s.logger.Warn("poll probe not started", "err", err)
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := p.run(s.ctx, s.cfg.PollProbeInterval); err != nil {
			s.logger.Warn("poll probe stopped", "err", err)
		}
	}()
}

func (s *Server) serve(name string, fn func() error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := fn(); err != nil && s.ctx.Err() == nil {
			s.errC <- fmt.Errorf("%s listener: %w", name, err)
		}
	}()
}

// Done is closed-over by callers that want to know when the server must
// stop on its own; it yields the reason.
func (s *Server) Done() <-chan error {
	out := make(chan error, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case err := <-s.errC:
			out <- err
		case <-s.raft.Removed():
			if s.left.Load() {
				out <- nil // it asked to (agent.go)
				break
			}
			out <- errors.New("this member was removed from the cluster")
		case <-s.raft.Done():
			out <- s.raft.Err()
		case <-s.ctx.Done():
		}
	}()
	return out
}

// publishSelf records this member's client addresses in the replicated
// membership, so clients can find every member's gRPC endpoint; the
// member is not ready until they are there (readiness). It proposes as
// soon as a leader is known: polling for one on a growing backoff left a
// new cluster's members unlisted for up to seconds after its election,
// and a client that asked then placed its watch stream at random.
func (s *Server) publishSelf() {
	backoff := 200 * time.Millisecond
	for s.ctx.Err() == nil {
		changed := s.raft.LeaderChanged()
		if s.raft.Status().Lead == 0 {
			select {
			case <-changed:
				continue
			case <-s.ctx.Done():
				return
			}
		}
		listed := s.selfPublished()
		if !listed {
			ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
			_, err := s.raft.Propose(ctx, &lodestonepb.Command{Op: &lodestonepb.Command_Member{Member: &lodestonepb.Member{
				Id: s.raft.ID(), Name: s.cfg.Name, GrpcAddr: s.advertiseGRPC, HttpAddr: s.advertiseHTTP,
			}}})
			cancel()
			if err != nil {
				s.logger.Debug("publish member addresses", "err", err)
			}
			listed = err == nil && s.selfPublished()
		}
		if listed {
			s.published.Store(true)
			return
		}
		select {
		case <-time.After(backoff):
		case <-s.ctx.Done():
			return
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

func (s *Server) selfPublished() bool {
	for _, m := range s.store.Members() {
		if m.Id == s.raft.ID() {
			return m.GrpcAddr == s.advertiseGRPC && m.HttpAddr == s.advertiseHTTP
		}
	}
	return false
}

func (s *Server) countRequests(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	s.metrics.requests.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
	return resp, err
}

// Close stops serving, stops the node and waits for every goroutine.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		var errs []error
		if s.grpcSrv != nil {
			stopGracefully(s.grpcSrv, 5*time.Second)
		}
		if s.httpSrv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := s.httpSrv.Shutdown(ctx); err != nil {
				errs = append(errs, fmt.Errorf("stop http: %w", err))
			}
			cancel()
		}
		if s.park != nil {
			// After the http.Server: it hands no connection back any more.
			errs = append(errs, s.park.Close())
		}
		errs = append(errs, s.closeDNS())
		s.local.Close() // NB: after the API that feeds it, before Raft
		if s.peerPort != nil {
			// NB: peer streams never end by themselves; this stops hard
			// and waits for the Raft streams.
			errs = append(errs, s.peerPort.Close())
		}
		s.closeListeners()
		if s.gossip != nil {
			errs = append(errs, s.gossip.close())
		}
		s.raft.Stop()
		errs = append(errs, s.transport.Close(), s.log.Close())
		// After the node: nothing publishes any more.
		errs = append(errs, s.hub.Close())
		s.wg.Wait()
		errs = append(errs, s.values.Close()) // NB: last: nothing reads the store now
		s.closeErr = errors.Join(errs...)
		s.logger.Info("server stopped")
	})
	return s.closeErr
}

// streamWorkers is the grpc.NumStreamWorkers value of a
// Config.GRPCStreamWorkers: 0 for none (a goroutine per call).
func streamWorkers(n int) uint32 {
	switch {
	case n < 0:
		return 0
	case n == 0:
		return DefaultGRPCStreamWorkers
	}
	return uint32(n)
}

func stopGracefully(srv *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		srv.Stop()
		<-done
	}
}

// lateHandler is a handler chosen after the chain in front of it is
// built, and before it serves.
type lateHandler struct{ h http.Handler }

func (l *lateHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) { l.h.ServeHTTP(w, r) }
