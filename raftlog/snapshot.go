package raftlog

import (
	"fmt"
	"io"
	"slices"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Snapshot implements raft.Storage: the current snapshot's metadata, or an
// empty snapshot if none was recorded. Its Data is always nil: the data
// stays in its file, and OpenSnapshot reads it (doc.go "Snapshot data").
// raft only needs the metadata to decide that a follower needs a snapshot;
// the data goes to that follower through OpenSnapshot.
func (l *Log) Snapshot() (raftpb.Snapshot, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return raftpb.Snapshot{}, ErrClosed
	}
	if l.snap.meta.Index == 0 {
		return raftpb.Snapshot{}, nil
	}
	return raftpb.Snapshot{Metadata: cloneSnapMeta(l.snap.meta)}, nil
}

// CreateSnapshot records a snapshot the local state machine made after
// applying entry i, with conf state cs (nil keeps the current snapshot's) and
// data. It returns raft.ErrSnapOutOfDate if i is not above the current
// snapshot index, an error wrapping raft.ErrUnavailable if i > LastIndex(),
// and ErrNotCommitted if i is above the saved commit index (only applied,
// hence committed, state may be snapshotted). It writes the data file crash-safely, then records the
// metadata in one bbolt transaction; it does not discard entries (call
// Compact). The Log keeps no reference to data.
//
// The data file is written without blocking Save, so CreateSnapshot may run
// on a goroutine other than the Ready loop's.
func (l *Log) CreateSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (raftpb.Snapshot, error) {
	snap, err := l.CreateSnapshotFrom(i, cs, writeBytes(data))
	snap.Data = data
	return snap, err
}

// CreateSnapshotFrom is CreateSnapshot with the data written by write
// straight into the data file, so it is never held in memory whole. The
// checks run before write is called; an error from write leaves nothing
// behind. The returned snapshot carries the metadata only.
func (l *Log) CreateSnapshotFrom(i uint64, cs *raftpb.ConfState, write func(io.Writer) error) (raftpb.Snapshot, error) {
	l.snapMu.Lock()
	defer l.snapMu.Unlock()
	term, meta, err := func() (uint64, raftpb.SnapshotMetadata, error) {
		l.mu.RLock()
		defer l.mu.RUnlock()
		if err := l.writableLocked(); err != nil {
			return 0, raftpb.SnapshotMetadata{}, err
		}
		if i <= l.snap.meta.Index {
			return 0, raftpb.SnapshotMetadata{}, raft.ErrSnapOutOfDate
		}
		if i > l.last {
			return 0, raftpb.SnapshotMetadata{}, fmt.Errorf("raftlog: create snapshot at %d beyond last index %d: %w",
				i, l.last, raft.ErrUnavailable)
		}
		if i > l.hs.Commit {
			return 0, raftpb.SnapshotMetadata{}, fmt.Errorf("%w: create snapshot at %d, saved commit index %d",
				ErrNotCommitted, i, l.hs.Commit)
		}
		meta := raftpb.SnapshotMetadata{Index: i, Term: l.terms.term(i), ConfState: l.snap.meta.ConfState}
		if cs != nil {
			meta.ConfState = *cs
		}
		return meta.Term, cloneSnapMeta(meta), nil
	}()
	if err != nil {
		return raftpb.Snapshot{}, err
	}
	size, err := l.installSnapshot(meta, write, false)
	if err != nil {
		return raftpb.Snapshot{}, fmt.Errorf("raftlog: create snapshot at %d: %w", i, err)
	}
	l.logger.Info("raftlog snapshot created", "index", i, "term", term, "bytes", size)
	return raftpb.Snapshot{Metadata: cloneSnapMeta(meta)}, nil
}

// writeBytes is a CreateSnapshotFrom writer of data.
func writeBytes(data []byte) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}
}

// ApplySnapshot persists a snapshot received from the leader
// (Ready.Snapshot). It returns raft.ErrSnapOutOfDate if its index is not
// above the current snapshot index, or is below the saved commit index (raft
// never emits such a snapshot). It writes the data file crash-safely,
// then in one bbolt transaction records the metadata, discards every entry
// (raft only emits a snapshot when its log does not contain the snapshot's
// index and term, so any retained entry would conflict; raft.MemoryStorage
// does the same), sets FirstIndex to the snapshot index + 1, and raises the
// hard state's commit to the snapshot index if it is lower (the snapshot is
// committed by definition, and raft refuses a hard state that commits less
// than FirstIndex()-1). The Log keeps no reference to snap.Data.
func (l *Log) ApplySnapshot(snap raftpb.Snapshot) error {
	l.snapMu.Lock()
	defer l.snapMu.Unlock()
	l.mu.RLock()
	err := l.writableLocked()
	switch {
	case err != nil:
	case snap.Metadata.Index <= l.snap.meta.Index:
		err = raft.ErrSnapOutOfDate
	case snap.Metadata.Index < l.hs.Commit:
		// raft ignores a snapshot at or below its commit index; applying one
		// would drop committed entries and leave a commit index beyond the log.
		err = fmt.Errorf("raftlog: snapshot %d below the saved commit index %d: %w",
			snap.Metadata.Index, l.hs.Commit, raft.ErrSnapOutOfDate)
	}
	l.mu.RUnlock()
	if err != nil {
		return err
	}
	meta := cloneSnapMeta(snap.Metadata)
	if _, err := l.installSnapshot(meta, writeBytes(snap.Data), true); err != nil {
		return fmt.Errorf("raftlog: apply snapshot at %d: %w", meta.Index, err)
	}
	l.logger.Info("raftlog snapshot applied", "index", meta.Index, "term", meta.Term, "bytes", len(snap.Data))
	l.kickRotation()
	return nil
}

// installSnapshot writes the data file through write, then records meta in
// one transaction; with replace it also discards the whole log
// (ApplySnapshot). It returns the data's size. The caller holds snapMu and
// has checked that meta.Index is above the current snapshot index.
func (l *Log) installSnapshot(meta raftpb.SnapshotMetadata, write func(io.Writer) error, replace bool) (int64, error) {
	path, size, crc, err := l.writeSnapFile(meta.Index, meta.Term, write)
	if err != nil {
		return 0, err
	}
	rec := snapRecord{meta: meta, dataLen: uint64(size), dataCRC: crc}
	if err := l.recordSnapshot(rec, replace); err != nil {
		// The file is not referenced by raft.db; remove it now or at the next
		// Open.
		if rerr := l.fs.Remove(path); rerr != nil {
			l.logger.Warn("raftlog: remove unrecorded snapshot file", "path", path, "err", rerr)
		}
		return 0, err
	}
	l.pruneSnapshots()
	return size, nil
}

// recordSnapshot commits rec (and, with replace, the log reset) and updates
// the in-memory view.
func (l *Log) recordSnapshot(rec snapRecord, replace bool) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.writableLocked(); err != nil {
		return err
	}
	i := rec.meta.Index
	if !replace && (i > l.last || i < l.prev.index || l.terms.term(i) != rec.meta.Term) {
		// Only a caller overwriting applied entries while snapshotting gets
		// here.
		return fmt.Errorf("%w: entry %d changed while its snapshot was written", ErrOutOfOrder, i)
	}
	hs := l.hs
	if replace && hs.Commit < i {
		hs.Commit = i
	}
	flushed, err := l.commitTx("record snapshot", l.last, func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put(keySnapshot, encodeSnapRecord(rec)); err != nil {
			return fmt.Errorf("put snapshot: %w", err)
		}
		if l.hsDirty || hs != l.hs {
			// A snapshot must never sit above the commit index on disk.
			if err := meta.Put(keyHardState, encodeHardState(hs)); err != nil {
				return fmt.Errorf("put hard state: %w", err)
			}
		}
		if !replace {
			return nil
		}
		// Dropping the bucket frees its pages wholesale instead of deleting
		// key by key.
		if err := tx.DeleteBucket(bucketEntries); err != nil {
			return fmt.Errorf("drop entries bucket: %w", err)
		}
		if _, err := tx.CreateBucket(bucketEntries); err != nil {
			return fmt.Errorf("create entries bucket: %w", err)
		}
		if err := meta.Put(keyCompacted, encodeCompacted(compacted{i, rec.meta.Term})); err != nil {
			return fmt.Errorf("put compacted: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.snap = rec
	l.hs, l.hsDirty = hs, false
	if replace {
		if l.rot.active {
			l.rot.reset = true
		}
		l.prev = compacted{i, rec.meta.Term}
		l.last = i
		l.terms.reset(i, rec.meta.Term)
		l.cache.reset()
	}
	l.flushedLocked(flushed)
	return nil
}

func cloneConfState(cs raftpb.ConfState) raftpb.ConfState {
	return raftpb.ConfState{
		Voters:         slices.Clone(cs.Voters),
		Learners:       slices.Clone(cs.Learners),
		VotersOutgoing: slices.Clone(cs.VotersOutgoing),
		LearnersNext:   slices.Clone(cs.LearnersNext),
		AutoLeave:      cs.AutoLeave,
	}
}

func cloneSnapMeta(m raftpb.SnapshotMetadata) raftpb.SnapshotMetadata {
	m.ConfState = cloneConfState(m.ConfState)
	return m
}
