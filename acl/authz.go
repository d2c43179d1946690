package acl

import (
	"sort"
	"strings"
)

// resource slots of an Authorizer's named rules.
const (
	slotKey = iota
	slotService
	slotNode
	slotSession
	slotAgent
	slotEvent
	numSlots
)

func slotOf(r Resource) int {
	switch r {
	case ResourceKey:
		return slotKey
	case ResourceService:
		return slotService
	case ResourceNode:
		return slotNode
	case ResourceSession:
		return slotSession
	case ResourceAgent:
		return slotAgent
	case ResourceEvent:
		return slotEvent
	}
	return -1
}

// named holds one resource's rules: exact names, and prefixes longest
// first so the first match is the longest.
type named struct {
	exact    map[string]Access
	prefixes []prefixRule
}

type prefixRule struct {
	prefix string
	access Access
}

// Authorizer is one token's compiled rights. It is immutable once built,
// so one value is shared by every request that presents the token.
type Authorizer struct {
	accessorID string
	all        Access // AccessWrite: AllowAll; AccessDeny: DenyAll; else rules decide
	rules      [numSlots]named
	operator   Access // AccessUnset: no rule
	acl        Access
	def        Access // what an unmatched name gets: AccessWrite or AccessDeny
}

// AllowAll returns an Authorizer that allows everything, acl:write
// included: a management token's, or every request's when ACLs are off.
func AllowAll(accessorID string) *Authorizer {
	return &Authorizer{accessorID: accessorID, all: AccessWrite}
}

// DenyAll returns an Authorizer that allows nothing.
func DenyAll(accessorID string) *Authorizer {
	return &Authorizer{accessorID: accessorID, all: AccessDeny}
}

// AccessorID names the token the rights belong to (for DeniedError and
// audit logs; never the secret).
func (a *Authorizer) AccessorID() string { return a.accessorID }

// mergeAccess combines two policies' access for the same rule: deny wins,
// otherwise the more permissive (Consul's takesPrecedenceOver).
func mergeAccess(a, b Access) Access {
	if a == AccessDeny || b == AccessDeny {
		return AccessDeny
	}
	return max(a, b)
}

// Compile builds the Authorizer of a token whose policies hold rules (one
// slice per policy, in any order: the merge is order-free). def is the
// configured default policy for names no rule matches: AccessWrite
// ("allow") or anything else for deny. As in Consul, the default never
// grants acl:read or acl:write; only a rule or management does.
func Compile(accessorID string, rules [][]Rule, def Access) *Authorizer {
	a := &Authorizer{accessorID: accessorID, def: AccessDeny}
	if def == AccessWrite {
		a.def = AccessWrite
	}
	type seg struct {
		slot   int
		prefix bool
		name   string
	}
	merged := map[seg]Access{}
	for _, rs := range rules {
		for _, r := range rs {
			switch r.Resource {
			case ResourceACL:
				a.acl = mergeSet(a.acl, r.Access)
				continue
			case ResourceOperator:
				a.operator = mergeSet(a.operator, r.Access)
				continue
			}
			s := slotOf(r.Resource)
			if s < 0 || r.Access == AccessUnset {
				continue
			}
			k := seg{s, r.Prefix, r.Name}
			merged[k] = mergeSet(merged[k], r.Access)
		}
	}
	for k, acc := range merged {
		n := &a.rules[k.slot]
		if k.prefix {
			n.prefixes = append(n.prefixes, prefixRule{k.name, acc})
			continue
		}
		if n.exact == nil {
			n.exact = map[string]Access{}
		}
		n.exact[k.name] = acc
	}
	for i := range a.rules {
		ps := a.rules[i].prefixes
		sort.Slice(ps, func(x, y int) bool {
			if len(ps[x].prefix) != len(ps[y].prefix) {
				return len(ps[x].prefix) > len(ps[y].prefix)
			}
			return ps[x].prefix < ps[y].prefix
		})
	}
	return a
}

func mergeSet(cur, next Access) Access {
	if cur == AccessUnset {
		return next
	}
	return mergeAccess(cur, next)
}

// grants reports whether a rule's access covers want. Write implies list
// and read, list implies read (Consul's enforce). want must be read, list
// or write.
func grants(have, want Access) bool {
	switch want {
	case AccessRead, AccessList, AccessWrite:
	default:
		return false
	}
	switch have {
	case AccessWrite:
		return true
	case AccessList:
		return want == AccessRead || want == AccessList
	case AccessRead:
		return want == AccessRead
	}
	return false
}

// access is the access the rules give name: the exact rule, else the
// longest matching prefix rule, else the default.
func (a *Authorizer) access(r Resource, name string) Access {
	switch r {
	case ResourceACL:
		if a.acl != AccessUnset {
			return a.acl
		}
		return AccessDeny
	case ResourceOperator:
		if a.operator != AccessUnset {
			return a.operator
		}
		return a.def
	}
	s := slotOf(r)
	if s < 0 {
		return AccessDeny
	}
	n := &a.rules[s]
	if acc, ok := n.exact[name]; ok {
		return acc
	}
	return n.covering(name, a.def)
}

// covering is the longest prefix rule that name starts with, else def.
func (n *named) covering(name string, def Access) Access {
	for _, p := range n.prefixes {
		if strings.HasPrefix(name, p.prefix) {
			return p.access
		}
	}
	return def
}

// Allowed reports whether the token may do want (read, list or write) on
// the named resource. name is ignored for operator and acl.
func (a *Authorizer) Allowed(r Resource, name string, want Access) bool {
	switch a.all {
	case AccessWrite:
		return true
	case AccessDeny:
		return false
	}
	return grants(a.access(r, name), want)
}

// Check is Allowed as an error: nil, or a *DeniedError naming the
// permission that was missing.
func (a *Authorizer) Check(r Resource, name string, want Access) error {
	if a.Allowed(r, name, want) {
		return nil
	}
	if r == ResourceOperator || r == ResourceACL {
		name = ""
	}
	return &DeniedError{AccessorID: a.accessorID, Resource: r, Access: want, Name: name}
}

// AllowedUnder reports whether want is allowed on every name that starts
// with prefix: the rule covering prefix itself grants it and no rule for a
// name under prefix (exact, or a longer prefix) takes it away. A recursive
// delete or a watch on a prefix needs it. For operator and acl it is
// Allowed.
func (a *Authorizer) AllowedUnder(r Resource, prefix string, want Access) bool {
	switch a.all {
	case AccessWrite:
		return true
	case AccessDeny:
		return false
	}
	s := slotOf(r)
	if s < 0 {
		return a.Allowed(r, prefix, want)
	}
	n := &a.rules[s]
	if !grants(n.covering(prefix, a.def), want) {
		return false
	}
	for name, acc := range n.exact {
		if strings.HasPrefix(name, prefix) && !grants(acc, want) {
			return false
		}
	}
	for _, p := range n.prefixes {
		if strings.HasPrefix(p.prefix, prefix) && !grants(p.access, want) {
			return false
		}
	}
	return true
}
