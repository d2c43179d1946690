package raftlog

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3"
)

// Compact discards the entries before compactIndex, with the semantics of
// raft.MemoryStorage.Compact: compactIndex itself becomes the "dummy" entry of
// which only the term is kept, so afterwards FirstIndex() == compactIndex+1
// and Term(compactIndex) still answers. It returns raft.ErrCompacted if compactIndex <= FirstIndex()-1
// (already compacted) and ErrCompactBeyondSnapshot if compactIndex is above
// the snapshot index. The freed pages are reused by later appends (see
// Stats).
//
// It deletes compactChunkEntries entries per bbolt transaction and lets go of the
// write lock between them, so a Save waits for one chunk at most. In one
// transaction, the first compaction of a server (95,000 entries behind a
// 100,000-entry snapshot) held Saves for 84 ms on an idle machine; and
// every member of a cluster compacts at about the same index, so the
// cluster's writes all stalled at once. Each chunk leaves a log compacted
// to its last index, so a crash between chunks leaves a valid log.
func (l *Log) Compact(compactIndex uint64) error {
	for first := true; ; first = false {
		done, err := l.compactChunk(compactIndex, first)
		if err != nil || done {
			return err
		}
		if h := l.opts.hooks; h != nil && h.compactChunk != nil {
			h.compactChunk()
		}
	}
}

// compactChunkEntries is the most entries one Compact transaction deletes.
const compactChunkEntries = 4096

// compactChunk deletes up to compactChunkEntries entries towards compactIndex and
// reports whether the log is compacted to compactIndex. Only the first
// chunk of a Compact reports an index already compacted away: a later
// one finds the work done by a snapshot applied meanwhile.
func (l *Log) compactChunk(compactIndex uint64, first bool) (done bool, err error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.writableLocked(); err != nil {
		return false, err
	}
	switch {
	case compactIndex <= l.prev.index && first:
		return false, raft.ErrCompacted
	case compactIndex <= l.prev.index:
		return true, nil
	case compactIndex > l.snap.meta.Index:
		return false, fmt.Errorf("%w: compact %d, snapshot index %d", ErrCompactBeyondSnapshot, compactIndex, l.snap.meta.Index)
	case compactIndex > l.last:
		return false, fmt.Errorf("%w: compact %d beyond last index %d", ErrCompactBeyondSnapshot, compactIndex, l.last)
	}
	upTo := min(compactIndex, l.prev.index+compactChunkEntries)
	c := compacted{upTo, l.terms.term(upTo)}
	flushed, err := l.commitTx("compact", l.last, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEntries)
		for i := l.prev.index + 1; i <= upTo; i++ {
			if err := b.Delete(indexKey(i)); err != nil {
				return fmt.Errorf("delete entry %d: %w", i, err)
			}
		}
		if err := tx.Bucket(bucketMeta).Put(keyCompacted, encodeCompacted(c)); err != nil {
			return fmt.Errorf("put compacted: %w", err)
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	l.mu.Lock()
	l.prev = c
	l.terms.compactTo(upTo)
	l.cache.dropBefore(upTo + 1)
	l.flushedLocked(flushed)
	l.mu.Unlock()
	if upTo < compactIndex {
		return false, nil
	}
	l.logger.Info("raftlog compacted", "index", c.index, "term", c.term)
	l.kickRotation()
	return true, nil
}
