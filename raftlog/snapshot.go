package raftlog

import (
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Snapshot implements raft.Storage: the current snapshot, or an empty one if
// none was recorded. The first call after Open reads the data file and checks
// its CRC (an error wrapping ErrCorrupt if it does not match); the data then
// stays in memory until the next snapshot replaces it. The returned Data is
// shared: do not modify it.
func (l *Log) Snapshot() (raftpb.Snapshot, error) {
	l.mu.RLock()
	snap, loaded, err := l.snapshotLocked()
	l.mu.RUnlock()
	if err != nil || loaded {
		return snap, err
	}
	// Load the data without holding wmu, so Save is not blocked behind a
	// large read. snapMu keeps the snapshot from changing meanwhile.
	l.snapMu.Lock()
	defer l.snapMu.Unlock()
	l.mu.RLock()
	snap, loaded, err = l.snapshotLocked()
	rec := l.snap
	l.mu.RUnlock()
	if err != nil || loaded {
		return snap, err
	}
	data, err := l.readSnapFile(rec)
	if err != nil {
		return raftpb.Snapshot{}, err
	}
	l.mu.Lock()
	l.snapData, l.snapLoaded = data, true
	l.mu.Unlock()
	snap.Data = data
	return snap, nil
}

// snapshotLocked returns the current snapshot; loaded is false if its data
// still has to be read from disk. The caller holds mu.
func (l *Log) snapshotLocked() (snap raftpb.Snapshot, loaded bool, err error) {
	if l.closed {
		return raftpb.Snapshot{}, false, ErrClosed
	}
	if l.snap.meta.Index == 0 {
		return raftpb.Snapshot{}, true, nil
	}
	snap.Metadata = cloneSnapMeta(l.snap.meta)
	if l.snapLoaded {
		snap.Data = l.snapData
	}
	return snap, l.snapLoaded, nil
}

// CreateSnapshot records a snapshot the local state machine made after
// applying entry i, with conf state cs (nil keeps the current snapshot's) and
// data. It returns raft.ErrSnapOutOfDate if i is not above the current
// snapshot index, an error wrapping raft.ErrUnavailable if i > LastIndex(),
// and ErrNotCommitted if i is above the saved commit index (only applied,
// hence committed, state may be snapshotted). It writes the data file crash-safely, then records the
// metadata in one bbolt transaction; it does not discard entries (call
// Compact). The Log keeps data in memory to serve Snapshot: do not modify it.
//
// The data file is written without blocking Save, so CreateSnapshot may run
// on a goroutine other than the Ready loop's.
func (l *Log) CreateSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (raftpb.Snapshot, error) {
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
	if err := l.installSnapshot(meta, data, false); err != nil {
		return raftpb.Snapshot{}, fmt.Errorf("raftlog: create snapshot at %d: %w", i, err)
	}
	l.logger.Info("raftlog snapshot created", "index", i, "term", term, "bytes", len(data))
	return raftpb.Snapshot{Data: data, Metadata: cloneSnapMeta(meta)}, nil
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
// than FirstIndex()-1). The Log keeps snap.Data in memory: do not modify it.
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
	if err := l.installSnapshot(meta, snap.Data, true); err != nil {
		return fmt.Errorf("raftlog: apply snapshot at %d: %w", meta.Index, err)
	}
	l.logger.Info("raftlog snapshot applied", "index", meta.Index, "term", meta.Term, "bytes", len(snap.Data))
	l.kickRotation()
	return nil
}

// installSnapshot writes the data file, then records meta in one
// transaction; with replace it also discards the whole log (ApplySnapshot).
// The caller holds snapMu and has checked that meta.Index is above the
// current snapshot index.
func (l *Log) installSnapshot(meta raftpb.SnapshotMetadata, data []byte, replace bool) error {
	path, err := l.writeSnapFile(meta.Index, meta.Term, data)
	if err != nil {
		return err
	}
	rec := snapRecord{meta: meta, dataLen: uint64(len(data)), dataCRC: checksum(data)}
	if err := l.recordSnapshot(rec, replace); err != nil {
		// The file is not referenced by raft.db; remove it now or at the next
		// Open.
		if rerr := l.fs.Remove(path); rerr != nil {
			l.logger.Warn("raftlog: remove unrecorded snapshot file", "path", path, "err", rerr)
		}
		return err
	}
	l.mu.Lock()
	l.snapData, l.snapLoaded = data, true
	l.mu.Unlock()
	l.pruneSnapshots()
	return nil
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
