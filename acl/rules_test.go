package acl

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseRules(t *testing.T) {
	got, err := ParseRules(`
key_prefix "app/" { policy = "write" }
key "app/x" { policy = "deny" }
key_prefix "" { policy = "list" }
service_prefix "" {
  policy = "read"
  intentions = "read"
}
node "n1" { policy = "write" }
session_prefix "" { policy = "read" }
agent_prefix "a" { policy = "read" }
event "deploy" { policy = "write" }
operator = "read"
acl = "write"
`)
	if err != nil {
		t.Fatal(err)
	}
	want := []Rule{
		{ResourceKey, "app/", true, AccessWrite},
		{ResourceKey, "app/x", false, AccessDeny},
		{ResourceKey, "", true, AccessList},
		{ResourceService, "", true, AccessRead},
		{ResourceNode, "n1", false, AccessWrite},
		{ResourceSession, "", true, AccessRead},
		{ResourceAgent, "a", true, AccessRead},
		{ResourceEvent, "deploy", false, AccessWrite},
		{ResourceOperator, "", false, AccessRead},
		{ResourceACL, "", false, AccessWrite},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}

func TestParseRulesJSONAndNestedForms(t *testing.T) {
	want := []Rule{{ResourceKey, "app/", true, AccessRead}}
	for _, text := range []string{
		`{"key_prefix": {"app/": {"policy": "read"}}}`,
		`key_prefix { "app/" { policy = "read" } }`,
	} {
		got, err := ParseRules(text)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("ParseRules(%s) = %+v, %v; want %+v", text, got, err, want)
		}
	}
}

func TestParseRulesErrors(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{`key_prefix "a" { policy = "write" `, "failed to parse"},
		{`keys "a" { policy = "read" }`, `unknown rule "keys" at line 1; allowed: acl, agent`},
		{`key "a" { policy = "admin" }`, `invalid policy "admin"; want "read", "write", "list" or "deny"`},
		{`service "a" { policy = "list" }`, `invalid policy "list"; want "read", "write" or "deny"`},
		{`operator = "list"`, `invalid policy "list"`},
		{`acl "x" { policy = "read" }`, "takes no name"},
		{`key "a" { }`, "has no policy"},
		{`key "a" { policy = "read" color = "red" }`, `unknown field "color"; want policy`},
		{`key "a" { policy = 3 }`, "policy must be a string"},
		{`key_prefix = "read"`, "needs a name and a block"},
	} {
		_, err := ParseRules(c.text)
		var re *RulesError
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseRules(%q) = %v, want error containing %q", c.text, err, c.want)
		} else if !asRulesError(err, &re) {
			t.Errorf("ParseRules(%q) error %T, want *RulesError", c.text, err)
		}
	}
}

func asRulesError(err error, re **RulesError) bool {
	e, ok := err.(*RulesError)
	*re = e
	return ok
}

func TestFormatRulesRoundTrip(t *testing.T) {
	rules := []Rule{
		{ResourceKey, `we"ird\name`, true, AccessList},
		{ResourceService, "web", false, AccessDeny},
		{ResourceOperator, "", false, AccessWrite},
	}
	got, err := ParseRules(FormatRules(rules))
	if err != nil {
		t.Fatalf("%v\n%s", err, FormatRules(rules))
	}
	if len(got) != 3 || !sameRules(got, rules) {
		t.Errorf("round trip: got %+v, want %+v", got, rules)
	}
}

func sameRules(a, b []Rule) bool {
	seen := map[Rule]int{}
	for _, r := range a {
		seen[r]++
	}
	for _, r := range b {
		seen[r]--
	}
	for _, n := range seen {
		if n != 0 {
			return false
		}
	}
	return true
}

// FuzzParseRules: the parser never panics (the store runs it inside
// Apply), fails only with a *RulesError, returns only well-formed rules,
// and what it accepts survives FormatRules and a second parse.
func FuzzParseRules(f *testing.F) {
	for _, s := range []string{
		`key_prefix "app/" { policy = "write" }`,
		`key "a" { policy = "deny" } operator = "read" acl = "write"`,
		`{"service_prefix": {"": {"policy": "read"}}}`,
		`service "web" { policy = "read" intentions = "write" }`,
		`key "\u00e9" { policy = "list" }`,
		`key "${x}" { policy = "read" }`,
		"key \"a\" { policy = <<EOF\nread\nEOF\n}",
		`node_prefix [ { "x" = 1 } ]`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		rules, err := ParseRules(text)
		if err != nil {
			if _, ok := err.(*RulesError); !ok {
				t.Fatalf("error %T (%v), want *RulesError", err, err)
			}
			return
		}
		for _, r := range rules {
			switch r.Access {
			case AccessRead, AccessWrite, AccessDeny:
			case AccessList:
				if r.Resource != ResourceKey {
					t.Fatalf("list on %s accepted", r.Resource)
				}
			default:
				t.Fatalf("rule %+v has access %v", r, r.Access)
			}
			if slotOf(r.Resource) < 0 && r.Resource != ResourceACL && r.Resource != ResourceOperator {
				t.Fatalf("unknown resource %q accepted", r.Resource)
			}
		}
		again, err := ParseRules(FormatRules(rules))
		if err != nil {
			// HCL v1 cannot spell every byte sequence as a quoted name;
			// such names can only come from input it also accepted
			// unquoted-differently, so only report real disagreement.
			if strings.ContainsAny(text, "${}\\") {
				return
			}
			t.Fatalf("formatted rules do not parse: %v\n%s", err, FormatRules(rules))
		}
		if !sameRules(again, rules) {
			t.Fatalf("round trip changed rules: %+v -> %+v", rules, again)
		}
	})
}
