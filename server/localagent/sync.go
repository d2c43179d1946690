package localagent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store"
)

// run is the background work, one step at a time: anti-entropy at start
// and every AntiEntropyInterval (or when a write found the catalog lost
// something), the transitions the checks made, and every ReapInterval the
// services due for deregistration.
func (a *Agent) run() {
	backoff := a.cfg.RetryMin
	retry := time.NewTimer(0) // NB: the first anti-entropy pass at once
	defer retry.Stop()
	ae := time.NewTimer(a.cfg.AntiEntropyInterval)
	defer ae.Stop()
	reap := time.NewTicker(a.cfg.ReapInterval)
	defer reap.Stop()
	needAE := true
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-a.kick:
		case <-retry.C:
		case <-ae.C:
			needAE = true
		case <-reap.C:
			a.reap()
			continue
		}
		err := a.step(needAE)
		if err == nil {
			if needAE {
				ae.Reset(a.cfg.AntiEntropyInterval)
			}
			needAE = false
			backoff = a.cfg.RetryMin
			continue
		}
		if a.ctx.Err() != nil {
			return
		}
		if errors.Is(err, errLost) {
			needAE = true
		}
		a.logger.Warn("local agent sync failed; retrying", "err", err, "retry_in", backoff)
		retry.Reset(backoff)
		backoff = min(2*backoff, a.cfg.RetryMax)
	}
}

// errLost marks a write the catalog refused because it lost what the
// write assumed (the node or the check): anti-entropy registers it again.
var errLost = errors.New("the catalog lost this node's registration")

// step runs anti-entropy if asked, then writes every pending transition.
func (a *Agent) step(antiEntropy bool) error {
	ctx, cancel := context.WithTimeout(a.ctx, a.cfg.WriteTimeout)
	defer cancel()
	if antiEntropy {
		if err := a.antiEntropy(ctx); err != nil {
			a.verifies.WithLabelValues("error").Inc()
			return err
		}
		a.verifies.WithLabelValues("ok").Inc()
	}
	a.mu.Lock()
	ids := slices.Sorted(maps.Keys(a.checks))
	a.mu.Unlock()
	a.opMu.Lock()
	defer a.opMu.Unlock()
	for _, id := range ids {
		if err := a.writeCheckLocked(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// writeCheckLocked writes check id's status if the catalog holds another
// one: one Raft entry per transition. a.opMu is held.
func (a *Agent) writeCheckLocked(ctx context.Context, id string) error {
	a.mu.Lock()
	l := a.checks[id]
	var remote lodestonepb.HealthStatus
	if l != nil {
		remote = l.remote
	}
	a.mu.Unlock()
	if remote == 0 {
		return nil // gone, or restored: anti-entropy will say what the catalog holds
	}
	st, out := l.status()
	if st == remote {
		return nil
	}
	_, err := a.apply(ctx, "check", &lodestonepb.Command{Op: &lodestonepb.Command_CheckUpdate{CheckUpdate: &lodestonepb.UpdateCheckRequest{
		Node: a.cfg.Node, CheckId: id, Status: st, Output: out}}})
	var re *store.RejectedError
	if errors.As(err, &re) && (re.Rule == store.RejectCheckMissing || re.Rule == store.RejectNodeMissing) {
		return fmt.Errorf("%w: update check %q: %w", errLost, id, err)
	}
	if err != nil {
		return fmt.Errorf("update check %q: %w", id, err)
	}
	a.mu.Lock()
	l.remote = st
	a.mu.Unlock()
	a.logger.Info("check transition written", "check", id, "status", lodestonepb.HealthStatusWord(st))
	return nil
}

// antiEntropy reads this node back from the catalog (after catching up
// with the leader), registers again what it lost, and learns the status
// it holds for every check, so the transitions that follow are written
// against what is there. On its first pass after a start, a check that
// has not run yet takes the catalog's status: an unchanged result then
// writes nothing.
func (a *Agent) antiEntropy(ctx context.Context) error {
	a.mu.Lock()
	empty := len(a.checks) == 0 && len(a.services) == 0
	if empty {
		a.synced = true // NB: nothing to compare: no read, no round
	}
	a.mu.Unlock()
	if empty {
		return nil
	}
	if err := a.cfg.Barrier(ctx); err != nil {
		return fmt.Errorf("catch up before reading the catalog: %w", err)
	}
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	first := !a.synced
	a.mu.Unlock()
	if err := a.EnsureNode(ctx); err != nil {
		return err
	}
	ns, _ := a.cfg.Catalog.Node(a.cfg.Node)
	cs, _ := a.cfg.Catalog.NodeChecks(a.cfg.Node)
	remoteSvc := map[string]bool{}
	for _, s := range ns.GetServices() {
		remoteSvc[s.Id] = true
	}
	remote := map[string]*lodestonepb.Check{}
	for _, c := range cs {
		remote[c.CheckId] = c
	}
	now := a.now()
	var writes []*lodestonepb.CatalogRegisterRequest
	a.mu.Lock()
	for _, id := range slices.Sorted(maps.Keys(a.checks)) {
		l := a.checks[id]
		rc := remote[id]
		if rc == nil {
			continue
		}
		if first && l.run != nil && !l.run.Probed() {
			l.run.Assume(rc.Status, rc.Output, now)
		}
		l.remote = rc.Status
	}
	for _, id := range slices.Sorted(maps.Keys(a.services)) {
		s := a.services[id]
		lost := !remoteSvc[id]
		for _, cid := range s.checks {
			lost = lost || remote[cid] == nil
		}
		if !lost {
			continue
		}
		w := &lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: a.cfg.Node}, SkipNodeUpdate: true, Service: s.svc}
		for _, cid := range s.checks {
			w.Checks = append(w.Checks, a.checks[cid].record(a.cfg.Node))
		}
		writes = append(writes, w)
	}
	for _, id := range slices.Sorted(maps.Keys(a.checks)) {
		if l := a.checks[id]; l.rec.ServiceId == "" && remote[id] == nil {
			writes = append(writes, &lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: a.cfg.Node}, SkipNodeUpdate: true,
				Checks: []*lodestonepb.Check{l.record(a.cfg.Node)}})
		}
	}
	a.mu.Unlock()
	for _, w := range writes {
		if _, err := a.apply(ctx, "register", &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: w}}); err != nil {
			return fmt.Errorf("register again what the catalog lost: %w", err)
		}
		a.mu.Lock()
		for _, c := range w.Checks {
			if l := a.checks[c.CheckId]; l != nil {
				l.remote = c.Status
			}
		}
		a.mu.Unlock()
		what := "node check " + w.Checks[0].CheckId
		if w.Service != nil {
			what = "service " + w.Service.Id
		}
		a.logger.Info("registered again what the catalog lost", "what", what)
	}
	a.mu.Lock()
	a.synced = true
	a.mu.Unlock()
	return nil
}

// reap deregisters the services with a check that has been critical
// longer than its DeregisterCriticalServiceAfter, as Consul's agent does.
func (a *Agent) reap() {
	now := a.now()
	a.mu.Lock()
	var due []string
	if a.synced { // NB: a restored check's status is not known before
		for _, id := range slices.Sorted(maps.Keys(a.services)) {
			for _, cid := range a.services[id].checks {
				if l := a.checks[cid]; l.run != nil && l.run.Reapable(now) {
					due = append(due, id)
					break
				}
			}
		}
	}
	a.mu.Unlock()
	for _, id := range due {
		ctx, cancel := context.WithTimeout(a.ctx, a.cfg.WriteTimeout)
		err := a.RemoveService(ctx, id)
		cancel()
		if err != nil {
			a.logger.Warn("deregistering a service critical for too long failed; retrying at the next reap", "service", id, "err", err)
			continue
		}
		a.logger.Info("check for service has been critical for too long; deregistered service", "service", id)
	}
}
