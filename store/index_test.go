package store

import (
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// TestKVIndexFor: a prefix's index moves with writes and deletes under it
// and with nothing else (docs/architecture.md, "A blocking query wakes only
// for what it read": every table and key range tracks the max index that
// touched it).
func TestKVIndexFor(t *testing.T) {
	d := newDriver(t)
	if got := d.s.KVIndexFor(nil, true); got != 1 {
		t.Errorf("empty store: %d, want 1 (never 0)", got)
	}
	d.applyAll(putCmd("a/1", "x"), putCmd("a/2", "x"), putCmd("b/1", "x")) // 1, 2, 3
	type q struct {
		key    string
		prefix bool
		want   uint64
	}
	check := func(step string, qs ...q) {
		t.Helper()
		for _, x := range qs {
			if got := d.s.KVIndexFor([]byte(x.key), x.prefix); got != x.want {
				t.Errorf("%s: KVIndexFor(%q, %v) = %d, want %d", step, x.key, x.prefix, got, x.want)
			}
		}
	}
	check("after puts", q{"a/", true, 2}, q{"b/", true, 3}, q{"a/1", false, 1}, q{"", true, 3}, q{"c/", true, 1}, q{"a/9", false, 1})
	d.apply(delCmd("a/2")) // 4
	check("after delete", q{"a/", true, 4}, q{"a/2", false, 4}, q{"b/", true, 3}, q{"a/1", false, 1}, q{"", true, 4})
	d.apply(putCmd("b/2", "x")) // 5
	check("after an unrelated put", q{"a/", true, 4}, q{"a/2", false, 4})
	d.apply(delPrefix("b/")) // 6
	check("after prefix delete", q{"b/", true, 6}, q{"b/1", false, 6}, q{"a/", true, 4})
	d.apply(txnCmd(opSet("a/3", "x"), op(DELETE, "a/3"))) // 7: no net change, no event
	check("after a txn with no net change", q{"a/", true, 4})
	d.apply(txnCmd(opSet("a/1", "x"), opIdx(CHECK_INDEX, "b/1", 99))) // 8: fails, rolled back
	check("after a failed txn", q{"a/", true, 4}, q{"a/1", false, 1})

	// Tombstones go after TombstoneRetention indices; the index then falls
	// back to what is left (documented: as after Consul's reaping).
	d.s.Apply(4+TombstoneRetention-1, putCmd("c/1", "x"))
	check("tombstone still kept", q{"a/", true, 4}, q{"a/2", false, 4})
	d.s.Apply(4+TombstoneRetention, putCmd("c/2", "x"))
	checkInvariants(t, d.s)
	check("tombstone of index 4 pruned", q{"a/", true, 1}, q{"a/2", false, 1}, q{"b/", true, 6})
	d.s.Apply(6+TombstoneRetention, putCmd("c/3", "x"))
	check("all pruned", q{"b/", true, 1})
	if got := d.s.tab.tombstones.len(); got != 0 {
		t.Errorf("%d tombstones left", got)
	}
}

// TestCatalogIndexIsolation: a write to another service or node does not
// raise an unrelated query's index, while everything a query's answer
// depends on does.
func TestCatalogIndexIsolation(t *testing.T) {
	c := newClock(t)
	c.ok(regSvc("n1", "web-1", "web"), regSvc("n2", "db-1", "db"), regNode("n3"),
		regCheck("n1", "web-http", "web-1", PASSING), regCheck("n2", "serfHealth", "", PASSING)) // 1..5
	type idx struct{ web, db, n1, n2, nodes, services, checks, sessions uint64 }
	read := func() idx {
		s := c.s
		return idx{s.ServiceIndex("web"), s.ServiceIndex("db"), s.NodeIndex("n1"), s.NodeIndex("n2"),
			s.NodesIndex(), s.ServicesIndex(), s.ChecksIndex(), s.SessionsIndex()}
	}
	if got, want := read(), (idx{4, 5, 4, 5, 3, 2, 5, 1}); got != want {
		t.Fatalf("start: %+v, want %+v", got, want)
	}
	steps := []struct {
		name string
		cmd  func() // applies one command at index i
		want func(i uint64, prev idx) idx
	}{
		{"db instance changes", func() { c.ok(regSvc("n2", "db-1", "db", "v2")) },
			func(i uint64, p idx) idx { p.db, p.n2, p.services = i, i, i; return p }},
		{"node check on n2 moves db, not web", func() { c.ok(checkUpd("n2", "serfHealth", WARNING, "")) },
			func(i uint64, p idx) idx { p.db, p.n2, p.checks = i, i, i; return p }},
		{"node without instances", func() { c.ok(register(nodeWithMeta("n3"))) },
			func(i uint64, p idx) idx { p.nodes = i; return p }},
		{"n1's address moves web and n1", func() { c.ok(register(nodeWithMeta("n1"))) },
			func(i uint64, p idx) idx { p.web, p.n1, p.nodes = i, i, i; return p }},
		{"KV and sessions move no catalog index", func() { c.ok(sessCreate(sid(1), "n3")) },
			func(i uint64, p idx) idx { p.sessions = i; return p }},
		{"renewal moves nothing", func() { c.ok(sessRenew(sid(1))) },
			func(i uint64, p idx) idx { return p }},
		{"last db instance gone: db falls back to ServicesIndex, never lower", func() { c.ok(dereg("n2", "db-1", "")) },
			func(i uint64, p idx) idx { p.db, p.n2, p.services = i, i, i; return p }},
		{"n2 gone: NodeIndex falls back to NodesIndex", func() { c.ok(dereg("n2", "", "")) },
			func(i uint64, p idx) idx { p.n2, p.nodes, p.checks = i, i, i; return p }},
	}
	for _, st := range steps {
		prev := read()
		st.cmd()
		if got, want := read(), st.want(c.s.Index(), prev); got != want {
			t.Errorf("%s:\n got %+v\nwant %+v", st.name, got, want)
		}
	}
}

func nodeWithMeta(name string) *lodestonepb.CatalogRegisterRequest {
	n := node(name)
	n.Meta = map[string]string{"changed": "yes"}
	return &lodestonepb.CatalogRegisterRequest{Node: n}
}

// TestIndexesNeverGoBackwards: over a random stream (no tombstone is old
// enough to be pruned), no blocking-query index ever decreases, none is 0,
// and none passes the applied index. This is what lets a blocking query
// wait for "index > wait index" and never miss a change.
func TestIndexesNeverGoBackwards(t *testing.T) {
	seed := testSeed(t)
	s := New()
	probes := map[string]func() uint64{
		"NodesIndex": s.NodesIndex, "ServicesIndex": s.ServicesIndex, "ChecksIndex": s.ChecksIndex, "SessionsIndex": s.SessionsIndex,
	}
	for _, n := range []string{"web", "db", "nope"} {
		probes["ServiceIndex "+n] = func() uint64 { return s.ServiceIndex(n) }
	}
	for _, n := range []string{"n0", "n1", "n2", "n3", "nope"} {
		probes["NodeIndex "+n] = func() uint64 { return s.NodeIndex(n) }
	}
	for _, p := range []string{"", "a", "ab", "svc/", "svc/web/1"} {
		probes["KVIndexFor prefix "+p] = func() uint64 { return s.KVIndexFor([]byte(p), true) }
	}
	probes["KVIndexFor key b/1"] = func() uint64 { return s.KVIndexFor([]byte("b/1"), false) }
	last := map[string]uint64{}
	for i, st := range randomSteps(seed, 3000) {
		run(t, s, []step{st})
		for name, f := range probes {
			got := f()
			if got == 0 || got < last[name] || (got > s.Index() && got > 1) {
				t.Fatalf("step %d (index %d): %s = %d, was %d", i, s.Index(), name, got, last[name])
			}
			last[name] = got
		}
	}
}
