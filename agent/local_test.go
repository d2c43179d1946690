package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/checks"
)

const (
	passing  = lodestonepb.HealthStatus_HEALTH_PASSING
	warning  = lodestonepb.HealthStatus_HEALTH_WARNING
	critical = lodestonepb.HealthStatus_HEALTH_CRITICAL
)

// testChecks are the agent tests' check rules: Consul's, with minimums low
// enough for fast tests.
var testChecks = checks.Options{MinInterval: time.Millisecond, MinDeregisterAfter: time.Millisecond}

// checkAt returns a new-check function for local.addService at t0.
func checkAt(t0 time.Time) func(*checks.Spec) *check {
	return func(s *checks.Spec) *check { return &check{Check: checks.New(s, t0)} }
}

func mustCompile(t *testing.T, d ServiceDefinition) *compiled {
	t.Helper()
	c, err := d.compile(testChecks)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// drain applies next()/done() until local agrees with the registry and
// returns the writes, as "kind:id[:status]".
func drain(l *local) []string {
	var out []string
	for o := l.next(); o != nil; o = l.next() {
		s := o.kind
		switch o.kind {
		case "register":
			s += ":" + o.service.Id
			for _, c := range o.checks {
				s += ":" + lodestonepb.HealthStatusWord(c.Status)
			}
		case "deregister":
			s += ":" + o.id
		case "check":
			s += ":" + o.id + ":" + lodestonepb.HealthStatusWord(o.status)
		}
		out = append(out, s)
		l.done(o)
		if len(out) > 100 {
			panic("next() never converges")
		}
	}
	return out
}

func TestLocalWritesOnlyTransitions(t *testing.T) {
	t0 := time.Unix(1000, 0)
	web := ServiceDefinition{Name: "web", Port: 80, Checks: []*CheckDefinition{
		{HTTP: "http://127.0.0.1:1/health", Interval: Duration(time.Second)},
		{TTL: Duration(10 * time.Second), Status: "passing"},
	}}
	l := newLocal(&lodestonepb.Node{Name: "a1", Address: "127.0.0.9"})
	_, added := l.addService(mustCompile(t, web), checkAt(t0))
	if len(added) != 2 || added[0].Spec().ID() != "service:web:1" || added[1].Spec().ID() != "service:web:2" {
		t.Fatalf("check ids: %v", added)
	}
	httpCheck, ttl := added[0], added[1]

	steps := []struct {
		name string
		do   func()
		want string
	}{
		{"node only until the HTTP check has run", func() {}, "node"},
		{"first probe: registered with real statuses", func() { httpCheck.Record(passing, "200 OK", t0) }, "register:web:passing:passing"},
		{"same result again: nothing", func() { httpCheck.Record(passing, "200 OK again", t0) }, ""},
		{"HTTP fails: one update", func() { httpCheck.Record(critical, "500", t0) }, "check:service:web:1:critical"},
		{"still failing with other output: nothing", func() { httpCheck.Record(critical, "503", t0) }, ""},
		{"flap inside one sync: the registry already agrees", func() {
			httpCheck.Record(passing, "", t0)
			httpCheck.Record(critical, "", t0)
		}, ""},
		{"TTL report with the same status: nothing", func() { ttl.UpdateTTL(passing, "ok", t0.Add(5*time.Second)) }, ""},
		{"TTL not expired yet", func() { ttl.ExpireTTL(t0.Add(14 * time.Second)) }, ""},
		{"TTL expired: one update", func() { ttl.ExpireTTL(t0.Add(15 * time.Second)) }, "check:service:web:2:critical"},
		{"expiry again: nothing", func() { ttl.ExpireTTL(t0.Add(16 * time.Second)) }, ""},
		{"report passing: one update", func() { ttl.UpdateTTL(passing, "back", t0.Add(17*time.Second)) }, "check:service:web:2:passing"},
		{"warning: one update", func() { ttl.UpdateTTL(warning, "slow", t0.Add(18*time.Second)) }, "check:service:web:2:warning"},
		{"deregister", func() { l.removeService("web") }, "deregister:web"},
	}
	for _, s := range steps {
		s.do()
		if got := strings.Join(drain(l), ","); got != s.want {
			t.Fatalf("%s: writes %q, want %q", s.name, got, s.want)
		}
	}
}

func TestLocalRecoversLostRegistration(t *testing.T) {
	l := newLocal(&lodestonepb.Node{Name: "a1", Address: "127.0.0.9"})
	_, added := l.addService(mustCompile(t, ServiceDefinition{Name: "db", Check: &CheckDefinition{TTL: Duration(time.Minute)}}),
		checkAt(time.Unix(0, 0)))
	if got := strings.Join(drain(l), ","); got != "node,register:db:critical" {
		t.Fatalf("start: %q", got)
	}
	added[0].Record(passing, "", time.Unix(0, 0))
	o := l.next()
	if o == nil || o.kind != "check" {
		t.Fatalf("want a check update, got %+v", o)
	}
	// The registry lost the node (an operator deregistered it): the update
	// is refused, and everything is written again with current statuses.
	l.lost(o)
	if got := strings.Join(drain(l), ","); got != "node,register:db:passing" {
		t.Fatalf("after loss: %q", got)
	}
}

func TestLocalReplaceService(t *testing.T) {
	l := newLocal(&lodestonepb.Node{Name: "a1"})
	mk := checkAt(time.Unix(0, 0))
	l.addService(mustCompile(t, ServiceDefinition{ID: "w1", Name: "web", Check: &CheckDefinition{TTL: Duration(time.Minute)}}), mk)
	drain(l)
	removed, added := l.addService(mustCompile(t, ServiceDefinition{ID: "w1", Name: "web", Port: 81, Check: &CheckDefinition{TTL: Duration(time.Minute), Status: "passing"}}), mk)
	if len(removed) != 1 || len(added) != 1 {
		t.Fatalf("removed %d added %d", len(removed), len(added))
	}
	if got := strings.Join(drain(l), ","); got != "register:w1:passing" {
		t.Fatalf("re-register: %q", got)
	}
}

func TestCompileDefinitions(t *testing.T) {
	cases := []struct {
		name    string
		def     ServiceDefinition
		wantErr bool
		wantIDs string
	}{
		{"single check gets service:<id>", ServiceDefinition{Name: "web", Check: &CheckDefinition{TCP: "127.0.0.1:80", Interval: Duration(time.Second)}}, false, "service:web"},
		{"explicit id", ServiceDefinition{Name: "web", Check: &CheckDefinition{CheckID: "x", TTL: Duration(time.Second)}}, false, "x"},
		{"no name", ServiceDefinition{}, true, ""},
		{"script checks are refused", ServiceDefinition{Name: "web", Check: &CheckDefinition{Args: []string{"true"}, Interval: Duration(time.Second)}}, true, ""},
		{"a check with nothing to run", ServiceDefinition{Name: "web", Check: &CheckDefinition{Interval: Duration(time.Second)}}, true, ""},
		{"http without interval", ServiceDefinition{Name: "web", Check: &CheckDefinition{HTTP: "http://x"}}, true, ""},
		{"bad status", ServiceDefinition{Name: "web", Check: &CheckDefinition{TTL: Duration(time.Second), Status: "fine"}}, true, ""},
		{"duplicate ids", ServiceDefinition{Name: "web", Checks: []*CheckDefinition{{CheckID: "x", TTL: Duration(time.Second)}, {CheckID: "x", TTL: Duration(time.Second)}}}, true, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.def.compile(testChecks)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			var ids []string
			for _, s := range c.checks {
				ids = append(ids, s.ID())
				if s.Initial != critical && tc.def.Check.Status == "" {
					t.Fatalf("default initial status %v, want critical", s.Initial)
				}
			}
			if got := strings.Join(ids, ","); got != tc.wantIDs {
				t.Fatalf("ids %q, want %q", got, tc.wantIDs)
			}
		})
	}
}

func TestLocalReconcileRepairsDifferences(t *testing.T) {
	mk := checkAt(time.Unix(0, 0))
	setup := func() (*local, *check) {
		l := newLocal(&lodestonepb.Node{Name: "a1"})
		_, added := l.addService(mustCompile(t, ServiceDefinition{Name: "web", Check: &CheckDefinition{TTL: Duration(time.Minute), Status: "passing"}}), mk)
		drain(l)
		return l, added[0]
	}
	remote := func(svcs []string, checks map[string]lodestonepb.HealthStatus) (*lodestonepb.NodeServices, []*lodestonepb.Check) {
		ns := &lodestonepb.NodeServices{Node: &lodestonepb.Node{Name: "a1"}}
		for _, s := range svcs {
			ns.Services = append(ns.Services, &lodestonepb.Service{Id: s, Name: s})
		}
		var cs []*lodestonepb.Check
		for id, st := range checks {
			cs = append(cs, &lodestonepb.Check{Node: "a1", CheckId: id, Status: st})
		}
		return ns, cs
	}
	cases := []struct {
		name   string
		svcs   []string
		checks map[string]lodestonepb.HealthStatus
		gone   bool
		want   string
	}{
		{"registry agrees: nothing", []string{"web"}, map[string]lodestonepb.HealthStatus{"service:web": passing, "serfHealth": critical}, false, ""},
		{"service deregistered behind our back", nil, map[string]lodestonepb.HealthStatus{"serfHealth": passing}, false, "register:web:passing"},
		{"check lost", []string{"web"}, nil, false, "register:web:passing"},
		{"status overwritten", []string{"web"}, map[string]lodestonepb.HealthStatus{"service:web": critical}, false, "check:service:web:passing"},
		{"unknown service from an earlier run", []string{"web", "old"}, map[string]lodestonepb.HealthStatus{"service:web": passing}, false, "deregister:old"},
		{"node gone", nil, nil, true, "node,register:web:passing"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, _ := setup()
			ns, cs := remote(tc.svcs, tc.checks)
			if tc.gone {
				ns = nil
			}
			l.reconcile(ns, cs)
			if got := strings.Join(drain(l), ","); got != tc.want {
				t.Fatalf("writes %q, want %q", got, tc.want)
			}
		})
	}
}
