package acl

import (
	"regexp"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Token, Policy and Role are the replicated ACL objects, as the store keeps
// them (links by id only). They are the protobuf messages the Raft log and
// snapshots carry, so nothing converts between a wire and a Go form; values
// handed out by a Source are shared and must not be modified.
type (
	Token  = lodestonepb.ACLToken
	Policy = lodestonepb.ACLPolicy
	Role   = lodestonepb.ACLRole
	Link   = lodestonepb.ACLLink
)

// Built-in objects, with Consul's ids, so tools that know them work.
const (
	// GlobalManagementPolicyID is the policy that grants everything.
	GlobalManagementPolicyID   = "00000000-0000-0000-0000-000000000001"
	GlobalManagementPolicyName = "global-management"
	// AnonymousTokenID is the accessor of the token a request without a
	// token acts as; its secret is AnonymousTokenSecret.
	AnonymousTokenID     = "00000000-0000-0000-0000-000000000002"
	AnonymousTokenSecret = "anonymous"
)

// GlobalManagementPolicy returns a fresh copy of the built-in policy.
func GlobalManagementPolicy() *Policy {
	return &Policy{
		Id:          GlobalManagementPolicyID,
		Name:        GlobalManagementPolicyName,
		Description: "Builtin Policy that grants unlimited access",
		Rules:       globalManagementRules,
	}
}

// AnonymousToken returns a fresh copy of the built-in anonymous token,
// with no policies (an operator may link some).
func AnonymousToken() *Token {
	return &Token{
		AccessorId:  AnonymousTokenID,
		SecretId:    AnonymousTokenSecret,
		Description: "Anonymous Token",
	}
}

// globalManagementRules is Consul's text for the policy. The Authorizer
// does not read it: linking the policy by id is what grants everything.
const globalManagementRules = `
acl = "write"
agent_prefix "" {
  policy = "write"
}
event_prefix "" {
  policy = "write"
}
key_prefix "" {
  policy = "write"
}
node_prefix "" {
  policy = "write"
}
operator = "write"
service_prefix "" {
  policy = "write"
}
session_prefix "" {
  policy = "write"
}
`

// validName is Consul's rule for policy and role names.
var validName = regexp.MustCompile(`^[A-Za-z0-9\-_]{1,128}$`)

// ValidName reports whether name may name a policy or a role: 1 to 128 of
// A-Z, a-z, 0-9, '-' and '_' (Consul's rule).
func ValidName(name string) bool { return validName.MatchString(name) }
