package store

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// t0 is the proposers' clock at the start of every test (unix nano).
const t0 = int64(1_700_000_000) * int64(time.Second)

const (
	PASSING  = lodestonepb.HealthStatus_HEALTH_PASSING
	WARNING  = lodestonepb.HealthStatus_HEALTH_WARNING
	CRITICAL = lodestonepb.HealthStatus_HEALTH_CRITICAL
	ANY      = lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED

	LOCK          = lodestonepb.TxnOp_LOCK
	UNLOCK        = lodestonepb.TxnOp_UNLOCK
	CHECK_SESSION = lodestonepb.TxnOp_CHECK_SESSION
)

// sid returns a deterministic session UUID.
func sid(n int) string { return fmt.Sprintf("%08x-0000-4000-8000-%012x", n, n) }

func at(now int64, c *lodestonepb.Command) *lodestonepb.Command {
	c.TimeUnixNano = now
	return c
}

func register(r *lodestonepb.CatalogRegisterRequest) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: r}}
}

func node(name string) *lodestonepb.Node {
	return &lodestonepb.Node{Name: name, Address: "10.0.0." + strings.TrimPrefix(name, "n")}
}

// regNode registers node name with its default address.
func regNode(name string) *lodestonepb.Command {
	return register(&lodestonepb.CatalogRegisterRequest{Node: node(name)})
}

// regSvc registers service id/name with tags on node name (and the node).
func regSvc(nodeName, id, name string, tags ...string) *lodestonepb.Command {
	return register(&lodestonepb.CatalogRegisterRequest{Node: node(nodeName),
		Service: &lodestonepb.Service{Id: id, Name: name, Tags: tags, Port: 8080}})
}

// regCheck registers a check (service id "" for a node check) on node.
func regCheck(nodeName, checkID, serviceID string, st lodestonepb.HealthStatus) *lodestonepb.Command {
	return register(&lodestonepb.CatalogRegisterRequest{Node: node(nodeName),
		Checks: []*lodestonepb.Check{{CheckId: checkID, Name: checkID, ServiceId: serviceID, Status: st}}})
}

func checkUpd(nodeName, checkID string, st lodestonepb.HealthStatus, output string) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_CheckUpdate{CheckUpdate: &lodestonepb.UpdateCheckRequest{
		Node: nodeName, CheckId: checkID, Status: st, Output: output}}}
}

func dereg(nodeName, serviceID, checkID string) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_CatalogDeregister{CatalogDeregister: &lodestonepb.CatalogDeregisterRequest{
		Node: nodeName, ServiceId: serviceID, CheckId: checkID}}}
}

type sessOpt func(*lodestonepb.SessionEntry)

func withChecks(ids ...string) sessOpt {
	return func(s *lodestonepb.SessionEntry) { s.NodeChecks = ids }
}
func withDelete() sessOpt {
	return func(s *lodestonepb.SessionEntry) { s.Behavior = lodestonepb.SessionBehavior_SESSION_DELETE }
}
func withTTL(d time.Duration) sessOpt {
	return func(s *lodestonepb.SessionEntry) { s.Ttl = durationpb.New(d) }
}
func withLockDelay(d time.Duration) sessOpt {
	return func(s *lodestonepb.SessionEntry) { s.LockDelay = durationpb.New(d) }
}

func sessCreate(id, nodeName string, opts ...sessOpt) *lodestonepb.Command {
	s := &lodestonepb.SessionEntry{Id: id, Node: nodeName, Name: "lock"}
	for _, o := range opts {
		o(s)
	}
	return &lodestonepb.Command{Op: &lodestonepb.Command_SessionCreate{SessionCreate: &lodestonepb.CreateSessionRequest{Session: s}}}
}

func sessDestroy(id string) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_SessionDestroy{SessionDestroy: &lodestonepb.DestroySessionRequest{Id: id}}}
}

func sessRenew(id string) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_SessionRenew{SessionRenew: &lodestonepb.RenewSessionRequest{Id: id}}}
}

func sessInvalidate(nodeName string, expiredAt int64, ids ...string) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_SessionInvalidate{SessionInvalidate: &lodestonepb.SessionInvalidate{
		Ids: ids, Node: nodeName, TtlExpiredAtUnixNano: expiredAt}}}
}

func acquireCmd(key, value, session string) *lodestonepb.Command {
	c := putCmd(key, value)
	c.GetPut().Session, c.GetPut().Acquire = session, true
	return c
}

func releaseCmd(key, value, session string) *lodestonepb.Command {
	c := putCmd(key, value)
	c.GetPut().Session, c.GetPut().Release = session, true
	return c
}

func opLock(verb lodestonepb.TxnOp_Verb, key, value, session string) *lodestonepb.TxnOp {
	o := op(verb, key)
	o.Session = session
	if value != "" {
		o.Value = []byte(value)
	}
	return o
}

// clock drives a store with consecutive indices and a proposer clock that
// the test moves by hand; every command is stamped with it.
type clock struct {
	*driver
	now int64
}

func newClock(t *testing.T) *clock { return &clock{driver: newDriver(t), now: t0} }

func (c *clock) do(cmd *lodestonepb.Command) (*lodestonepb.CommandResult, []Event) {
	c.t.Helper()
	cmd.TimeUnixNano = c.now
	return c.apply(cmd)
}

// ok applies cmds and fails the test on a malformed or rejected one.
func (c *clock) ok(cmds ...*lodestonepb.Command) {
	c.t.Helper()
	for _, cmd := range cmds {
		res, _ := c.do(cmd)
		if res.Result == nil {
			c.t.Fatalf("command %v malformed: %v", cmd, CheckCommand(cmd))
		}
		if err := ResultError(res); err != nil {
			c.t.Fatalf("command %v rejected: %v", cmd, err)
		}
	}
}

func (c *clock) advance(d time.Duration) { c.now += int64(d) }

// checkCatalogInvariants verifies what must hold after every command
// beside the KV invariants: references resolve, derived lookups equal a
// fresh rebuild (the same answer two ways), per-name index rows exist
// exactly for live names and are never below the data they cover.
//
// held maps each session to the keys the KV tree says it holds (collected
// by checkInvariants' own walk of the tree, so the tree is walked once).
func checkCatalogInvariants(t *testing.T, s *Store, held map[string]map[string]struct{}) {
	t.Helper()
	tab := &s.tab
	fail := func(format string, args ...any) { t.Helper(); t.Errorf("invariant: "+format, args...) }
	for _, ti := range []uint64{tab.nodesIndex, tab.servicesIndex, tab.checksIndex, tab.sessionsIndex} {
		if ti > s.index {
			fail("table index %d above applied %d", ti, s.index)
		}
	}
	tab.nodes.ascend(func(k string, n *lodestonepb.Node) bool {
		if k != n.Name || n.CreateIndex == 0 || n.CreateIndex > n.ModifyIndex || n.ModifyIndex > tab.nodesIndex {
			fail("node %q stored as %q c=%d m=%d nodesIndex=%d", n.Name, k, n.CreateIndex, n.ModifyIndex, tab.nodesIndex)
		}
		if i, ok := tab.nodeIdx.get(k); !ok || i < n.ModifyIndex {
			fail("node %q: nodeIdx %d (present %v) below ModifyIndex %d", k, i, ok, n.ModifyIndex)
		}
		return true
	})
	tab.nodeIdx.ascend(func(k string, _ uint64) bool {
		if _, ok := tab.nodes.get(k); !ok {
			fail("nodeIdx row for missing node %q", k)
		}
		return true
	})
	names := map[string]bool{}
	tab.services.ascend(func(k string, v *lodestonepb.Service) bool {
		names[v.Name] = true
		if k != compositeKey(v.Node, v.Id) || v.ModifyIndex > tab.servicesIndex || v.CreateIndex == 0 {
			fail("service %q/%q stored as %q", v.Node, v.Id, k)
		}
		if _, ok := tab.nodes.get(v.Node); !ok {
			fail("service %q on missing node %q", v.Id, v.Node)
		}
		if i, _ := tab.serviceIdx.get(v.Name); i < v.ModifyIndex {
			fail("serviceIdx[%q] = %d below instance ModifyIndex %d", v.Name, i, v.ModifyIndex)
		}
		if i, _ := tab.nodeIdx.get(v.Node); i < v.ModifyIndex {
			fail("nodeIdx[%q] = %d below service ModifyIndex %d", v.Node, i, v.ModifyIndex)
		}
		return true
	})
	tab.serviceIdx.ascend(func(k string, _ uint64) bool {
		if !names[k] {
			fail("serviceIdx row for service %q without instances", k)
		}
		return true
	})
	tab.checks.ascend(func(k string, c *lodestonepb.Check) bool {
		if k != compositeKey(c.Node, c.CheckId) || c.ModifyIndex > tab.checksIndex || c.CreateIndex == 0 {
			fail("check %q/%q stored as %q", c.Node, c.CheckId, k)
		}
		if _, ok := tab.nodes.get(c.Node); !ok {
			fail("check %q on missing node %q", c.CheckId, c.Node)
		}
		if i, _ := tab.nodeIdx.get(c.Node); i < c.ModifyIndex {
			fail("nodeIdx[%q] = %d below check ModifyIndex %d", c.Node, i, c.ModifyIndex)
		}
		if c.ServiceId != "" {
			svc, ok := tab.services.get(compositeKey(c.Node, c.ServiceId))
			if !ok {
				fail("check %q of missing service %q", c.CheckId, c.ServiceId)
			} else if c.ServiceName != svc.Name || !slices.Equal(c.ServiceTags, svc.Tags) {
				fail("check %q says service %q %v, service is %q %v", c.CheckId, c.ServiceName, c.ServiceTags, svc.Name, svc.Tags)
			} else if i, _ := tab.serviceIdx.get(svc.Name); i < c.ModifyIndex {
				fail("serviceIdx[%q] = %d below check ModifyIndex %d", svc.Name, i, c.ModifyIndex)
			}
		}
		if c.Status == ANY {
			fail("check %q stored without status", c.CheckId)
		}
		return true
	})
	tab.sessions.ascend(func(k string, se *lodestonepb.SessionEntry) bool {
		if k != se.Id || se.CreateIndex == 0 || se.ModifyIndex > tab.sessionsIndex {
			fail("session %q stored as %q", se.Id, k)
		}
		if _, ok := tab.nodes.get(se.Node); !ok {
			fail("session %q on missing node %q", se.Id, se.Node)
		}
		for _, c := range sessionCheckIDs(se) {
			ch, ok := tab.checks.get(compositeKey(se.Node, c))
			if !ok || ch.Status == CRITICAL {
				fail("session %q bound to missing or critical check %q", se.Id, c)
			}
		}
		return true
	})
	for _, id := range sortedKeys(held) {
		if _, ok := tab.sessions.get(id); !ok {
			fail("keys %v held by missing session %q", sortedKeys(held[id]), id)
		}
	}
	tab.tombstones.ascend(func(k string, i uint64) bool {
		if i > s.kvIndex {
			fail("tombstone of %q at %d above kvIndex %d", k, i, s.kvIndex)
		}
		return true
	})
	want := rebuildDerived(newTree(), s.tab)
	want.sessionKeys = held
	got := s.der
	if g, w := dumpTable(got.servicesByName), dumpTable(want.servicesByName); g != w {
		fail("servicesByName %s, rebuilt %s", g, w)
	}
	if !maps.Equal(got.nodeIDs, want.nodeIDs) {
		fail("nodeIDs %v, rebuilt %v", got.nodeIDs, want.nodeIDs)
	}
	for name, pair := range map[string][2]map[string]map[string]struct{}{
		"nodeSessions":  {got.nodeSessions, want.nodeSessions},
		"checkSessions": {got.checkSessions, want.checkSessions},
		"sessionKeys":   {got.sessionKeys, want.sessionKeys},
	} {
		if !maps.EqualFunc(pair[0], pair[1], func(a, b map[string]struct{}) bool { return maps.Equal(a, b) }) {
			fail("%s %v, rebuilt %v", name, pair[0], pair[1])
		}
	}
	live := map[string]uint64{}
	for _, r := range got.tombQueue.q[got.tombQueue.head:] {
		live[r.key] = max(live[r.key], r.index)
	}
	tab.tombstones.ascend(func(k string, i uint64) bool {
		if live[k] != i {
			fail("tombstone %q at %d has no queue entry (queue has %d)", k, i, live[k])
		}
		return true
	})
}

func dumpTable[T any](t table[T]) string {
	var b strings.Builder
	t.ascend(func(k string, v T) bool {
		fmt.Fprintf(&b, "%q=%v;", k, v)
		return true
	})
	return b.String()
}

// dumpCatalog renders every catalog table, side table and index
// compactly, for comparing two stores.
func dumpCatalog(s *Store) string {
	var b strings.Builder
	mo := proto.MarshalOptions{Deterministic: true}
	line := func(kind, k string, m proto.Message) {
		bs, _ := mo.Marshal(m)
		fmt.Fprintf(&b, "%s %q %x\n", kind, k, bs)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	t := s.tab
	fmt.Fprintf(&b, "nodes=%d services=%d checks=%d sessions=%d\n", t.nodesIndex, t.servicesIndex, t.checksIndex, t.sessionsIndex)
	t.nodes.ascend(func(k string, v *lodestonepb.Node) bool { line("node", k, v); return true })
	t.services.ascend(func(k string, v *lodestonepb.Service) bool { line("service", k, v); return true })
	t.checks.ascend(func(k string, v *lodestonepb.Check) bool { line("check", k, v); return true })
	t.sessions.ascend(func(k string, v *lodestonepb.SessionEntry) bool { line("session", k, v); return true })
	fmt.Fprintf(&b, "tombstones %s\nlockdelays %s\nnodeidx %s\nserviceidx %s\n",
		dumpTable(t.tombstones), dumpTable(t.lockDelays), dumpTable(t.nodeIdx), dumpTable(t.serviceIdx))
	return b.String()
}

// evKeys renders events as "put key" / "del key", NUL shown as "|".
func evKeys(evs []Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = fmt.Sprintf("%s %s", e.Type, strings.ReplaceAll(string(e.KV.Key), "\x00", "|"))
	}
	return out
}
