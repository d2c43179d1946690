package gateway

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestOutlierDataDriven runs testdata/outlier/*.txt: outlier ejection on a
// service of bare origins, with time stepped by hand.
//
// The DSL:
//
//	new origins=a,b,c [consecutive=N] [base=D] [max=D] [decay=D] [pct=N]
//	    A service of the named origins (defaults: 3, 10s, 40s, 30s, 50).
//	fail o=X [n=N]
//	ok o=X
//	    Record N failed (or one successful) attempts on X; print what
//	    each did.
//	advance d=D
//	    Move the clock.
//	state
//	    Print each origin: ejected or not (and until when), its
//	    multiplier and failure run.
//	pick [n=N]
//	    Run N picks (default 1000) with a seeded source; print how many
//	    each origin got (ejected origins get none).
func TestOutlierDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/outlier", func(t *testing.T, path string) {
		var (
			cfg   OutlierConfig
			svc   *service
			start = time.Unix(1000, 0)
			now   time.Time
		)
		origin := func(d *datadriven.TestData) *origin {
			var id string
			d.ScanArgs(t, "o", &id)
			m := svc.members[id]
			if m == nil {
				t.Fatalf("no origin %q", id)
			}
			return m.origin
		}
		rel := func(at time.Time) string { return "+" + at.Sub(start).String() }
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			var b strings.Builder
			switch d.Cmd {
			case "new":
				cfg = OutlierConfig{Consecutive: 3, BaseEjection: 10 * time.Second, MaxEjection: 40 * time.Second, Decay: 30 * time.Second, MaxEjectedPercent: 50}
				var ids string
				d.ScanArgs(t, "origins", &ids)
				d.MaybeScanArgs(t, "consecutive", &cfg.Consecutive)
				d.MaybeScanArgs(t, "pct", &cfg.MaxEjectedPercent)
				for _, f := range []struct {
					k string
					p *time.Duration
				}{{"base", &cfg.BaseEjection}, {"max", &cfg.MaxEjection}, {"decay", &cfg.Decay}} {
					if d.HasArg(f.k) {
						var s string
						d.ScanArgs(t, f.k, &s)
						v, err := time.ParseDuration(s)
						if err != nil {
							t.Fatal(err)
						}
						*f.p = v
					}
				}
				env := bareEnv(4, 100, 1, 1)
				var u Update
				for i, id := range strings.Split(ids, ",") {
					in := Instance{Address: "10.0.0.1", Port: 8000 + i, Healthy: true}
					u.Instances = append(u.Instances, InstanceChange{Service: "svc", ID: id, Instance: &in})
				}
				tb, _ := emptyTable(nil, env).apply(u, env)
				svc = tb.services["svc"]
				now = start
				fmt.Fprintf(&b, "%d origins, at most %d ejected at once\n", len(svc.members), maxEjected(len(svc.members), cfg.MaxEjectedPercent))
			case "fail", "ok":
				o := origin(d)
				n := 1
				d.MaybeScanArgs(t, "n", &n)
				for range n {
					res, dur := recordResult(cfg, svc, o, d.Cmd == "fail", now)
					switch res {
					case outcomeNone:
						fmt.Fprintf(&b, "%s: ok\n", o.inst.ID)
					case outcomeIgnored:
						fmt.Fprintf(&b, "%s: failure ignored\n", o.inst.ID)
					case outcomeCounted:
						fmt.Fprintf(&b, "%s: failure counted (run %d)\n", o.inst.ID, o.out.consecutive)
					case outcomeEjected:
						fmt.Fprintf(&b, "%s: ejected for %s (until %s)\n", o.inst.ID, dur, rel(o.out.ejectedUntil))
					case outcomeCapped:
						fmt.Fprintf(&b, "%s: would be ejected, but the service is at its cap\n", o.inst.ID)
					}
				}
			case "advance":
				var s string
				d.ScanArgs(t, "d", &s)
				v, err := time.ParseDuration(s)
				if err != nil {
					t.Fatal(err)
				}
				now = now.Add(v)
				fmt.Fprintf(&b, "now %s\n", rel(now))
			case "state":
				ids := make([]string, 0, len(svc.members))
				for id := range svc.members {
					ids = append(ids, id)
				}
				slices.Sort(ids)
				for _, id := range ids {
					o := svc.members[id].origin
					o.out.decay(cfg, now)
					st := "in"
					if !o.available(now.UnixNano()) {
						st = "ejected until " + rel(o.out.ejectedUntil)
					}
					fmt.Fprintf(&b, "%s: %s, multiplier %d, run %d\n", id, st, o.out.multiplier, o.out.consecutive)
				}
			case "pick":
				n := 1000
				d.MaybeScanArgs(t, "n", &n)
				rng := rand.New(rand.NewPCG(1, 2))
				counts := map[string]int{}
				for range n {
					p := svc.choose(0, now.UnixNano(), nil, rng.IntN)
					if p == nil {
						counts["(none)"]++
						continue
					}
					counts[p.origin.inst.ID]++
					p.origin.release()
				}
				keys := make([]string, 0, len(counts))
				for k := range counts {
					keys = append(keys, k)
				}
				slices.Sort(keys)
				for _, k := range keys {
					fmt.Fprintf(&b, "%s: %d\n", k, counts[k])
				}
			default:
				t.Fatalf("unknown command %q", d.Cmd)
			}
			return b.String()
		})
	})
}

// TestPickPowerOfTwo: with one origin busy, power of two choices sends it
// far less than its even share; origins at their limit get nothing; an
// excluded origin is skipped unless it is the only one.
func TestPickPowerOfTwo(t *testing.T) {
	env := bareEnv(1, 100, 1, 1)
	var u Update
	for i := range 4 {
		in := Instance{Address: "10.0.0.1", Port: 8000 + i, Healthy: true}
		u.Instances = append(u.Instances, InstanceChange{Service: "s", ID: fmt.Sprint("o", i), Instance: &in})
	}
	tb, _ := emptyTable(nil, env).apply(u, env)
	s := tb.services["s"]
	busy := s.members["o0"].origin
	busy.inflight.Store(50)
	rng := rand.New(rand.NewPCG(3, 4))
	counts := map[string]int{}
	for range 4000 {
		p := s.choose(0, 0, nil, rng.IntN)
		counts[p.origin.inst.ID]++
		p.origin.release()
	}
	// Even share is 1000; P2C picks o0 only when both draws are o0, which
	// pick avoids, so it gets (almost) nothing.
	if got := counts["o0"]; got > 100 {
		t.Errorf("busy origin got %d of 4000 picks, want ≤ 100 (P2C avoids it)", got)
	}
	busy.inflight.Store(0)

	for _, m := range s.members {
		m.origin.limit = 1
	}
	var held []*pool
	for range 4 {
		p := s.choose(0, 0, nil, rng.IntN)
		if p == nil {
			t.Fatal("choose found no origin with free slots")
		}
		held = append(held, p)
	}
	if p := s.choose(0, 0, nil, rng.IntN); p != nil {
		t.Errorf("choose = %s with every origin at its limit, want nil", p.origin)
	}
	for _, p := range held {
		p.origin.release()
	}

	only := tb.services["s"].members["o1"].origin
	solo := &service{shards: [][]*pool{{{origin: only}}}, fallback: []*pool{{origin: only}}}
	if p := solo.choose(0, 0, []*origin{only}, rng.IntN); p == nil || p.origin != only {
		t.Errorf("choose with the only origin excluded = %v, want it anyway as a last resort", p)
	} else {
		p.origin.release()
	}
}
