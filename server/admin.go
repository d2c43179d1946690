package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"sort"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store"
)

// snapshotChunkBytes is the data carried by one SavedSnapshotChunk: well
// under gRPC's default 4 MiB receive limit.
const snapshotChunkBytes = 1 << 20

// adminService serves the operator RPCs: snapshot save and the admission
// policy. Admission control never gates it.
type adminService struct {
	lodestonepb.UnimplementedAdminServer
	s *Server
}

// liveSnapshot is a copy-on-write view of the store taken in apply order,
// with the Raft term and configuration at its index.
type liveSnapshot struct {
	snap *store.Snapshot
	term uint64
	cs   raftpb.ConfState
	err  error
}

// liveSnapshot runs in the Raft loop: nothing is applied while it runs, so
// the store view, its term and the configuration agree.
func (n *node) liveSnapshot() liveSnapshot {
	sn := n.store.Snapshot()
	// NB: the term from apply, not the log: an entry applied before this
	// node's own append of it was durable is not in the log yet.
	if sn.Index() != n.appliedIndex {
		return liveSnapshot{err: fmt.Errorf("store at index %d, applied index %d", sn.Index(), n.appliedIndex)}
	}
	term := n.appliedTerm
	cs := raftpb.ConfState{
		Voters:   append([]uint64(nil), n.confState.Voters...),
		Learners: append([]uint64(nil), n.confState.Learners...),
	}
	return liveSnapshot{snap: sn, term: term, cs: cs}
}

// takeSnapshot asks the loop for a liveSnapshot.
func (n *node) takeSnapshot(ctx context.Context) (liveSnapshot, error) {
	ch := make(chan liveSnapshot, 1)
	select {
	case n.liveSnapC <- ch:
	case <-ctx.Done():
		return liveSnapshot{}, ctx.Err()
	case <-n.doneC:
		return liveSnapshot{}, n.stoppedErr()
	}
	select {
	case ls := <-ch:
		return ls, ls.err
	case <-ctx.Done():
		return liveSnapshot{}, ctx.Err()
	}
}

// SaveSnapshot streams the state as of a linearizable read: everything
// acknowledged before the call is in it. The header comes first, then the
// data in chunks, then the SHA-256 of the data.
func (a *adminService) SaveSnapshot(_ *lodestonepb.SaveSnapshotRequest, stream lodestonepb.Admin_SaveSnapshotServer) error {
	ctx := stream.Context()
	n := a.s.node
	if _, err := n.readIndex(ctx); err != nil {
		return toStatus(err)
	}
	ls, err := n.takeSnapshot(ctx)
	if err != nil {
		return toStatus(err)
	}
	var buf bytes.Buffer
	if _, err := ls.snap.WriteTo(&buf); err != nil {
		return toStatus(fmt.Errorf("encode snapshot: %w", err))
	}
	data := buf.Bytes()
	voters := append([]uint64(nil), ls.cs.Voters...)
	sort.Slice(voters, func(i, j int) bool { return voters[i] < voters[j] })
	learners := append([]uint64(nil), ls.cs.Learners...)
	sort.Slice(learners, func(i, j int) bool { return learners[i] < learners[j] })
	hdr := &lodestonepb.SavedSnapshotHeader{
		Index: ls.snap.Index(), Term: ls.term, Voters: voters, Learners: learners,
		Size: uint64(len(data)), Member: a.s.cfg.Name,
	}
	if err := stream.Send(&lodestonepb.SavedSnapshotChunk{Header: hdr}); err != nil {
		return err
	}
	for off := 0; off < len(data); off += snapshotChunkBytes {
		end := min(off+snapshotChunkBytes, len(data))
		if err := stream.Send(&lodestonepb.SavedSnapshotChunk{Data: data[off:end]}); err != nil {
			return err
		}
	}
	sum := sha256.Sum256(data)
	a.s.logger.Info("snapshot streamed to operator", "index", hdr.Index, "term", hdr.Term, "bytes", len(data))
	return stream.Send(&lodestonepb.SavedSnapshotChunk{Sha256: sum[:]})
}
