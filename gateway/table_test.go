package gateway

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// bareEnv builds tables without metrics or transports.
func bareEnv(shards, size, replication int, seed uint64) *tableEnv {
	return &tableEnv{
		shards:     shards,
		maxBits:    maxSubsetBits(shards, replication),
		subsetSize: size,
		seed:       seed,
		newService: func(name string) *serviceState { return &serviceState{name: name} },
		newOrigin: func(st *serviceState, in Instance, seq uint32) *origin {
			return newBareOrigin(st, in, seq, 0)
		},
		newPool:  func(shard int, o *origin) *pool { return &pool{shard: shard, origin: o} },
		newRoute: func(r Route) *routeEntry { return &routeEntry{Route: r} },
	}
}

// checkTable asserts the table's invariants and recomputes every subset
// from scratch to compare with the incrementally maintained one (STYLE
// rule 22: the same answer two ways).
func checkTable(t *testing.T, tb *table, env *tableEnv) {
	t.Helper()
	for name, s := range tb.services {
		if len(s.members) == 0 {
			t.Fatalf("service %s: published with no member", name)
		}
		if got, want := len(s.shards), env.shards; got != want {
			t.Fatalf("service %s: %d shards, want %d", name, got, want)
		}
		nsub := 1 << s.bits
		if s.bits > env.maxBits {
			t.Fatalf("service %s: %d subsets exceed the cap %d", name, nsub, 1<<env.maxBits)
		}
		seqs := map[uint32]string{}
		for id, m := range s.members {
			if other, dup := seqs[m.seq]; dup {
				t.Fatalf("service %s: %s and %s share seq %d", name, id, other, m.seq)
			}
			seqs[m.seq] = id
			if m.origin.seq != m.seq || m.origin.inst.ID != id {
				t.Fatalf("service %s: member %s and its origin disagree", name, id)
			}
		}
		// From scratch: shard i holds exactly the members whose seq maps to
		// subset i mod 2^bits, in seq order.
		held := map[*origin]int{}
		for i, sh := range s.shards {
			var want []uint32
			for seq := range seqs {
				if subsetOf(seq, s.bits) == i&(nsub-1) {
					want = append(want, seq)
				}
			}
			slices.Sort(want)
			var got []uint32
			for _, p := range sh {
				if p.shard != i {
					t.Fatalf("service %s: shard %d holds a pool of shard %d", name, i, p.shard)
				}
				if s.members[p.origin.inst.ID] == nil || s.members[p.origin.inst.ID].origin != p.origin {
					t.Fatalf("service %s: shard %d holds a pool of a stale origin %s", name, i, p.origin)
				}
				got = append(got, p.origin.seq)
				held[p.origin]++
			}
			if !slices.Equal(got, want) {
				t.Fatalf("service %s: shard %d holds seqs %v, recomputed %v", name, i, got, want)
			}
		}
		// Balance of connections: every origin is held by exactly
		// Shards/subsets pools.
		for _, m := range s.members {
			if got, want := held[m.origin], env.shards>>s.bits; got != want {
				t.Fatalf("service %s: origin %s held by %d shards, want %d", name, m.origin, got, want)
			}
		}
		if got, want := len(s.fallback), len(s.members); got != want {
			t.Fatalf("service %s: fallback has %d pools, want %d", name, got, want)
		}
	}
}

// TestTableDataDriven runs testdata/table*.txt against table.apply with bare
// constructors: no sockets, no goroutines, no clock.
//
// The DSL:
//
//	new [shards=N] [size=N] [replication=N] [seed=N] [static=name:svc:host:prefix,...]
//	    An empty table.
//	update [index=N] [reset] [reset-routes]
//	put svc=S id=I [addr=H:P] [proto=P] [unhealthy]   (one per input line)
//	del svc=S id=I
//	set svc=S ids=a,b,c        a full set of instances a, b, c
//	route name=N svc=S [host=H] [prefix=P] [strip]
//	unroute name=N
//	    Apply one update made of the input lines; print its diff.
//	subsets svc=S
//	    Print the ring: subsets, replication, and each shard's origins
//	    as id(seq).
//	match host=H path=P
//	    Print the route the request matches.
func TestTableDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/table", func(t *testing.T, path string) {
		var (
			env *tableEnv
			tb  *table
		)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "new":
				shards, size, repl, seed := 8, 2, 1, 1
				d.MaybeScanArgs(t, "shards", &shards)
				d.MaybeScanArgs(t, "size", &size)
				d.MaybeScanArgs(t, "replication", &repl)
				d.MaybeScanArgs(t, "seed", &seed)
				env = bareEnv(shards, size, repl, uint64(seed))
				var static []Route
				if d.HasArg("static") {
					var spec string
					d.ScanArgs(t, "static", &spec)
					for _, s := range strings.Split(spec, ",") {
						f := strings.Split(s, ":")
						static = append(static, Route{Name: f[0], Service: f[1], Host: f[2], PathPrefix: f[3]}.normalize())
					}
				}
				tb = emptyTable(static, env)
				return fmt.Sprintf("ok: %d shards, subsets of ≥%d, up to %d subsets\n", shards, size, 1<<env.maxBits)
			case "update":
				u := Update{Reset: d.HasArg("reset"), ResetRoutes: d.HasArg("reset-routes")}
				var idx int
				d.MaybeScanArgs(t, "index", &idx)
				u.Index = uint64(idx)
				for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
					if line == "" {
						continue
					}
					parseUpdateLine(t, &u, line)
				}
				nt, diff := tb.apply(u, env)
				checkTable(t, nt, env)
				tb = nt
				out := diff.String()
				if out == "" {
					out = "no change\n"
				}
				return fmt.Sprintf("index %d\n%s", tb.index, out)
			case "subsets":
				var svc string
				d.ScanArgs(t, "svc", &svc)
				s := tb.services[svc]
				if s == nil {
					return "no such service\n"
				}
				var b strings.Builder
				fmt.Fprintf(&b, "%d instances, %d subsets, replication %d\n", len(s.members), 1<<s.bits, env.shards>>s.bits)
				for i, sh := range s.shards {
					var ids []string
					for _, p := range sh {
						ids = append(ids, fmt.Sprintf("%s(%d)", p.origin.inst.ID, p.origin.seq))
					}
					fmt.Fprintf(&b, "shard %d: %s\n", i, strings.Join(ids, " "))
				}
				return b.String()
			case "match":
				var host, path string
				d.ScanArgs(t, "host", &host)
				d.ScanArgs(t, "path", &path)
				e := tb.router.match(host, path)
				if e == nil {
					return "no route\n"
				}
				return fmt.Sprintf("%s → %s\n", e.Name, e.Service)
			}
			t.Fatalf("unknown command %q", d.Cmd)
			return ""
		})
	})
}

func parseUpdateLine(t *testing.T, u *Update, line string) {
	t.Helper()
	f := strings.Fields(line)
	args := map[string]string{}
	for _, kv := range f[1:] {
		k, v, _ := strings.Cut(kv, "=")
		args[k] = v
	}
	inst := func(svc, id string) Instance {
		addr := args["addr"]
		if addr == "" {
			addr = "10.0.0.1:" + strconv.Itoa(8000+len(id)*7+int(id[0]))
		}
		host, port, _ := strings.Cut(addr, ":")
		p, _ := strconv.Atoi(port)
		in := Instance{Service: svc, ID: id, Address: host, Port: p, Healthy: true}
		if _, ok := args["unhealthy"]; ok {
			in.Healthy = false
		}
		if pr := args["proto"]; pr != "" {
			in.Meta = map[string]string{"protocol": pr}
		}
		return in
	}
	switch f[0] {
	case "put":
		in := inst(args["svc"], args["id"])
		u.Instances = append(u.Instances, InstanceChange{Service: args["svc"], ID: args["id"], Instance: &in})
	case "del":
		u.Instances = append(u.Instances, InstanceChange{Service: args["svc"], ID: args["id"]})
	case "set":
		set := ServiceSet{Service: args["svc"]}
		if args["ids"] != "" {
			for _, id := range strings.Split(args["ids"], ",") {
				set.Instances = append(set.Instances, inst(args["svc"], id))
			}
		}
		u.Sets = append(u.Sets, set)
	case "route":
		r := Route{Name: args["name"], Service: args["svc"], Host: args["host"], PathPrefix: args["prefix"]}
		_, r.StripPrefix = args["strip"]
		u.Routes = append(u.Routes, RouteChange{Name: r.Name, Route: &r})
	case "unroute":
		u.Routes = append(u.Routes, RouteChange{Name: args["name"]})
	default:
		t.Fatalf("unknown update line %q", line)
	}
}

var _ = maps.Keys[map[string]int]
