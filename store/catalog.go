package store

import (
	"slices"
	"sort"

	"github.com/google/btree"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// tables is the replicated state beside the KV tree and the members: the
// catalog, the sessions, and the KV side tables. Every table is a
// copy-on-write B-tree so a Snapshot freezes them all in O(1). Stored
// messages are immutable (a write replaces the pointer).
type tables struct {
	nodes    table[*lodestonepb.Node]         // by node name
	services table[*lodestonepb.Service]      // by node \x00 service id
	checks   table[*lodestonepb.Check]        // by node \x00 check id
	sessions table[*lodestonepb.SessionEntry] // by session id

	// tombstones: key -> index of the command that deleted it, kept for
	// TombstoneRetention indices so KVIndexFor counts deletes (see
	// index.go).
	tombstones table[uint64]
	// lockDelays: key -> unix nano (proposer clock) before which an
	// acquire is refused, set when a session holding the key is
	// invalidated.
	lockDelays table[int64]

	// nodeIdx / serviceIdx: the index of the last command that touched a
	// node (its record, services or checks) / any instance of a service
	// name (including the checks and node that count for it). A row exists
	// while the node / at least one instance exists; otherwise the table
	// index (nodesIndex / servicesIndex) answers, which is never lower.
	nodeIdx    table[uint64]
	serviceIdx table[uint64]

	nodesIndex    uint64 // last command that changed a node record
	servicesIndex uint64 // last command that changed a service record
	checksIndex   uint64 // last command that changed a check
	sessionsIndex uint64 // last command that created or removed a session
}

func newTables() tables {
	return tables{
		nodes:      newTable[*lodestonepb.Node](),
		services:   newTable[*lodestonepb.Service](),
		checks:     newTable[*lodestonepb.Check](),
		sessions:   newTable[*lodestonepb.SessionEntry](),
		tombstones: newTable[uint64](),
		lockDelays: newTable[int64](),
		nodeIdx:    newTable[uint64](),
		serviceIdx: newTable[uint64](),
	}
}

func (t tables) clone() tables {
	c := t
	c.nodes, c.services, c.checks, c.sessions = t.nodes.clone(), t.services.clone(), t.checks.clone(), t.sessions.clone()
	c.tombstones, c.lockDelays = t.tombstones.clone(), t.lockDelays.clone()
	c.nodeIdx, c.serviceIdx = t.nodeIdx.clone(), t.serviceIdx.clone()
	return c
}

// derived holds lookups computed from the KV tree and the tables. Restore
// rebuilds them (rebuildDerived); snapshots do not carry them. Iterating
// one of the maps is only allowed through sortedSet, so nothing that
// replicas must agree on depends on Go's map order.
type derived struct {
	// servicesByName: service name \x00 node \x00 id -> the same *Service as
	// in tables.services.
	servicesByName table[*lodestonepb.Service]
	nodeIDs        map[string]string              // node UUID -> node name
	nodeSessions   map[string]map[string]struct{} // node -> session ids
	checkSessions  map[string]map[string]struct{} // node \x00 check id -> session ids
	sessionKeys    map[string]map[string]struct{} // session id -> keys it holds
	tombQueue      tombQueue                      // tombstones in index order, for pruning
}

func newDerived() derived {
	return derived{
		servicesByName: newTable[*lodestonepb.Service](),
		nodeIDs:        map[string]string{},
		nodeSessions:   map[string]map[string]struct{}{},
		checkSessions:  map[string]map[string]struct{}{},
		sessionKeys:    map[string]map[string]struct{}{},
	}
}

// rebuildDerived computes the derived lookups for a restored state.
func rebuildDerived(kv *btree.BTreeG[item], t tables) derived {
	d := newDerived()
	t.services.ascend(func(_ string, s *lodestonepb.Service) bool {
		d.servicesByName.set(compositeKey(s.Name, s.Node, s.Id), s)
		return true
	})
	t.nodes.ascend(func(_ string, n *lodestonepb.Node) bool {
		if n.Id != "" {
			d.nodeIDs[n.Id] = n.Name
		}
		return true
	})
	t.sessions.ascend(func(_ string, s *lodestonepb.SessionEntry) bool {
		d.bindSession(s)
		return true
	})
	kv.Ascend(func(it item) bool {
		if s := it.r.session(); s != "" {
			addToSet(d.sessionKeys, s, string(it.key()))
		}
		return true
	})
	t.tombstones.ascend(func(k string, idx uint64) bool {
		d.tombQueue.push(idx, k)
		return true
	})
	d.tombQueue.sort()
	return d
}

func (d *derived) bindSession(s *lodestonepb.SessionEntry) {
	addToSet(d.nodeSessions, s.Node, s.Id)
	for _, c := range sessionCheckIDs(s) {
		addToSet(d.checkSessions, compositeKey(s.Node, c), s.Id)
	}
}

func (d *derived) unbindSession(s *lodestonepb.SessionEntry) {
	delFromSet(d.nodeSessions, s.Node, s.Id)
	for _, c := range sessionCheckIDs(s) {
		delFromSet(d.checkSessions, compositeKey(s.Node, c), s.Id)
	}
}

func addToSet(m map[string]map[string]struct{}, k, v string) {
	s := m[k]
	if s == nil {
		s = map[string]struct{}{}
		m[k] = s
	}
	s[v] = struct{}{}
}

func delFromSet(m map[string]map[string]struct{}, k, v string) {
	if s := m[k]; s != nil {
		delete(s, v)
		if len(s) == 0 {
			delete(m, k)
		}
	}
}

// sortedSet returns the members of m[k] sorted.
func sortedSet(m map[string]map[string]struct{}, k string) []string {
	s := m[k]
	out := make([]string, 0, len(s))
	for v := range s {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// sessionCheckIDs returns the distinct check ids a session is bound to:
// checks, node_checks and service_checks together, sorted.
func sessionCheckIDs(s *lodestonepb.SessionEntry) []string {
	ids := make([]string, 0, len(s.Checks)+len(s.NodeChecks)+len(s.ServiceChecks))
	ids = append(ids, s.Checks...)
	ids = append(ids, s.NodeChecks...)
	for _, sc := range s.ServiceChecks {
		if sc != nil {
			ids = append(ids, sc.Id)
		}
	}
	sort.Strings(ids)
	return slices.Compact(ids)
}

// --- change tracking -------------------------------------------------------

// catChanges records what one command touched in the catalog and sessions,
// for the index bumps and events finalized at its end (applier.finishCatalog).
// Each map goes from an event key to whether the row existed before the
// command (recorded at the first mark, which always precedes the first
// mutation).
type catChanges struct {
	nodes     map[string]bool // node name
	instances map[string]bool // service name \x00 node \x00 service id
	checks    map[string]bool // node \x00 check id
	sessions  map[string]bool // session id
	names     map[string]bool // service names whose serviceIdx moves
	swept     bool            // lock delays expired at a.now were pruned
}

func (a *applier) catalog() *catChanges {
	if a.cat == nil {
		a.cat = &catChanges{
			nodes: map[string]bool{}, instances: map[string]bool{}, checks: map[string]bool{},
			sessions: map[string]bool{}, names: map[string]bool{},
		}
	}
	return a.cat
}

// markNode records that node name (its record if record, else its services
// or checks) changes in this command. Call before the mutation.
func (a *applier) markNode(name string, record bool) {
	c := a.catalog()
	if _, seen := c.nodes[name]; !seen {
		_, ok := a.s.tab.nodes.get(name)
		c.nodes[name] = ok
	}
	if record {
		a.s.tab.nodesIndex = a.index
	}
}

// markInstance records that instance svc (as it is or is about to be
// stored) changes, as a record if record, else through its node or checks.
// Call before the mutation.
func (a *applier) markInstance(svc *lodestonepb.Service, record bool) {
	c := a.catalog()
	k := compositeKey(svc.Name, svc.Node, svc.Id)
	if _, seen := c.instances[k]; !seen {
		_, ok := a.s.der.servicesByName.get(k)
		c.instances[k] = ok
	}
	c.names[svc.Name] = true
	if record {
		a.s.tab.servicesIndex = a.index
	}
	a.markNode(svc.Node, false)
}

// markNodeInstances marks every instance on node (its record or a
// node-level check changes, which every instance's health includes).
func (a *applier) markNodeInstances(node string) {
	a.s.tab.services.ascendPrefix(under(node), func(_ string, s *lodestonepb.Service) bool {
		a.markInstance(s, false)
		return true
	})
}

// markCheck records that a check changes from old to cur (either may be
// nil). Call before the mutation.
func (a *applier) markCheck(old, cur *lodestonepb.Check) {
	c := a.catalog()
	for _, ch := range []*lodestonepb.Check{old, cur} {
		if ch == nil {
			continue
		}
		k := compositeKey(ch.Node, ch.CheckId)
		if _, seen := c.checks[k]; !seen {
			c.checks[k] = old != nil
		}
		a.markNode(ch.Node, false)
		if ch.ServiceId == "" {
			a.markNodeInstances(ch.Node)
		} else if svc, ok := a.s.tab.services.get(compositeKey(ch.Node, ch.ServiceId)); ok {
			a.markInstance(svc, false)
		}
	}
	a.s.tab.checksIndex = a.index
}

// markSession records that session id is created or removed. Call before
// the mutation.
func (a *applier) markSession(id string) {
	c := a.catalog()
	if _, seen := c.sessions[id]; !seen {
		_, ok := a.s.tab.sessions.get(id)
		c.sessions[id] = ok
	}
	a.s.tab.sessionsIndex = a.index
}

// finishCatalog moves the per-name indices and returns the catalog events
// of the command, sorted by key (see doc.go for the namespace).
func (a *applier) finishCatalog() []Event {
	c := a.cat
	if c == nil {
		return nil
	}
	t := &a.s.tab
	for _, name := range sortedKeys(c.nodes) {
		if _, ok := t.nodes.get(name); ok {
			t.nodeIdx.set(name, a.index)
		} else {
			t.nodeIdx.del(name)
		}
	}
	for _, name := range sortedKeys(c.names) {
		if a.hasInstances(name) {
			t.serviceIdx.set(name, a.index)
		} else {
			t.serviceIdx.del(name)
		}
	}
	var evs []Event
	emit := func(key []byte, before bool, cur proto.Message, createIndex uint64) {
		switch {
		case cur != nil:
			evs = append(evs, Event{Type: EventPut, KV: &lodestonepb.KeyValue{
				Key: key, Value: marshalEvent(cur), CreateIndex: createIndex, ModifyIndex: a.index}})
		case before:
			evs = append(evs, Event{Type: EventDelete, KV: &lodestonepb.KeyValue{Key: key, ModifyIndex: a.index}})
		}
	}
	for _, k := range sortedKeys(c.checks) {
		node, id := splitPair(k)
		if ch, ok := t.checks.get(k); ok {
			emit(CheckEventKey(node, id), c.checks[k], ch, ch.CreateIndex)
		} else {
			emit(CheckEventKey(node, id), c.checks[k], nil, 0)
		}
	}
	for _, name := range sortedKeys(c.nodes) {
		if n, ok := t.nodes.get(name); ok {
			emit(NodeEventKey(name), c.nodes[name], n, n.CreateIndex)
		} else {
			emit(NodeEventKey(name), c.nodes[name], nil, 0)
		}
	}
	for _, k := range sortedKeys(c.instances) {
		name, node, id := splitTriple(k)
		if svc, ok := a.s.der.servicesByName.get(k); ok {
			n, _ := t.nodes.get(node)
			emit(ServiceInstanceEventKey(name, node, id), c.instances[k], a.s.health(n, svc), svc.CreateIndex)
		} else {
			emit(ServiceInstanceEventKey(name, node, id), c.instances[k], nil, 0)
		}
	}
	for _, id := range sortedKeys(c.sessions) {
		if s, ok := t.sessions.get(id); ok {
			emit(SessionEventKey(id), c.sessions[id], s, s.CreateIndex)
		} else {
			emit(SessionEventKey(id), c.sessions[id], nil, 0)
		}
	}
	return evs
}

func (a *applier) hasInstances(name string) bool {
	found := false
	a.s.der.servicesByName.ascendPrefix(under(name), func(string, *lodestonepb.Service) bool {
		found = true
		return false
	})
	return found
}

func marshalEvent(m proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		// Only invalid UTF-8 in a string field can fail, and protobuf-go
		// refuses to unmarshal such a command in the first place.
		panic("store: marshal catalog event: " + err.Error())
	}
	return b
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func splitPair(k string) (string, string) {
	for i := 0; i < len(k); i++ {
		if k[i] == 0 {
			return k[:i], k[i+1:]
		}
	}
	return k, ""
}

func splitTriple(k string) (string, string, string) {
	a, rest := splitPair(k)
	b, c := splitPair(rest)
	return a, b, c
}

// --- catalog commands ------------------------------------------------------

func (a *applier) reject(res *lodestonepb.CommandResult, rule, format string, args ...any) *lodestonepb.CommandResult {
	res.Rejected = &lodestonepb.Rejection{Rule: rule, Detail: sprintf(format, args...)}
	return res
}

func (a *applier) catalogRegister(r *lodestonepb.CatalogRegisterRequest) *lodestonepb.CommandResult {
	if checkRegister(r) != nil {
		return &lodestonepb.CommandResult{}
	}
	res := &lodestonepb.CommandResult{Result: &lodestonepb.CommandResult_CatalogRegister{
		CatalogRegister: &lodestonepb.CatalogRegisterResponse{}}}
	t := &a.s.tab
	name := r.Node.Name
	_, exists := t.nodes.get(name)
	// Preconditions first: a refused registration changes nothing.
	if r.SkipNodeUpdate && !exists {
		return a.reject(res, RejectNodeMissing,
			"node %q is not registered; register it with an address (skip_node_update needs an existing node)", name)
	}
	if !r.SkipNodeUpdate && r.Node.Id != "" {
		if other, ok := a.s.der.nodeIDs[r.Node.Id]; ok && other != name {
			return a.reject(res, RejectNodeIDTaken, "node id %q already belongs to node %q; node ids are unique", r.Node.Id, other)
		}
	}
	var svc *lodestonepb.Service
	if r.Service != nil {
		svc = normalizeService(r.Service, name)
	}
	for _, c := range r.Checks {
		sid := c.ServiceId
		if sid == "" || (svc != nil && svc.Id == sid) {
			continue
		}
		if _, ok := t.services.get(compositeKey(name, sid)); !ok {
			return a.reject(res, RejectServiceMissing,
				"check %q refers to service %q, which is not registered on node %q; register the service first", checkID(c), sid, name)
		}
	}

	if !r.SkipNodeUpdate {
		a.upsertNode(r.Node)
	}
	if svc != nil {
		a.upsertService(svc)
	}
	for _, c := range r.Checks {
		a.upsertCheck(normalizeCheck(c, name))
	}
	return res
}

func checkID(c *lodestonepb.Check) string {
	if c.CheckId != "" {
		return c.CheckId
	}
	return c.Name
}

// normalizeService returns a copy of s as it is stored: id defaults to the
// name, weights to {1, 1}, node is the registration's.
func normalizeService(s *lodestonepb.Service, node string) *lodestonepb.Service {
	n := proto.CloneOf(s)
	if n.Id == "" {
		n.Id = n.Name
	}
	if n.Weights == nil {
		n.Weights = &lodestonepb.Weights{Passing: 1, Warning: 1}
	}
	n.Node = node
	n.CreateIndex, n.ModifyIndex = 0, 0
	return n
}

// normalizeCheck returns a copy of c as it is stored (before the service
// fields are filled in): id defaults to the name, node to the
// registration's, status to critical.
func normalizeCheck(c *lodestonepb.Check, node string) *lodestonepb.Check {
	n := proto.CloneOf(c)
	n.CheckId = checkID(c)
	n.Node = node
	if n.Status == lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED {
		n.Status = lodestonepb.HealthStatus_HEALTH_CRITICAL
	}
	n.CreateIndex, n.ModifyIndex = 0, 0
	return n
}

func (a *applier) upsertNode(in *lodestonepb.Node) {
	t := &a.s.tab
	n := proto.CloneOf(in)
	cur, ok := t.nodes.get(n.Name)
	if ok {
		n.CreateIndex, n.ModifyIndex = cur.CreateIndex, cur.ModifyIndex
		if proto.Equal(n, cur) {
			return // NB: an agent re-registering the same node wakes nobody
		}
	} else {
		n.CreateIndex = a.index
	}
	n.ModifyIndex = a.index
	a.markNode(n.Name, true)
	a.markNodeInstances(n.Name)
	t.nodes.set(n.Name, n)
	if ok && cur.Id != "" && a.s.der.nodeIDs[cur.Id] == cur.Name {
		a.setNodeID(cur.Id, "")
	}
	if n.Id != "" {
		a.setNodeID(n.Id, n.Name)
	}
}

func (a *applier) upsertService(svc *lodestonepb.Service) {
	t := &a.s.tab
	key := compositeKey(svc.Node, svc.Id)
	cur, ok := t.services.get(key)
	if ok {
		svc.CreateIndex, svc.ModifyIndex = cur.CreateIndex, cur.ModifyIndex
		if proto.Equal(svc, cur) {
			return
		}
	} else {
		svc.CreateIndex = a.index
	}
	svc.ModifyIndex = a.index
	if ok {
		a.markInstance(cur, true)
		if cur.Name != svc.Name {
			a.s.der.servicesByName.del(compositeKey(cur.Name, cur.Node, cur.Id))
		}
	}
	a.markInstance(svc, true)
	t.services.set(key, svc)
	a.s.der.servicesByName.set(compositeKey(svc.Name, svc.Node, svc.Id), svc)
	if ok && (cur.Name != svc.Name || !slices.Equal(cur.Tags, svc.Tags)) {
		// Checks carry a copy of their service's name and tags; keep it
		// true.
		for _, ch := range a.serviceChecks(svc.Node, svc.Id) {
			n := proto.CloneOf(ch)
			n.ServiceName, n.ServiceTags = svc.Name, slices.Clone(svc.Tags)
			n.ModifyIndex = a.index
			a.markCheck(ch, n)
			t.checks.set(compositeKey(n.Node, n.CheckId), n)
		}
	}
}

// serviceChecks returns the checks of service id on node, by check id.
func (a *applier) serviceChecks(node, id string) []*lodestonepb.Check {
	var out []*lodestonepb.Check
	a.s.tab.checks.ascendPrefix(under(node), func(_ string, c *lodestonepb.Check) bool {
		if c.ServiceId == id {
			out = append(out, c)
		}
		return true
	})
	return out
}

func (a *applier) upsertCheck(c *lodestonepb.Check) {
	t := &a.s.tab
	if c.ServiceId != "" {
		svc, _ := t.services.get(compositeKey(c.Node, c.ServiceId)) // checked by the caller
		c.ServiceName, c.ServiceTags = svc.GetName(), slices.Clone(svc.GetTags())
	} else {
		c.ServiceName, c.ServiceTags = "", nil
	}
	key := compositeKey(c.Node, c.CheckId)
	cur, ok := t.checks.get(key)
	if ok {
		c.CreateIndex, c.ModifyIndex = cur.CreateIndex, cur.ModifyIndex
		if proto.Equal(c, cur) {
			return
		}
	} else {
		c.CreateIndex = a.index
	}
	c.ModifyIndex = a.index
	a.markCheck(cur, c)
	t.checks.set(key, c)
	if c.Status == lodestonepb.HealthStatus_HEALTH_CRITICAL {
		a.invalidateCheckSessions(c.Node, c.CheckId)
	}
}

func (a *applier) checkUpdate(u *lodestonepb.UpdateCheckRequest) *lodestonepb.CommandResult {
	if checkCheckUpdate(u) != nil {
		return &lodestonepb.CommandResult{}
	}
	resp := &lodestonepb.UpdateCheckResponse{}
	res := &lodestonepb.CommandResult{Result: &lodestonepb.CommandResult_CheckUpdate{CheckUpdate: resp}}
	key := compositeKey(u.Node, u.CheckId)
	cur, ok := a.s.tab.checks.get(key)
	if !ok {
		return a.reject(res, RejectCheckMissing, "check %q is not registered on node %q; register it first", u.CheckId, u.Node)
	}
	if cur.Status == u.Status && cur.Output == u.Output {
		resp.Check = cur
		return res
	}
	n := proto.CloneOf(cur)
	n.Status, n.Output, n.ModifyIndex = u.Status, u.Output, a.index
	a.markCheck(cur, n)
	a.s.tab.checks.set(key, n)
	resp.Check = n
	if n.Status == lodestonepb.HealthStatus_HEALTH_CRITICAL {
		a.invalidateCheckSessions(n.Node, n.CheckId)
	}
	return res
}

func (a *applier) catalogDeregister(d *lodestonepb.CatalogDeregisterRequest) *lodestonepb.CommandResult {
	if checkDeregister(d) != nil {
		return &lodestonepb.CommandResult{}
	}
	resp := &lodestonepb.CatalogDeregisterResponse{}
	res := &lodestonepb.CommandResult{Result: &lodestonepb.CommandResult_CatalogDeregister{CatalogDeregister: resp}}
	st := &deregStats{}
	switch {
	case d.ServiceId == "" && d.CheckId == "":
		a.removeNode(d.Node, st)
	default:
		if d.ServiceId != "" {
			a.removeService(d.Node, d.ServiceId, st)
		}
		if d.CheckId != "" {
			a.removeCheck(d.Node, d.CheckId, st)
		}
	}
	resp.RemovedServices, resp.RemovedChecks, resp.InvalidatedSessions = st.services, st.checks, st.sessions
	return res
}

type deregStats struct{ services, checks, sessions uint32 }

func (a *applier) removeCheck(node, id string, st *deregStats) {
	key := compositeKey(node, id)
	cur, ok := a.s.tab.checks.get(key)
	if !ok {
		return
	}
	a.markCheck(cur, nil)
	a.s.tab.checks.del(key)
	st.checks++
	st.sessions += a.invalidateCheckSessions(node, id)
}

func (a *applier) removeService(node, id string, st *deregStats) {
	key := compositeKey(node, id)
	cur, ok := a.s.tab.services.get(key)
	if !ok {
		return
	}
	for _, c := range a.serviceChecks(node, id) {
		a.removeCheck(node, c.CheckId, st)
	}
	a.markInstance(cur, true)
	a.s.tab.services.del(key)
	a.s.der.servicesByName.del(compositeKey(cur.Name, cur.Node, cur.Id))
	st.services++
}

func (a *applier) removeNode(name string, st *deregStats) {
	t := &a.s.tab
	cur, ok := t.nodes.get(name)
	if !ok {
		return
	}
	for _, k := range t.services.keysWithPrefix(under(name)) {
		_, id := splitPair(k)
		a.removeService(name, id, st)
	}
	for _, k := range t.checks.keysWithPrefix(under(name)) {
		_, id := splitPair(k)
		a.removeCheck(name, id, st)
	}
	for _, id := range sortedSet(a.s.der.nodeSessions, name) {
		if a.invalidateSession(id) {
			st.sessions++
		}
	}
	a.markNode(name, true)
	t.nodes.del(name)
	if cur.Id != "" && a.s.der.nodeIDs[cur.Id] == name {
		a.setNodeID(cur.Id, "")
	}
}

// invalidateCheckSessions invalidates every session bound to the check and
// returns how many.
func (a *applier) invalidateCheckSessions(node, checkID string) uint32 {
	var n uint32
	for _, id := range sortedSet(a.s.der.checkSessions, compositeKey(node, checkID)) {
		if a.invalidateSession(id) {
			n++
		}
	}
	return n
}
