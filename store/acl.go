package store

import (
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// The ACL tables: tokens, policies and roles (Consul's ACL objects), with
// the bootstrap state and the ACL index.
//
// They are one immutable value swapped atomically on each change (an ACL
// write copies the maps: ACL writes are rare and the tables small), so the
// reads the resolver makes on every request take no lock, and Snapshot
// freezes them in O(1). The built-in global-management policy and
// anonymous token are present from the start, so they exist whether or not
// a server enforces ACLs and need no command to create them.
//
// Links are kept by id: a write may name a policy or role by id or name;
// Apply resolves names and refuses unknown ones. A deleted policy or role
// stays linked by id and the link is skipped when read (ACLLinks) and
// when resolving, as Consul drops links to deleted objects lazily.
type aclState struct {
	index          uint64 // last command that changed an ACL table
	bootstrapIndex uint64 // index of the bootstrap, 0: none yet

	tokens      map[string]*acl.Token // by accessor id
	secrets     map[string]*acl.Token // by secret id
	policies    map[string]*acl.Policy
	policyNames map[string]*acl.Policy
	roles       map[string]*acl.Role
	roleNames   map[string]*acl.Role
}

func newACLState() *aclState {
	st := &aclState{
		tokens: map[string]*acl.Token{}, secrets: map[string]*acl.Token{},
		policies: map[string]*acl.Policy{}, policyNames: map[string]*acl.Policy{},
		roles: map[string]*acl.Role{}, roleNames: map[string]*acl.Role{},
	}
	st.putPolicy(acl.GlobalManagementPolicy())
	st.putToken(acl.AnonymousToken())
	return st
}

func (st *aclState) clone() *aclState {
	c := *st
	c.tokens, c.secrets = cloneMap(st.tokens), cloneMap(st.secrets)
	c.policies, c.policyNames = cloneMap(st.policies), cloneMap(st.policyNames)
	c.roles, c.roleNames = cloneMap(st.roles), cloneMap(st.roleNames)
	return &c
}

func cloneMap[T any](m map[string]T) map[string]T {
	c := make(map[string]T, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func (st *aclState) putToken(t *acl.Token) {
	if old, ok := st.tokens[t.AccessorId]; ok {
		delete(st.secrets, old.SecretId)
	}
	st.tokens[t.AccessorId], st.secrets[t.SecretId] = t, t
}

func (st *aclState) putPolicy(p *acl.Policy) {
	if old, ok := st.policies[p.Id]; ok {
		delete(st.policyNames, old.Name)
	}
	st.policies[p.Id], st.policyNames[p.Name] = p, p
}

func (st *aclState) putRole(r *acl.Role) {
	if old, ok := st.roles[r.Id]; ok {
		delete(st.roleNames, old.Name)
	}
	st.roles[r.Id], st.roleNames[r.Name] = r, r
}

// Rejection rules of ACL commands.
const (
	RejectACLBootstrap = "acl-bootstrap-once" // bootstrap after a bootstrap
	RejectACLMissing   = "acl-object-exists"  // update of, or link to, an unknown token, policy or role
	RejectACLIDTaken   = "acl-id-unique"      // create with an id or secret already in use
	RejectACLNameTaken = "acl-name-unique"    // a policy or role name already in use
	RejectACLBuiltin   = "acl-builtin"        // deleting or rewriting a built-in object
)

// Invalid rules of ACL commands (CheckCommand).
const (
	RuleACLRules = "acl-rules" // a policy's rules must parse (acl.ParseRules)
	RuleACLName  = "acl-name"  // policy and role names: acl.ValidName
	RuleACLID    = "acl-id"    // ids and secrets: non-empty, no NUL, at most 128 bytes
)

// checkACL is CheckCommand for an ACL command: what depends only on the
// command, never on the state.
func checkACL(c *lodestonepb.ACLCommand) error {
	if c == nil || c.Op == nil {
		return invalid(-1, "command", RuleCommandOp, "acl command has no operation")
	}
	id := func(field, v string) error {
		if v == "" || len(v) > 128 || strings.IndexByte(v, 0) >= 0 {
			return invalid(-1, field, RuleACLID, "%s %q must be 1 to 128 bytes without NUL", field, v)
		}
		return nil
	}
	links := func(field string, ls []*lodestonepb.ACLLink) error {
		for _, l := range ls {
			if l == nil || l.Id == "" && l.Name == "" {
				return invalid(-1, field, RuleACLID, "a link in %s has neither an ID nor a Name", field)
			}
		}
		return nil
	}
	name := func(kind, n string) error {
		if !acl.ValidName(n) {
			return invalid(-1, "name", RuleACLName, "Invalid %s name %q: use 1 to 128 of A-Z, a-z, 0-9, '-' and '_'", kind, n)
		}
		return nil
	}
	token := func(t *lodestonepb.ACLToken) error {
		if t == nil {
			return invalid(-1, "command", RuleCommandOp, "acl token command has no token")
		}
		if err := id("AccessorID", t.AccessorId); err != nil {
			return err
		}
		if err := id("SecretID", t.SecretId); err != nil && (c.Create || t.SecretId != "") {
			return err
		}
		if err := links("Policies", t.Policies); err != nil {
			return err
		}
		return links("Roles", t.Roles)
	}
	switch op := c.Op.(type) {
	case *lodestonepb.ACLCommand_Bootstrap:
		if op.Bootstrap == nil {
			return invalid(-1, "command", RuleCommandOp, "acl bootstrap has no token")
		}
		if err := id("AccessorID", op.Bootstrap.AccessorId); err != nil {
			return err
		}
		return id("SecretID", op.Bootstrap.SecretId)
	case *lodestonepb.ACLCommand_TokenSet:
		return token(op.TokenSet)
	case *lodestonepb.ACLCommand_PolicySet:
		p := op.PolicySet
		if p == nil {
			return invalid(-1, "command", RuleCommandOp, "acl policy command has no policy")
		}
		if err := id("ID", p.Id); err != nil {
			return err
		}
		if err := name("policy", p.Name); err != nil {
			return err
		}
		if _, err := acl.ParseRules(p.Rules); err != nil {
			return invalid(-1, "rules", RuleACLRules, "%s", err.Error())
		}
	case *lodestonepb.ACLCommand_RoleSet:
		r := op.RoleSet
		if r == nil {
			return invalid(-1, "command", RuleCommandOp, "acl role command has no role")
		}
		if err := id("ID", r.Id); err != nil {
			return err
		}
		if err := name("role", r.Name); err != nil {
			return err
		}
		return links("Policies", r.Policies)
	case *lodestonepb.ACLCommand_TokenDelete:
		return id("AccessorID", op.TokenDelete)
	case *lodestonepb.ACLCommand_PolicyDelete:
		return id("ID", op.PolicyDelete)
	case *lodestonepb.ACLCommand_RoleDelete:
		return id("ID", op.RoleDelete)
	}
	return nil
}

// rejectACL is a refusal; like the catalog's, it carries an (empty)
// result variant, since a result without one means malformed.
func rejectACL(rule, format string, args ...any) *lodestonepb.CommandResult {
	res := aclResult(&lodestonepb.ACLResult{})
	res.Rejected = &lodestonepb.Rejection{Rule: rule, Detail: sprintf(format, args...)}
	return res
}

func aclResult(r *lodestonepb.ACLResult) *lodestonepb.CommandResult {
	return &lodestonepb.CommandResult{Result: &lodestonepb.CommandResult_Acl{Acl: r}}
}

// applyACL applies one ACL command. A command CheckCommand refuses
// changes nothing (Result unset); one the state refuses is Rejected. Only
// a change moves the ACL index; a delete of nothing changes nothing.
func (a *applier) applyACL(c *lodestonepb.ACLCommand) *lodestonepb.CommandResult {
	if checkACL(c) != nil {
		return &lodestonepb.CommandResult{}
	}
	cur := a.s.acls.Load()
	st := cur.clone()
	var res *lodestonepb.ACLResult
	var rej *lodestonepb.CommandResult
	switch op := c.Op.(type) {
	case *lodestonepb.ACLCommand_Bootstrap:
		if st.bootstrapIndex != 0 {
			return rejectACL(RejectACLBootstrap, "ACL bootstrap no longer allowed (reset index: %d)", st.bootstrapIndex)
		}
		t := proto.CloneOf(op.Bootstrap)
		t.Policies = []*lodestonepb.ACLLink{{Id: acl.GlobalManagementPolicyID}}
		t.Roles = nil
		if rej = a.createToken(st, t); rej != nil {
			return rej
		}
		st.bootstrapIndex = a.index
		res = &lodestonepb.ACLResult{Token: t}
	case *lodestonepb.ACLCommand_TokenSet:
		t := proto.CloneOf(op.TokenSet)
		if t.Policies, rej = resolveLinks(t.Policies, "policy", st.policies, st.policyNames); rej != nil {
			return rej
		}
		if t.Roles, rej = resolveLinks(t.Roles, "role", st.roles, st.roleNames); rej != nil {
			return rej
		}
		if c.Create {
			rej = a.createToken(st, t)
		} else {
			old, ok := st.tokens[t.AccessorId]
			switch {
			case !ok:
				return rejectACL(RejectACLMissing, "Cannot find token %q", t.AccessorId)
			case t.SecretId != "" && t.SecretId != old.SecretId:
				return rejectACL(RejectACLIDTaken, "Changing a token's SecretID is not permitted")
			}
			t.SecretId, t.CreateIndex, t.CreateTimeUnixNano, t.ModifyIndex = old.SecretId, old.CreateIndex, old.CreateTimeUnixNano, a.index
			st.putToken(t)
		}
		if rej != nil {
			return rej
		}
		res = &lodestonepb.ACLResult{Token: t}
	case *lodestonepb.ACLCommand_TokenDelete:
		if op.TokenDelete == acl.AnonymousTokenID {
			return rejectACL(RejectACLBuiltin, "Deletion of the builtin anonymous token is not permitted")
		}
		old, ok := st.tokens[op.TokenDelete]
		if !ok {
			return aclResult(&lodestonepb.ACLResult{})
		}
		delete(st.tokens, old.AccessorId)
		delete(st.secrets, old.SecretId)
		res = &lodestonepb.ACLResult{Deleted: true}
	case *lodestonepb.ACLCommand_PolicySet:
		p := proto.CloneOf(op.PolicySet)
		old, exists := st.policies[p.Id]
		switch {
		case c.Create && exists:
			return rejectACL(RejectACLIDTaken, "A policy with ID %q already exists", p.Id)
		case !c.Create && !exists:
			return rejectACL(RejectACLMissing, "Cannot find policy %q", p.Id)
		}
		if other, ok := st.policyNames[p.Name]; ok && other.Id != p.Id {
			return rejectACL(RejectACLNameTaken, "Invalid Policy: A Policy with Name %q already exists", p.Name)
		}
		if p.Id == acl.GlobalManagementPolicyID && (p.Rules != old.Rules || len(p.Datacenters) > 0) {
			return rejectACL(RejectACLBuiltin, "Changing the Rules or Datacenters for the builtin global-management policy is not permitted")
		}
		p.CreateIndex, p.ModifyIndex = a.index, a.index
		if exists {
			p.CreateIndex = old.CreateIndex
		}
		st.putPolicy(p)
		res = &lodestonepb.ACLResult{Policy: p}
	case *lodestonepb.ACLCommand_PolicyDelete:
		if op.PolicyDelete == acl.GlobalManagementPolicyID {
			return rejectACL(RejectACLBuiltin, "Deletion of the builtin global-management policy is not permitted")
		}
		old, ok := st.policies[op.PolicyDelete]
		if !ok {
			return aclResult(&lodestonepb.ACLResult{})
		}
		delete(st.policies, old.Id)
		delete(st.policyNames, old.Name)
		res = &lodestonepb.ACLResult{Deleted: true}
	case *lodestonepb.ACLCommand_RoleSet:
		r := proto.CloneOf(op.RoleSet)
		old, exists := st.roles[r.Id]
		switch {
		case c.Create && exists:
			return rejectACL(RejectACLIDTaken, "A role with ID %q already exists", r.Id)
		case !c.Create && !exists:
			return rejectACL(RejectACLMissing, "Cannot find role %q", r.Id)
		}
		if other, ok := st.roleNames[r.Name]; ok && other.Id != r.Id {
			return rejectACL(RejectACLNameTaken, "Invalid Role: A Role with Name %q already exists", r.Name)
		}
		if r.Policies, rej = resolveLinks(r.Policies, "policy", st.policies, st.policyNames); rej != nil {
			return rej
		}
		r.CreateIndex, r.ModifyIndex = a.index, a.index
		if exists {
			r.CreateIndex = old.CreateIndex
		}
		st.putRole(r)
		res = &lodestonepb.ACLResult{Role: r}
	case *lodestonepb.ACLCommand_RoleDelete:
		old, ok := st.roles[op.RoleDelete]
		if !ok {
			return aclResult(&lodestonepb.ACLResult{})
		}
		delete(st.roles, old.Id)
		delete(st.roleNames, old.Name)
		res = &lodestonepb.ACLResult{Deleted: true}
	}
	st.index = a.index
	a.s.acls.Store(st)
	return aclResult(res)
}

// createToken stores a new token t (ids filled by the proposer).
func (a *applier) createToken(st *aclState, t *acl.Token) *lodestonepb.CommandResult {
	if _, ok := st.tokens[t.AccessorId]; ok {
		return rejectACL(RejectACLIDTaken, "Invalid Token: AccessorID is already in use")
	}
	if _, ok := st.secrets[t.SecretId]; ok {
		return rejectACL(RejectACLIDTaken, "Invalid Token: SecretID is already in use")
	}
	t.CreateIndex, t.ModifyIndex = a.index, a.index
	if t.CreateTimeUnixNano == 0 {
		t.CreateTimeUnixNano = a.now
	}
	st.putToken(t)
	return nil
}

// resolveLinks turns links given by id or name into links by id only,
// without duplicates, in the order given. An unknown one rejects.
func resolveLinks[T interface{ GetId() string }](ls []*lodestonepb.ACLLink, kind string, byID, byName map[string]T) ([]*lodestonepb.ACLLink, *lodestonepb.CommandResult) {
	if len(ls) == 0 {
		return nil, nil
	}
	out := make([]*lodestonepb.ACLLink, 0, len(ls))
	seen := map[string]bool{}
	for _, l := range ls {
		id := l.Id
		if id != "" {
			if _, ok := byID[id]; !ok {
				return nil, rejectACL(RejectACLMissing, "No such ACL %s with ID %q", kind, id)
			}
		} else {
			v, ok := byName[l.Name]
			if !ok {
				return nil, rejectACL(RejectACLMissing, "No such ACL %s with name %q", kind, l.Name)
			}
			id = v.GetId()
		}
		if !seen[id] {
			seen[id] = true
			out = append(out, &lodestonepb.ACLLink{Id: id})
		}
	}
	return out, nil
}

// ACLIndex returns the index of the last command that changed an ACL
// table (0: none). It takes no lock. Compare for inequality: Restore may
// move it back.
func (s *Store) ACLIndex() uint64 { return s.acls.Load().index }

// ACLBootstrapIndex returns the index of the ACL bootstrap, 0 if none.
func (s *Store) ACLBootstrapIndex() uint64 { return s.acls.Load().bootstrapIndex }

// TokenBySecret returns the token with secret. Like every ACL read it
// takes no lock, and the value is shared: do not modify it.
func (s *Store) TokenBySecret(secret string) (*acl.Token, bool) {
	t, ok := s.acls.Load().secrets[secret]
	return t, ok
}

// ACLToken returns the token with accessor id.
func (s *Store) ACLToken(accessor string) (*acl.Token, bool) {
	t, ok := s.acls.Load().tokens[accessor]
	return t, ok
}

// Policy returns the policy with id.
func (s *Store) Policy(id string) (*acl.Policy, bool) {
	p, ok := s.acls.Load().policies[id]
	return p, ok
}

// PolicyByName returns the policy named name.
func (s *Store) PolicyByName(name string) (*acl.Policy, bool) {
	p, ok := s.acls.Load().policyNames[name]
	return p, ok
}

// Role returns the role with id.
func (s *Store) Role(id string) (*acl.Role, bool) {
	r, ok := s.acls.Load().roles[id]
	return r, ok
}

// RoleByName returns the role named name.
func (s *Store) RoleByName(name string) (*acl.Role, bool) {
	r, ok := s.acls.Load().roleNames[name]
	return r, ok
}

// ACLTokens returns every token sorted by accessor id, and the ACL index.
func (s *Store) ACLTokens() ([]*acl.Token, uint64) {
	st := s.acls.Load()
	return sortedValues(st.tokens), st.index
}

// ACLPolicies returns every policy sorted by id, and the ACL index.
func (s *Store) ACLPolicies() ([]*acl.Policy, uint64) {
	st := s.acls.Load()
	return sortedValues(st.policies), st.index
}

// ACLRoles returns every role sorted by id, and the ACL index.
func (s *Store) ACLRoles() ([]*acl.Role, uint64) {
	st := s.acls.Load()
	return sortedValues(st.roles), st.index
}

// ACLLinks returns links (by id, as stored) with their current names,
// leaving out those whose policy or role (by kind: "policy" or "role")
// no longer exists. The result is fresh; callers own it.
func (s *Store) ACLLinks(kind string, links []*acl.Link) []*acl.Link {
	st := s.acls.Load()
	out := make([]*acl.Link, 0, len(links))
	for _, l := range links {
		switch kind {
		case "policy":
			if p, ok := st.policies[l.Id]; ok {
				out = append(out, &acl.Link{Id: p.Id, Name: p.Name})
			}
		case "role":
			if r, ok := st.roles[l.Id]; ok {
				out = append(out, &acl.Link{Id: r.Id, Name: r.Name})
			}
		}
	}
	return out
}

func sortedValues[T any](m map[string]T) []T {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]T, len(keys))
	for i, k := range keys {
		out[i] = m[k]
	}
	return out
}

// aclSnapshot is the ACL state as its snapshot record holds it.
func (st *aclState) snapshot() *lodestonepb.ACLSnapshot {
	return &lodestonepb.ACLSnapshot{
		Policies: sortedValues(st.policies), Roles: sortedValues(st.roles), Tokens: sortedValues(st.tokens),
		Index: st.index, BootstrapIndex: st.bootstrapIndex,
	}
}

// aclFromSnapshot rebuilds the ACL state from its record, or says why
// not: duplicate ids, names or secrets, or a missing built-in.
func aclFromSnapshot(m *lodestonepb.ACLSnapshot) (*aclState, string) {
	st := &aclState{
		index: m.Index, bootstrapIndex: m.BootstrapIndex,
		tokens: map[string]*acl.Token{}, secrets: map[string]*acl.Token{},
		policies: map[string]*acl.Policy{}, policyNames: map[string]*acl.Policy{},
		roles: map[string]*acl.Role{}, roleNames: map[string]*acl.Role{},
	}
	for _, p := range m.Policies {
		if _, dup := st.policies[p.Id]; dup {
			return nil, sprintf("duplicate ACL policy id %q", p.Id)
		}
		if _, dup := st.policyNames[p.Name]; dup {
			return nil, sprintf("duplicate ACL policy name %q", p.Name)
		}
		st.putPolicy(p)
	}
	for _, r := range m.Roles {
		if _, dup := st.roles[r.Id]; dup {
			return nil, sprintf("duplicate ACL role id %q", r.Id)
		}
		if _, dup := st.roleNames[r.Name]; dup {
			return nil, sprintf("duplicate ACL role name %q", r.Name)
		}
		st.putRole(r)
	}
	for _, t := range m.Tokens {
		if _, dup := st.tokens[t.AccessorId]; dup {
			return nil, sprintf("duplicate ACL token accessor %q", t.AccessorId)
		}
		if _, dup := st.secrets[t.SecretId]; dup {
			return nil, sprintf("duplicate ACL token secret (accessor %q)", t.AccessorId)
		}
		st.putToken(t)
	}
	if _, ok := st.policies[acl.GlobalManagementPolicyID]; !ok {
		return nil, "ACL state lacks the global-management policy"
	}
	if _, ok := st.tokens[acl.AnonymousTokenID]; !ok {
		return nil, "ACL state lacks the anonymous token"
	}
	return st, ""
}
