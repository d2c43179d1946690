package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/checks"
	"github.com/lodestone-kv/lodestone/gossip"
	"github.com/lodestone-kv/lodestone/internal/buildinfo"
	"github.com/lodestone-kv/lodestone/internal/token"
)

// Registry is the part of the gRPC Catalog service the agent writes
// through; lodestonepb.CatalogClient implements it. Each call may run
// concurrently with the others.
type Registry interface {
	Register(ctx context.Context, in *lodestonepb.CatalogRegisterRequest, opts ...grpc.CallOption) (*lodestonepb.CatalogRegisterResponse, error)
	Deregister(ctx context.Context, in *lodestonepb.CatalogDeregisterRequest, opts ...grpc.CallOption) (*lodestonepb.CatalogDeregisterResponse, error)
	UpdateCheck(ctx context.Context, in *lodestonepb.UpdateCheckRequest, opts ...grpc.CallOption) (*lodestonepb.UpdateCheckResponse, error)
	Node(ctx context.Context, in *lodestonepb.NodeRequest, opts ...grpc.CallOption) (*lodestonepb.NodeResponse, error)
	Checks(ctx context.Context, in *lodestonepb.ChecksRequest, opts ...grpc.CallOption) (*lodestonepb.ChecksResponse, error)
}

var _ Registry = lodestonepb.CatalogClient(nil)

// Agent is one running agent.
type Agent struct {
	cfg    Config
	logger *slog.Logger
	now    func() time.Time
	reg    Registry
	conn   *grpc.ClientConn
	pool   *gossip.Pool
	prom   *prometheus.Registry

	httpLis net.Listener
	httpSrv *http.Server

	mu      sync.Mutex
	local   *local
	started bool          // checks added from now on start at once
	kick    chan struct{} // wakes the sync loop; capacity one

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error

	checksRun   *prometheus.CounterVec
	transitions *prometheus.CounterVec
	writes      *prometheus.CounterVec
	verifies    *prometheus.CounterVec
}

// New validates cfg, dials the registry, binds the gossip and HTTP
// sockets and loads cfg.Services. Start runs it.
func New(cfg Config) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("node", cfg.NodeName)
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	prom := cfg.Registerer
	if prom == nil {
		prom = prometheus.NewRegistry()
	}
	a := &Agent{cfg: cfg, logger: logger, now: now, prom: prom, kick: make(chan struct{}, 1)}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.checksRun = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lodestone", Subsystem: "agent", Name: "checks_run_total", Help: "Check runs by type (http, tcp, ttl expiry) and result status.",
	}, []string{"type", "status"})
	a.transitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lodestone", Subsystem: "agent", Name: "check_transitions_total", Help: "Local check status changes by type and new status.",
	}, []string{"type", "status"})
	a.writes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lodestone", Subsystem: "agent", Name: "registry_writes_total", Help: "Writes to the registry by kind (node, register, deregister, check) and result (ok, error).",
	}, []string{"kind", "result"})
	a.verifies = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lodestone", Subsystem: "agent", Name: "anti_entropy_runs_total", Help: "Reads of this node back from the registry, by result (ok, error).",
	}, []string{"result"})
	for _, c := range []prometheus.Collector{a.checksRun, a.transitions, a.writes, a.verifies} {
		if err := prom.Register(c); err != nil {
			return nil, fmt.Errorf("register agent metrics: %w", err)
		}
	}
	// NB: a registry the agent shares with another part of the process
	// may hold the build's metric already; it is the same one.
	if err := prom.Register(buildinfo.NewCollector()); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
		return nil, fmt.Errorf("register agent metrics: %w", err)
	}

	var err error
	a.reg = cfg.registry
	if a.reg == nil {
		a.conn, err = dialRegistry(cfg.Endpoints, cfg.TLS, cfg.Token)
		if err != nil {
			return nil, err
		}
		a.reg = lodestonepb.NewCatalogClient(a.conn)
	}
	gcfg := cfg.Gossip
	gcfg.Logger, gcfg.Registerer, gcfg.Now = logger.With("component", "gossip"), prom, cfg.Now
	a.pool, err = gossip.New(gcfg)
	if err != nil {
		return nil, errors.Join(err, a.closeConn())
	}
	if cfg.ListenHTTP != "" {
		a.httpLis, err = net.Listen("tcp", cfg.ListenHTTP)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("listen on %s: %w", cfg.ListenHTTP, err), a.pool.Close(), a.closeConn())
		}
	}

	addr := cfg.Address
	if addr == "" {
		addr, _, _ = net.SplitHostPort(a.pool.Addr())
	}
	a.local = newLocal(&lodestonepb.Node{Name: cfg.NodeName, Address: addr, Meta: cfg.NodeMeta})
	for i := range cfg.Services {
		c, err := cfg.Services[i].compile(cfg.checkOptions(true))
		if err != nil {
			return nil, errors.Join(err, a.closeSockets())
		}
		a.local.addService(c, a.newCheck)
	}
	return a, nil
}

// dialRegistry connects to any of the servers: pick-first over all of
// them, so a dead server is skipped (followers forward writes).
func dialRegistry(endpoints []string, tlsCfg *tls.Config, secret string) (*grpc.ClientConn, error) {
	r := manual.NewBuilderWithScheme("lodestone-agent")
	var addrs []resolver.Address
	for _, ep := range endpoints {
		// NB: TLS verifies each server by its own host, not the
		// resolver's made-up authority.
		host, _, _ := net.SplitHostPort(ep)
		addrs = append(addrs, resolver.Address{Addr: ep, ServerName: host})
	}
	r.InitialState(resolver.State{Addresses: addrs})
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	conn, err := grpc.NewClient(r.Scheme()+":///registry", grpc.WithResolvers(r), grpc.WithTransportCredentials(creds),
		grpc.WithPerRPCCredentials(token.PerRPC(secret)))
	if err != nil {
		return nil, fmt.Errorf("dial registry %v: %w", endpoints, err)
	}
	return conn, nil
}

// HTTPAddr is the bound local API address ("" when disabled).
func (a *Agent) HTTPAddr() string {
	if a.httpLis == nil {
		return ""
	}
	return a.httpLis.Addr().String()
}

// GossipAddr is the agent's gossip address.
func (a *Agent) GossipAddr() string { return a.pool.Addr() }

// Members is the agent's view of the gossip pool.
func (a *Agent) Members() []gossip.Member { return a.pool.Members() }

// Registry is the agent's metrics registry.
func (a *Agent) Registry() *prometheus.Registry { return a.prom }

// Start joins the pool, starts every check and the sync loop, and serves
// the local API. It returns at once.
func (a *Agent) Start() {
	a.pool.Start()
	a.mu.Lock()
	a.started = true
	for _, c := range a.local.checks {
		a.startCheck(c)
	}
	a.mu.Unlock()
	a.wg.Add(2)
	go func() {
		defer a.wg.Done()
		a.runSync()
	}()
	go func() {
		defer a.wg.Done()
		a.runReaper()
	}()
	if a.httpLis != nil {
		a.httpSrv = &http.Server{Handler: a.routes(), ReadHeaderTimeout: 10 * time.Second}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			if err := a.httpSrv.Serve(a.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.logger.Error("agent http", "err", err)
			}
		}()
	}
	a.logger.Info("agent started", "gossip", a.pool.Addr(), "http", a.HTTPAddr(), "services", len(a.local.services))
}

// newCheck is a check in its initial state, not running yet.
func (a *Agent) newCheck(s *checks.Spec) *check { return &check{Check: checks.New(s, a.now())} }

// AddService registers (or replaces) a service and its checks locally;
// the sync loop writes it once its checks have run. A definition from the
// local API compiles with local false (script checks need
// EnableScriptChecks).
func (a *Agent) AddService(def ServiceDefinition) error {
	c, err := def.compile(a.cfg.checkOptions(false))
	if err != nil {
		return err
	}
	a.mu.Lock()
	removed, added := a.local.addService(c, a.newCheck)
	if a.ctx.Err() == nil && a.started {
		for _, ch := range added {
			a.startCheck(ch)
		}
	}
	a.mu.Unlock()
	stopChecks(removed)
	a.notify()
	return nil
}

// RemoveService drops a service locally; the sync loop deregisters it.
// It reports false for an unknown id.
func (a *Agent) RemoveService(id string) bool {
	a.mu.Lock()
	removed, ok := a.local.removeService(id)
	a.mu.Unlock()
	stopChecks(removed)
	if ok {
		a.notify()
	}
	return ok
}

// ErrUnknownCheck and ErrNotTTL are UpdateTTL's refusals.
var (
	ErrUnknownCheck = errors.New("agent: unknown check id")
	ErrNotTTL       = errors.New("agent: check is not a TTL check")
)

// UpdateTTL records an application's report on a TTL check.
func (a *Agent) UpdateTTL(id string, st lodestonepb.HealthStatus, output string) error {
	a.mu.Lock()
	c, ok := a.local.checks[id]
	a.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownCheck, id)
	}
	changed, err := c.UpdateTTL(st, output, a.now())
	if err != nil {
		return fmt.Errorf("%w: %q", ErrNotTTL, id)
	}
	a.observed(c.Check, checks.Result{Status: st, Output: output, Changed: changed})
	return nil
}

// observed counts a check result and, on a change (or a first probe, which
// a service's registration may wait for), wakes the sync loop. It is the
// checks' Hooks.Result.
func (a *Agent) observed(c *checks.Check, r checks.Result) {
	kind := c.Spec().Kind
	a.checksRun.WithLabelValues(kind, lodestonepb.HealthStatusWord(r.Status)).Inc()
	if r.Changed {
		a.transitions.WithLabelValues(kind, lodestonepb.HealthStatusWord(r.Status)).Inc()
		a.logger.Info("check changed", "check", c.Spec().ID(), "status", lodestonepb.HealthStatusWord(r.Status), "output", r.Output)
	}
	if r.Changed || r.First {
		a.notify()
	}
}

// startCheck starts c's goroutine; a.mu is held.
func (a *Agent) startCheck(c *check) {
	c.Start(a.ctx, checks.Hooks{Now: a.now, Result: a.observed, Logger: a.logger})
}

// stopChecks stops checks and waits for them; a.mu must not be held.
func stopChecks(cs []*check) {
	for _, c := range cs {
		c.Stop()
	}
}

func (a *Agent) notify() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// runReaper deregisters, every CheckReapInterval, the services whose check
// has been critical longer than their DeregisterCriticalServiceAfter.
func (a *Agent) runReaper() {
	t := time.NewTicker(a.cfg.CheckReapInterval)
	defer t.Stop()
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		due := a.local.reapable(a.now())
		a.mu.Unlock()
		for _, id := range due {
			if a.RemoveService(id) {
				a.logger.Info("check for service has been critical for too long; deregistered service", "service", id)
			}
		}
	}
}

// runSync writes local changes to the registry, one at a time, until the
// agent stops.
func (a *Agent) runSync() {
	backoff := a.cfg.RetryMin
	verify := time.NewTicker(a.cfg.AntiEntropyInterval)
	defer verify.Stop()
	for {
		a.mu.Lock()
		o := a.local.next()
		a.mu.Unlock()
		if o == nil {
			select {
			case <-a.ctx.Done():
				return
			case <-a.kick:
			case <-verify.C:
				if err := a.antiEntropy(a.ctx); err != nil && a.ctx.Err() == nil {
					a.verifies.WithLabelValues("error").Inc()
					a.logger.Warn("anti-entropy read failed", "err", err)
				} else {
					a.verifies.WithLabelValues("ok").Inc()
				}
			}
			continue
		}
		stale, err := a.write(a.ctx, o)
		if err == nil {
			a.writes.WithLabelValues(o.kind, "ok").Inc()
			a.mu.Lock()
			a.local.done(o)
			for _, id := range stale {
				if _, ok := a.local.services[id]; !ok {
					a.local.gone[id] = true
				}
			}
			a.mu.Unlock()
			backoff = a.cfg.RetryMin
			continue
		}
		if a.ctx.Err() != nil {
			return
		}
		a.writes.WithLabelValues(o.kind, "error").Inc()
		if status.Code(err) == codes.FailedPrecondition || status.Code(err) == codes.NotFound {
			a.mu.Lock()
			a.local.lost(o)
			a.mu.Unlock()
		}
		a.logger.Warn("registry write failed; retrying", "kind", o.kind, "err", err, "retry_in", backoff)
		select {
		case <-a.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, a.cfg.RetryMax)
	}
}

// antiEntropy reads the node back (linearizable reads: a ReadIndex round,
// no log entry, and no stale view that would look like a loss) and marks
// differences for the sync loop.
func (a *Agent) antiEntropy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.WriteTimeout)
	defer cancel()
	name := a.local.node.Name // immutable after New
	n, err := a.reg.Node(ctx, &lodestonepb.NodeRequest{Name: name})
	if err != nil {
		return fmt.Errorf("read node: %w", err)
	}
	cs, err := a.reg.Checks(ctx, &lodestonepb.ChecksRequest{Node: name})
	if err != nil {
		return fmt.Errorf("read checks: %w", err)
	}
	a.mu.Lock()
	a.local.reconcile(n.GetNode(), cs.GetChecks())
	a.mu.Unlock()
	return nil
}

// write performs o. A node write also returns the services the registry
// lists on this node that the agent does not know (left by an earlier
// run), to deregister.
func (a *Agent) write(ctx context.Context, o *op) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.WriteTimeout)
	defer cancel()
	node := a.local.node // immutable after New
	switch o.kind {
	case "node":
		if _, err := a.reg.Register(ctx, &lodestonepb.CatalogRegisterRequest{Node: node}); err != nil {
			return nil, fmt.Errorf("register node: %w", err)
		}
		resp, err := a.reg.Node(ctx, &lodestonepb.NodeRequest{Name: node.Name})
		if err != nil {
			return nil, fmt.Errorf("read node: %w", err)
		}
		var stale []string
		for _, s := range resp.GetNode().GetServices() {
			stale = append(stale, s.Id)
		}
		return stale, nil
	case "register":
		_, err := a.reg.Register(ctx, &lodestonepb.CatalogRegisterRequest{Node: node, Service: o.service, Checks: o.checks})
		if err != nil {
			return nil, fmt.Errorf("register service %q: %w", o.service.Id, err)
		}
		a.logger.Info("service registered", "service", o.service.Id, "checks", len(o.checks))
	case "deregister":
		if _, err := a.reg.Deregister(ctx, &lodestonepb.CatalogDeregisterRequest{Node: node.Name, ServiceId: o.id}); err != nil {
			return nil, fmt.Errorf("deregister service %q: %w", o.id, err)
		}
		a.logger.Info("service deregistered", "service", o.id)
	case "check":
		if _, err := a.reg.UpdateCheck(ctx, &lodestonepb.UpdateCheckRequest{Node: node.Name, CheckId: o.id, Status: o.status, Output: o.output}); err != nil {
			return nil, fmt.Errorf("update check %q: %w", o.id, err)
		}
	}
	return nil, nil
}

// Close stops the checks and the sync loop, then leaves the pool (and
// deregisters the node with OnStopDeregister), and closes everything. ctx
// bounds the deregistration.
func (a *Agent) Close(ctx context.Context) error {
	a.closeOnce.Do(func() {
		var errs []error
		if a.httpSrv != nil {
			sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if err := a.httpSrv.Shutdown(sctx); err != nil {
				errs = append(errs, fmt.Errorf("stop agent http: %w", err))
			}
			cancel()
		}
		a.cancel()
		a.wg.Wait()
		a.mu.Lock()
		running := slices.Collect(maps.Values(a.local.checks))
		a.mu.Unlock()
		stopChecks(running)
		if err := a.pool.Leave(2 * time.Second); err != nil {
			errs = append(errs, err)
		}
		if a.cfg.OnStop == OnStopDeregister {
			dctx, cancel := context.WithTimeout(ctx, a.cfg.WriteTimeout)
			_, err := a.reg.Deregister(dctx, &lodestonepb.CatalogDeregisterRequest{Node: a.cfg.NodeName})
			cancel()
			if err != nil {
				errs = append(errs, fmt.Errorf("deregister node %s: %w", a.cfg.NodeName, err))
			} else {
				a.logger.Info("node deregistered")
			}
		}
		errs = append(errs, a.closeSockets())
		a.closeErr = errors.Join(errs...)
		a.logger.Info("agent stopped")
	})
	return a.closeErr
}

func (a *Agent) closeSockets() error {
	var errs []error
	if a.httpLis != nil {
		a.httpLis.Close()
	}
	errs = append(errs, a.pool.Close(), a.closeConn())
	return errors.Join(errs...)
}

func (a *Agent) closeConn() error {
	if a.conn == nil {
		return nil
	}
	if err := a.conn.Close(); err != nil {
		return fmt.Errorf("close registry connection: %w", err)
	}
	return nil
}
