// Package acl is Lodestone's authorization: tokens, policies written in
// Consul's rule language, roles, and the Authorizer a token resolves to.
//
// # Objects
//
// A Policy holds rules (ParseRules); a Role links policies; a Token links
// policies and roles. They are replicated by the store (store/acl.go),
// which resolves links given by name to ids when it applies a write and
// refuses unknown ones. Two objects are built in, with Consul's ids: the
// global-management policy (GlobalManagementPolicyID), whose link grants
// everything, and the anonymous token (AnonymousTokenID, secret
// "anonymous"), which requests without a token act as and which has no
// policies until an operator links some.
//
// # Rules
//
//	key_prefix "app/" { policy = "write" }
//	key "app/x" { policy = "deny" }
//	service_prefix "" { policy = "read" }
//	operator = "read"
//	acl = "write"
//
// Resources: key, service, node, session, agent, event (each also as
// *_prefix), operator and acl. Policies: read, write, deny, and for keys
// list. Anything else is a *RulesError saying what was found and what is
// allowed.
//
// # Precedence (Consul's)
//
// For a name, an exact rule beats every prefix rule; among prefix rules
// the longest matching prefix wins; the empty prefix matches everything.
// The rule that matches decides: a read rule refuses a write even when the
// default policy is allow. Only when no rule matches does the default
// policy (Config.DefaultPolicy) decide; it never grants acl:read or
// acl:write (in Consul only management or an acl rule does).
//
// Write implies list and read, list implies read (Consul's enforce: a key
// write rule also lets a token list keys).
//
// # Merge
//
// A token's rules are those of its policies and of its roles' policies.
// Rules for the same segment (resource, exact or prefix, name) from
// several policies merge: deny wins over everything, otherwise the most
// permissive (write > list > read). Rules for different segments never
// merge; precedence above picks among them.
//
// # Resolution and caching
//
// A Resolver turns a secret into an Authorizer: "" is the anonymous token,
// a secret nobody issued is ErrNotFound, and with ACLs disabled every
// secret is AllowAll. Compiled Authorizers are cached by secret and the
// whole cache is dropped when Source.ACLIndex moves, so any change to a
// token, policy or role applies to the next request, and a hit costs one
// atomic load and a map lookup under a read lock, with no allocation. The
// cache holds at most maxCachedAuthorizers entries.
//
// # The rules of the API
//
// CheckCommand is the one set of write rules: the gRPC door checks each
// write method's request with it and the Consul HTTP API checks every
// command it proposes, so both refuse the same things with the same
// DeniedError. A request names sessions and services by id, rules name
// nodes and services: Catalog (the store) answers those lookups. The
// Filter functions are the read side: a list leaves out what the token
// may not read, as Consul's do, instead of failing the whole read.
package acl
