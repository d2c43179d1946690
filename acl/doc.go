// Package acl is Lodestone's authorization: tokens, policies written in
// Consul's rule language, roles, and the Authorizer a token resolves to.
package acl
