package agent

import (
	"maps"
	"slices"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/checks"
)

// local is what the registry should say about this node next to what it
// was last told. Plain methods; the agent's mutex serializes them.
type local struct {
	node       *lodestonepb.Node
	nodeSynced bool

	services map[string]*localService
	checks   map[string]*check
	// gone lists service ids to deregister from the registry.
	gone map[string]bool
}

type localService struct {
	svc    *lodestonepb.Service
	checks []string // check ids, in definition order
	// version counts local re-registrations; synced is the version the
	// registry has (0: none).
	version, synced uint64
}

func newLocal(node *lodestonepb.Node) *local {
	return &local{node: node, services: map[string]*localService{}, checks: map[string]*check{}, gone: map[string]bool{}}
}

// addService adds or replaces a service with its checks. It returns the
// checks it replaced (their runners must stop) and the new ones (to
// start).
func (l *local) addService(c *compiled, newCheck func(*checks.Spec) *check) (removed, added []*check) {
	id := c.service.Id
	var version uint64 = 1
	if old, ok := l.services[id]; ok {
		version = old.version + 1
		for _, cid := range old.checks {
			removed = append(removed, l.checks[cid])
			delete(l.checks, cid)
		}
	}
	ls := &localService{svc: c.service, version: version}
	for _, spec := range c.checks {
		ch := newCheck(spec)
		l.checks[spec.ID()] = ch
		ls.checks = append(ls.checks, spec.ID())
		added = append(added, ch)
	}
	l.services[id] = ls
	delete(l.gone, id)
	return removed, added
}

// removeService drops a service and returns its checks; false if unknown.
func (l *local) removeService(id string) ([]*check, bool) {
	ls, ok := l.services[id]
	if !ok {
		return nil, false
	}
	var removed []*check
	for _, cid := range ls.checks {
		removed = append(removed, l.checks[cid])
		delete(l.checks, cid)
	}
	delete(l.services, id)
	l.gone[id] = true
	return removed, true
}

// op is one registry write.
type op struct {
	kind string // "node", "register", "deregister", "check"
	// register: the service, its version and the check statuses sent.
	service *lodestonepb.Service
	version uint64
	checks  []*lodestonepb.Check
	// deregister: the service id; check: the check id and status.
	id     string
	status lodestonepb.HealthStatus
	output string
}

// next returns the next write that brings the registry closer to local,
// or nil when it agrees. Order: the node, deregistrations, registrations
// (only once every HTTP/TCP check of the service has a real result),
// check transitions.
func (l *local) next() *op {
	if !l.nodeSynced {
		return &op{kind: "node"}
	}
	for _, id := range slices.Sorted(maps.Keys(l.gone)) {
		return &op{kind: "deregister", id: id}
	}
	for _, id := range slices.Sorted(maps.Keys(l.services)) {
		ls := l.services[id]
		if ls.synced == ls.version {
			continue
		}
		o := &op{kind: "register", service: ls.svc, version: ls.version}
		ready := true
		for _, cid := range ls.checks {
			c := l.checks[cid]
			if c.Spec().Kind != checks.KindTTL && !c.Probed() {
				ready = false
				break
			}
			o.checks = append(o.checks, c.catalog(l.node.Name))
		}
		if ready {
			return o
		}
	}
	for _, id := range slices.Sorted(maps.Keys(l.checks)) {
		c := l.checks[id]
		if ls := l.services[c.Spec().ServiceID()]; ls == nil || ls.synced == 0 {
			continue // goes in with its service's registration
		}
		if c.dirty() {
			st, out := c.Status()
			return &op{kind: "check", id: id, status: st, output: out}
		}
	}
	return nil
}

// done records that o was written.
func (l *local) done(o *op) {
	switch o.kind {
	case "node":
		l.nodeSynced = true
	case "deregister":
		delete(l.gone, o.id)
	case "register":
		if ls := l.services[o.service.Id]; ls != nil && ls.version == o.version {
			ls.synced = o.version
			for _, c := range o.checks {
				if lc := l.checks[c.CheckId]; lc != nil {
					lc.remote = c.Status
				}
			}
		}
	case "check":
		if c := l.checks[o.id]; c != nil {
			c.remote = o.status
		}
	}
}

// lost records that the registry refused o because it no longer has what
// o assumed (the node or check was deregistered behind our back): the
// service is registered again in full.
func (l *local) lost(o *op) {
	switch o.kind {
	case "check":
		if c := l.checks[o.id]; c != nil {
			if ls := l.services[c.Spec().ServiceID()]; ls != nil {
				ls.synced = 0
			}
		}
		l.nodeSynced = false
	case "register":
		l.nodeSynced = false
	}
}

// reconcile compares the registry's record of this node (nil: the node is
// gone) and its checks with what the registry was last told, and marks
// every difference for writing: a service it lacks or whose checks it lost
// is registered again, a check whose stored status differs is updated, a
// service it has that the agent does not know is deregistered. Checks the
// agent does not own (the leader's serfHealth) are left alone.
func (l *local) reconcile(node *lodestonepb.NodeServices, checks []*lodestonepb.Check) {
	if node == nil {
		l.resync()
		return
	}
	remoteSvc := map[string]bool{}
	for _, s := range node.Services {
		remoteSvc[s.Id] = true
		if _, ok := l.services[s.Id]; !ok {
			l.gone[s.Id] = true
		}
	}
	remoteCheck := map[string]*lodestonepb.Check{}
	for _, c := range checks {
		remoteCheck[c.CheckId] = c
	}
	for id, ls := range l.services {
		if ls.synced == 0 {
			continue // not written yet: nothing to compare
		}
		if !remoteSvc[id] {
			ls.synced = 0
			continue
		}
		for _, cid := range ls.checks {
			rc := remoteCheck[cid]
			if rc == nil {
				ls.synced = 0
				break
			}
			l.checks[cid].remote = rc.Status
		}
	}
}

// resync forgets what the registry was told, so everything is written
// again (after the node was re-registered from scratch).
func (l *local) resync() {
	l.nodeSynced = false
	for _, ls := range l.services {
		ls.synced = 0
	}
	for _, c := range l.checks {
		c.remote = 0
	}
}

// reapable lists the services with a check that has been critical longer
// than its DeregisterCriticalServiceAfter at now, as Consul's agent reaps
// them.
func (l *local) reapable(now time.Time) []string {
	var out []string
	for _, id := range slices.Sorted(maps.Keys(l.services)) {
		for _, cid := range l.services[id].checks {
			if l.checks[cid].Reapable(now) {
				out = append(out, id)
				break
			}
		}
	}
	return out
}
