package raftlog

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Save persists one Ready: ents (replacing every stored entry with index >=
// ents[0].Index, the conflicting suffix) and hs (unless
// raft.IsEmptyHardState(hs)), durable before Save returns: as one record
// appended to the journal (raft.wal) and fdatasynced, or, when the journal is
// full, disabled or holds as much as a checkpoint allows, as one bbolt write
// transaction of raft.db that also carries what the journal held (FORMAT.md
// "Journal"). Entries at or below FirstIndex()-1 are skipped, as
// raft.MemoryStorage.Append does. ents must be consecutive and must not leave
// a gap after LastIndex(), and hs.Commit must lie in [FirstIndex()-1, the
// resulting last index] (raft refuses to start otherwise); if not, Save
// returns ErrOutOfOrder and writes nothing.
//
// A Save with no entries whose hard state differs from the saved one only in
// Commit (raft.MustSync is false) writes nothing: the new commit index is
// kept in memory, served by InitialState, and written by the next journal
// record or raft.db transaction. After a crash the commit index may therefore read lower than
// it was; Raft relearns it from the leader, and nothing committed is lost
// because the entries themselves were synced.
//
// The Log keeps the entries (and their Data) in its cache: the caller must not
// modify them afterwards (raft never does). Save may run concurrently with
// the raft.Storage methods, which see either the old or the new state.
func (l *Log) Save(hs raftpb.HardState, ents []raftpb.Entry) error {
	hasHS := !raft.IsEmptyHardState(hs)
	if !hasHS && len(ents) == 0 {
		return nil
	}
	for i := 1; i < len(ents); i++ {
		if ents[i].Index != ents[0].Index+uint64(i) {
			return fmt.Errorf("%w: entry %d follows entry %d", ErrOutOfOrder, ents[i].Index, ents[i-1].Index)
		}
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if err := l.writableLocked(); err != nil {
		return err
	}
	if len(ents) > 0 {
		switch first := l.prev.index + 1; {
		case ents[len(ents)-1].Index < first:
			ents = nil
		case ents[0].Index < first:
			ents = ents[first-ents[0].Index:]
		}
	}
	newLast := l.last
	if len(ents) > 0 {
		if ents[0].Index > l.last+1 {
			return fmt.Errorf("%w: entry %d would leave a gap after last index %d",
				ErrOutOfOrder, ents[0].Index, l.last)
		}
		newLast = ents[len(ents)-1].Index
	}
	if hasHS && (hs.Commit > newLast || hs.Commit < l.prev.index) {
		// raft refuses to start from such a hard state; refuse to write it.
		return fmt.Errorf("%w: hard state commit %d outside the log [%d, %d]",
			ErrOutOfOrder, hs.Commit, l.prev.index, newLast)
	}
	if len(ents) == 0 && (!hasHS || hs == l.hs) {
		return nil
	}
	if len(ents) == 0 && !raft.MustSync(hs, l.hs, 0) {
		// NB: only the commit index moved. Raft needs no fsync for that
		// (a restarted node relearns its commit index from the leader), and
		// syncing it would add a second write and fdatasync to every
		// write's path. The next journal record or transaction writes it.
		l.mu.Lock()
		l.hs, l.hsDirty = hs, true
		l.mu.Unlock()
		return nil
	}
	if !hasHS && l.hsDirty {
		hs, hasHS = l.hs, true
	}
	// Encode (and checksum) outside the transaction.
	vals := make([][]byte, len(ents))
	var bytes int64
	for i := range ents {
		vals[i] = encodeEntry(&ents[i])
		bytes += int64(len(vals[i]))
	}
	if l.rot.active && len(ents) > 0 {
		// A rotation in progress copies this range again (see rotationTrack).
		l.mu.Lock()
		l.rot.markDirty(ents[0].Index)
		l.mu.Unlock()
	}
	var dataBytes int64
	for i := range ents {
		dataBytes += int64(len(ents[i].Data))
	}
	pendFrom := l.pendFrom
	if len(ents) > 0 && (pendFrom == 0 || ents[0].Index < pendFrom) {
		pendFrom = ents[0].Index
	}
	rec := journalRecord{vals: vals}
	if len(ents) > 0 {
		rec.first = ents[0].Index
	}
	if hasHS {
		rec.hs = encodeHardState(hs)
	}
	// NB: a fold that failed stops the Log here rather than at the next
	// switch; one that is over frees its slot and its entries' bound.
	if err := l.reapFoldLocked(false, false); err != nil {
		return err
	}
	fits, deferred := l.journalFits(pendFrom, newLast, dataBytes, &rec)
	if deferred {
		// NB: the epoch is due, but the previous fold still runs; the
		// first Save after it switches.
		l.checkpointDeferrals.Add(1)
	}
	if !fits && l.epochFits(ents, dataBytes, &rec) {
		// The epoch is due for a checkpoint: fold it in the background and
		// write this record to the other slot, once the previous fold has
		// freed it.
		if err := l.reapFoldLocked(true, true); err != nil {
			return err
		}
		if l.journalPending() {
			defer l.startFold(l.handOverLocked())
		}
		pendFrom, fits = 0, true
		if len(ents) > 0 {
			pendFrom = ents[0].Index
		}
	}
	if fits {
		start := time.Now()
		written, err := l.jr.append(&rec)
		if err != nil {
			return l.fail("save to journal", err)
		}
		l.observeSave(time.Since(start), len(ents), bytes, written)
		l.storeJournalBytes()
		l.mu.Lock()
		defer l.mu.Unlock()
		l.savedLocked(hs, hasHS, ents, newLast)
		if len(ents) > 0 {
			l.pendFrom = pendFrom
			l.pendBytes += dataBytes
		}
		if hasHS {
			l.hsDirty = true // raft.db's is older until the next checkpoint
		}
		return nil
	}
	upTo := newLast
	if len(ents) > 0 {
		upTo = ents[0].Index - 1 // the rest of the pending entries ents replaces
	}
	allocBefore := pageAlloc(l.db)
	start := time.Now()
	flushed, err := l.commitTx("save", upTo, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEntries)
		// NB: keys arrive in ascending order, so fill pages completely
		// instead of bbolt's default 50% split.
		b.FillPercent = 1.0
		for i := range ents {
			if err := b.Put(indexKey(ents[i].Index), vals[i]); err != nil {
				return fmt.Errorf("put entry %d: %w", ents[i].Index, err)
			}
		}
		if len(ents) > 0 {
			// Drop the rest of a conflicting suffix longer than ents.
			for i := newLast + 1; i <= l.last; i++ {
				if err := b.Delete(indexKey(i)); err != nil {
					return fmt.Errorf("delete entry %d: %w", i, err)
				}
			}
		}
		if hasHS {
			if err := tx.Bucket(bucketMeta).Put(keyHardState, encodeHardState(hs)); err != nil {
				return fmt.Errorf("put hard state: %w", err)
			}
		}
		return nil
	})
	took := time.Since(start)
	if err != nil {
		return err
	}
	// NB: write transactions are serialized by wmu, so the growth of bbolt's
	// page allocation counter is this commit's dirty pages; add the meta page.
	l.observeSave(took, len(ents), bytes, pageAlloc(l.db)-allocBefore+int64(l.pageSize))
	l.mu.Lock()
	defer l.mu.Unlock()
	l.savedLocked(hs, hasHS, ents, newLast)
	l.flushedLocked(flushed)
	if hasHS {
		l.hsDirty = false
	}
	return nil
}

// observeSave records one Save's cost.
func (l *Log) observeSave(took time.Duration, entries int, bytes, written int64) {
	l.saveSeconds.Observe(took.Seconds())
	l.commitWriteBytes.Observe(float64(written))
	l.commits.Add(1)
	l.appended.Add(uint64(entries))
	l.lastCommitNanos.Store(int64(took))
	l.lastCommitBytes.Store(bytes)
	l.lastCommitWrite.Store(written)
}

// savedLocked updates the in-memory view after a Save. The caller holds wmu
// and mu.
func (l *Log) savedLocked(hs raftpb.HardState, hasHS bool, ents []raftpb.Entry, newLast uint64) {
	if len(ents) > 0 {
		if ents[0].Index <= l.last {
			l.terms.truncateFrom(ents[0].Index)
			l.cache.truncateFrom(ents[0].Index)
		}
		for i := range ents {
			l.terms.append(ents[i].Index, ents[i].Term)
		}
		l.cache.append(ents)
		l.last = newLast
	}
	if hasHS {
		l.hs = hs
	}
}
