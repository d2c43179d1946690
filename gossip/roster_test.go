package gossip

import (
	"testing"
	"time"
)

func TestRoster(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	agent := Meta{Role: RoleAgent, Name: "a"}
	leaving := Meta{Role: RoleAgent, Name: "a", Leaving: true}
	type step struct {
		name        string
		do          func(r *Roster) bool
		wantChanged bool
		want        Member // state of "a" after the step; zero Name: absent
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"join then crash then return", []step{
			{"join", func(r *Roster) bool { return r.Alive("a", "127.0.0.2:1", agent, at(0)) }, true, Member{"a", "127.0.0.2:1", RoleAgent, StateAlive, at(0), false}},
			{"same again", func(r *Roster) bool { return r.Alive("a", "127.0.0.2:1", agent, at(1)) }, false, Member{"a", "127.0.0.2:1", RoleAgent, StateAlive, at(0), false}},
			{"failed", func(r *Roster) bool { return r.Gone("a", "127.0.0.2:1", agent, at(2)) }, true, Member{"a", "127.0.0.2:1", RoleAgent, StateFailed, at(2), false}},
			{"failed twice", func(r *Roster) bool { return r.Gone("a", "127.0.0.2:1", agent, at(3)) }, false, Member{"a", "127.0.0.2:1", RoleAgent, StateFailed, at(2), false}},
			{"back on a new port", func(r *Roster) bool { return r.Alive("a", "127.0.0.2:2", agent, at(4)) }, true, Member{"a", "127.0.0.2:2", RoleAgent, StateAlive, at(4), false}},
		}},
		{"leave", []step{
			{"join", func(r *Roster) bool { return r.Alive("a", "127.0.0.2:1", agent, at(0)) }, true, Member{"a", "127.0.0.2:1", RoleAgent, StateAlive, at(0), false}},
			{"announces leaving", func(r *Roster) bool { return r.Alive("a", "127.0.0.2:1", leaving, at(4)) }, false, Member{"a", "127.0.0.2:1", RoleAgent, StateAlive, at(0), true}},
			{"left", func(r *Roster) bool { return r.Gone("a", "127.0.0.2:1", agent, at(5)) }, true, Member{"a", "127.0.0.2:1", RoleAgent, StateLeft, at(5), true}},
			{"rejoins", func(r *Roster) bool { return r.Alive("a", "127.0.0.2:1", agent, at(6)) }, true, Member{"a", "127.0.0.2:1", RoleAgent, StateAlive, at(6), false}},
			{"then crashes", func(r *Roster) bool { return r.Gone("a", "127.0.0.2:1", agent, at(7)) }, true, Member{"a", "127.0.0.2:1", RoleAgent, StateFailed, at(7), false}},
		}},
		{"regression: death of a member never seen alive is recorded", []step{
			{"failed", func(r *Roster) bool { return r.Gone("a", "127.0.0.2:1", agent, at(1)) }, true, Member{"a", "127.0.0.2:1", RoleAgent, StateFailed, at(1), false}},
		}},
		{"metadata update changes role", []step{
			{"join unknown role", func(r *Roster) bool { return r.Alive("a", "127.0.0.2:1", Meta{}, at(0)) }, true, Member{"a", "127.0.0.2:1", "", StateAlive, at(0), false}},
			{"update", func(r *Roster) bool { return r.Alive("a", "127.0.0.2:1", agent, at(1)) }, true, Member{"a", "127.0.0.2:1", RoleAgent, StateAlive, at(0), false}},
		}},
		{"forget after the timeout only", []step{
			{"join", func(r *Roster) bool { return r.Alive("a", "127.0.0.2:1", agent, at(0)) }, true, Member{"a", "127.0.0.2:1", RoleAgent, StateAlive, at(0), false}},
			{"alive is never forgotten", func(r *Roster) bool { return len(r.Forget(at(100))) > 0 }, false, Member{"a", "127.0.0.2:1", RoleAgent, StateAlive, at(0), false}},
			{"failed", func(r *Roster) bool { return r.Gone("a", "127.0.0.2:1", agent, at(100)) }, true, Member{"a", "127.0.0.2:1", RoleAgent, StateFailed, at(100), false}},
			{"too early", func(r *Roster) bool { return len(r.Forget(at(109))) > 0 }, false, Member{"a", "127.0.0.2:1", RoleAgent, StateFailed, at(100), false}},
			{"forgotten", func(r *Roster) bool { return len(r.Forget(at(110))) > 0 }, true, Member{}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRoster(10 * time.Second)
			for _, s := range tc.steps {
				if got := s.do(r); got != s.wantChanged {
					t.Fatalf("%s: changed = %v, want %v", s.name, got, s.wantChanged)
				}
				got, ok := r.Get("a")
				if !ok {
					got = Member{}
				}
				if got != s.want {
					t.Fatalf("%s: member = %+v, want %+v", s.name, got, s.want)
				}
				assertRosterSorted(t, r)
			}
		})
	}
}

// assertRosterSorted checks the Roster's invariant: Members is sorted by
// unique name and agrees with Get.
func assertRosterSorted(t *testing.T, r *Roster) {
	t.Helper()
	ms := r.Members()
	for i, m := range ms {
		if i > 0 && ms[i-1].Name >= m.Name {
			t.Fatalf("members not sorted and unique: %v", ms)
		}
		if g, _ := r.Get(m.Name); g != m {
			t.Fatalf("Get(%q) = %+v, Members has %+v", m.Name, g, m)
		}
	}
}

func TestMetaRoundTrip(t *testing.T) {
	m := Meta{Role: RoleServer, Name: "s1"}
	if got := DecodeMeta(EncodeMeta(m)); got != m {
		t.Fatalf("got %+v, want %+v", got, m)
	}
	if got := DecodeMeta([]byte("\x00garbage")); got != (Meta{}) {
		t.Fatalf("garbage decoded to %+v", got)
	}
}

func TestConfigValidate(t *testing.T) {
	ok := func() Config {
		c := DefaultConfig()
		c.Name, c.Role, c.BindAddr = "a", RoleAgent, "127.0.0.1:0"
		return c
	}
	cases := []struct {
		name  string
		edit  func(*Config)
		field string
	}{
		{"defaults", func(*Config) {}, ""},
		{"no name", func(c *Config) { c.Name = "" }, "name"},
		{"bad role", func(c *Config) { c.Role = "x" }, "role"},
		{"bad bind", func(c *Config) { c.BindAddr = "nope" }, "bind"},
		{"bad key", func(c *Config) { c.EncryptKey = "c2hvcnQ=" }, "encrypt"},
		{"good key", func(c *Config) { c.EncryptKey = "AAAAAAAAAAAAAAAAAAAAAA==" }, ""},
		{"timeout above interval", func(c *Config) { c.ProbeTimeout = 2 * c.ProbeInterval }, "probe-timeout"},
		{"bad join", func(c *Config) { c.Join = []string{"x"} }, "join"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := ok()
			tc.edit(&c)
			err := c.Validate()
			var ce *ConfigError
			switch {
			case tc.field == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tc.field != "" && (!errorsAs(err, &ce) || ce.Field != tc.field):
				t.Fatalf("got %v, want a ConfigError on %s", err, tc.field)
			}
		})
	}
}

func TestDetectionBound(t *testing.T) {
	c := DefaultConfig()
	// 2 members: 1 probe round, the failed probe's interval, 6×4×1s suspicion, 4 gossip rounds.
	if got, want := c.DetectionBound(2), time.Second+time.Second+24*time.Second+800*time.Millisecond; got != want {
		t.Fatalf("got %v, want %v", got, want)
	}
	if c.DetectionBound(100) <= c.DetectionBound(10) {
		t.Fatal("bound must grow with the pool")
	}
}
