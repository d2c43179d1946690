package localagent

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/checks"
)

// The operations the /v1/agent endpoints call. Each checks its input
// (a refusal changes nothing), saves the registrations it leads to, makes
// its catalog write and only then changes what runs; a failed write puts
// the saved registrations back. The caller has checked the caller's
// permission.

// commit saves regs, runs write, and keeps regs as the agent's once the
// write succeeded; on a failed write the file gets the old ones back.
// a.opMu is held.
func (a *Agent) commit(ctx context.Context, regs registrations, write func(context.Context) error) error {
	if err := a.persist(regs); err != nil {
		return err
	}
	if err := write(ctx); err != nil {
		a.mu.Lock()
		old := a.regs
		a.mu.Unlock()
		if perr := a.persist(old); perr != nil {
			a.logger.Error("restoring the saved registrations after a failed write", "err", perr)
		}
		return err
	}
	a.mu.Lock()
	a.regs = regs
	a.mu.Unlock()
	return nil
}

// AddService registers service svc with the checks recs (catalog records
// from checks.Definition.Catalog), or updates it: a check it already runs
// with the same definition keeps running; a redefined one starts from the
// status it had (unless its definition gives one). Checks of the service
// not in recs stay, unless replace (Consul's replace-existing-checks).
func (a *Agent) AddService(ctx context.Context, svc *lodestonepb.Service, recs []*lodestonepb.Check, replace bool) error {
	svc = proto.CloneOf(svc)
	if svc.Id == "" {
		svc.Id = svc.Name
	}
	svc.Node = ""
	recs = cloneChecks(recs)
	seen := map[string]bool{}
	for _, rec := range recs {
		rec.Node, rec.ServiceId = "", svc.Id
		if seen[rec.CheckId] {
			return &checks.DefinitionError{Msg: fmt.Sprintf("Invalid check: service %q has two checks %q", svc.Id, rec.CheckId)}
		}
		seen[rec.CheckId] = true
		if _, err := checks.Compile(rec, a.cfg.Checks); err != nil {
			return err
		}
	}

	a.opMu.Lock()
	defer a.opMu.Unlock()
	if err := a.EnsureNode(ctx); err != nil {
		return err
	}
	a.mu.Lock()
	p := a.planService(svc, recs, seen, replace, a.now())
	a.mu.Unlock()
	err := a.commit(ctx, p.regs, func(ctx context.Context) error {
		_, err := a.apply(ctx, "register", &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: p.write}})
		if err != nil {
			return err
		}
		for _, id := range p.stale {
			if _, err := a.apply(ctx, "deregister", deregisterCheck(a.cfg.Node, id)); err != nil {
				return fmt.Errorf("remove check %q replaced by the registration: %w", id, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	a.mu.Lock()
	stopped := a.installService(svc, recs, p)
	a.mu.Unlock()
	stop(stopped)
	a.wake() // NB: a result that came during the write
	a.logger.Info("service registered", "service", svc.Id, "checks", len(recs)+len(p.kept))
	return nil
}

// servicePlan is what one AddService changes.
type servicePlan struct {
	kept  []string // the service's checks that stay as they are
	stale []string // its checks replace-existing-checks removes
	news  []*local // the checks of recs, in order (some may be kept running)
	write *lodestonepb.CatalogRegisterRequest
	regs  registrations
}

// planService works out AddService's change; a.mu is held.
func (a *Agent) planService(svc *lodestonepb.Service, recs []*lodestonepb.Check, seen map[string]bool, replace bool, now time.Time) servicePlan {
	var p servicePlan
	var keptRecs []*lodestonepb.Check
	if old := a.services[svc.Id]; old != nil {
		for _, id := range old.checks {
			switch {
			case seen[id]:
			case replace && a.checks[id].rec.Type != maintenanceType:
				p.stale = append(p.stale, id)
			default:
				p.kept = append(p.kept, id)
				keptRecs = append(keptRecs, a.checks[id].rec)
			}
		}
	}
	p.write = &lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: a.cfg.Node}, SkipNodeUpdate: true, Service: svc}
	for _, id := range p.kept {
		p.write.Checks = append(p.write.Checks, a.checks[id].record(a.cfg.Node))
	}
	for _, rec := range recs {
		l := a.successor(a.checks[rec.CheckId], rec, now)
		p.news = append(p.news, l)
		p.write.Checks = append(p.write.Checks, l.record(a.cfg.Node))
	}
	p.regs = a.regs
	for id := range seen {
		p.regs = p.regs.withoutCheck(id) // NB: it may have been a node check, or another service's
	}
	p.regs = p.regs.with(serviceKey(svc.Id), &lodestonepb.CatalogRegisterRequest{Service: svc, Checks: append(keptRecs, recs...)})
	return p
}

// installService makes p what runs, once written, and returns the checks
// to stop; a.mu is held.
func (a *Agent) installService(svc *lodestonepb.Service, recs []*lodestonepb.Check, p servicePlan) []*local {
	written := map[string]lodestonepb.HealthStatus{}
	for _, c := range p.write.Checks {
		written[c.CheckId] = c.Status
	}
	var stopped []*local
	s := &service{svc: svc, checks: slices.Clone(p.kept)}
	for _, id := range p.kept {
		a.checks[id].remote = written[id]
	}
	for i, l := range p.news {
		id := recs[i].CheckId
		prev := a.checks[id]
		if prev != nil && prev != l {
			stopped = append(stopped, prev)
			a.detachLocked(id)
		}
		// NB: what was written, not the status now: a result that came
		// meanwhile is a transition still to write.
		l.remote = written[id]
		a.checks[id] = l
		s.checks = append(s.checks, id)
		if prev != l {
			a.startLocked(l)
		}
	}
	for _, id := range p.stale {
		stopped = append(stopped, a.checks[id])
		delete(a.checks, id)
	}
	a.services[svc.Id] = s
	a.notifyLocked()
	return stopped
}

// successor is the check that takes over from prev (nil: none) with
// record rec: prev itself when its definition is the same and rec gives no
// status, else a new check that starts from prev's status unless rec
// gives one. a.mu is held.
func (a *Agent) successor(prev *local, rec *lodestonepb.Check, now time.Time) *local {
	unspecified := rec.Status == lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED
	if prev != nil && prev.run != nil && unspecified && sameDefinition(prev.rec, rec) {
		return prev
	}
	l, _ := a.newLocal(rec, now) // NB: compiled before
	if prev != nil && unspecified && l.run != nil {
		st, out := prev.status()
		l.run.Assume(st, out, now)
	}
	return l
}

func sameDefinition(a, b *lodestonepb.Check) bool {
	a, b = proto.CloneOf(a), proto.CloneOf(b)
	a.Status, b.Status, a.Output, b.Output = 0, 0, "", ""
	return proto.Equal(a, b)
}

func cloneChecks(cs []*lodestonepb.Check) []*lodestonepb.Check {
	out := make([]*lodestonepb.Check, len(cs))
	for i, c := range cs {
		out[i] = proto.CloneOf(c)
	}
	return out
}

// detachLocked removes check id from its service's list; a.mu is held.
func (a *Agent) detachLocked(id string) {
	l := a.checks[id]
	if l == nil {
		return
	}
	if s := a.services[l.rec.ServiceId]; s != nil {
		s.checks = slices.DeleteFunc(slices.Clone(s.checks), func(c string) bool { return c == id })
	}
}

func deregisterCheck(node, id string) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_CatalogDeregister{CatalogDeregister: &lodestonepb.CatalogDeregisterRequest{
		Node: node, CheckId: id}}}
}

// RemoveService deregisters service id with its checks. A service this
// agent does not know but the catalog lists on its node is deregistered
// too; ErrUnknownService when neither has it.
func (a *Agent) RemoveService(ctx context.Context, id string) error {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	s := a.services[id]
	regs := a.regs.with(serviceKey(id), nil)
	a.mu.Unlock()
	var removed uint32
	err := a.commit(ctx, regs, func(ctx context.Context) error {
		res, err := a.apply(ctx, "deregister", &lodestonepb.Command{Op: &lodestonepb.Command_CatalogDeregister{CatalogDeregister: &lodestonepb.CatalogDeregisterRequest{
			Node: a.cfg.Node, ServiceId: id}}})
		removed = res.GetCatalogDeregister().GetRemovedServices()
		return err
	})
	if err != nil {
		return err
	}
	if s == nil {
		if removed == 0 {
			return fmt.Errorf("%w %q", ErrUnknownService, id)
		}
		return nil
	}
	a.mu.Lock()
	var stopped []*local
	for _, cid := range s.checks {
		stopped = append(stopped, a.checks[cid])
		delete(a.checks, cid)
	}
	delete(a.services, id)
	a.notifyLocked()
	a.mu.Unlock()
	stop(stopped)
	a.logger.Info("service deregistered", "service", id)
	return nil
}

// AddCheck registers check rec (a record from
// checks.Definition.Catalog): a node-level check, or with rec.ServiceId a
// check of that local service (ErrUnknownService if there is none).
func (a *Agent) AddCheck(ctx context.Context, rec *lodestonepb.Check) error {
	rec = proto.CloneOf(rec)
	rec.Node = ""
	if _, err := checks.Compile(rec, a.cfg.Checks); err != nil {
		return err
	}
	return a.addCheck(ctx, rec)
}

// addCheck is AddCheck after the definition passed, maintenance checks
// included.
func (a *Agent) addCheck(ctx context.Context, rec *lodestonepb.Check) error {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	s := a.services[rec.ServiceId]
	a.mu.Unlock()
	if rec.ServiceId != "" && s == nil {
		return fmt.Errorf("%w %q", ErrUnknownService, rec.ServiceId)
	}
	if err := a.EnsureNode(ctx); err != nil {
		return err
	}
	now := a.now()
	a.mu.Lock()
	l := a.successor(a.checks[rec.CheckId], rec, now)
	write := &lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: a.cfg.Node}, SkipNodeUpdate: true,
		Checks: []*lodestonepb.Check{l.record(a.cfg.Node)}}
	regs := a.regs.withoutCheck(rec.CheckId)
	if s == nil {
		regs = regs.with(checkKey(rec.CheckId), &lodestonepb.CatalogRegisterRequest{Checks: []*lodestonepb.Check{rec}})
	} else {
		reg := proto.CloneOf(regs[serviceKey(rec.ServiceId)])
		reg.Checks = append(reg.Checks, rec)
		regs = regs.with(serviceKey(rec.ServiceId), reg)
	}
	a.mu.Unlock()
	err := a.commit(ctx, regs, func(ctx context.Context) error {
		_, err := a.apply(ctx, "register", &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: write}})
		return err
	})
	if err != nil {
		return err
	}
	a.mu.Lock()
	var stopped []*local
	prev := a.checks[rec.CheckId]
	if prev != nil && prev != l {
		stopped = append(stopped, prev)
		a.detachLocked(rec.CheckId)
	}
	l.remote = write.Checks[0].Status // NB: what was written, not the status now
	a.checks[rec.CheckId] = l
	if s != nil && !slices.Contains(s.checks, rec.CheckId) {
		s.checks = append(slices.Clone(s.checks), rec.CheckId)
	}
	if prev != l {
		a.startLocked(l)
	}
	a.mu.Unlock()
	stop(stopped)
	a.wake() // NB: a result that came during the write
	return nil
}

// RemoveCheck deregisters check id. A check this agent does not know but
// the catalog lists on its node is deregistered too; ErrUnknownCheck
// when neither has it.
func (a *Agent) RemoveCheck(ctx context.Context, id string) error {
	a.opMu.Lock()
	defer a.opMu.Unlock()
	a.mu.Lock()
	l := a.checks[id]
	regs := a.regs.withoutCheck(id)
	a.mu.Unlock()
	var removed uint32
	err := a.commit(ctx, regs, func(ctx context.Context) error {
		res, err := a.apply(ctx, "deregister", deregisterCheck(a.cfg.Node, id))
		removed = res.GetCatalogDeregister().GetRemovedChecks()
		return err
	})
	if err != nil {
		return err
	}
	if l == nil {
		if removed == 0 {
			return fmt.Errorf("%w %q", ErrUnknownCheck, id)
		}
		return nil
	}
	a.mu.Lock()
	a.detachLocked(id)
	delete(a.checks, id)
	a.mu.Unlock()
	stop([]*local{l})
	return nil
}

// UpdateTTL records an application's report on TTL check id and writes
// the status if it changed; ErrUnknownCheck or checks.ErrNotTTL
// otherwise. A write that fails is retried in the background and is not
// the caller's error (Consul's agent answers 200 and syncs later).
func (a *Agent) UpdateTTL(ctx context.Context, id string, st lodestonepb.HealthStatus, output string) error {
	a.mu.Lock()
	l := a.checks[id]
	a.mu.Unlock()
	if l == nil {
		return fmt.Errorf("%w %q", ErrUnknownCheck, id)
	}
	if l.run == nil {
		return checks.ErrNotTTL
	}
	a.opMu.Lock()
	defer a.opMu.Unlock()
	changed, err := l.run.UpdateTTL(st, output, a.now())
	if err != nil {
		return err
	}
	a.observed(l.run, checks.Result{Status: st, Output: output, Changed: changed})
	if err := a.writeCheckLocked(ctx, id); err != nil {
		a.logger.Warn("TTL report not written yet; retrying", "check", id, "err", err)
		a.wake()
	}
	return nil
}

// SetNodeMaintenance puts this node in maintenance (a critical
// _node_maintenance check with reason as its notes) or takes it out.
func (a *Agent) SetNodeMaintenance(ctx context.Context, enable bool, reason string) error {
	if !enable {
		return a.removeMaintenance(ctx, NodeMaintenanceID)
	}
	if reason == "" {
		reason = defaultNodeMaintReason
	}
	return a.addMaintenance(ctx, &lodestonepb.Check{CheckId: NodeMaintenanceID, Name: "Node Maintenance Mode", Notes: reason,
		Status: lodestonepb.HealthStatus_HEALTH_CRITICAL, Type: maintenanceType})
}

// SetServiceMaintenance puts local service id in maintenance (a critical
// _service_maintenance:<id> check) or takes it out; ErrUnknownService if
// this agent has no such service.
func (a *Agent) SetServiceMaintenance(ctx context.Context, id string, enable bool, reason string) error {
	if _, _, ok := a.Service(id); !ok {
		return fmt.Errorf("%w %q", ErrUnknownService, id)
	}
	if !enable {
		return a.removeMaintenance(ctx, ServiceMaintenanceIDOf+id)
	}
	if reason == "" {
		reason = defaultServiceMaintReason
	}
	return a.addMaintenance(ctx, &lodestonepb.Check{CheckId: ServiceMaintenanceIDOf + id, Name: "Service Maintenance Mode", Notes: reason,
		ServiceId: id, Status: lodestonepb.HealthStatus_HEALTH_CRITICAL, Type: maintenanceType})
}

// addMaintenance registers a maintenance check unless it is there
// already (Consul keeps the first reason).
func (a *Agent) addMaintenance(ctx context.Context, rec *lodestonepb.Check) error {
	a.mu.Lock()
	_, on := a.checks[rec.CheckId]
	a.mu.Unlock()
	if on {
		return nil
	}
	if err := a.addCheck(ctx, rec); err != nil {
		return err
	}
	a.logger.Info("maintenance mode on", "check", rec.CheckId, "reason", rec.Notes)
	return nil
}

func (a *Agent) removeMaintenance(ctx context.Context, id string) error {
	a.mu.Lock()
	_, on := a.checks[id]
	a.mu.Unlock()
	if !on {
		return nil
	}
	if err := a.RemoveCheck(ctx, id); err != nil {
		return err
	}
	a.logger.Info("maintenance mode off", "check", id)
	return nil
}
