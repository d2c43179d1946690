package client

import (
	"slices"
	"strings"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

func TestBookPlan(t *testing.T) {
	b := newBook([]string{"a:1", "b:1", "c:1"})
	check := func(step string, want ...string) {
		t.Helper()
		if got := b.plan(); !slices.Equal(got, want) {
			t.Errorf("%s: plan = %v, want %v", step, got, want)
		}
	}
	check("fresh", "a:1", "b:1", "c:1")

	b.failed("a:1")
	check("after a failed", "b:1", "c:1", "a:1")

	b.succeeded("c:1")
	check("after c answered", "c:1", "a:1", "b:1")

	// The leader's id alone does not reorder: its address is unknown.
	b.observeHeader("", &lodestonepb.ResponseHeader{LeaderId: 2})
	check("leader id without address", "c:1", "a:1", "b:1")

	b.observeMembers([]*lodestonepb.Member{
		{Id: 1, GrpcAddr: "a:1"}, {Id: 2, GrpcAddr: "b:1"}, {Id: 3, GrpcAddr: "d:1"},
		{Id: 4, GrpcAddr: "0.0.0.0:7400"}, {Id: 5, GrpcAddr: ":7400"}, {Id: 6},
	})
	check("leader b known, d learned, wildcards ignored", "b:1", "c:1", "a:1", "d:1")

	b.failed("b:1")
	if got, want := b.leaderID, uint64(0); got != want {
		t.Errorf("leader after its endpoint failed = %d, want %d", got, want)
	}
	check("leader failed", "c:1", "a:1", "b:1", "d:1")

	b.observeHeader("", &lodestonepb.ResponseHeader{LeaderId: 3})
	check("leader d (learned, not configured)", "d:1", "c:1", "a:1", "b:1")

	b.observeHeader("", &lodestonepb.ResponseHeader{})
	check("no leader", "c:1", "a:1", "b:1", "d:1")
}

func TestBookFollowerPlan(t *testing.T) {
	b := newBook([]string{"a:1", "b:1", "c:1"})
	check := func(step string, spread int, want ...string) {
		t.Helper()
		if got := b.followerPlan(spread); !slices.Equal(got, want) {
			t.Errorf("%s: followerPlan(%d) = %v, want %v", step, spread, got, want)
		}
	}
	check("fresh: the configured order", 0, "a:1", "b:1", "c:1")

	// The leader answered at a:1 before any member published an address:
	// the answer's header names the member that served it.
	b.observeHeader("a:1", &lodestonepb.ResponseHeader{LeaderId: 1, NodeId: 1})
	check("leader known by its answer", 0, "b:1", "c:1", "a:1")

	// Three members: the leader needs one follower, so one carries the
	// watches, the same one for every client: the lowest id.
	three := []*lodestonepb.Member{{Id: 1, GrpcAddr: "a:1"}, {Id: 2, GrpcAddr: "b:1"}, {Id: 3, GrpcAddr: "d:1"}}
	b.observeMembers(three)
	b.observeHeader("b:1", &lodestonepb.ResponseHeader{LeaderId: 2, NodeId: 2})
	check("3 members, spread 0", 0, "a:1", "d:1", "c:1", "b:1")
	check("3 members, spread 1: the same follower first", 1, "a:1", "d:1", "c:1", "b:1")

	// Five: the leader needs two of four followers, so two carry the
	// watches, clients spread over them.
	b.observeMembers(append(three, &lodestonepb.Member{Id: 4, GrpcAddr: "e:1"}, &lodestonepb.Member{Id: 5, GrpcAddr: "f:1"}))
	check("5 members, spread 0", 0, "a:1", "d:1", "e:1", "f:1", "c:1", "b:1")
	check("5 members, spread 1", 1, "d:1", "a:1", "e:1", "f:1", "c:1", "b:1")
	check("5 members, spread wraps", 4, "a:1", "d:1", "e:1", "f:1", "c:1", "b:1")

	b.observeMembers(three)
	b.observeHeader("c:1", &lodestonepb.ResponseHeader{NodeId: 3})
	check("no leader: nothing moves last", 1, "a:1", "b:1", "d:1", "c:1")
}

func TestParseWatchFrom(t *testing.T) {
	for _, w := range []WatchFrom{WatchFromFollowers, WatchFromLeader} {
		if got, err := ParseWatchFrom(w.String()); err != nil || got != w {
			t.Errorf("ParseWatchFrom(%q) = %v, %v; want %v", w.String(), got, err, w)
		}
	}
	if _, err := ParseWatchFrom("nearest"); err == nil || !strings.Contains(err.Error(), "want followers or leader") {
		t.Errorf(`ParseWatchFrom("nearest") error = %v, want one naming the allowed values`, err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   Config
		field string // "" for valid
	}{
		{"zero is valid", Config{}, ""},
		{"default is valid", DefaultConfig(), ""},
		{"empty endpoint", Config{Endpoints: []string{"a:1", " "}}, "Endpoints[1]"},
		{"url endpoint", Config{Endpoints: []string{"http://a:1"}}, "Endpoints[0]"},
		{"negative dial timeout", Config{DialTimeout: -1}, "DialTimeout"},
		{"base above max", Config{BackoffBase: 2, BackoffMax: 1}, "BackoffBase"},
		{"reconnect base above max", Config{ReconnectBase: 2, ReconnectMax: 1}, "ReconnectBase"},
		{"negative reconnect", Config{ReconnectMax: -1}, "ReconnectMax"},
		{"negative attempts", Config{MaxAttempts: -1}, "MaxAttempts"},
		{"watch from leader", Config{WatchFrom: WatchFromLeader}, ""},
		{"unknown watch placement", Config{WatchFrom: 7}, "WatchFrom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			var ce *ConfigError
			switch {
			case tc.field == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.field != "" && !asConfigError(err, &ce):
				t.Fatalf("Validate() = %v, want *ConfigError for %s", err, tc.field)
			case tc.field != "" && ce.Field != tc.field:
				t.Errorf("Validate() field = %q, want %q", ce.Field, tc.field)
			}
			if _, err := New(tc.cfg); (err == nil) != (tc.field == "") {
				t.Errorf("New() error = %v, want error: %v", err, tc.field != "")
			}
		})
	}
}

func asConfigError(err error, ce **ConfigError) bool {
	e, ok := err.(*ConfigError)
	*ce = e
	return ok
}
