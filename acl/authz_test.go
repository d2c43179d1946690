package acl

import (
	"errors"
	"testing"
)

func mustRules(t testing.TB, text string) []Rule {
	t.Helper()
	r, err := ParseRules(text)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestPrecedence(t *testing.T) {
	type check struct {
		r    Resource
		name string
		want Access
		ok   bool
	}
	cases := []struct {
		name     string
		policies []string
		def      Access
		checks   []check
	}{
		{"exact beats prefix", []string{`key_prefix "app/" { policy = "write" }  key "app/secret" { policy = "deny" }`}, AccessDeny, []check{
			{ResourceKey, "app/x", AccessWrite, true},
			{ResourceKey, "app/secret", AccessRead, false},
			{ResourceKey, "app/secret2", AccessWrite, true}, // exact is exact
		}},
		{"exact read beats prefix write", []string{`key_prefix "" { policy = "write" } key "cfg" { policy = "read" }`}, AccessDeny, []check{
			{ResourceKey, "cfg", AccessRead, true},
			{ResourceKey, "cfg", AccessWrite, false},
		}},
		{"longest prefix wins", []string{`key_prefix "a/" { policy = "read" } key_prefix "a/b/" { policy = "write" } key_prefix "a/b/c/" { policy = "deny" }`}, AccessDeny, []check{
			{ResourceKey, "a/x", AccessRead, true},
			{ResourceKey, "a/x", AccessWrite, false},
			{ResourceKey, "a/b/x", AccessWrite, true},
			{ResourceKey, "a/b/c/x", AccessRead, false},
		}},
		{"empty prefix matches everything", []string{`service_prefix "" { policy = "read" }`}, AccessDeny, []check{
			{ResourceService, "anything", AccessRead, true},
			{ResourceService, "", AccessRead, true},
			{ResourceService, "web", AccessWrite, false},
		}},
		{"deny wins in merge", []string{`key_prefix "app/" { policy = "write" }`, `key_prefix "app/" { policy = "deny" }`}, AccessWrite, []check{
			{ResourceKey, "app/x", AccessRead, false},
		}},
		{"most permissive wins in merge", []string{`key_prefix "app/" { policy = "read" }`, `key_prefix "app/" { policy = "write" }`, `key_prefix "app/" { policy = "list" }`}, AccessDeny, []check{
			{ResourceKey, "app/x", AccessWrite, true},
		}},
		{"merge is per segment: exact deny and prefix write from different policies", []string{`key "app/x" { policy = "deny" }`, `key_prefix "app/" { policy = "write" }`}, AccessDeny, []check{
			{ResourceKey, "app/x", AccessRead, false},
			{ResourceKey, "app/y", AccessWrite, true},
		}},
		{"default deny", nil, AccessDeny, []check{
			{ResourceKey, "a", AccessRead, false},
			{ResourceOperator, "", AccessRead, false},
		}},
		{"default allow", nil, AccessWrite, []check{
			{ResourceKey, "a", AccessWrite, true},
			{ResourceNode, "n", AccessWrite, true},
			{ResourceOperator, "", AccessWrite, true},
			// Consul: the default policy never grants ACL management.
			{ResourceACL, "", AccessRead, false},
		}},
		{"a matching rule decides even under default allow", []string{`key_prefix "ro/" { policy = "read" }`}, AccessWrite, []check{
			{ResourceKey, "ro/x", AccessWrite, false},
			{ResourceKey, "rw/x", AccessWrite, true},
		}},
		// Consul's enforce(): key write grants list; list grants read, not write.
		{"key write implies list (Consul)", []string{`key_prefix "w/" { policy = "write" } key_prefix "l/" { policy = "list" } key_prefix "r/" { policy = "read" }`}, AccessDeny, []check{
			{ResourceKey, "w/", AccessList, true},
			{ResourceKey, "l/", AccessList, true},
			{ResourceKey, "l/x", AccessRead, true},
			{ResourceKey, "l/x", AccessWrite, false},
			{ResourceKey, "r/", AccessList, false},
			{ResourceKey, "r/x", AccessRead, true},
		}},
		{"operator and acl ignore names", []string{`operator = "read" acl = "write"`}, AccessDeny, []check{
			{ResourceOperator, "whatever", AccessRead, true},
			{ResourceOperator, "", AccessWrite, false},
			{ResourceACL, "x", AccessWrite, true},
		}},
		{"resources are separate", []string{`key_prefix "" { policy = "write" }`}, AccessDeny, []check{
			{ResourceService, "web", AccessRead, false},
			{ResourceKey, "web", AccessWrite, true},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var sets [][]Rule
			for _, p := range c.policies {
				sets = append(sets, mustRules(t, p))
			}
			a := Compile("acc", sets, c.def)
			for _, ch := range c.checks {
				if got := a.Allowed(ch.r, ch.name, ch.want); got != ch.ok {
					t.Errorf("Allowed(%s, %q, %s) = %v, want %v", ch.r, ch.name, ch.want, got, ch.ok)
				}
				err := a.Check(ch.r, ch.name, ch.want)
				if (err == nil) != ch.ok {
					t.Errorf("Check(%s, %q, %s) = %v", ch.r, ch.name, ch.want, err)
				}
			}
		})
	}
}

func TestAllowedUnder(t *testing.T) {
	a := Compile("acc", [][]Rule{mustRules(t, `
key_prefix "app/" { policy = "write" }
key "app/locked" { policy = "read" }
key_prefix "app/sub/" { policy = "write" }
key_prefix "other/" { policy = "write" }
key_prefix "other/ro/" { policy = "read" }
`)}, AccessDeny)
	for _, c := range []struct {
		prefix string
		ok     bool
	}{
		{"app/", false},      // app/locked is read-only
		{"app/sub/", true},   // nothing below takes write away
		{"app/s", true},      // covered by app/, app/sub/ below is write
		{"app/lock", false},  // app/locked under it
		{"other/ro/", false}, // the covering rule itself is read
		{"other/", false},
		{"nothing/", false}, // default deny covers it
		{"", false},
	} {
		if got := a.AllowedUnder(ResourceKey, c.prefix, AccessWrite); got != c.ok {
			t.Errorf("AllowedUnder(key, %q, write) = %v, want %v", c.prefix, got, c.ok)
		}
	}
	if !a.AllowedUnder(ResourceKey, "app/", AccessRead) {
		t.Error("read under app/ refused")
	}
	def := Compile("acc", [][]Rule{mustRules(t, `key_prefix "x/" { policy = "deny" }`)}, AccessWrite)
	if def.AllowedUnder(ResourceKey, "", AccessWrite) || !def.AllowedUnder(ResourceKey, "y/", AccessWrite) {
		t.Error("default allow: a deny below must refuse the whole keyspace, not y/")
	}
}

func TestStaticAuthorizers(t *testing.T) {
	all, none := AllowAll("m"), DenyAll("d")
	for _, r := range []Resource{ResourceKey, ResourceACL, ResourceOperator, ResourceService} {
		if !all.Allowed(r, "x", AccessWrite) || !all.AllowedUnder(r, "", AccessWrite) {
			t.Errorf("AllowAll refused %s", r)
		}
		if none.Allowed(r, "x", AccessRead) || none.AllowedUnder(r, "x", AccessRead) {
			t.Errorf("DenyAll allowed %s", r)
		}
	}
	err := none.Check(ResourceKey, "k", AccessWrite)
	var de *DeniedError
	if !errors.As(err, &de) || de.AccessorID != "d" || de.Name != "k" {
		t.Fatalf("Check = %v", err)
	}
	if want := `Permission denied: token with AccessorID 'd' lacks permission 'key:write' on "k"`; err.Error() != want {
		t.Errorf("got %q, want %q", err, want)
	}
	if err := none.Check(ResourceACL, "ignored", AccessRead); err.Error() != "Permission denied: token with AccessorID 'd' lacks permission 'acl:read'" {
		t.Errorf("acl denial text: %q", err)
	}
}
