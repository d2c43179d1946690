package store

import (
	"bytes"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/clusterid"
)

// Restoring a live cluster (Command.restore, PUT /v1/snapshot): every
// replica decodes the same snapshot stream carried by the entry and swaps
// it in, so they stay identical.
//
// What is replaced: the keys with their tombstones and lock delays, the
// catalog, the sessions, the ACL tables. What stays: the membership (it is
// Raft's configuration, which only conf changes move), the admission
// policy (an operator's setting for this cluster's servers) and the
// cluster id. Records keep the indices they had in the snapshot; every
// table index, and every node's and service's, moves to the restore's
// index, so a blocking read of any of them sees a change. A session's TTL
// runs from the restore's time, not from its last renewal before the
// snapshot. Applying emits no events: the server tells the watch hub
// that the state was replaced (watchers resume from a reload).
//
// Refused (the state is unchanged; Rejected names RejectRestore): a
// stream that does not decode; one of another cluster, or that names no
// cluster (only a snapshot of this cluster restores online; another
// restores offline into a new cluster); one at or above the applying
// index, which would hold records from the cluster's future.

// RejectRestore is the rule of a refused restore.
const RejectRestore = "restore-snapshot"

func (a *applier) restoreState(r *lodestonepb.StateRestore) *lodestonepb.CommandResult {
	if r == nil || len(r.State) == 0 {
		return &lodestonepb.CommandResult{}
	}
	out := &lodestonepb.StateRestoreResult{}
	res := &lodestonepb.CommandResult{Result: &lodestonepb.CommandResult_Restore{Restore: out}}
	st, err := decodeInto(bytes.NewReader(r.State), a.s.values, 0)
	if err != nil {
		return a.reject(res, RejectRestore, "the snapshot does not decode: %v", err)
	}
	if why := restoreRefusal(st, a.s.ClusterID(), a.index); why != "" {
		a.s.freeValues(st.kv)
		return a.reject(res, RejectRestore, "%s", why)
	}
	s := &a.s.tab
	*s = st.tab
	a.s.freeValues(a.s.kv)
	a.s.kv = st.kv
	a.s.der = rebuildDerived(st.kv, st.tab)
	acls := st.acls
	if acls == nil {
		acls = newACLState()
	}
	a.s.acls.Store(acls)
	a.s.kvIndex = a.index
	s.nodesIndex, s.servicesIndex, s.checksIndex, s.sessionsIndex = a.index, a.index, a.index, a.index
	for _, t := range []table[uint64]{s.nodeIdx, s.serviceIdx} {
		for _, k := range t.keysWithPrefix("") {
			t.set(k, a.index)
		}
	}
	var renewed []*lodestonepb.SessionEntry
	s.sessions.ascend(func(_ string, se *lodestonepb.SessionEntry) bool {
		if se.Ttl != nil {
			renewed = append(renewed, se)
		}
		return true
	})
	for _, se := range renewed {
		n := proto.CloneOf(se)
		n.RenewedUnixNano = a.now
		s.sessions.set(n.Id, n)
	}
	out.SnapshotIndex = st.index
	return res
}

// restoreRefusal says why st may not replace the state of cluster at
// index, or "".
func restoreRefusal(st *decoded, cluster clusterid.ID, index uint64) string {
	switch {
	case st.cluster.IsZero():
		return "the snapshot names no cluster (it was saved by an older build): restore it offline into a new cluster with 'lodestone snapshot restore'"
	case st.cluster != cluster:
		return fmt.Sprintf("the snapshot is of cluster %s, this is cluster %s: a snapshot restores online only into the cluster it was saved from; restore it offline into a new cluster with 'lodestone snapshot restore'", st.cluster, cluster)
	case st.index >= index:
		return fmt.Sprintf("the snapshot is at index %d, at or past this cluster's %d: it is not a snapshot of this cluster's past", st.index, index)
	}
	return ""
}
