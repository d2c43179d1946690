package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/gossip"
	"github.com/lodestone-kv/lodestone/store"
)

// catalogFixture is a real store fed commands in log order.
type catalogFixture struct {
	t     *testing.T
	st    *store.Store
	index uint64
}

func (f *catalogFixture) apply(cmd *lodestonepb.Command) *lodestonepb.CommandResult {
	f.t.Helper()
	f.index++
	cmd.TimeUnixNano = time.Unix(1_700_000_000, 0).Add(time.Duration(f.index) * time.Second).UnixNano()
	res, _ := f.st.Apply(f.index, cmd)
	if err := store.ResultError(res); err != nil || res.Result == nil {
		f.t.Fatalf("apply %v: %v (malformed: %v)", cmd, err, store.CheckCommand(cmd))
	}
	return res
}

func (f *catalogFixture) serf(node string) lodestonepb.HealthStatus {
	checks, _ := f.st.NodeChecks(node)
	for _, c := range checks {
		if c.CheckId == SerfCheckID {
			return c.Status
		}
	}
	return lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED
}

func regService(node, id string) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: &lodestonepb.CatalogRegisterRequest{
		Node:    &lodestonepb.Node{Name: node, Address: "127.0.0.9"},
		Service: &lodestonepb.Service{Id: id, Name: id, Port: 80},
	}}}
}

func newSession(node, id string) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_SessionCreate{SessionCreate: &lodestonepb.CreateSessionRequest{
		Session: &lodestonepb.SessionEntry{Id: id, Node: node, LockDelay: durationpb.New(0)},
	}}}
}

func gossipMember(name string, st gossip.State) gossip.Member {
	return gossip.Member{Name: name, Addr: "127.0.0.9:7946", Role: gossip.RoleAgent, State: st}
}

func kinds(cmds []*lodestonepb.Command) string {
	var out []string
	for _, c := range cmds {
		out = append(out, commandKind(c))
	}
	return strings.Join(out, ",")
}

// TestPlanGossip checks docs/architecture.md invariant 9: the leader turns a failed node into
// critical checks and invalidated sessions, and liveness costs no steady
// writes. Each case's plan is applied to the store and planned again: the
// second plan must be empty (the plan is a diff, so applying it closes it).
func TestPlanGossip(t *testing.T) {
	A, F, L := gossip.StateAlive, gossip.StateFailed, gossip.StateLeft
	cases := []struct {
		name      string
		setup     []*lodestonepb.Command
		members   []gossip.Member
		reap      bool
		wantKinds string
		wantSerf  map[string]lodestonepb.HealthStatus
	}{
		{name: "new alive member: node and passing serfHealth in one write",
			members: []gossip.Member{gossipMember("a1", A)}, wantKinds: "register",
			wantSerf: map[string]lodestonepb.HealthStatus{"a1": lodestonepb.HealthStatus_HEALTH_PASSING}},
		{name: "alive member registered by its agent: serfHealth only",
			setup: []*lodestonepb.Command{regService("a1", "web")}, members: []gossip.Member{gossipMember("a1", A)}, wantKinds: "register",
			wantSerf: map[string]lodestonepb.HealthStatus{"a1": lodestonepb.HealthStatus_HEALTH_PASSING}},
		{name: "steady state writes nothing",
			setup:   []*lodestonepb.Command{regService("a1", "web"), serfRegister(&lodestonepb.Node{Name: "a1"}, true, lodestonepb.HealthStatus_HEALTH_PASSING, serfOutputAlive)},
			members: []gossip.Member{gossipMember("a1", A)}, wantKinds: ""},
		{name: "failed member: critical, sessions invalidated",
			setup: []*lodestonepb.Command{regService("a1", "web"), serfRegister(&lodestonepb.Node{Name: "a1"}, true, lodestonepb.HealthStatus_HEALTH_PASSING, serfOutputAlive),
				newSession("a1", "00000000-0000-4000-8000-000000000001")},
			members: []gossip.Member{gossipMember("a1", F)}, wantKinds: "check,invalidate",
			wantSerf: map[string]lodestonepb.HealthStatus{"a1": lodestonepb.HealthStatus_HEALTH_CRITICAL}},
		{name: "failed member without sessions: one write",
			setup:   []*lodestonepb.Command{regService("a1", "web"), serfRegister(&lodestonepb.Node{Name: "a1"}, true, lodestonepb.HealthStatus_HEALTH_PASSING, serfOutputAlive)},
			members: []gossip.Member{gossipMember("a1", L)}, wantKinds: "check",
			wantSerf: map[string]lodestonepb.HealthStatus{"a1": lodestonepb.HealthStatus_HEALTH_CRITICAL}},
		{name: "failed member whose serfHealth is missing gets it critical",
			setup:   []*lodestonepb.Command{regService("a1", "web")},
			members: []gossip.Member{gossipMember("a1", F)}, wantKinds: "register",
			wantSerf: map[string]lodestonepb.HealthStatus{"a1": lodestonepb.HealthStatus_HEALTH_CRITICAL}},
		{name: "failed member not in the catalog: nothing",
			members: []gossip.Member{gossipMember("a1", F)}, wantKinds: ""},
		{name: "member back alive: passing again",
			setup:   []*lodestonepb.Command{regService("a1", "web"), serfRegister(&lodestonepb.Node{Name: "a1"}, true, lodestonepb.HealthStatus_HEALTH_CRITICAL, serfOutputFailed)},
			members: []gossip.Member{gossipMember("a1", A)}, wantKinds: "check",
			wantSerf: map[string]lodestonepb.HealthStatus{"a1": lodestonepb.HealthStatus_HEALTH_PASSING}},
		{name: "unknown to the pool: left alone before the reap grace",
			setup:   []*lodestonepb.Command{regService("ghost", "web"), serfRegister(&lodestonepb.Node{Name: "ghost"}, true, lodestonepb.HealthStatus_HEALTH_PASSING, serfOutputAlive)},
			members: []gossip.Member{gossipMember("a1", A)}, wantKinds: "register",
			wantSerf: map[string]lodestonepb.HealthStatus{"ghost": lodestonepb.HealthStatus_HEALTH_PASSING}},
		{name: "unknown to the pool: critical after the reap grace",
			setup:   []*lodestonepb.Command{regService("ghost", "web"), serfRegister(&lodestonepb.Node{Name: "ghost"}, true, lodestonepb.HealthStatus_HEALTH_PASSING, serfOutputAlive)},
			members: nil, reap: true, wantKinds: "check",
			wantSerf: map[string]lodestonepb.HealthStatus{"ghost": lodestonepb.HealthStatus_HEALTH_CRITICAL}},
		{name: "nodes without serfHealth are not the pool's business",
			setup: []*lodestonepb.Command{regService("external", "db")}, reap: true, wantKinds: ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &catalogFixture{t: t, st: store.New()}
			for _, c := range tc.setup {
				f.apply(c)
			}
			plan := planGossip(tc.members, f.st, tc.reap)
			if got := kinds(plan); got != tc.wantKinds {
				t.Fatalf("plan = %q, want %q (%v)", got, tc.wantKinds, plan)
			}
			for _, c := range plan {
				f.apply(c)
			}
			for node, want := range tc.wantSerf {
				if got := f.serf(node); got != want {
					t.Fatalf("serfHealth of %s = %v, want %v", node, got, want)
				}
			}
			for _, m := range tc.members {
				if m.State != gossip.StateAlive {
					if ss, _ := f.st.NodeSessions(m.Name); len(ss) != 0 {
						t.Fatalf("failed node %s still has sessions %v", m.Name, ss)
					}
				}
			}
			if again := planGossip(tc.members, f.st, tc.reap); len(again) != 0 {
				t.Fatalf("plan after applying the plan = %s, want nothing", kinds(again))
			}
		})
	}
}

func TestPlanGossipManyHealthyNodesWritesNothing(t *testing.T) {
	f := &catalogFixture{t: t, st: store.New()}
	var ms []gossip.Member
	for i := range 100 {
		name := fmt.Sprintf("a%03d", i)
		ms = append(ms, gossipMember(name, gossip.StateAlive))
		f.apply(regService(name, "svc"))
	}
	for _, c := range planGossip(ms, f.st, true) {
		f.apply(c)
	}
	before := f.st.Index()
	for range 3 {
		if plan := planGossip(ms, f.st, true); len(plan) != 0 {
			t.Fatalf("steady plan = %s", kinds(plan))
		}
	}
	if got := f.st.Index(); got != before {
		t.Fatalf("index moved from %d to %d", before, got)
	}
}
