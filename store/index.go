package store

import (
	"bytes"
	"sort"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// TombstoneRetention is how many indices a deleted key's tombstone is kept
// after its delete, so KVIndexFor still counts the delete. It is part of
// the replicated semantics (Apply prunes by it, so every replica holds the
// same tombstones): changing it is a protocol change. At 10k writes/s it
// covers ~26 s; at 100 writes/s ~43 min.
const TombstoneRetention uint64 = 1 << 18

// QueryMeta says what a catalog or session read saw.
type QueryMeta struct {
	// Index is the highest index that changed the data the read depends
	// on (Consul's X-Consul-Index); never 0. A blocking read returns once
	// it passes the client's wait index.
	Index uint64
	// Applied is the applied index the read was made at (the
	// ResponseHeader index).
	Applied uint64
}

// atLeast1 is Consul's rule for X-Consul-Index: never 0, so a client's
// first blocking query (index 0) does not spin.
func atLeast1(i uint64) uint64 { return max(i, 1) }

// KVIndexFor returns the highest ModifyIndex of the key (prefix false) or
// of every key starting with key (prefix true; empty: all keys), counting
// deletes through tombstones (see TombstoneRetention); at least 1. A write
// to a key outside the range never raises it.
//
// A prefix read walks every key and tombstone under the prefix while
// holding the read lock: O(keys under prefix), the same as reading them.
// NB: call it BEFORE reading the data it stands for (Get, Range): an index
// older than the data only costs the client one spurious wake-up, a newer
// one would let it sleep through a change.
//
// The answer can go DOWN when a tombstone that held it is pruned (only
// after TombstoneRetention indices without a newer change under the
// range): a blocking query with a higher wait index just keeps waiting,
// and Consul clients reset on an index that goes backwards, as they do
// after Consul's own tombstone reaping.
func (s *Store) KVIndexFor(key []byte, prefix bool) uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if prefix && len(key) == 0 {
		return atLeast1(s.kvIndex)
	}
	var m uint64
	if !prefix {
		if it, ok := s.kv.Get(probe(key)); ok {
			m = it.r.ModifyIndex
		}
		if t, ok := s.tab.tombstones.get(string(key)); ok {
			m = max(m, t)
		}
		return atLeast1(m)
	}
	s.kv.AscendGreaterOrEqual(probe(key), func(it item) bool {
		if !bytes.HasPrefix(it.key(), key) {
			return false
		}
		m = max(m, it.r.ModifyIndex)
		return true
	})
	s.tab.tombstones.ascendPrefix(string(key), func(_ string, t uint64) bool {
		m = max(m, t)
		return true
	})
	return atLeast1(m)
}

// NodesIndex is the index of the last change to any node record (node list
// queries); at least 1.
func (s *Store) NodesIndex() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return atLeast1(s.tab.nodesIndex)
}

// ServicesIndex is the index of the last change to any service instance
// record (the service-name list); at least 1.
func (s *Store) ServicesIndex() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return atLeast1(s.tab.servicesIndex)
}

// ChecksIndex is the index of the last change to any check; at least 1.
func (s *Store) ChecksIndex() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return atLeast1(s.tab.checksIndex)
}

// SessionsIndex is the index of the last session create, destroy or
// invalidation (renewals do not count); at least 1.
func (s *Store) SessionsIndex() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return atLeast1(s.tab.sessionsIndex)
}

// NodeIndex is the index of the last change to node name, its services or
// its checks; NodesIndex when the node is not registered; at least 1.
func (s *Store) NodeIndex(name string) uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.nodeIndex(name)
}

func (s *Store) nodeIndex(name string) uint64 {
	if i, ok := s.tab.nodeIdx.get(name); ok {
		return atLeast1(i)
	}
	return atLeast1(s.tab.nodesIndex)
}

// ServiceIndex is the index of the last change to anything the health of
// service name depends on: its instances, their checks, the node-level
// checks and node records of the nodes they run on. ServicesIndex when no
// instance exists; at least 1. A change to another service, or to a node
// without an instance of it, does not raise it.
func (s *Store) ServiceIndex(name string) uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.serviceIndex(name)
}

func (s *Store) serviceIndex(name string) uint64 {
	if i, ok := s.tab.serviceIdx.get(name); ok {
		return atLeast1(i)
	}
	return atLeast1(s.tab.servicesIndex)
}

// --- tombstones ------------------------------------------------------------

type tombRef struct {
	index uint64
	key   string
}

// tombQueue holds tombstones in the order they were written (ascending
// index), so pruning pops from the front. Entries whose tombstone has been
// overwritten by a later delete are skipped when popped.
type tombQueue struct {
	q    []tombRef
	head int
}

func (q *tombQueue) push(index uint64, key string) { q.q = append(q.q, tombRef{index, key}) }

// sort orders a queue rebuilt from a snapshot.
func (q *tombQueue) sort() {
	sort.Slice(q.q, func(i, j int) bool {
		if q.q[i].index != q.q[j].index {
			return q.q[i].index < q.q[j].index
		}
		return q.q[i].key < q.q[j].key
	})
}

// recordTombstones notes the deletes among evs at index.
func (s *Store) recordTombstones(index uint64, evs []Event) {
	for _, e := range evs {
		if e.Type == EventDelete {
			k := string(e.KV.Key)
			s.tab.tombstones.set(k, index)
			s.der.tombQueue.push(index, k)
		}
	}
}

// pruneTombstones forgets tombstones written TombstoneRetention or more
// indices before index. Deterministic: it depends only on the state and
// the applied index.
func (s *Store) pruneTombstones(index uint64) {
	if index < TombstoneRetention {
		return
	}
	floor := index - TombstoneRetention
	q := &s.der.tombQueue
	for q.head < len(q.q) && q.q[q.head].index <= floor {
		r := q.q[q.head]
		if t, ok := s.tab.tombstones.get(r.key); ok && t == r.index {
			s.tab.tombstones.del(r.key)
		}
		q.q[q.head] = tombRef{}
		q.head++
	}
	if q.head > 1024 && q.head*2 > len(q.q) {
		q.q = append(q.q[:0:0], q.q[q.head:]...)
		q.head = 0
	}
}

// --- event namespace -------------------------------------------------------

// Reserved event key prefixes (see doc.go). User keys never contain NUL,
// so no user key starts with any of them.
const (
	NodeEventPrefix    = "\x00catalog/node/"
	ServiceEventPrefix = "\x00catalog/service/"
	CheckEventPrefix   = "\x00catalog/check/"
	SessionEventPrefix = "\x00session/"
)

// IsReservedKey reports whether key is in the store's event namespace
// (starts with NUL) rather than a user key.
func IsReservedKey(key []byte) bool { return len(key) > 0 && key[0] == 0 }

// NodeEventKey is the event key of node name.
func NodeEventKey(name string) []byte { return []byte(NodeEventPrefix + name) }

// ServiceEventKeyPrefix is the prefix of the event keys of every instance
// of service name (and of no other service).
func ServiceEventKeyPrefix(name string) []byte { return []byte(ServiceEventPrefix + name + "\x00") }

// ServiceInstanceEventKey is the event key of instance id of service name
// on node.
func ServiceInstanceEventKey(name, node, id string) []byte {
	return []byte(ServiceEventPrefix + name + "\x00" + node + "\x00" + id)
}

// CheckEventKey is the event key of check id on node.
func CheckEventKey(node, id string) []byte { return []byte(CheckEventPrefix + node + "\x00" + id) }

// SessionEventKey is the event key of session id.
func SessionEventKey(id string) []byte { return []byte(SessionEventPrefix + id) }

// health joins an instance with its node and the checks that count for it.
// Caller holds s.mu.
func (s *Store) health(n *lodestonepb.Node, svc *lodestonepb.Service) *lodestonepb.ServiceHealth {
	h := &lodestonepb.ServiceHealth{Node: n, Service: svc}
	s.tab.checks.ascendPrefix(under(svc.Node), func(_ string, c *lodestonepb.Check) bool {
		if c.ServiceId == "" || c.ServiceId == svc.Id {
			h.Checks = append(h.Checks, c)
		}
		return true
	})
	h.Status = aggregate(h.Checks)
	return h
}

// aggregate is Consul's AggregatedStatus: critical if any check is
// critical, else warning if any is warning, else passing.
func aggregate(checks []*lodestonepb.Check) lodestonepb.HealthStatus {
	st := lodestonepb.HealthStatus_HEALTH_PASSING
	for _, c := range checks {
		switch c.Status {
		case lodestonepb.HealthStatus_HEALTH_CRITICAL:
			return lodestonepb.HealthStatus_HEALTH_CRITICAL
		case lodestonepb.HealthStatus_HEALTH_WARNING:
			st = lodestonepb.HealthStatus_HEALTH_WARNING
		case lodestonepb.HealthStatus_HEALTH_PASSING:
		default:
			return lodestonepb.HealthStatus_HEALTH_CRITICAL // unknown: fail safe
		}
	}
	return st
}
