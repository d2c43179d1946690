package store

import (
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Catalog and session reads. Each holds the read lock for the whole answer,
// so the data and the QueryMeta it returns are one consistent view.
// Returned messages are shared with the store (like Get's entries):
// callers must not modify them; the wrapper messages (ServiceInstance,
// ServiceHealth, NodeServices, ServiceSummary) and slices are fresh and
// the caller's.

// Services lists every service name with the sorted union of its
// instances' tags, by name (/v1/catalog/services). Index: ServicesIndex.
func (s *Store) Services() ([]*lodestonepb.ServiceSummary, QueryMeta) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*lodestonepb.ServiceSummary
	var cur *lodestonepb.ServiceSummary
	s.der.servicesByName.ascend(func(_ string, svc *lodestonepb.Service) bool {
		if cur == nil || cur.Name != svc.Name {
			if cur != nil {
				cur.Tags = sortedUnique(cur.Tags)
			}
			cur = &lodestonepb.ServiceSummary{Name: svc.Name}
			out = append(out, cur)
		}
		cur.Tags = append(cur.Tags, svc.Tags...)
		return true
	})
	if cur != nil {
		cur.Tags = sortedUnique(cur.Tags)
	}
	return out, s.meta(s.tab.servicesIndex)
}

func sortedUnique(tags []string) []string {
	sort.Strings(tags)
	return slices.Compact(tags)
}

func (s *Store) meta(index uint64) QueryMeta {
	return QueryMeta{Index: atLeast1(index), Applied: s.index}
}

// ServiceInstances lists the instances of service name, ordered by node
// then service id (/v1/catalog/service/:name). tags keeps only instances
// carrying every tag (case-insensitive, as Consul); passingOnly keeps only
// instances whose checks (node-level and their own) all pass. Index:
// ServiceIndex(name).
func (s *Store) ServiceInstances(name string, tags []string, passingOnly bool) ([]*lodestonepb.ServiceInstance, QueryMeta) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*lodestonepb.ServiceInstance
	s.eachInstance(name, tags, passingOnly, func(h *lodestonepb.ServiceHealth) {
		out = append(out, &lodestonepb.ServiceInstance{Node: h.Node, Service: h.Service})
	})
	return out, s.meta(s.serviceIndex(name))
}

// HealthService lists the instances of service name with their node and
// the checks that count for them (node-level and their own, by check id)
// and the aggregated status (/v1/health/service/:name). Filters as
// ServiceInstances. Index: ServiceIndex(name).
func (s *Store) HealthService(name string, tags []string, passingOnly bool) ([]*lodestonepb.ServiceHealth, QueryMeta) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*lodestonepb.ServiceHealth
	s.eachInstance(name, tags, passingOnly, func(h *lodestonepb.ServiceHealth) { out = append(out, h) })
	return out, s.meta(s.serviceIndex(name))
}

func (s *Store) eachInstance(name string, tags []string, passingOnly bool, fn func(*lodestonepb.ServiceHealth)) {
	s.der.servicesByName.ascendPrefix(under(name), func(_ string, svc *lodestonepb.Service) bool {
		if !hasTags(svc.Tags, tags) {
			return true
		}
		n, _ := s.tab.nodes.get(svc.Node)
		h := s.health(n, svc)
		if passingOnly && !allPassing(h.Checks) {
			return true
		}
		fn(h)
		return true
	})
}

func hasTags(have, want []string) bool {
	for _, w := range want {
		if !slices.ContainsFunc(have, func(h string) bool { return strings.EqualFold(h, w) }) {
			return false
		}
	}
	return true
}

// allPassing is Consul's ?passing filter: warning does not pass.
func allPassing(checks []*lodestonepb.Check) bool {
	for _, c := range checks {
		if c.Status != lodestonepb.HealthStatus_HEALTH_PASSING {
			return false
		}
	}
	return true
}

// Nodes lists every node by name (/v1/catalog/nodes). Index: NodesIndex.
func (s *Store) Nodes() ([]*lodestonepb.Node, QueryMeta) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*lodestonepb.Node, 0, s.tab.nodes.len())
	s.tab.nodes.ascend(func(_ string, n *lodestonepb.Node) bool {
		out = append(out, n)
		return true
	})
	return out, s.meta(s.tab.nodesIndex)
}

// Node returns node name with its services by id, or nil when it is not
// registered (/v1/catalog/node/:name). Index: NodeIndex(name).
func (s *Store) Node(name string) (*lodestonepb.NodeServices, QueryMeta) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n, ok := s.tab.nodes.get(name)
	if !ok {
		return nil, s.meta(s.nodeIndex(name))
	}
	ns := &lodestonepb.NodeServices{Node: n}
	s.tab.services.ascendPrefix(under(name), func(_ string, svc *lodestonepb.Service) bool {
		ns.Services = append(ns.Services, svc)
		return true
	})
	return ns, s.meta(s.nodeIndex(name))
}

// NodeChecks lists the checks of node by check id (/v1/health/node/:node).
// Index: NodeIndex(node).
func (s *Store) NodeChecks(node string) ([]*lodestonepb.Check, QueryMeta) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*lodestonepb.Check
	s.tab.checks.ascendPrefix(under(node), func(_ string, c *lodestonepb.Check) bool {
		out = append(out, c)
		return true
	})
	return out, s.meta(s.nodeIndex(node))
}

// ServiceChecks lists the service checks of every instance of service name,
// by node then check id (/v1/health/checks/:service; node-level checks are
// not included, as in Consul). Index: ServiceIndex(name).
func (s *Store) ServiceChecks(name string) ([]*lodestonepb.Check, QueryMeta) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*lodestonepb.Check
	s.der.servicesByName.ascendPrefix(under(name), func(_ string, svc *lodestonepb.Service) bool {
		s.tab.checks.ascendPrefix(under(svc.Node), func(_ string, c *lodestonepb.Check) bool {
			if c.ServiceId == svc.Id {
				out = append(out, c)
			}
			return true
		})
		return true
	})
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Node != out[j].Node {
			return out[i].Node < out[j].Node
		}
		return out[i].CheckId < out[j].CheckId
	})
	return out, s.meta(s.serviceIndex(name))
}

// ChecksInState lists the checks in state (HEALTH_STATUS_UNSPECIFIED: any),
// by node then check id (/v1/health/state/:state). Index: ChecksIndex.
func (s *Store) ChecksInState(state lodestonepb.HealthStatus) ([]*lodestonepb.Check, QueryMeta) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*lodestonepb.Check
	s.tab.checks.ascend(func(_ string, c *lodestonepb.Check) bool {
		if state == lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED || c.Status == state {
			out = append(out, c)
		}
		return true
	})
	return out, s.meta(s.tab.checksIndex)
}

// Session returns session id, or nil (/v1/session/info/:id). Index:
// SessionsIndex.
func (s *Store) Session(id string) (*lodestonepb.SessionEntry, QueryMeta) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	se, _ := s.tab.sessions.get(id)
	return se, s.meta(s.tab.sessionsIndex)
}

// Sessions lists every session by id (/v1/session/list). Index:
// SessionsIndex.
func (s *Store) Sessions() ([]*lodestonepb.SessionEntry, QueryMeta) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*lodestonepb.SessionEntry, 0, s.tab.sessions.len())
	s.tab.sessions.ascend(func(_ string, se *lodestonepb.SessionEntry) bool {
		out = append(out, se)
		return true
	})
	return out, s.meta(s.tab.sessionsIndex)
}

// NodeSessions lists the sessions of node by id (/v1/session/node/:node).
// Index: SessionsIndex.
func (s *Store) NodeSessions(node string) ([]*lodestonepb.SessionEntry, QueryMeta) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*lodestonepb.SessionEntry
	for _, id := range sortedSet(s.der.nodeSessions, node) {
		se, _ := s.tab.sessions.get(id)
		out = append(out, se)
	}
	return out, s.meta(s.tab.sessionsIndex)
}

// SessionLocks lists, sorted, the keys session id holds the lock of.
// Index: KVIndex (a lock moves with its key).
func (s *Store) SessionLocks(id string) []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return sortedSet(s.der.sessionKeys, id)
}

// ExpiredSessions returns, sorted, the ids of the TTL sessions that have
// expired at now: not renewed for TTL × SessionTTLMultiplier since
// max(their recorded renewal, notBefore). The store reads no clock; the
// leader calls this with its own and proposes a SessionInvalidate with the
// ids and ttl_expired_at_unix_nano = now.
//
// notBefore is when the caller became leader: renewals are recorded by
// commands, and a new leader cannot know about renewals that an old one
// did not replicate or that clock skew between proposers mis-dates, so
// every session gets a full TTL from the leadership change (Consul resets
// its timers the same way). O(sessions).
func (s *Store) ExpiredSessions(now, notBefore time.Time) []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []string
	nowN, nb := unixNano(now), unixNano(notBefore)
	s.tab.sessions.ascend(func(id string, se *lodestonepb.SessionEntry) bool {
		if dl, ok := ttlDeadline(se, max(se.RenewedUnixNano, nb)); ok && dl <= nowN {
			out = append(out, id)
		}
		return true
	})
	return out
}

// NextSessionExpiry returns the earliest TTL deadline (see ExpiredSessions)
// so the leader can arm one timer; false when no session has a TTL.
// O(sessions).
func (s *Store) NextSessionExpiry(notBefore time.Time) (time.Time, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	nb := unixNano(notBefore)
	var first int64
	found := false
	s.tab.sessions.ascend(func(_ string, se *lodestonepb.SessionEntry) bool {
		if dl, ok := ttlDeadline(se, max(se.RenewedUnixNano, nb)); ok && (!found || dl < first) {
			first, found = dl, true
		}
		return true
	})
	if !found {
		return time.Time{}, false
	}
	return time.Unix(0, first), true
}

// unixNano is t.UnixNano clamped to the int64 range (the zero Time, year
// 1, is far below it; UnixNano is undefined there).
func unixNano(t time.Time) int64 {
	switch {
	case t.Before(time.Unix(0, math.MinInt64)):
		return math.MinInt64
	case t.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	}
	return t.UnixNano()
}

// LockDelay returns until when (the proposers' clock) an acquire of key is
// refused because a session holding it was invalidated; false when no
// delay is recorded. A recorded time in the past means no delay.
func (s *Store) LockDelay(key []byte) (time.Time, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	until, ok := s.tab.lockDelays.get(string(key))
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(0, until), true
}
