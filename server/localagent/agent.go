package localagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/checks"
	"github.com/lodestone-kv/lodestone/store"
)

// Catalog is what the agent reads of the state; *store.Store implements
// it.
type Catalog interface {
	Node(name string) (*lodestonepb.NodeServices, store.QueryMeta)
	NodeChecks(node string) ([]*lodestonepb.Check, store.QueryMeta)
}

var _ Catalog = (*store.Store)(nil)

// Config configures the agent.
type Config struct {
	// Node and Address are the catalog node this server is the agent of.
	Node, Address string
	// Dir holds the registrations (FileName); empty keeps them in memory
	// only.
	Dir string
	// Catalog is the state, read-only.
	Catalog Catalog
	// Apply proposes a command with the server's authority and returns
	// once it is applied here (the server's write path).
	Apply func(context.Context, *lodestonepb.Command) (*lodestonepb.CommandResult, uint64, error)
	// Barrier makes the next Catalog read reflect everything the leader
	// has committed (before anti-entropy compares).
	Barrier func(context.Context) error
	// Checks are the rules checks compile under (script checks,
	// minimums).
	Checks checks.Options
	// ReapInterval is how often services whose check stayed critical past
	// their DeregisterCriticalServiceAfter are deregistered. Default 30s,
	// as Consul.
	ReapInterval time.Duration
	// AntiEntropyInterval is how often the catalog is read back and what
	// it lost is written again. Default 1m. Reads only while it agrees.
	AntiEntropyInterval time.Duration
	// RetryMin and RetryMax bound the back-off between failed background
	// writes. Defaults 200ms and 5s.
	RetryMin, RetryMax time.Duration
	// WriteTimeout bounds one background write. Default 10s: more than a
	// write's wait for a new leader.
	WriteTimeout time.Duration
	// Logger receives logs; nil discards them.
	Logger *slog.Logger
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// Now is the clock checks decide with; nil is time.Now.
	Now func() time.Time
}

// FileName is the registrations' file in Config.Dir.
const FileName = "local.json"

// Errors the Consul API answers with Consul's words.
var (
	ErrUnknownService = errors.New("unknown service")
	ErrUnknownCheck   = errors.New("unknown check")
)

// Maintenance checks, named as Consul names them.
const (
	NodeMaintenanceID      = "_node_maintenance"
	ServiceMaintenanceIDOf = "_service_maintenance:"
	maintenanceType        = "maintenance"

	defaultNodeMaintReason    = "Maintenance mode is enabled for this node, but no reason was provided. This is a default message."
	defaultServiceMaintReason = "Maintenance mode is enabled for this service, but no reason was provided. This is a default message."
)

// Agent is a server's local agent.
type Agent struct {
	cfg    Config
	logger *slog.Logger
	now    func() time.Time

	// opMu makes each catalog write and the local change it goes with one
	// step: operations, transitions and anti-entropy never interleave.
	opMu sync.Mutex

	mu       sync.Mutex
	regs     registrations // as persisted
	services map[string]*service
	checks   map[string]*local
	changed  chan struct{} // closed when a service changes
	started  bool
	// synced: anti-entropy ran once, so every check's remote status is
	// known and the reaper may judge restored checks.
	synced bool

	kick   chan struct{} // a transition to write; capacity one
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	runs, transitions, writes, verifies *prometheus.CounterVec
}

type service struct {
	svc    *lodestonepb.Service
	checks []string // check ids, maintenance included
}

// local is one check of this node.
type local struct {
	rec *lodestonepb.Check // as registered
	run *checks.Check      // nil for a maintenance check: its status is fixed
	// remote is the status the catalog holds as far as this agent knows:
	// the one it wrote, or read back; 0 for a check restored from the
	// file until anti-entropy read it.
	remote lodestonepb.HealthStatus
}

func (l *local) status() (lodestonepb.HealthStatus, string) {
	if l.run == nil {
		return l.rec.Status, l.rec.Output
	}
	return l.run.Status()
}

// record is the catalog record of l on node, at its current status.
func (l *local) record(node string) *lodestonepb.Check {
	r := proto.CloneOf(l.rec)
	r.Node = node
	r.Status, r.Output = l.status()
	return r
}

// New loads the registrations of cfg.Dir; Start runs their checks.
func New(cfg Config) (*Agent, error) {
	if cfg.Node == "" || cfg.Catalog == nil || cfg.Apply == nil || cfg.Barrier == nil {
		return nil, errors.New("localagent: Node, Catalog, Apply and Barrier are required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.ReapInterval, 30*time.Second)
	def(&cfg.AntiEntropyInterval, time.Minute)
	def(&cfg.RetryMin, 200*time.Millisecond)
	def(&cfg.RetryMax, 5*time.Second)
	def(&cfg.WriteTimeout, 10*time.Second)
	a := &Agent{cfg: cfg, logger: cfg.Logger, now: cfg.Now, services: map[string]*service{}, checks: map[string]*local{},
		changed: make(chan struct{}), kick: make(chan struct{}, 1)}
	if a.logger == nil {
		a.logger = slog.New(slog.DiscardHandler)
	}
	if a.now == nil {
		a.now = time.Now
	}
	if a.cfg.Checks.Logger == nil {
		a.cfg.Checks.Logger = a.logger
	}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.runs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lodestone", Subsystem: "localagent", Name: "checks_run_total",
		Help: "Runs of this server's own checks (registered through its /v1/agent API) by type and result status.",
	}, []string{"type", "status"})
	a.transitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lodestone", Subsystem: "localagent", Name: "check_transitions_total",
		Help: "Status changes of this server's own checks by type and new status.",
	}, []string{"type", "status"})
	a.writes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lodestone", Subsystem: "localagent", Name: "writes_total",
		Help: "Catalog writes of this server's local agent by kind (register, deregister, check) and result (ok, error).",
	}, []string{"kind", "result"})
	a.verifies = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lodestone", Subsystem: "localagent", Name: "anti_entropy_runs_total",
		Help: "Reads of this server's own node back from the catalog, by result (ok, error).",
	}, []string{"result"})
	if r := cfg.Registerer; r != nil {
		for _, c := range []prometheus.Collector{a.runs, a.transitions, a.writes, a.verifies} {
			if err := r.Register(c); err != nil {
				return nil, fmt.Errorf("register local agent metrics: %w", err)
			}
		}
	}
	regs, err := a.load()
	if err != nil {
		return nil, err
	}
	a.regs = regs
	a.build()
	return a, nil
}

func (a *Agent) path() string {
	if a.cfg.Dir == "" {
		return ""
	}
	return filepath.Join(a.cfg.Dir, FileName)
}

// build makes the live state from a.regs at load. A check that no longer
// compiles (a script check, with scripts since disabled) is skipped with
// a warning: the server starts, and the check's catalog record keeps its
// last status.
func (a *Agent) build() {
	now := a.now()
	for _, key := range slices.Sorted(maps.Keys(a.regs)) {
		reg := a.regs[key]
		var s *service
		if reg.Service != nil {
			s = &service{svc: reg.Service}
			a.services[reg.Service.Id] = s
		}
		for _, rec := range reg.Checks {
			l, err := a.newLocal(rec, now)
			if err != nil {
				a.logger.Warn("a saved check does not compile any more; it does not run", "check", rec.CheckId, "err", err)
				continue
			}
			a.checks[rec.CheckId] = l
			if s != nil {
				s.checks = append(s.checks, rec.CheckId)
			}
		}
	}
}

// newLocal is a check of this node in its initial state at now.
func (a *Agent) newLocal(rec *lodestonepb.Check, now time.Time) (*local, error) {
	if rec.Type == maintenanceType {
		return &local{rec: rec}, nil
	}
	spec, err := checks.Compile(rec, a.cfg.Checks)
	if err != nil {
		return nil, err
	}
	return &local{rec: rec, run: checks.New(spec, now)}, nil
}

// Start runs every check and the background work (transitions,
// anti-entropy, the reaper) until Close.
func (a *Agent) Start() {
	a.mu.Lock()
	a.started = true
	for _, l := range a.checks {
		a.startLocked(l)
	}
	a.mu.Unlock()
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.run()
	}()
}

// startLocked starts l's check if the agent runs; a.mu is held.
func (a *Agent) startLocked(l *local) {
	if l.run != nil && a.started && a.ctx.Err() == nil {
		l.run.Start(a.ctx, checks.Hooks{Now: a.now, Result: a.observed, Logger: a.logger})
	}
}

// Close stops the checks and the background work.
func (a *Agent) Close() {
	a.cancel()
	a.wg.Wait()
	a.mu.Lock()
	all := slices.Collect(maps.Values(a.checks))
	a.mu.Unlock()
	stop(all)
}

func stop(ls []*local) {
	for _, l := range ls {
		if l.run != nil {
			l.run.Stop()
		}
	}
}

// observed is the checks' Hooks.Result: it counts the run and, on a
// change, wakes the writer.
func (a *Agent) observed(c *checks.Check, r checks.Result) {
	kind := c.Spec().Kind
	a.runs.WithLabelValues(kind, lodestonepb.HealthStatusWord(r.Status)).Inc()
	if !r.Changed {
		return
	}
	a.transitions.WithLabelValues(kind, lodestonepb.HealthStatusWord(r.Status)).Inc()
	a.logger.Info("check changed", "check", c.Spec().ID(), "status", lodestonepb.HealthStatusWord(r.Status), "output", r.Output)
	a.wake()
}

func (a *Agent) wake() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// notifyLocked wakes the readers waiting for a service change; a.mu is
// held.
func (a *Agent) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// Service returns local service id, and a channel closed at the next
// change to any local service (for Consul's hash-blocking reads).
func (a *Agent) Service(id string) (*lodestonepb.Service, <-chan struct{}, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.services[id]
	if !ok {
		return nil, a.changed, false
	}
	return s.svc, a.changed, true
}

// apply writes cmd with the server's authority, counted by kind.
func (a *Agent) apply(ctx context.Context, kind string, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, error) {
	res, _, err := a.cfg.Apply(ctx, cmd)
	result := "ok"
	if err != nil {
		result = "error"
	}
	a.writes.WithLabelValues(kind, result).Inc()
	return res, err
}

// EnsureNode registers this agent's node when the catalog lacks it. An
// existing node is left alone (whoever registered it owns its record).
func (a *Agent) EnsureNode(ctx context.Context) error {
	if ns, _ := a.cfg.Catalog.Node(a.cfg.Node); ns != nil {
		return nil
	}
	_, err := a.apply(ctx, "register", &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: &lodestonepb.CatalogRegisterRequest{
		Node: &lodestonepb.Node{Name: a.cfg.Node, Address: a.cfg.Address},
	}}})
	if err != nil {
		return fmt.Errorf("register this agent's node %q: %w", a.cfg.Node, err)
	}
	return nil
}
