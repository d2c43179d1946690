package acl

import (
	"errors"
	"fmt"
)

// Resource names a kind of thing a rule grants access to, as Consul's rule
// language names it.
type Resource string

// The resources of Consul's rule language that Lodestone enforces.
const (
	ResourceKey      Resource = "key"
	ResourceService  Resource = "service"
	ResourceNode     Resource = "node"
	ResourceSession  Resource = "session"
	ResourceAgent    Resource = "agent"
	ResourceEvent    Resource = "event"
	ResourceOperator Resource = "operator"
	ResourceACL      Resource = "acl"
)

// Access is a rule's policy. Order matters: a larger value grants more,
// except Deny, which when merging two policies for the same rule wins.
type Access int

// Access levels. List implies Read for keys (Consul's key_prefix "list").
const (
	AccessUnset Access = iota
	AccessDeny
	AccessRead
	AccessList
	AccessWrite
)

func (a Access) String() string {
	switch a {
	case AccessDeny:
		return "deny"
	case AccessRead:
		return "read"
	case AccessList:
		return "list"
	case AccessWrite:
		return "write"
	}
	return "unset"
}

// ErrNotFound is a token secret nobody issued (Consul's "ACL not found").
var ErrNotFound = errors.New("ACL not found")

// DeniedError is a request its token may not make. Its text is Consul's,
// because clients and operators grep for it.
type DeniedError struct {
	AccessorID string
	Resource   Resource
	Access     Access
	Name       string // empty for operator and acl
}

func (e *DeniedError) Error() string {
	perm := fmt.Sprintf("%s:%s", e.Resource, e.Access)
	if e.Resource == ResourceOperator || e.Resource == ResourceACL {
		return fmt.Sprintf("Permission denied: token with AccessorID '%s' lacks permission '%s'", e.AccessorID, perm)
	}
	return fmt.Sprintf("Permission denied: token with AccessorID '%s' lacks permission '%s' on %q", e.AccessorID, perm, e.Name)
}
