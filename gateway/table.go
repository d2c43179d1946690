package gateway

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// table is one immutable version of the routing table. The gateway holds
// the current one in an atomic.Pointer: requests Load it and never lock;
// the single updater goroutine computes the next version with apply (a
// plain method: no goroutines, no I/O, no clock) and Stores it.
//
// Versions share what did not change: a service that an update does not
// touch is the same *service in both, and within a touched service only
// the shards whose subset changed get new slices. The mutable per-origin
// state (in-flight count, outlier state, pools) lives in *origin and *pool
// objects that versions share by pointer; nothing reachable from a
// published table is ever written except through those objects' atomics.
type table struct {
	index    uint64
	static   []*routeEntry          // routes file, never changed by updates
	routes   map[string]*routeEntry // registry routes by name
	router   *router
	services map[string]*service
}

// service is one version of a service: its healthy instances, their ring
// positions and the per-shard subsets.
type service struct {
	name    string
	state   *serviceState      // shared by every version of the service
	members map[string]*member // by instance id
	seqs    seqAlloc
	bits    int       // log2 of the number of subsets
	shards  [][]*pool // shards[i]: the pools of shard i's subset, by seq
	// fallback holds one pool per member (from the first shard of its
	// subset), by seq: used when every origin of a shard's subset is
	// ejected or at its limit.
	fallback []*pool
}

// member is one healthy instance on the ring.
type member struct {
	inst   Instance
	seq    uint32
	origin *origin
}

// tableEnv is what apply needs from outside: the ring's shape and
// constructors for the stateful objects a new version may need. Tests use
// bare constructors; the gateway's attach metrics and transports.
type tableEnv struct {
	shards     int
	maxBits    int
	subsetSize int
	seed       uint64

	newService func(name string) *serviceState
	newOrigin  func(st *serviceState, inst Instance, seq uint32) *origin
	newPool    func(shard int, o *origin) *pool
	newRoute   func(r Route) *routeEntry
}

// tableDiff says what an apply changed, for logs, tests and the shell's
// clean-up (closing pools, deleting metric series).
type tableDiff struct {
	routesUpserted []string
	routesRemoved  []string
	rejected       []string // invalid instances or routes, with the reason
	services       []serviceDiff

	closedPools    []*pool       // the shell closes their idle connections
	removedOrigins []*origin     // the shell deletes their metric series
	removedRoutes  []*routeEntry // likewise
}

type serviceDiff struct {
	name                     string
	added, removed, replaced []string
	bitsFrom, bitsTo         int // -1: the service did not exist
	subsetsTouched           []int
	poolsOpened, poolsClosed int
	size                     int // instances after
}

// emptyTable returns the table before any update, with static routes.
func emptyTable(static []Route, env *tableEnv) *table {
	t := &table{routes: map[string]*routeEntry{}, services: map[string]*service{}}
	for _, r := range static {
		t.static = append(t.static, env.newRoute(r))
	}
	t.router = newRouter(t.static)
	return t
}

// svcChange collects an update's changes to one service.
type svcChange struct {
	full bool                 // replace the whole set
	want map[string]*Instance // id → desired instance (nil: remove)
}

// apply returns the table after u, and what changed. t is not modified.
func (t *table) apply(u Update, env *tableEnv) (*table, *tableDiff) {
	d := &tableDiff{}
	nt := &table{index: max(t.index, u.Index), static: t.static, routes: t.routes, router: t.router, services: t.services}
	if u.Reset {
		// NB: a Reset may go back (a registry restored from a snapshot):
		// resume from its index, not from a newer one it never had.
		nt.index = u.Index
	}

	// Routes.
	if u.Reset || u.ResetRoutes || len(u.Routes) > 0 {
		routes := make(map[string]*routeEntry, len(t.routes))
		if !u.Reset && !u.ResetRoutes {
			maps.Copy(routes, t.routes)
		}
		for _, rc := range u.Routes {
			if rc.Route == nil {
				delete(routes, rc.Name)
				continue
			}
			r := *rc.Route
			r.Name = rc.Name
			if err := r.Validate(); err != nil {
				d.rejected = append(d.rejected, err.Error())
				delete(routes, rc.Name)
				continue
			}
			r = r.normalize()
			if old, ok := t.routes[r.Name]; ok && old.Route == r {
				routes[r.Name] = old // unchanged: keep its metrics
				continue
			}
			routes[r.Name] = env.newRoute(r)
		}
		for name, old := range t.routes {
			if routes[name] != old {
				d.removedRoutes = append(d.removedRoutes, old)
				if routes[name] == nil {
					d.routesRemoved = append(d.routesRemoved, name)
				}
			}
		}
		for name, e := range routes {
			if t.routes[name] != e {
				d.routesUpserted = append(d.routesUpserted, name)
			}
		}
		sort.Strings(d.routesUpserted)
		sort.Strings(d.routesRemoved)
		nt.routes = routes
		// Registry routes override static ones of the same name.
		entries := slices.Collect(maps.Values(routes))
		for _, s := range t.static {
			if _, ok := routes[s.Name]; !ok {
				entries = append(entries, s)
			}
		}
		nt.router = newRouter(entries)
	}

	// Instances, grouped by service.
	changes := map[string]*svcChange{}
	get := func(name string) *svcChange {
		c := changes[name]
		if c == nil {
			c = &svcChange{want: map[string]*Instance{}}
			changes[name] = c
		}
		return c
	}
	if u.Reset {
		for name := range t.services {
			get(name).full = true
		}
	}
	for _, set := range u.Sets {
		c := get(set.Service)
		c.full = true
		clear(c.want)
		for _, in := range set.Instances {
			in.Service = set.Service
			c.want[in.ID] = &in
		}
	}
	for _, ic := range u.Instances {
		c := get(ic.Service)
		if ic.Instance != nil {
			in := *ic.Instance
			in.Service, in.ID = ic.Service, ic.ID
			c.want[ic.ID] = &in
		} else {
			c.want[ic.ID] = nil
		}
	}
	if u.Reset {
		// Everything not mentioned is gone: mark services with no
		// instances in the update as full and empty.
		for name := range changes {
			changes[name].full = true
		}
	}
	if len(changes) > 0 {
		nt.services = maps.Clone(t.services)
		names := slices.Sorted(maps.Keys(changes))
		for _, name := range names {
			old := t.services[name]
			ns := old.apply(name, changes[name], env, d)
			if ns == nil {
				delete(nt.services, name)
			} else {
				nt.services[name] = ns
			}
		}
	}
	return nt, d
}

// apply returns the service after ch (nil when it has no instance left).
// s may be nil (a new service).
func (s *service) apply(name string, ch *svcChange, env *tableEnv, d *tableDiff) *service {
	sd := serviceDiff{name: name, bitsFrom: -1}
	ns := &service{name: name, members: map[string]*member{}}
	if s != nil {
		sd.bitsFrom = s.bits
		ns.state = s.state
		ns.members = maps.Clone(s.members)
		ns.seqs = s.seqs.clone()
		ns.bits = s.bits
	}
	if ns.state == nil {
		ns.state = env.newService(name)
	}
	want := ch.want
	if ch.full && s != nil {
		for id := range s.members {
			if _, ok := want[id]; !ok {
				want[id] = nil
			}
		}
	}

	// Decide, then remove first so that adds reuse the freed seqs (and so
	// land in the subsets that just lost an origin).
	touchedSeqs := map[uint32]bool{}
	var adds []*Instance
	for _, id := range slices.Sorted(maps.Keys(want)) {
		in := want[id]
		if in != nil && in.Healthy {
			if err := in.Validate(); err != nil {
				d.rejected = append(d.rejected, err.Error())
				in = nil
			}
		}
		old := ns.members[id]
		switch {
		case in == nil || !in.Healthy:
			if old != nil {
				delete(ns.members, id)
				ns.seqs.put(old.seq)
				touchedSeqs[old.seq] = true
				sd.removed = append(sd.removed, id)
				d.removedOrigins = append(d.removedOrigins, old.origin)
			}
		case old != nil && sameEndpoint(old.inst, *in):
			// A re-registration that changes nothing keeps everything.
		case old != nil:
			// Same id, new address or meta: new origin, same ring slot.
			ns.members[id] = &member{inst: *in, seq: old.seq, origin: env.newOrigin(ns.state, *in, old.seq)}
			touchedSeqs[old.seq] = true
			sd.replaced = append(sd.replaced, id)
			d.removedOrigins = append(d.removedOrigins, old.origin)
		default:
			adds = append(adds, in)
		}
	}
	slices.SortFunc(adds, func(a, b *Instance) int {
		return cmp.Or(cmp.Compare(shuffleKey(env.seed, a.ID), shuffleKey(env.seed, b.ID)), strings.Compare(a.ID, b.ID))
	})
	for _, in := range adds {
		seq := ns.seqs.take()
		m := &member{inst: *in, seq: seq, origin: env.newOrigin(ns.state, *in, seq)}
		ns.members[in.ID] = m
		touchedSeqs[m.seq] = true
		sd.added = append(sd.added, in.ID)
	}
	sd.size = len(ns.members)

	var oldShards [][]*pool
	if s != nil {
		oldShards = s.shards
	}
	if len(ns.members) == 0 {
		for _, sh := range oldShards {
			for _, p := range sh {
				d.closedPools = append(d.closedPools, p)
				sd.poolsClosed++
			}
		}
		sd.bitsTo = -1
		d.services = append(d.services, sd)
		return nil
	}

	prev := -1
	if s != nil {
		prev = s.bits
	}
	ns.bits = subsetBits(len(ns.members), prev, env.maxBits, env.subsetSize)
	sd.bitsTo = ns.bits
	nsub := 1 << ns.bits
	touched := map[int]bool{}
	if s == nil || ns.bits != s.bits {
		for j := range nsub {
			touched[j] = true
		}
	} else {
		for seq := range touchedSeqs {
			touched[subsetOf(seq, ns.bits)] = true
		}
	}
	sd.subsetsTouched = slices.Sorted(maps.Keys(touched))

	// Members of the touched subsets, by seq.
	buckets := map[int][]*member{}
	for _, m := range ns.members {
		if j := subsetOf(m.seq, ns.bits); touched[j] {
			buckets[j] = append(buckets[j], m)
		}
	}
	for _, b := range buckets {
		slices.SortFunc(b, func(x, y *member) int { return cmp.Compare(x.seq, y.seq) })
	}

	ns.shards = make([][]*pool, env.shards)
	if oldShards != nil {
		copy(ns.shards, oldShards)
	}
	for i := range env.shards {
		j := i & (nsub - 1)
		if !touched[j] {
			continue
		}
		reuse := map[*origin]*pool{}
		if oldShards != nil {
			for _, p := range oldShards[i] {
				reuse[p.origin] = p
			}
		}
		list := make([]*pool, 0, len(buckets[j]))
		for _, m := range buckets[j] {
			p := reuse[m.origin]
			if p != nil {
				delete(reuse, m.origin)
			} else {
				p = env.newPool(i, m.origin)
				sd.poolsOpened++
			}
			list = append(list, p)
		}
		for _, p := range reuse {
			d.closedPools = append(d.closedPools, p)
			sd.poolsClosed++
		}
		ns.shards[i] = list
	}

	// Fallback: each member's pool in the first shard of its subset.
	ns.fallback = make([]*pool, 0, len(ns.members))
	for j := range nsub {
		ns.fallback = append(ns.fallback, ns.shards[j]...)
	}
	slices.SortFunc(ns.fallback, func(x, y *pool) int { return cmp.Compare(x.origin.seq, y.origin.seq) })

	slices.Sort(sd.added)
	slices.Sort(sd.removed)
	slices.Sort(sd.replaced)
	d.services = append(d.services, sd)
	return ns
}

// String renders the diff on one line per part, for logs and tests.
func (d *tableDiff) String() string {
	var b strings.Builder
	if len(d.routesUpserted) > 0 {
		fmt.Fprintf(&b, "routes upserted: %s\n", strings.Join(d.routesUpserted, " "))
	}
	if len(d.routesRemoved) > 0 {
		fmt.Fprintf(&b, "routes removed: %s\n", strings.Join(d.routesRemoved, " "))
	}
	for _, r := range d.rejected {
		fmt.Fprintf(&b, "rejected: %s\n", r)
	}
	for _, s := range d.services {
		fmt.Fprintf(&b, "service %s: size=%d", s.name, s.size)
		if len(s.added) > 0 {
			fmt.Fprintf(&b, " +%s", strings.Join(s.added, ","))
		}
		if len(s.removed) > 0 {
			fmt.Fprintf(&b, " -%s", strings.Join(s.removed, ","))
		}
		if len(s.replaced) > 0 {
			fmt.Fprintf(&b, " ~%s", strings.Join(s.replaced, ","))
		}
		if s.bitsFrom != s.bitsTo {
			fmt.Fprintf(&b, " subsets %s→%s", subsetsString(s.bitsFrom), subsetsString(s.bitsTo))
		}
		if len(s.subsetsTouched) > 0 {
			fmt.Fprintf(&b, " touched=%v", s.subsetsTouched)
		}
		fmt.Fprintf(&b, " pools +%d -%d\n", s.poolsOpened, s.poolsClosed)
	}
	return b.String()
}

func subsetsString(bits int) string {
	if bits < 0 {
		return "none"
	}
	return fmt.Sprint(1 << bits)
}
