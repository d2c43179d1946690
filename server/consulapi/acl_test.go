package consulapi_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/server/servertest"
)

// aclClient starts a real one-member server and returns the official
// Consul client pointed at it, once the member leads.
func aclClient(t *testing.T) *consul.Client {
	t.Helper()
	srv := servertest.Start(t, nil)
	cfg := consul.DefaultConfig()
	cfg.Address = srv.HTTPAddr()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	cfg.HttpClient = &http.Client{Transport: tr}
	c, err := consul.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if leader, err := c.Status().Leader(); err == nil && leader != "" {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatal("no leader within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestACLAPIWithConsulClient(t *testing.T) {
	c := aclClient(t)
	a := c.ACL()

	boot, _, err := a.Bootstrap()
	if err != nil {
		t.Fatal(err)
	}
	if boot.SecretID == "" || boot.AccessorID == "" || len(boot.Policies) != 1 || boot.Policies[0].Name != acl.GlobalManagementPolicyName {
		t.Fatalf("bootstrap token %+v", boot)
	}
	if _, _, err := a.Bootstrap(); err == nil || !strings.Contains(err.Error(), "403") ||
		!strings.Contains(err.Error(), "Permission denied: ACL bootstrap no longer allowed (reset index: ") {
		t.Fatalf("second bootstrap: %v", err)
	}

	pol, _, err := a.PolicyCreate(&consul.ACLPolicy{Name: "kv-app", Description: "app keys",
		Rules: `key_prefix "app/" { policy = "write" }`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pol.ID == "" || pol.CreateIndex == 0 || pol.Rules == "" {
		t.Errorf("created policy %+v", pol)
	}
	svc, _, err := a.PolicyCreate(&consul.ACLPolicy{Name: "svc-read", Rules: `service_prefix "" { policy = "read" }`}, nil)
	if err != nil {
		t.Fatal(err)
	}

	// Invalid rules: a clear 400, nothing stored.
	before, _, err := a.PolicyList(nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = a.PolicyCreate(&consul.ACLPolicy{Name: "bad", Rules: `key_prefix "x" { policy = "admin" }`}, nil)
	if err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), `invalid policy "admin"`) {
		t.Fatalf("invalid rules: %v", err)
	}
	_, _, err = a.PolicyCreate(&consul.ACLPolicy{Name: "bad", Rules: `kee "x" { policy = "read" }`}, nil)
	if err == nil || !strings.Contains(err.Error(), `unknown rule "kee"`) {
		t.Fatalf("unknown resource: %v", err)
	}
	after, _, _ := a.PolicyList(nil)
	if len(after) != len(before) || len(before) != 3 { // global-management, kv-app, svc-read
		t.Errorf("policy list %d before, %d after a refused create", len(before), len(after))
	}

	role, _, err := a.RoleCreate(&consul.ACLRole{Name: "readers", Policies: []*consul.ACLRolePolicyLink{{Name: "svc-read"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(role.Policies) != 1 || role.Policies[0].ID != svc.ID || role.Policies[0].Name != "svc-read" {
		t.Errorf("role policies %+v", role.Policies)
	}
	if _, _, err := a.RoleCreate(&consul.ACLRole{Name: "r2", Policies: []*consul.ACLRolePolicyLink{{Name: "nope"}}}, nil); err == nil ||
		!strings.Contains(err.Error(), `No such ACL policy with name "nope"`) {
		t.Errorf("role with unknown policy: %v", err)
	}

	tok, _, err := a.TokenCreate(&consul.ACLToken{Description: "app",
		Policies: []*consul.ACLTokenPolicyLink{{ID: pol.ID}}, Roles: []*consul.ACLTokenRoleLink{{Name: "readers"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok.SecretID == "" || len(tok.Policies) != 1 || tok.Policies[0].Name != "kv-app" || len(tok.Roles) != 1 || tok.Roles[0].ID != role.ID {
		t.Errorf("created token %+v", tok)
	}

	// Self, as the new token.
	self, _, err := a.TokenReadSelf(&consul.QueryOptions{Token: tok.SecretID})
	if err != nil || self.AccessorID != tok.AccessorID || self.SecretID != tok.SecretID {
		t.Fatalf("self: %+v %v", self, err)
	}
	if _, _, err := a.TokenReadSelf(&consul.QueryOptions{Token: "no-such-secret"}); err == nil || !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), "ACL not found") {
		t.Errorf("self with unknown secret: %v", err)
	}

	list, meta, err := a.TokenList(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 || meta.LastIndex == 0 { // anonymous, bootstrap, app
		t.Errorf("token list has %d entries at index %d", len(list), meta.LastIndex)
	}

	// Update: description and links replaced, secret kept.
	tok.Description = "app v2"
	tok.Roles = nil
	upd, _, err := a.TokenUpdate(tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	if upd.Description != "app v2" || len(upd.Roles) != 0 || upd.SecretID != tok.SecretID || upd.ModifyIndex <= upd.CreateIndex {
		t.Errorf("updated token %+v", upd)
	}
	clone, _, err := a.TokenClone(tok.AccessorID, "copy", nil)
	if err != nil || clone.AccessorID == tok.AccessorID || clone.Description != "copy" || len(clone.Policies) != 1 {
		t.Errorf("clone: %+v %v", clone, err)
	}

	// Read by name, delete a linked policy: the link goes.
	if p, _, err := a.PolicyReadByName("kv-app", nil); err != nil || p.ID != pol.ID {
		t.Errorf("policy by name: %+v %v", p, err)
	}
	if r, _, err := a.RoleReadByName("readers", nil); err != nil || r.ID != role.ID {
		t.Errorf("role by name: %+v %v", r, err)
	}
	if _, err := a.PolicyDelete(pol.ID, nil); err != nil {
		t.Fatal(err)
	}
	if got, _, err := a.TokenRead(tok.AccessorID, nil); err != nil || len(got.Policies) != 0 {
		t.Errorf("token after its policy was deleted: %+v %v", got, err)
	}
	if p, _, err := a.PolicyRead(pol.ID, nil); err == nil || !strings.Contains(err.Error(), "ACL not found") {
		t.Errorf("deleted policy read: %+v %v", p, err)
	}
	if r, _, err := a.RoleRead("no-such-role", nil); err != nil || r != nil {
		t.Errorf("missing role read: %+v %v", r, err)
	}
	if _, err := a.RoleDelete(role.ID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := a.TokenDelete(tok.AccessorID, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.TokenRead(tok.AccessorID, nil); err == nil || !strings.Contains(err.Error(), "ACL not found") {
		t.Errorf("deleted token read: %v", err)
	}
	if _, err := a.TokenDelete(acl.AnonymousTokenID, nil); err == nil || !strings.Contains(err.Error(), "anonymous") {
		t.Errorf("deleting the anonymous token: %v", err)
	}
	// (The client drops the body of a failed policy delete: check the code
	// and that the policy is still there.)
	if _, err := a.PolicyDelete(acl.GlobalManagementPolicyID, nil); err == nil || !strings.Contains(err.Error(), "500") {
		t.Errorf("deleting global-management: %v", err)
	}
	if p, _, err := a.PolicyRead(acl.GlobalManagementPolicyID, nil); err != nil || p.Name != "global-management" {
		t.Errorf("global-management after a refused delete: %+v %v", p, err)
	}
}

// TestACLBootstrapWithPresetSecret: PUT /v1/acl/bootstrap takes the
// management token's secret in {"BootstrapSecret": ...}, as Consul does
// (consul acl bootstrap FILE); a secret that is not a UUID is a 400 that
// leaves the ACL system unbootstrapped.
func TestACLBootstrapWithPresetSecret(t *testing.T) {
	a := aclClient(t).ACL()
	const preset = "6a1f1c52-3b8e-4c1d-9e2f-0b7d5a4c3e21"

	for _, bad := range []string{"not-a-uuid", "6a1f1c52-3b8e-4c1d-9e2f-0b7d5a4c3e2", "6a1f1c52+3b8e-4c1d-9e2f-0b7d5a4c3e21", "6a1f1c52-3b8e-4c1d-9e2f-0b7d5a4c3e2g"} {
		_, _, err := a.BootstrapWithToken(bad)
		if err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), "Invalid BootstrapSecret: it must be a UUID") {
			t.Fatalf("bootstrap with %q: %v, want 400 naming the UUID rule", bad, err)
		}
		if strings.Contains(err.Error(), bad) {
			t.Errorf("the error repeats the refused secret: %v", err)
		}
	}

	boot, _, err := a.BootstrapWithToken(preset)
	if err != nil {
		t.Fatalf("bootstrap after refused attempts (they must change nothing): %v", err)
	}
	if boot.SecretID != preset || boot.AccessorID == "" || boot.AccessorID == preset {
		t.Fatalf("bootstrap token %+v, want SecretID %s and a fresh accessor", boot, preset)
	}
	self, _, err := a.TokenReadSelf(&consul.QueryOptions{Token: preset})
	if err != nil || self.AccessorID != boot.AccessorID || len(self.Policies) != 1 || self.Policies[0].ID != acl.GlobalManagementPolicyID {
		t.Fatalf("the preset secret as a token: %+v %v, want the global-management token", self, err)
	}
	// The preset secret is a working management token: it may write ACLs.
	if _, _, err := a.PolicyCreate(&consul.ACLPolicy{Name: "p", Rules: `key_prefix "" { policy = "read" }`},
		&consul.WriteOptions{Token: preset}); err != nil {
		t.Fatalf("policy create with the preset secret: %v", err)
	}
	if _, _, err := a.BootstrapWithToken(preset); err == nil || !strings.Contains(err.Error(), "403") ||
		!strings.Contains(err.Error(), "ACL bootstrap no longer allowed") {
		t.Fatalf("second bootstrap with the same secret: %v", err)
	}
}
