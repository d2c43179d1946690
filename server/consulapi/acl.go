package consulapi

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/token"
	"github.com/lodestone-kv/lodestone/store"
)

// The ACL endpoints: Consul's /v1/acl/{bootstrap,token,policy,role}
// shapes, encoded with the official client's own types so the JSON is the
// one it sends and parses. Writes become ACL commands (store/acl.go) with
// ids, secrets and times filled here, by the proposer.

// redactedSecret is what Consul shows instead of a secret to a caller
// without acl:write.
const redactedSecret = "<hidden>"

func (a *API) registerACL(mux *http.ServeMux, handle func(string, func(http.ResponseWriter, *http.Request) error)) {
	handle("PUT /v1/acl/bootstrap", a.aclBootstrap)
	handle("PUT /v1/acl/token", a.aclTokenCreate)
	handle("GET /v1/acl/token/self", a.aclTokenSelf)
	handle("GET /v1/acl/token/{id}", a.aclTokenRead)
	handle("PUT /v1/acl/token/{id}", a.aclTokenUpdate)
	handle("DELETE /v1/acl/token/{id}", a.aclTokenDelete)
	handle("PUT /v1/acl/token/{id}/clone", a.aclTokenClone)
	handle("GET /v1/acl/tokens", a.aclTokenList)
	handle("PUT /v1/acl/policy", a.aclPolicyCreate)
	handle("GET /v1/acl/policy/{id}", a.aclPolicyRead)
	handle("PUT /v1/acl/policy/{id}", a.aclPolicyUpdate)
	handle("DELETE /v1/acl/policy/{id}", a.aclPolicyDelete)
	handle("GET /v1/acl/policy/name/{name}", a.aclPolicyReadByName)
	handle("GET /v1/acl/policies", a.aclPolicyList)
	handle("PUT /v1/acl/role", a.aclRoleCreate)
	handle("GET /v1/acl/role/{id}", a.aclRoleRead)
	handle("PUT /v1/acl/role/{id}", a.aclRoleUpdate)
	handle("DELETE /v1/acl/role/{id}", a.aclRoleDelete)
	handle("GET /v1/acl/role/name/{name}", a.aclRoleReadByName)
	handle("GET /v1/acl/roles", a.aclRoleList)
}

// aclCheck resolves the caller and checks want on the acl resource.
func (a *API) aclCheck(r *http.Request, want acl.Access) (*acl.Authorizer, error) {
	authz, err := a.authorizer(r)
	if err != nil {
		return nil, err
	}
	return authz, authz.Check(acl.ResourceACL, "", want)
}

// aclRead settles a read's consistency after the permission check.
func (a *API) aclRead(r *http.Request) (*acl.Authorizer, error) {
	authz, err := a.aclCheck(r, acl.AccessRead)
	if err != nil {
		return nil, err
	}
	q, err := a.parseQuery(r)
	if err != nil {
		return nil, err
	}
	return authz, a.read(r.Context(), q)
}

func (a *API) aclApply(r *http.Request, c *lodestonepb.ACLCommand) (*lodestonepb.ACLResult, error) {
	cmd := &lodestonepb.Command{Op: &lodestonepb.Command_Acl{Acl: c}, TimeUnixNano: time.Now().UnixNano()}
	// Refuse what is malformed (bad rules, bad names) before it costs a
	// Raft round; Apply checks the same.
	if err := store.CheckCommand(cmd); err != nil {
		return nil, err
	}
	res, _, err := a.b.Apply(r.Context(), cmd)
	if err != nil {
		return nil, err
	}
	return res.GetAcl(), nil
}

func decodeACLBody(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return badRequest("Request decode failed: %v", err)
	}
	return nil
}

// newACLID returns a random (version 4) UUID, as Consul's ids and secrets
// are.
func newACLID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], nil
}

// isUUID reports whether s has a UUID's shape: 8-4-4-4-12 hex digits.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}

func fillID(p *string) error {
	if *p != "" {
		return nil
	}
	id, err := newACLID()
	*p = id
	return err
}

func links(ls []*consul.ACLLink) []*lodestonepb.ACLLink {
	var out []*lodestonepb.ACLLink
	for _, l := range ls {
		if l != nil {
			out = append(out, &lodestonepb.ACLLink{Id: l.ID, Name: l.Name})
		}
	}
	return out
}

func (a *API) linksOut(kind string, ls []*lodestonepb.ACLLink) []*consul.ACLLink {
	out := []*consul.ACLLink{}
	for _, l := range a.b.Store().ACLLinks(kind, ls) {
		out = append(out, &consul.ACLLink{ID: l.Id, Name: l.Name})
	}
	return out
}

func (a *API) tokenOut(t *lodestonepb.ACLToken, showSecret bool) *consul.ACLToken {
	out := &consul.ACLToken{
		CreateIndex: t.CreateIndex, ModifyIndex: t.ModifyIndex, AccessorID: t.AccessorId, SecretID: t.SecretId,
		Description: t.Description, Policies: a.linksOut("policy", t.Policies), Roles: a.linksOut("role", t.Roles),
		Local: t.Local, CreateTime: time.Unix(0, t.CreateTimeUnixNano).UTC(),
	}
	if !showSecret {
		out.SecretID = redactedSecret
	}
	return out
}

func policyOut(p *lodestonepb.ACLPolicy) *consul.ACLPolicy {
	return &consul.ACLPolicy{ID: p.Id, Name: p.Name, Description: p.Description, Rules: p.Rules,
		Datacenters: p.Datacenters, CreateIndex: p.CreateIndex, ModifyIndex: p.ModifyIndex}
}

func (a *API) roleOut(r *lodestonepb.ACLRole) *consul.ACLRole {
	return &consul.ACLRole{ID: r.Id, Name: r.Name, Description: r.Description, Policies: a.linksOut("policy", r.Policies),
		CreateIndex: r.CreateIndex, ModifyIndex: r.ModifyIndex}
}

func (a *API) aclBootstrap(w http.ResponseWriter, r *http.Request) error {
	var in struct{ BootstrapSecret string }
	if err := decodeACLBody(r, &in); err != nil {
		return err
	}
	// NB: checked here, not in store.CheckCommand: logs written before
	// this check may hold a bootstrap with any secret, and replay must
	// apply them as it did.
	if in.BootstrapSecret != "" && !isUUID(in.BootstrapSecret) {
		return badRequest("Invalid BootstrapSecret: it must be a UUID (8-4-4-4-12 hex digits, such as uuidgen prints), or left out for a fresh one")
	}
	t := &lodestonepb.ACLToken{SecretId: in.BootstrapSecret, Description: "Bootstrap Token (Global Management)",
		CreateTimeUnixNano: time.Now().UnixNano()}
	if err := fillID(&t.AccessorId); err != nil {
		return err
	}
	if err := fillID(&t.SecretId); err != nil {
		return err
	}
	res, err := a.aclApply(r, &lodestonepb.ACLCommand{Op: &lodestonepb.ACLCommand_Bootstrap{Bootstrap: t}})
	if rejected(err, store.RejectACLBootstrap) {
		// Consul: 403 with its permission-denied prefix.
		return &httpError{http.StatusForbidden, "Permission denied: " + err.Error()}
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, a.tokenOut(res.Token, true))
	return nil
}

func (a *API) aclTokenWrite(w http.ResponseWriter, r *http.Request, create bool) error {
	if _, err := a.aclCheck(r, acl.AccessWrite); err != nil {
		return err
	}
	var in consul.ACLToken
	if err := decodeACLBody(r, &in); err != nil {
		return err
	}
	t := &lodestonepb.ACLToken{AccessorId: in.AccessorID, SecretId: in.SecretID, Description: in.Description,
		Policies: links(in.Policies), Roles: links(in.Roles), Local: in.Local}
	if create {
		t.CreateTimeUnixNano = time.Now().UnixNano()
		if err := fillID(&t.AccessorId); err != nil {
			return err
		}
		if err := fillID(&t.SecretId); err != nil {
			return err
		}
	} else {
		id := r.PathValue("id")
		if t.AccessorId != "" && t.AccessorId != id {
			return badRequest("Token Accessor ID in URL and payload do not match")
		}
		t.AccessorId = id
	}
	res, err := a.aclApply(r, &lodestonepb.ACLCommand{Create: create, Op: &lodestonepb.ACLCommand_TokenSet{TokenSet: t}})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, a.tokenOut(res.Token, true))
	return nil
}

func (a *API) aclTokenCreate(w http.ResponseWriter, r *http.Request) error {
	return a.aclTokenWrite(w, r, true)
}

func (a *API) aclTokenUpdate(w http.ResponseWriter, r *http.Request) error {
	return a.aclTokenWrite(w, r, false)
}

func (a *API) aclTokenClone(w http.ResponseWriter, r *http.Request) error {
	if _, err := a.aclCheck(r, acl.AccessWrite); err != nil {
		return err
	}
	var in struct{ Description string }
	if err := decodeACLBody(r, &in); err != nil {
		return err
	}
	src, ok := a.b.Store().ACLToken(r.PathValue("id"))
	if !ok {
		return acl.ErrNotFound
	}
	t := &lodestonepb.ACLToken{Description: src.Description, Policies: src.Policies, Roles: src.Roles, Local: src.Local,
		CreateTimeUnixNano: time.Now().UnixNano()}
	if in.Description != "" {
		t.Description = in.Description
	}
	if err := fillID(&t.AccessorId); err != nil {
		return err
	}
	if err := fillID(&t.SecretId); err != nil {
		return err
	}
	res, err := a.aclApply(r, &lodestonepb.ACLCommand{Create: true, Op: &lodestonepb.ACLCommand_TokenSet{TokenSet: t}})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, a.tokenOut(res.Token, true))
	return nil
}

func (a *API) aclTokenRead(w http.ResponseWriter, r *http.Request) error {
	authz, err := a.aclRead(r)
	if err != nil {
		return err
	}
	t, ok := a.b.Store().ACLToken(r.PathValue("id"))
	if !ok {
		return acl.ErrNotFound // Consul: 403 "ACL not found"
	}
	a.setMeta(w, a.b.Store().ACLIndex())
	writeJSON(w, http.StatusOK, a.tokenOut(t, authz.Allowed(acl.ResourceACL, "", acl.AccessWrite)))
	return nil
}

// aclTokenSelf needs no permission: presenting the secret is enough.
func (a *API) aclTokenSelf(w http.ResponseWriter, r *http.Request) error {
	secret := token.FromRequest(r)
	if secret == "" {
		secret = acl.AnonymousTokenSecret
	}
	t, ok := a.b.Store().TokenBySecret(secret)
	if !ok {
		return acl.ErrNotFound
	}
	a.setMeta(w, a.b.Store().ACLIndex())
	writeJSON(w, http.StatusOK, a.tokenOut(t, true))
	return nil
}

func (a *API) aclTokenList(w http.ResponseWriter, r *http.Request) error {
	authz, err := a.aclRead(r)
	if err != nil {
		return err
	}
	show := authz.Allowed(acl.ResourceACL, "", acl.AccessWrite)
	ts, idx := a.b.Store().ACLTokens()
	out := make([]*consul.ACLTokenListEntry, 0, len(ts))
	for _, t := range ts {
		o := a.tokenOut(t, show)
		out = append(out, &consul.ACLTokenListEntry{CreateIndex: o.CreateIndex, ModifyIndex: o.ModifyIndex,
			AccessorID: o.AccessorID, SecretID: o.SecretID, Description: o.Description, Policies: o.Policies,
			Roles: o.Roles, Local: o.Local, CreateTime: o.CreateTime})
	}
	a.setMeta(w, idx)
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (a *API) aclDelete(w http.ResponseWriter, r *http.Request, c *lodestonepb.ACLCommand) error {
	if _, err := a.aclCheck(r, acl.AccessWrite); err != nil {
		return err
	}
	if _, err := a.aclApply(r, c); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, true)
	return nil
}

func (a *API) aclTokenDelete(w http.ResponseWriter, r *http.Request) error {
	return a.aclDelete(w, r, &lodestonepb.ACLCommand{Op: &lodestonepb.ACLCommand_TokenDelete{TokenDelete: r.PathValue("id")}})
}

func (a *API) aclPolicyWrite(w http.ResponseWriter, r *http.Request, create bool) error {
	if _, err := a.aclCheck(r, acl.AccessWrite); err != nil {
		return err
	}
	var in consul.ACLPolicy
	if err := decodeACLBody(r, &in); err != nil {
		return err
	}
	p := &lodestonepb.ACLPolicy{Id: in.ID, Name: in.Name, Description: in.Description, Rules: in.Rules, Datacenters: in.Datacenters}
	if create {
		if p.Id != "" {
			return badRequest("Cannot specify an ID in policy creation")
		}
		if err := fillID(&p.Id); err != nil {
			return err
		}
	} else {
		id := r.PathValue("id")
		if p.Id != "" && p.Id != id {
			return badRequest("Policy ID in URL and payload do not match")
		}
		p.Id = id
	}
	res, err := a.aclApply(r, &lodestonepb.ACLCommand{Create: create, Op: &lodestonepb.ACLCommand_PolicySet{PolicySet: p}})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, policyOut(res.Policy))
	return nil
}

func (a *API) aclPolicyCreate(w http.ResponseWriter, r *http.Request) error {
	return a.aclPolicyWrite(w, r, true)
}

func (a *API) aclPolicyUpdate(w http.ResponseWriter, r *http.Request) error {
	return a.aclPolicyWrite(w, r, false)
}

func (a *API) aclPolicyDelete(w http.ResponseWriter, r *http.Request) error {
	return a.aclDelete(w, r, &lodestonepb.ACLCommand{Op: &lodestonepb.ACLCommand_PolicyDelete{PolicyDelete: r.PathValue("id")}})
}

func (a *API) aclPolicyAnswer(w http.ResponseWriter, r *http.Request, find func(*store.Store) (*lodestonepb.ACLPolicy, bool)) error {
	if _, err := a.aclRead(r); err != nil {
		return err
	}
	p, ok := find(a.b.Store())
	if !ok {
		return acl.ErrNotFound // Consul answers a missing policy 403 "ACL not found"; its client expects it
	}
	a.setMeta(w, a.b.Store().ACLIndex())
	writeJSON(w, http.StatusOK, policyOut(p))
	return nil
}

func (a *API) aclPolicyRead(w http.ResponseWriter, r *http.Request) error {
	return a.aclPolicyAnswer(w, r, func(s *store.Store) (*lodestonepb.ACLPolicy, bool) { return s.Policy(r.PathValue("id")) })
}

func (a *API) aclPolicyReadByName(w http.ResponseWriter, r *http.Request) error {
	return a.aclPolicyAnswer(w, r, func(s *store.Store) (*lodestonepb.ACLPolicy, bool) { return s.PolicyByName(r.PathValue("name")) })
}

func (a *API) aclPolicyList(w http.ResponseWriter, r *http.Request) error {
	if _, err := a.aclRead(r); err != nil {
		return err
	}
	ps, idx := a.b.Store().ACLPolicies()
	out := make([]*consul.ACLPolicyListEntry, 0, len(ps))
	for _, p := range ps {
		out = append(out, &consul.ACLPolicyListEntry{ID: p.Id, Name: p.Name, Description: p.Description,
			Datacenters: p.Datacenters, CreateIndex: p.CreateIndex, ModifyIndex: p.ModifyIndex})
	}
	a.setMeta(w, idx)
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (a *API) aclRoleWrite(w http.ResponseWriter, r *http.Request, create bool) error {
	if _, err := a.aclCheck(r, acl.AccessWrite); err != nil {
		return err
	}
	var in consul.ACLRole
	if err := decodeACLBody(r, &in); err != nil {
		return err
	}
	ro := &lodestonepb.ACLRole{Id: in.ID, Name: in.Name, Description: in.Description, Policies: links(in.Policies)}
	if create {
		if ro.Id != "" {
			return badRequest("Cannot specify an ID in role creation")
		}
		if err := fillID(&ro.Id); err != nil {
			return err
		}
	} else {
		id := r.PathValue("id")
		if ro.Id != "" && ro.Id != id {
			return badRequest("Role ID in URL and payload do not match")
		}
		ro.Id = id
	}
	res, err := a.aclApply(r, &lodestonepb.ACLCommand{Create: create, Op: &lodestonepb.ACLCommand_RoleSet{RoleSet: ro}})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, a.roleOut(res.Role))
	return nil
}

func (a *API) aclRoleCreate(w http.ResponseWriter, r *http.Request) error {
	return a.aclRoleWrite(w, r, true)
}
func (a *API) aclRoleUpdate(w http.ResponseWriter, r *http.Request) error {
	return a.aclRoleWrite(w, r, false)
}

func (a *API) aclRoleDelete(w http.ResponseWriter, r *http.Request) error {
	return a.aclDelete(w, r, &lodestonepb.ACLCommand{Op: &lodestonepb.ACLCommand_RoleDelete{RoleDelete: r.PathValue("id")}})
}

func (a *API) aclRoleAnswer(w http.ResponseWriter, r *http.Request, find func(*store.Store) (*lodestonepb.ACLRole, bool)) error {
	if _, err := a.aclRead(r); err != nil {
		return err
	}
	ro, ok := find(a.b.Store())
	if !ok {
		// Consul: 404 with no body, which its client reads as "none".
		w.WriteHeader(http.StatusNotFound)
		return nil
	}
	a.setMeta(w, a.b.Store().ACLIndex())
	writeJSON(w, http.StatusOK, a.roleOut(ro))
	return nil
}

func (a *API) aclRoleRead(w http.ResponseWriter, r *http.Request) error {
	return a.aclRoleAnswer(w, r, func(s *store.Store) (*lodestonepb.ACLRole, bool) { return s.Role(r.PathValue("id")) })
}

func (a *API) aclRoleReadByName(w http.ResponseWriter, r *http.Request) error {
	return a.aclRoleAnswer(w, r, func(s *store.Store) (*lodestonepb.ACLRole, bool) { return s.RoleByName(r.PathValue("name")) })
}

func (a *API) aclRoleList(w http.ResponseWriter, r *http.Request) error {
	if _, err := a.aclRead(r); err != nil {
		return err
	}
	rs, idx := a.b.Store().ACLRoles()
	out := make([]*consul.ACLRole, 0, len(rs))
	for _, ro := range rs {
		out = append(out, a.roleOut(ro))
	}
	a.setMeta(w, idx)
	writeJSON(w, http.StatusOK, out)
	return nil
}
