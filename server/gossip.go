package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/gossip"
	"github.com/lodestone-kv/lodestone/store"
)

// SerfCheckID is the node-level check the leader keeps on every pool
// member's catalog node, named as Consul's so Consul clients that bind
// sessions to "serfHealth" by default work unchanged. Passing while the
// member is alive in the gossip pool, critical once it failed or left.
const SerfCheckID = "serfHealth"

// Outputs of the serfHealth check, as Consul words them where it has one.
const (
	serfCheckName     = "Serf Health Status"
	serfOutputAlive   = "Agent alive and reachable"
	serfOutputFailed  = "Agent not live or unreachable"
	serfOutputLeft    = "Agent left the gossip pool"
	serfOutputMissing = "Node not in the gossip pool"
)

// gossipCatalog is what planning reads of the catalog; *store.Store
// implements it.
type gossipCatalog interface {
	Node(name string) (*lodestonepb.NodeServices, store.QueryMeta)
	NodeChecks(node string) ([]*lodestonepb.Check, store.QueryMeta)
	NodeSessions(node string) ([]*lodestonepb.SessionEntry, store.QueryMeta)
	ChecksInState(state lodestonepb.HealthStatus) ([]*lodestonepb.Check, store.QueryMeta)
}

var _ gossipCatalog = (*store.Store)(nil)

// planGossip returns the catalog commands (without time) that make the
// catalog agree with the pool, and nothing when it already does:
//
//   - an alive member gets its node (if missing) and a passing serfHealth;
//   - a failed or left member that is in the catalog gets a critical
//     serfHealth, and its sessions are invalidated;
//   - with reap, a catalog node whose serfHealth is not critical but that
//     the pool does not know at all gets it critical.
//
// NB: the plan is a diff, never a refresh: an unchanged pool yields no
// commands, so liveness costs no Raft writes in steady state.
func planGossip(members []gossip.Member, cat gossipCatalog, reap bool) []*lodestonepb.Command {
	var out []*lodestonepb.Command
	known := make(map[string]bool, len(members))
	for _, m := range members {
		known[m.Name] = true
		ns, _ := cat.Node(m.Name)
		var serf *lodestonepb.Check
		if ns != nil {
			checks, _ := cat.NodeChecks(m.Name)
			for _, c := range checks {
				if c.CheckId == SerfCheckID {
					serf = c
				}
			}
		}
		switch m.State {
		case gossip.StateAlive:
			switch {
			case ns == nil:
				host, _, err := net.SplitHostPort(m.Addr)
				if err != nil {
					host = m.Addr
				}
				out = append(out, serfRegister(&lodestonepb.Node{Name: m.Name, Address: host}, false, lodestonepb.HealthStatus_HEALTH_PASSING, serfOutputAlive))
			case serf == nil:
				out = append(out, serfRegister(&lodestonepb.Node{Name: m.Name}, true, lodestonepb.HealthStatus_HEALTH_PASSING, serfOutputAlive))
			case serf.Status != lodestonepb.HealthStatus_HEALTH_PASSING:
				out = append(out, serfUpdate(m.Name, lodestonepb.HealthStatus_HEALTH_PASSING, serfOutputAlive))
			}
		case gossip.StateFailed, gossip.StateLeft:
			if ns == nil {
				continue // never registered, or deregistered: nothing to mark
			}
			output := serfOutputFailed
			if m.State == gossip.StateLeft {
				output = serfOutputLeft
			}
			switch {
			case serf == nil:
				out = append(out, serfRegister(&lodestonepb.Node{Name: m.Name}, true, lodestonepb.HealthStatus_HEALTH_CRITICAL, output))
			case serf.Status != lodestonepb.HealthStatus_HEALTH_CRITICAL:
				out = append(out, serfUpdate(m.Name, lodestonepb.HealthStatus_HEALTH_CRITICAL, output))
			}
			if sessions, _ := cat.NodeSessions(m.Name); len(sessions) > 0 {
				out = append(out, &lodestonepb.Command{Op: &lodestonepb.Command_SessionInvalidate{
					SessionInvalidate: &lodestonepb.SessionInvalidate{Node: m.Name}}})
			}
		}
	}
	if reap {
		var orphans []string
		for _, st := range []lodestonepb.HealthStatus{lodestonepb.HealthStatus_HEALTH_PASSING, lodestonepb.HealthStatus_HEALTH_WARNING} {
			checks, _ := cat.ChecksInState(st)
			for _, c := range checks {
				if c.CheckId == SerfCheckID && !known[c.Node] {
					orphans = append(orphans, c.Node)
				}
			}
		}
		sort.Strings(orphans)
		for _, n := range orphans {
			out = append(out, serfUpdate(n, lodestonepb.HealthStatus_HEALTH_CRITICAL, serfOutputMissing))
		}
	}
	return out
}

func serfRegister(node *lodestonepb.Node, skipNode bool, st lodestonepb.HealthStatus, output string) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: &lodestonepb.CatalogRegisterRequest{
		Node: node, SkipNodeUpdate: skipNode,
		Checks: []*lodestonepb.Check{{Node: node.Name, CheckId: SerfCheckID, Name: serfCheckName, Status: st, Output: output, Type: "serf"}},
	}}}
}

func serfUpdate(node string, st lodestonepb.HealthStatus, output string) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_CheckUpdate{CheckUpdate: &lodestonepb.UpdateCheckRequest{
		Node: node, CheckId: SerfCheckID, Status: st, Output: output,
	}}}
}

// commandKind names a planned command for logs and metrics.
func commandKind(cmd *lodestonepb.Command) string {
	switch cmd.Op.(type) {
	case *lodestonepb.Command_CatalogRegister:
		return "register"
	case *lodestonepb.Command_CheckUpdate:
		return "check"
	case *lodestonepb.Command_SessionInvalidate:
		return "invalidate"
	}
	return "other"
}

// serverGossip is the server's pool member and, while the server leads,
// the reconciler that writes pool transitions into the catalog.
type serverGossip struct {
	s       *core
	cfg     GossipConfig
	pool    *gossip.Pool
	logger  *slog.Logger
	now     func() time.Time
	started time.Time

	runs   prometheus.Counter
	writes *prometheus.CounterVec

	wg sync.WaitGroup
}

// openGossip binds the gossip sockets; nil without Config.Gossip.
func openGossip(s *core) (*serverGossip, error) {
	if !s.cfg.Gossip.Enabled() {
		return nil, nil
	}
	g := &serverGossip{s: s, cfg: s.cfg.Gossip, logger: s.logger.With("component", "gossip"), now: time.Now}
	pcfg := g.cfg.Pool
	pcfg.Logger, pcfg.Registerer = g.logger, s.metrics.reg
	g.runs = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "lodestone", Subsystem: "gossip", Name: "reconcile_runs_total",
		Help: "Times the leader diffed the gossip pool against the catalog.",
	})
	g.writes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "lodestone", Subsystem: "gossip", Name: "reconcile_writes_total",
		Help: "Catalog writes made by the leader for pool transitions, by kind (register, check, invalidate) and result (ok, error).",
	}, []string{"kind", "result"})
	pool, err := gossip.New(pcfg)
	if err != nil {
		return nil, fmt.Errorf("start gossip: %w", err)
	}
	if err := s.metrics.reg.Register(g.runs); err != nil {
		return nil, errors.Join(fmt.Errorf("register gossip metrics: %w", err), pool.Close())
	}
	s.metrics.reg.MustRegister(g.writes)
	g.pool, g.started = pool, g.now()
	return g, nil
}

// start joins the pool and starts the reconciler, which runs until ctx
// ends.
func (g *serverGossip) start(ctx context.Context) {
	g.pool.Start()
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.run(ctx)
	}()
}

// close waits for the reconciler (its ctx has ended), announces this
// server's departure and closes the pool.
func (g *serverGossip) close() error {
	g.wg.Wait()
	var errs []error
	if err := g.pool.Leave(time.Second); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, g.pool.Close())
	return errors.Join(errs...)
}

// run reconciles whenever this server leads and the pool changes, the
// leader changes, the interval passes, or a retry is due.
func (g *serverGossip) run(ctx context.Context) {
	tick := time.NewTicker(g.cfg.ReconcileInterval)
	defer tick.Stop()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		leaderC := g.s.raft.LeaderChanged()
		select {
		case <-ctx.Done():
			return
		case <-retry.C:
		case <-g.pool.Changed():
		case <-tick.C:
		case <-leaderC:
		}
		if g.s.raft.Status().State != raft.StateLeader {
			continue
		}
		if err := g.reconcile(ctx); err != nil && ctx.Err() == nil {
			var rej *store.RejectedError
			if errors.As(err, &rej) {
				g.logger.Error("gossip reconcile refused; retrying at the next interval", "err", err, "retry_in", g.cfg.ReconcileInterval)
				continue
			}
			g.logger.Warn("gossip reconcile failed; retrying", "err", err, "retry_in", g.cfg.RetryInterval)
			retry.Reset(g.cfg.RetryInterval)
		}
	}
}

// reconcile reads the catalog at a linearizable index (a new leader may
// not have applied everything yet), plans and writes the transitions.
func (g *serverGossip) reconcile(ctx context.Context) error {
	g.runs.Inc()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := g.s.raft.ReadIndex(rctx); err != nil {
		return fmt.Errorf("read catalog: %w", err)
	}
	now := g.now()
	reap := now.Sub(g.started) >= g.cfg.ReapGrace
	for _, cmd := range planGossip(g.pool.Members(), g.s.store, reap) {
		kind := commandKind(cmd)
		cmd.TimeUnixNano = now.UnixNano()
		_, index, err := g.s.write(rctx, cmd)
		if err != nil {
			g.writes.WithLabelValues(kind, "error").Inc()
			return fmt.Errorf("write %s: %w", kind, err)
		}
		g.writes.WithLabelValues(kind, "ok").Inc()
		g.logger.Info("gossip transition written", "kind", kind, "index", index, "command", cmd.String())
	}
	return nil
}
