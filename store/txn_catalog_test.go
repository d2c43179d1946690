package store

import (
	"strings"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

func catalogTxn(ops ...*lodestonepb.MixedTxnOp) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_CatalogTxn{CatalogTxn: &lodestonepb.CatalogTxnRequest{Ops: ops}}}
}

func kvOp(o *lodestonepb.TxnOp) *lodestonepb.MixedTxnOp {
	return &lodestonepb.MixedTxnOp{Op: &lodestonepb.MixedTxnOp_Kv{Kv: o}}
}

func catOp(verb lodestonepb.TxnOp_Verb, index uint64, n *lodestonepb.Node, s *lodestonepb.Service, c *lodestonepb.Check) *lodestonepb.MixedTxnOp {
	return &lodestonepb.MixedTxnOp{Op: &lodestonepb.MixedTxnOp_Catalog{Catalog: &lodestonepb.CatalogTxnOp{
		Verb: verb, Index: index, Node: n, Service: s, Check: c}}}
}

// dumpAll renders the whole replicated state but the applied index.
func dumpAll(s *Store) string {
	var b strings.Builder
	b.WriteString(dumpCatalog(s))
	kvs, _, _ := s.Range(nil, nil, 0, false)
	for _, kv := range kvs {
		b.WriteString(kv.String() + "\n")
	}
	return b.String()
}

// Node, service, check and KV operations in one command: each sees the
// earlier ones, and the results carry the objects as stored.
func TestCatalogTxnAppliesInOrder(t *testing.T) {
	c := newClock(t)
	res, evs := c.do(catalogTxn(
		catOp(lodestonepb.TxnOp_SET, 0, &lodestonepb.Node{Name: "n1", Address: "10.0.0.1", Id: "11111111-2222-4333-8444-555555555555"}, nil, nil),
		catOp(lodestonepb.TxnOp_SET, 0, nil, &lodestonepb.Service{Node: "n1", Id: "web-1", Name: "web", Port: 80}, nil),
		catOp(lodestonepb.TxnOp_SET, 0, nil, nil, &lodestonepb.Check{Node: "n1", CheckId: "web-1-alive", ServiceId: "web-1", Status: PASSING}),
		kvOp(opSet("cfg/web", "on")),
		catOp(lodestonepb.TxnOp_GET, 0, nil, &lodestonepb.Service{Node: "n1", Id: "web-1"}, nil),
	))
	out := res.GetCatalogTxn()
	if !out.GetSucceeded() || len(out.Results) != 5 {
		t.Fatalf("txn: %v", res)
	}
	idx := c.s.Index()
	if n := out.Results[0].Node; n.GetName() != "n1" || n.ModifyIndex != idx {
		t.Errorf("node result %v", n)
	}
	if s := out.Results[1].Service; s.GetId() != "web-1" || s.Node != "n1" || s.ModifyIndex != idx {
		t.Errorf("service result %v", s)
	}
	if ch := out.Results[2].Check; ch.GetServiceName() != "web" || ch.Status != PASSING {
		t.Errorf("check result %v", ch)
	}
	if kv := out.Results[3].Kv.GetKv(); string(kv.GetKey()) != "cfg/web" {
		t.Errorf("kv result %v", out.Results[3])
	}
	if s := out.Results[4].Service; s.GetName() != "web" {
		t.Errorf("service get %v", s)
	}
	hs, _ := c.s.HealthService("web", nil, true)
	if len(hs) != 1 || len(evs) == 0 {
		t.Fatalf("passing web instances %v, events %v", hs, evKeys(evs))
	}
	// CAS by the ModifyIndex just read, then a stale CAS.
	res, _ = c.do(catalogTxn(catOp(lodestonepb.TxnOp_CAS, idx, nil, &lodestonepb.Service{Node: "n1", Id: "web-1", Name: "web", Port: 81}, nil)))
	if !res.GetCatalogTxn().GetSucceeded() {
		t.Fatalf("cas at the current index: %v", res)
	}
	res, _ = c.do(catalogTxn(catOp(lodestonepb.TxnOp_CAS, idx, nil, &lodestonepb.Service{Node: "n1", Id: "web-1", Name: "web", Port: 82}, nil)))
	if errs := res.GetCatalogTxn().GetErrors(); len(errs) != 1 || errs[0].What != `failed to set service "web-1" on node "n1", index is stale` {
		t.Fatalf("stale cas: %v", res)
	}
	// delete-cas of the node removes it with its service and check.
	ns, _ := c.s.Node("n1")
	res, _ = c.do(catalogTxn(catOp(lodestonepb.TxnOp_DELETE_CAS, ns.Node.ModifyIndex, &lodestonepb.Node{Name: "n1"}, nil, nil)))
	if !res.GetCatalogTxn().GetSucceeded() {
		t.Fatalf("delete-cas: %v", res)
	}
	if ns, _ := c.s.Node("n1"); ns != nil {
		t.Fatalf("node after delete-cas: %v", ns)
	}
}

// A failing operation undoes everything the command did before it: keys,
// the catalog, sessions it invalidated and the locks they held, node ids
// and every derived lookup (checkInvariants compares those with a fresh
// rebuild after each command), and it emits no event.
func TestCatalogTxnFailureChangesNothing(t *testing.T) {
	c := newClock(t)
	c.ok(
		register(&lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: "n1", Address: "10.0.0.1", Id: "11111111-2222-4333-8444-555555555555"},
			Service: &lodestonepb.Service{Id: "db-1", Name: "db"},
			Checks:  []*lodestonepb.Check{{CheckId: "alive", Status: PASSING}}}),
		sessCreate(sid(1), "n1", withChecks("alive")),
		acquireCmd("locks/db", "leader", sid(1)),
		putCmd("k", "v1"),
	)
	before := dumpAll(c.s)
	res, evs := c.do(catalogTxn(
		kvOp(opSet("k", "v2")),
		kvOp(opSet("new", "x")),
		catOp(lodestonepb.TxnOp_SET, 0, &lodestonepb.Node{Name: "n2", Address: "10.0.0.2", Id: "99999999-2222-4333-8444-555555555555"}, nil, nil),
		catOp(lodestonepb.TxnOp_SET, 0, nil, nil, &lodestonepb.Check{Node: "n1", CheckId: "alive", Status: CRITICAL}), // invalidates the session
		catOp(lodestonepb.TxnOp_DELETE, 0, &lodestonepb.Node{Name: "n1"}, nil, nil),
		catOp(lodestonepb.TxnOp_SET, 0, &lodestonepb.Node{Name: "n3", Address: "10.0.0.3", Id: "11111111-2222-4333-8444-555555555555"}, nil, nil),
		catOp(lodestonepb.TxnOp_GET, 0, nil, &lodestonepb.Service{Node: "n9", Id: "nope"}, nil),
	))
	out := res.GetCatalogTxn()
	if out.GetSucceeded() || len(out.Errors) != 1 || out.Errors[0].OpIndex != 6 || out.Errors[0].What != `service "nope" on node "n9" doesn't exist` {
		t.Fatalf("txn: %v", res)
	}
	if len(evs) != 0 {
		t.Fatalf("a failed txn emitted %v", evKeys(evs))
	}
	if after := dumpAll(c.s); after != before {
		t.Fatalf("state changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if kv, _ := c.s.Get([]byte("locks/db")); kv == nil || kv.Session != sid(1) {
		t.Fatalf("lock after the failed txn: %v", kv)
	}
	// The undone bindings are live: the check going critical now
	// invalidates the session and frees the lock.
	c.ok(checkUpd("n1", "alive", CRITICAL, ""))
	if kv, _ := c.s.Get([]byte("locks/db")); kv == nil || kv.Session != "" {
		t.Fatalf("lock after its session's check failed: %v", kv)
	}
	// n2's id was never taken.
	c.ok(register(&lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: "n4", Address: "10.0.0.4", Id: "99999999-2222-4333-8444-555555555555"}}))
}

// Malformed catalog operations are refused before anything runs, with
// the operation's position.
func TestCatalogTxnMalformed(t *testing.T) {
	cases := []struct {
		op   *lodestonepb.MixedTxnOp
		want string
	}{
		{catOp(lodestonepb.TxnOp_SET, 0, nil, nil, nil), "names exactly one"},
		{catOp(lodestonepb.TxnOp_SET, 0, &lodestonepb.Node{Name: "n"}, &lodestonepb.Service{Node: "n", Name: "s"}, nil), "names exactly one"},
		{catOp(lodestonepb.TxnOp_LOCK, 0, &lodestonepb.Node{Name: "n", Address: "a"}, nil, nil), "not a catalog operation"},
		{catOp(lodestonepb.TxnOp_SET, 3, &lodestonepb.Node{Name: "n", Address: "a"}, nil, nil), "index is not used"},
		{catOp(lodestonepb.TxnOp_SET, 0, nil, &lodestonepb.Service{Name: "s"}, nil), "node"},
		{&lodestonepb.MixedTxnOp{}, "empty"},
	}
	for _, tc := range cases {
		cmd := catalogTxn(kvOp(opSet("k", "v")), tc.op)
		err := CheckCommand(cmd)
		if err == nil || !strings.Contains(err.Error(), "txn op 1") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want txn op 1 and %q", tc.op, err, tc.want)
		}
		d := newDriver(t)
		cmd.TimeUnixNano = t0
		if res, _ := d.apply(cmd); res.Result != nil {
			t.Errorf("%v applied: %v", tc.op, res)
		}
		if kv, _ := d.s.Get([]byte("k")); kv != nil {
			t.Errorf("%v: a malformed txn wrote %v", tc.op, kv)
		}
	}
	// What the limits refuse in a registration they refuse in a txn op.
	for _, op := range []*lodestonepb.MixedTxnOp{
		catOp(lodestonepb.TxnOp_SET, 0, nil, &lodestonepb.Service{Node: "n", Name: "s", Port: 1 << 20}, nil),
		catOp(lodestonepb.TxnOp_SET, 0, &lodestonepb.Node{Name: "n"}, nil, nil),
	} {
		cmd := catalogTxn(kvOp(opSet("k", "v")), op)
		cmd.TimeUnixNano = t0
		if err := DefaultLimits().ValidateCommand(cmd); err == nil || !strings.Contains(err.Error(), "txn op 1") {
			t.Errorf("%v passed the limits: %v", op, err)
		}
	}
}
