package store

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

var _ acl.Source = (*Store)(nil)

func aclCmd(c *lodestonepb.ACLCommand) *lodestonepb.Command {
	return &lodestonepb.Command{TimeUnixNano: t0, Op: &lodestonepb.Command_Acl{Acl: c}}
}

func bootstrapCmd(accessor, secret string) *lodestonepb.Command {
	return aclCmd(&lodestonepb.ACLCommand{Op: &lodestonepb.ACLCommand_Bootstrap{Bootstrap: &lodestonepb.ACLToken{
		AccessorId: accessor, SecretId: secret, Description: "Bootstrap Token (Global Management)"}}})
}

func policySet(create bool, id, name, rules string) *lodestonepb.Command {
	return aclCmd(&lodestonepb.ACLCommand{Create: create, Op: &lodestonepb.ACLCommand_PolicySet{PolicySet: &lodestonepb.ACLPolicy{
		Id: id, Name: name, Rules: rules}}})
}

func roleSet(create bool, id, name string, policies ...*lodestonepb.ACLLink) *lodestonepb.Command {
	return aclCmd(&lodestonepb.ACLCommand{Create: create, Op: &lodestonepb.ACLCommand_RoleSet{RoleSet: &lodestonepb.ACLRole{
		Id: id, Name: name, Policies: policies}}})
}

func tokenSet(create bool, accessor, secret string, policies, roles []*lodestonepb.ACLLink) *lodestonepb.Command {
	return aclCmd(&lodestonepb.ACLCommand{Create: create, Op: &lodestonepb.ACLCommand_TokenSet{TokenSet: &lodestonepb.ACLToken{
		AccessorId: accessor, SecretId: secret, Policies: policies, Roles: roles}}})
}

func byName(n string) *lodestonepb.ACLLink { return &lodestonepb.ACLLink{Name: n} }
func byID(id string) *lodestonepb.ACLLink  { return &lodestonepb.ACLLink{Id: id} }

// applyOK applies c at the next index and fails unless it took effect.
func applyOK(t *testing.T, s *Store, c *lodestonepb.Command) *lodestonepb.ACLResult {
	t.Helper()
	res, _ := s.Apply(s.Index()+1, c)
	if res.GetAcl() == nil || res.Rejected != nil {
		t.Fatalf("apply %v: %v (check: %v)", c, res, CheckCommand(c))
	}
	return res.GetAcl()
}

// applyRejected applies c and fails unless the state refused it with rule
// and nothing changed.
func applyRejected(t *testing.T, s *Store, c *lodestonepb.Command, rule, detail string) {
	t.Helper()
	before, idx := dumpACL(s), s.ACLIndex()
	res, _ := s.Apply(s.Index()+1, c)
	err := ResultError(res)
	var re *RejectedError
	if !errors.As(err, &re) || re.Rule != rule || !strings.Contains(re.Detail, detail) {
		t.Fatalf("apply %v: %v, want rejection %s containing %q", c, err, rule, detail)
	}
	if dumpACL(s) != before || s.ACLIndex() != idx {
		t.Fatal("a rejected ACL command changed the tables")
	}
}

func TestACLBuiltinsExistFromTheStart(t *testing.T) {
	s := New()
	if tok, ok := s.TokenBySecret(acl.AnonymousTokenSecret); !ok || tok.AccessorId != acl.AnonymousTokenID || len(tok.Policies) != 0 {
		t.Errorf("anonymous token: %v %v", tok, ok)
	}
	if p, ok := s.PolicyByName("global-management"); !ok || p.Id != acl.GlobalManagementPolicyID {
		t.Errorf("global-management: %v %v", p, ok)
	}
	if s.ACLIndex() != 0 || s.ACLBootstrapIndex() != 0 {
		t.Error("indices not 0")
	}
}

func TestACLBootstrapOnce(t *testing.T) {
	s := New()
	res := applyOK(t, s, bootstrapCmd("acc-1", "sec-1"))
	if res.Token.CreateIndex != 1 || len(res.Token.Policies) != 1 || res.Token.Policies[0].Id != acl.GlobalManagementPolicyID || res.Token.CreateTimeUnixNano != t0 {
		t.Errorf("bootstrap token %v", res.Token)
	}
	if s.ACLBootstrapIndex() != 1 || s.ACLIndex() != 1 {
		t.Errorf("bootstrap index %d, acl index %d", s.ACLBootstrapIndex(), s.ACLIndex())
	}
	applyRejected(t, s, bootstrapCmd("acc-2", "sec-2"), RejectACLBootstrap, "ACL bootstrap no longer allowed (reset index: 1)")
	r := acl.NewResolver(s, acl.Config{Enabled: true})
	if a, err := r.Resolve("sec-1"); err != nil || !a.Allowed(acl.ResourceACL, "", acl.AccessWrite) {
		t.Errorf("bootstrap token is not management: %v %v", a, err)
	}
}

func TestACLObjects(t *testing.T) {
	s := New()
	applyOK(t, s, policySet(true, "p1", "kv-write", `key_prefix "app/" { policy = "write" }`))
	applyOK(t, s, policySet(true, "p2", "svc-read", `service_prefix "" { policy = "read" }`))
	applyRejected(t, s, policySet(true, "p3", "kv-write", ``), RejectACLNameTaken, `A Policy with Name "kv-write" already exists`)
	applyRejected(t, s, policySet(true, "p1", "other", ``), RejectACLIDTaken, "already exists")
	applyRejected(t, s, policySet(false, "p9", "other", ``), RejectACLMissing, `Cannot find policy "p9"`)

	role := applyOK(t, s, roleSet(true, "r1", "readers", byName("svc-read"))).Role
	if len(role.Policies) != 1 || role.Policies[0].Id != "p2" || role.Policies[0].Name != "" {
		t.Errorf("role links %v, want p2 by id only", role.Policies)
	}
	applyRejected(t, s, roleSet(true, "r2", "x", byName("nope")), RejectACLMissing, `No such ACL policy with name "nope"`)

	tok := applyOK(t, s, tokenSet(true, "a1", "s1", []*lodestonepb.ACLLink{byName("kv-write"), byID("p1")}, []*lodestonepb.ACLLink{byName("readers")})).Token
	if len(tok.Policies) != 1 || tok.Policies[0].Id != "p1" || len(tok.Roles) != 1 || tok.Roles[0].Id != "r1" {
		t.Errorf("token links %v %v", tok.Policies, tok.Roles)
	}
	applyRejected(t, s, tokenSet(true, "a2", "s1", nil, nil), RejectACLIDTaken, "SecretID is already in use")
	applyRejected(t, s, tokenSet(true, "a1", "s9", nil, nil), RejectACLIDTaken, "AccessorID is already in use")
	applyRejected(t, s, tokenSet(true, "a3", "s3", nil, []*lodestonepb.ACLLink{byID("r9")}), RejectACLMissing, `No such ACL role with ID "r9"`)
	applyRejected(t, s, tokenSet(false, "a1", "other", nil, nil), RejectACLIDTaken, "Changing a token's SecretID is not permitted")

	// Update keeps the secret and the creation, moves ModifyIndex.
	upd := applyOK(t, s, tokenSet(false, "a1", "", []*lodestonepb.ACLLink{byID("p2")}, nil)).Token
	if upd.SecretId != "s1" || upd.CreateIndex != tok.CreateIndex || upd.ModifyIndex != s.Index() || len(upd.Roles) != 0 {
		t.Errorf("updated token %v", upd)
	}
	if got, _ := s.TokenBySecret("s1"); got != upd {
		t.Error("secret index not updated")
	}

	// Renaming a policy frees its old name and keeps links by id.
	applyOK(t, s, policySet(false, "p2", "svc-read-2", `service_prefix "" { policy = "read" }`))
	if _, ok := s.PolicyByName("svc-read"); ok {
		t.Error("old name still resolves")
	}
	if links := s.ACLLinks("policy", upd.Policies); len(links) != 1 || links[0].Name != "svc-read-2" {
		t.Errorf("links after rename: %v", links)
	}

	// Deleting a linked policy is allowed (Consul); the link drops.
	if !applyOK(t, s, aclCmd(&lodestonepb.ACLCommand{Op: &lodestonepb.ACLCommand_PolicyDelete{PolicyDelete: "p2"}})).Deleted {
		t.Error("delete reported nothing deleted")
	}
	if links := s.ACLLinks("policy", upd.Policies); len(links) != 0 {
		t.Errorf("link to a deleted policy still shown: %v", links)
	}
	// A delete of nothing changes nothing, not even the index.
	idx := s.ACLIndex()
	if applyOK(t, s, aclCmd(&lodestonepb.ACLCommand{Op: &lodestonepb.ACLCommand_RoleDelete{RoleDelete: "zz"}})).Deleted || s.ACLIndex() != idx {
		t.Error("delete of a missing role changed something")
	}

	applyRejected(t, s, aclCmd(&lodestonepb.ACLCommand{Op: &lodestonepb.ACLCommand_TokenDelete{TokenDelete: acl.AnonymousTokenID}}), RejectACLBuiltin, "anonymous")
	applyRejected(t, s, aclCmd(&lodestonepb.ACLCommand{Op: &lodestonepb.ACLCommand_PolicyDelete{PolicyDelete: acl.GlobalManagementPolicyID}}), RejectACLBuiltin, "global-management")
	applyRejected(t, s, policySet(false, acl.GlobalManagementPolicyID, "global-management", `key "x" { policy = "read" }`), RejectACLBuiltin, "global-management")

	// The anonymous token can be given policies.
	applyOK(t, s, tokenSet(false, acl.AnonymousTokenID, "", []*lodestonepb.ACLLink{byID("p1")}, nil))
	a, _ := acl.NewResolver(s, acl.Config{Enabled: true}).Resolve("")
	if !a.Allowed(acl.ResourceKey, "app/x", acl.AccessWrite) {
		t.Error("anonymous token's policy not applied")
	}

	applyOK(t, s, aclCmd(&lodestonepb.ACLCommand{Op: &lodestonepb.ACLCommand_TokenDelete{TokenDelete: "a1"}}))
	if _, ok := s.TokenBySecret("s1"); ok {
		t.Error("deleted token still resolves by secret")
	}
}

func TestACLMalformedCommands(t *testing.T) {
	for _, c := range []struct {
		cmd  *lodestonepb.Command
		rule string
	}{
		{aclCmd(nil), RuleCommandOp},
		{aclCmd(&lodestonepb.ACLCommand{}), RuleCommandOp},
		{policySet(true, "p", "bad name!", ""), RuleACLName},
		{policySet(true, "p", "ok", `key_prefix "a" { policy = "admin" }`), RuleACLRules},
		{policySet(true, "p", "ok", `nodes "a" { policy = "read" }`), RuleACLRules},
		{policySet(true, "", "ok", ""), RuleACLID},
		{roleSet(true, "r", "ok", &lodestonepb.ACLLink{}), RuleACLID},
		{tokenSet(true, "a", "", nil, nil), RuleACLID},
		{bootstrapCmd("a", ""), RuleACLID},
	} {
		s := New()
		res, _ := s.Apply(1, c.cmd)
		err := CheckCommand(c.cmd)
		var ie *InvalidError
		if res.Result != nil || !errors.As(err, &ie) || ie.Rule != c.rule {
			t.Errorf("%v: result %v, check %v; want malformed by %s", c.cmd, res, err, c.rule)
		}
		if s.ACLIndex() != 0 {
			t.Errorf("%v changed the ACL tables", c.cmd)
		}
	}
	err := CheckCommand(policySet(true, "p", "ok", `key_prefix "a" { policy = "admin" }`))
	if !strings.Contains(err.Error(), `invalid policy "admin"`) {
		t.Errorf("rules error does not say what was wrong: %v", err)
	}
}

func TestACLSnapshotRoundTrip(t *testing.T) {
	s := New()
	applyOK(t, s, bootstrapCmd("acc", "sec"))
	applyOK(t, s, policySet(true, "p1", "kv", `key_prefix "" { policy = "read" }`))
	applyOK(t, s, roleSet(true, "r1", "role", byID("p1")))
	applyOK(t, s, tokenSet(true, "a1", "s1", nil, []*lodestonepb.ACLLink{byID("r1")}))
	b := encode(t, s)
	r := New()
	if err := r.Restore(bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	if got, want := dump(r), dump(s); got != want {
		t.Fatalf("round trip:\n%s\nwant\n%s", got, want)
	}
	if !bytes.Equal(encode(t, r), b) {
		t.Error("re-encoding differs")
	}
	applyRejected(t, r, bootstrapCmd("x", "y"), RejectACLBootstrap, "reset index: 1")

	// A version 3 snapshot (before ACLs) restores the built-ins only.
	old := newRaw(3).keyAt("k", nil, 1, 1).trailerV3(2, 1, map[byte]uint64{recKV: 1}).bytes()
	if err := r.Restore(bytes.NewReader(old)); err != nil {
		t.Fatal(err)
	}
	if r.ACLIndex() != 0 || r.ACLBootstrapIndex() != 0 {
		t.Error("version 3 restore kept ACL state")
	}
	if _, ok := r.TokenBySecret("sec"); ok {
		t.Error("version 3 restore kept a token")
	}
	if _, ok := r.TokenBySecret(acl.AnonymousTokenSecret); !ok {
		t.Error("version 3 restore lacks the anonymous token")
	}
}

func TestACLSnapshotRefusesDamage(t *testing.T) {
	s := New()
	applyOK(t, s, policySet(true, "p1", "kv", ""))
	valid := encode(t, s)
	// Drop the ACL record: a version 5 stream must have one.
	noACL := newRaw(5)
	var p [trailerLenV5]byte
	binary := func(off int, v uint64) {
		for i := 0; i < 8; i++ {
			p[off+i] = byte(v >> (56 - 8*i))
		}
	}
	binary(0, 5)
	c := noACL.crc
	p[152], p[153], p[154], p[155] = byte(c>>24), byte(c>>16), byte(c>>8), byte(c)
	noACL.record(recTrailer, p[:])
	if err := New().Restore(bytes.NewReader(noACL.bytes())); err == nil || !strings.Contains(err.Error(), "no ACL state record") {
		t.Errorf("missing ACL record: %v", err)
	}
	dup := &lodestonepb.ACLSnapshot{Policies: []*lodestonepb.ACLPolicy{acl.GlobalManagementPolicy(), {Id: "x", Name: "global-management"}},
		Tokens: []*lodestonepb.ACLToken{acl.AnonymousToken()}}
	if err := New().Restore(bytes.NewReader(newRaw(5).msg(recACL, dup).bytes())); err == nil || !strings.Contains(err.Error(), `duplicate ACL policy name "global-management"`) {
		t.Errorf("duplicate name: %v", err)
	}
	if err := New().Restore(bytes.NewReader(valid)); err != nil {
		t.Fatal(err)
	}
}
