package acl

import "github.com/lodestone-kv/lodestone/api/lodestonepb"

// The read filters: what a token may not read is left out of a list, as
// Consul does, rather than failing the whole read. Each returns its input
// when nothing is dropped and a new slice otherwise, never editing the
// input: lists share their elements with the store.

// FilterKVs keeps the entries whose key a may read.
func FilterKVs(a *Authorizer, kvs []*lodestonepb.KeyValue) []*lodestonepb.KeyValue {
	return keep(kvs, func(kv *lodestonepb.KeyValue) bool { return a.Allowed(ResourceKey, string(kv.Key), AccessRead) })
}

// FilterServices keeps the services a may read.
func FilterServices(a *Authorizer, s []*lodestonepb.ServiceSummary) []*lodestonepb.ServiceSummary {
	return keep(s, func(s *lodestonepb.ServiceSummary) bool { return a.Allowed(ResourceService, s.Name, AccessRead) })
}

// FilterNodeServices keeps the services of one node a may read.
func FilterNodeServices(a *Authorizer, s []*lodestonepb.Service) []*lodestonepb.Service {
	return keep(s, func(s *lodestonepb.Service) bool { return a.Allowed(ResourceService, s.Name, AccessRead) })
}

// FilterNodes keeps the nodes a may read.
func FilterNodes(a *Authorizer, n []*lodestonepb.Node) []*lodestonepb.Node {
	return keep(n, func(n *lodestonepb.Node) bool { return a.Allowed(ResourceNode, n.Name, AccessRead) })
}

// FilterInstances keeps the instances on nodes a may read.
func FilterInstances(a *Authorizer, s []*lodestonepb.ServiceInstance) []*lodestonepb.ServiceInstance {
	return keep(s, func(i *lodestonepb.ServiceInstance) bool {
		return a.Allowed(ResourceNode, i.GetNode().GetName(), AccessRead)
	})
}

// FilterHealth keeps the instances on nodes a may read.
func FilterHealth(a *Authorizer, s []*lodestonepb.ServiceHealth) []*lodestonepb.ServiceHealth {
	return keep(s, func(i *lodestonepb.ServiceHealth) bool {
		return a.Allowed(ResourceNode, i.GetNode().GetName(), AccessRead)
	})
}

// FilterChecks keeps a service's checks where a may read the service and
// a node's checks where it may read the node.
func FilterChecks(a *Authorizer, cs []*lodestonepb.Check) []*lodestonepb.Check {
	return keep(cs, func(c *lodestonepb.Check) bool {
		if c.ServiceName != "" {
			return a.Allowed(ResourceService, c.ServiceName, AccessRead)
		}
		return a.Allowed(ResourceNode, c.Node, AccessRead)
	})
}

// FilterSessions keeps the sessions on nodes a may read sessions of.
func FilterSessions(a *Authorizer, s []*lodestonepb.SessionEntry) []*lodestonepb.SessionEntry {
	return keep(s, func(s *lodestonepb.SessionEntry) bool { return a.Allowed(ResourceSession, s.Node, AccessRead) })
}

func keep[T any](s []T, ok func(T) bool) []T {
	for i, v := range s {
		if !ok(v) {
			out := append(make([]T, 0, len(s)-1), s[:i]...)
			for _, w := range s[i+1:] {
				if ok(w) {
					out = append(out, w)
				}
			}
			return out
		}
	}
	return s
}
