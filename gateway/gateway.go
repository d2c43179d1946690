package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/gateway/internal/h1"
)

// Gateway is the edge proxy. New binds its listeners and loads the routes
// file and the persisted table; Start serves; Close stops everything it
// started. Run wraps the three.
type Gateway struct {
	cfg        Config
	log        *slog.Logger
	clock      Clock
	env        *tableEnv
	table      atomic.Pointer[table]
	m          *metrics
	admit      *limiter
	budget     *retryBudget
	factory    *transportFactory
	retryAfter string
	stats      struct{ ejections, shed, retries atomic.Int64 }

	source    Source
	ownClient *client.Client // made from Config.Registry; closed by Close

	proxyLn, adminLn   net.Listener
	front              *h1.Server   // serves proxyLn
	proxySrv, adminSrv *http.Server // proxySrv: what front hands off

	connMu     sync.Mutex   // orders SetConnected's transitions
	connected  atomic.Bool  // read without connMu: staleSince is set first
	staleSince atomic.Int64 // unix nanos (Clock) since the table is not known current
	ready      atomic.Bool  // a table came from the registry or the state dir

	persistKick chan struct{}
	changedMu   sync.Mutex    // guards changed; never taken by requests
	changed     chan struct{} // closed and replaced on every Apply and SetConnected
	ctx         context.Context
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	handlers    sync.WaitGroup // ServeHTTP calls running (net/http does not wait for them on Close)
	upMu        sync.Mutex     // orders trackUpgrade's Add before Close's Wait
	upgrades    sync.WaitGroup // spliced WebSocket connections (upgrade.go)
	errc        chan error
	started     atomic.Bool
	closeOnce   sync.Once
	closeErr    error
}

// New validates cfg, binds the proxy and admin listeners, and loads the
// routes file and the persisted table (a cold start serves that table
// until the registry answers). It starts no goroutine.
func New(cfg Config) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	g := &Gateway{
		cfg:         cfg,
		log:         log,
		clock:       cfg.Clock,
		admit:       newLimiter(cfg.MaxInFlight, cfg.MaxQueue, cfg.MaxQueueTime),
		budget:      newRetryBudget(cfg.Clock, cfg.RetryBudgetRatio, cfg.RetryBudgetMinPerSec),
		retryAfter:  retryAfterValue(cfg.RetryAfter.Seconds()),
		persistKick: make(chan struct{}, 1),
		changed:     make(chan struct{}),
		errc:        make(chan error, 2),
	}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.m = newMetrics(g)
	g.factory = &transportFactory{
		connectTimeout: cfg.ConnectTimeout,
		poolIdle:       cfg.PoolIdleTimeout,
		maxIdle:        cfg.OriginConcurrency,
		tls:            cfg.OriginTLS,
		stats:          &connStats{},
	}
	seed := cfg.Seed
	if seed == 0 {
		h := fnv.New64a()
		host, _ := os.Hostname()
		fmt.Fprintf(h, "%s|%s", host, cfg.Listen)
		seed = h.Sum64()
	}
	g.env = &tableEnv{
		shards:     cfg.Shards,
		maxBits:    maxSubsetBits(cfg.Shards, cfg.Replication),
		subsetSize: cfg.SubsetSize,
		seed:       seed,
		newService: func(name string) *serviceState {
			return &serviceState{name: name, m: g.m.forService(name)}
		},
		newOrigin: func(st *serviceState, in Instance, seq uint32) *origin {
			o := newBareOrigin(st, in, seq, cfg.OriginConcurrency)
			o.m = g.m.forOrigin(st.name, in.ID)
			return o
		},
		newPool: func(shard int, o *origin) *pool {
			p := &pool{shard: shard, origin: o, f: g.factory}
			o.addPool(p)
			return p
		},
		newRoute: func(r Route) *routeEntry {
			return &routeEntry{Route: r, m: g.m.forRoute(r.Name)}
		},
	}

	var static []Route
	if cfg.RoutesFile != "" {
		var err error
		if static, err = LoadRoutesFile(cfg.RoutesFile); err != nil {
			return nil, err
		}
	}
	g.table.Store(emptyTable(static, g.env))
	g.staleSince.Store(g.clock.Now().UnixNano())
	if cfg.StateDir != "" {
		switch p, err := loadTable(cfg.StateDir); {
		case err == nil:
			g.Apply(p.update())
			g.staleSince.Store(p.SavedAt.UnixNano())
			log.Info("gateway: cold start from the persisted table", "index", p.Index, "saved_at", p.SavedAt,
				"instances", len(p.Instances), "routes", len(p.Routes))
		case errors.Is(err, os.ErrNotExist):
		default:
			log.Warn("gateway: ignoring the persisted table; waiting for the registry", "err", err)
		}
	}

	g.source = cfg.Source
	if g.source == nil {
		c, err := client.New(client.Config{
			Endpoints:             cfg.Registry,
			Token:                 cfg.RegistryToken,
			DialTimeout:           2 * time.Second,
			BackoffBase:           100 * time.Millisecond,
			BackoffMax:            2 * time.Second,
			WatchProgressInterval: 2 * time.Second, // a dead registry is noticed in ~4s
			Logger:                log.With("component", "client"),
			TLS:                   cfg.RegistryTLS,
		})
		if err != nil {
			return nil, fmt.Errorf("registry client: %w", err)
		}
		src, err := newSource(c, cfg, log)
		if err != nil {
			c.Close()
			return nil, err
		}
		g.source, g.ownClient = src, c
	}

	var err error
	if g.proxyLn, err = listenProxy(cfg.Listen); err != nil {
		g.closeClient()
		return nil, fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	if g.adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
		g.proxyLn.Close()
		g.closeClient()
		return nil, fmt.Errorf("listen admin %s: %w", cfg.AdminListen, err)
	}
	if cfg.FrontTLS != nil {
		g.proxyLn = tls.NewListener(g.proxyLn, cfg.FrontTLS)
	}
	if cfg.AdminTLS != nil {
		g.adminLn = tls.NewListener(g.adminLn, cfg.AdminTLS)
	}
	g.front = h1.NewServer(g.proxyLn, h1.ServerConfig{
		Handler:           g.handle,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.ClientIdleTimeout,
		Logger:            log,
	})
	errLog := slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	g.proxySrv = &http.Server{
		Handler:           g,
		ConnContext:       handedTLS,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.ClientIdleTimeout,
		ErrorLog:          errLog,
	}
	g.adminSrv = &http.Server{
		Handler:           g.adminHandler(),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       cfg.ClientIdleTimeout,
		ErrorLog:          errLog,
	}
	return g, nil
}

// Addr returns the proxy listener's address.
func (g *Gateway) Addr() string { return g.proxyLn.Addr().String() }

// AdminAddr returns the admin listener's address.
func (g *Gateway) AdminAddr() string { return g.adminLn.Addr().String() }

// Registry returns the gateway's Prometheus registry (served on /metrics).
func (g *Gateway) Registry() *prometheus.Registry { return g.m.reg }

// Index returns the registry index of the current routing table.
func (g *Gateway) Index() uint64 { return g.table.Load().index }

// Ready reports whether the gateway has a table from the registry or the
// state dir (what /readyz answers).
func (g *Gateway) Ready() bool { return g.ready.Load() }

// Staleness returns how long the table has not been known to match the
// registry: 0 while the source is connected.
func (g *Gateway) Staleness() time.Duration {
	if g.connected.Load() {
		return 0
	}
	return max(0, g.clock.Now().Sub(time.Unix(0, g.staleSince.Load())))
}

// Stats are counters for tests and operators (the same numbers are on
// /metrics).
type Stats struct {
	ConnectionsOpened int64 // connections ever opened to origins
	ConnectionsOpen   int64 // connections open now
	Ejections         int64
	Shed              int64 // requests answered 503 without an origin
	Retries           int64
	InFlight          int64
	Index             uint64
	Connected         bool
}

// Stats returns the current counters.
func (g *Gateway) Stats() Stats {
	return Stats{
		ConnectionsOpened: g.factory.stats.opened.Load(),
		ConnectionsOpen:   g.factory.stats.open.Load(),
		Ejections:         g.stats.ejections.Load(),
		Shed:              g.stats.shed.Load(),
		Retries:           g.stats.retries.Load(),
		InFlight:          g.admit.inFlight(),
		Index:             g.Index(),
		Connected:         g.connected.Load(),
	}
}

// Start serves the proxy and admin listeners, subscribes to the source and
// starts persisting. It returns at once; Done reports a fatal error.
func (g *Gateway) Start() {
	if !g.started.CompareAndSwap(false, true) {
		return
	}
	g.serve("admin", g.adminSrv, g.adminLn)
	g.serve("proxy", g.proxySrv, g.front.HandedOff())
	g.wg.Go(func() {
		if err := g.front.Serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			select {
			case g.errc <- fmt.Errorf("proxy listener: %w", err):
			default:
			}
		}
	})
	if g.cfg.StateDir != "" {
		saved := g.table.Load() // as loaded from the state dir, or empty
		g.wg.Go(func() { g.persistLoop(saved) })
	}
	g.wg.Go(g.runSource)
	g.wg.Go(g.sweepLoop)
	g.log.Info("gateway: serving", "listen", g.Addr(), "admin", g.AdminAddr(), "shards", g.cfg.Shards)
}

func (g *Gateway) serve(name string, srv *http.Server, ln net.Listener) {
	g.wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			select {
			case g.errc <- fmt.Errorf("%s listener: %w", name, err):
			default:
			}
		}
	})
}

// newSource builds the Source cfg.Instances names over c.
func newSource(c *client.Client, cfg Config, log *slog.Logger) (Source, error) {
	kcfg := DefaultKVSourceConfig()
	kcfg.Prefix = cfg.KVPrefix
	kcfg.Logger = log
	if cfg.Instances == InstancesKV {
		return NewKVSource(c, kcfg)
	}
	return NewCatalogSource(c, CatalogSourceConfig{KVSourceConfig: kcfg})
}

// Done yields an error when a listener fails; the caller should Close.
func (g *Gateway) Done() <-chan error { return g.errc }

// runSource keeps the source running; Run returns only on errors retrying
// cannot fix, so it is restarted after a jittered backoff.
func (g *Gateway) runSource() {
	for n := 1; ; n++ {
		err := g.source.Run(g.ctx, g.Index(), g)
		if g.ctx.Err() != nil {
			return
		}
		d := backoffDelay(n, time.Second, 30*time.Second)
		g.log.Warn("gateway: source stopped; serving the last table and retrying", "in", d, "err", err)
		select {
		case <-g.ctx.Done():
			return
		case <-time.After(d):
		}
	}
}

// sweepLoop closes fast-path keep-alive connections idle for longer than
// PoolIdleTimeout (http.Transport does the same for its own), checking
// every half of it.
func (g *Gateway) sweepLoop() {
	t := time.NewTicker(g.cfg.PoolIdleTimeout / 2)
	defer t.Stop()
	for {
		select {
		case <-g.ctx.Done():
			return
		case <-t.C:
		}
		for _, s := range g.table.Load().services {
			for _, sh := range s.shards {
				for _, p := range sh {
					p.closeH1(int64(g.cfg.PoolIdleTimeout))
				}
			}
		}
	}
}

// Apply implements Sink: it computes the next table with the pure
// table.apply, swaps it in, then cleans up what the diff says is gone.
func (g *Gateway) Apply(u Update) {
	old := g.table.Load()
	nt, d := old.apply(u, g.env)
	g.table.Store(nt)
	g.m.updates.Inc()
	for _, p := range d.closedPools {
		p.close()
	}
	for _, o := range d.removedOrigins {
		if s := nt.services[o.state.name]; s == nil || s.members[o.inst.ID] == nil {
			g.m.deleteOrigin(o.state.name, o.inst.ID)
		}
	}
	for _, r := range d.removedRoutes {
		if _, ok := nt.routes[r.Name]; !ok && !staticHas(nt.static, r.Name) {
			g.m.deleteRoute(r.Name)
		}
	}
	for _, r := range d.rejected {
		g.log.Warn("gateway: ignoring invalid registry entry", "err", r)
	}
	if u.Reset || len(d.routesUpserted)+len(d.routesRemoved) > 0 {
		g.log.Info("gateway: routing table updated", "index", nt.index, "reset", u.Reset,
			"services", len(nt.services), "routes", len(nt.routes)+len(nt.static),
			"routes_upserted", d.routesUpserted, "routes_removed", d.routesRemoved)
	} else if !u.IsProgress() && g.log.Enabled(context.Background(), slog.LevelDebug) {
		g.log.Debug("gateway: routing table updated", "index", nt.index, "diff", d.String())
	}
	g.notify()
	if !u.IsProgress() {
		g.ready.Store(true)
		select {
		case g.persistKick <- struct{}{}:
		default:
		}
	}
}

func staticHas(static []*routeEntry, name string) bool {
	for _, s := range static {
		if s.Name == name {
			return true
		}
	}
	return false
}

// SetConnected implements Sink.
func (g *Gateway) SetConnected(connected bool, err error) {
	g.connMu.Lock()
	if g.connected.Load() == connected {
		g.connMu.Unlock()
		return
	}
	if !connected {
		// NB: before connected goes false, so whoever sees the outage
		// sees when it began: set after, a Staleness read in between
		// measured from the outage before (or from start), and one read
		// after the clock moved on measured from too late.
		g.staleSince.Store(g.clock.Now().UnixNano())
	}
	g.connected.Store(connected)
	g.connMu.Unlock()
	defer g.notify()
	if connected {
		g.ready.Store(true)
		g.log.Info("gateway: registry connected", "index", g.Index())
		return
	}
	g.log.Warn("gateway: registry unreachable; serving the last known good table", "index", g.Index(), "err", err)
}

func (g *Gateway) notify() {
	g.changedMu.Lock()
	close(g.changed)
	g.changed = make(chan struct{})
	g.changedMu.Unlock()
}

// waitUntil blocks until cond holds (checked after every table update and
// connection change) or ctx ends.
func (g *Gateway) waitUntil(ctx context.Context, cond func() bool) error {
	for {
		g.changedMu.Lock()
		ch := g.changed
		g.changedMu.Unlock()
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// WaitIndex blocks until the routing table has reached index idx (every
// registry change up to idx is applied: a request admitted afterwards is
// routed by it) or ctx ends.
func (g *Gateway) WaitIndex(ctx context.Context, idx uint64) error {
	return g.waitUntil(ctx, func() bool { return g.Index() >= idx })
}

// WaitConnected blocks until the source's link to the registry is up (or
// down, for connected false) or ctx ends.
func (g *Gateway) WaitConnected(ctx context.Context, connected bool) error {
	return g.waitUntil(ctx, func() bool { return g.connected.Load() == connected })
}

// persistLoop writes the table to StateDir when it changed since
// savedTable, at most once
// per PersistInterval, and once more on Close.
func (g *Gateway) persistLoop(savedTable *table) {
	save := func() {
		t := g.table.Load()
		if t == savedTable {
			return
		}
		if err := saveTable(g.cfg.StateDir, t.snapshot(g.clock.Now())); err != nil {
			g.m.persistErrors.Inc()
			g.log.Warn("gateway: persist routing table", "dir", g.cfg.StateDir, "err", err)
			return
		}
		savedTable = t
	}
	for {
		select {
		case <-g.ctx.Done():
			save()
			return
		case <-g.persistKick:
		}
		save()
		select {
		case <-g.ctx.Done():
			save()
			return
		case <-time.After(g.cfg.PersistInterval):
		}
	}
}

// Close stops the listeners (giving in-flight requests up to 5s), the
// source and the persister, closes every origin connection and the
// registry client it made, and returns the first error.
func (g *Gateway) Close() error {
	g.closeOnce.Do(func() {
		g.cancel()
		var errs []error
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := g.front.Shutdown(ctx)
		if err == nil {
			err = g.proxySrv.Shutdown(ctx)
		}
		if err != nil {
			// In-flight requests outlived the grace period: close their
			// connections; their contexts end and they return promptly.
			g.front.Close()
			g.proxySrv.Close()
			errs = append(errs, fmt.Errorf("stop proxy: %w", err))
		}
		cancel()
		if err := g.adminSrv.Close(); err != nil {
			errs = append(errs, fmt.Errorf("stop admin: %w", err))
		}
		if !g.started.Load() {
			g.proxyLn.Close()
			g.adminLn.Close()
		}
		g.wg.Wait()
		g.upMu.Lock() // after this no splice starts (g.ctx is done)
		g.upMu.Unlock()
		g.upgrades.Wait() // and every running one is closing
		g.handlers.Wait()
		t := g.table.Load()
		for _, s := range t.services {
			for _, sh := range s.shards {
				for _, p := range sh {
					p.close()
				}
			}
		}
		if err := g.closeClient(); err != nil {
			errs = append(errs, fmt.Errorf("close registry client: %w", err))
		}
		g.closeErr = errors.Join(errs...)
		g.log.Info("gateway: stopped")
	})
	return g.closeErr
}

func (g *Gateway) closeClient() error {
	if g.ownClient == nil {
		return nil
	}
	return g.ownClient.Close()
}

// Run starts a gateway for cfg and serves until ctx ends or a listener
// fails, then closes it. It is what `lodestone gateway` and `lodestone dev`
// call.
func Run(ctx context.Context, cfg Config) error {
	g, err := New(cfg)
	if err != nil {
		return err
	}
	g.Start()
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-g.Done():
	}
	if err := g.Close(); err != nil && runErr == nil {
		runErr = err
	}
	return runErr
}
