package raftlog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
)

// errNothingReplayed rolls back the replay transaction of an empty journal.
var errNothingReplayed = errors.New("journal holds no records to replay")

// openJournal opens raft.wal and replays into raft.db, in one transaction,
// every record raft.db does not hold yet, so that load sees the whole log:
// those of the two epochs after the consumed one, in epoch order (an epoch
// being folded and the one written meanwhile). A version 2 file's single
// slot is replayed as such, and the same transaction upgrades the file.
// Only open calls it, before the Log is shared.
func (l *Log) openJournal() (err error) {
	path := filepath.Join(l.dir, journalFileName)
	_, statErr := l.fs.Stat(path)
	exists := statErr == nil
	if statErr != nil && !errors.Is(statErr, os.ErrNotExist) {
		// NB: taking the file for missing would, with the journal disabled,
		// skip replaying records that Saves acknowledged.
		return fmt.Errorf("raftlog: stat journal %s: %w", path, statErr)
	}
	upgrade := l.journalVersion == formatVersionOneSlot
	if l.opts.JournalBytes < 0 && !exists && !upgrade {
		return nil
	}
	j, err := openJournal(l.fs, path, upgrade)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil && j != nil {
			_ = j.close()
		}
	}()
	if !exists {
		if err := l.fs.SyncDir(l.dir); err != nil {
			return fmt.Errorf("raftlog: sync dir %s: %w", l.dir, err)
		}
	}
	var n, next uint64
	err = l.db.Update(func(tx *bolt.Tx) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = l.corrupt("bbolt", 0, fmt.Sprintf("bbolt panicked while replaying the journal: %v", r), nil)
			}
		}()
		var was, consumed uint64
		n, was, consumed, err = l.replayJournal(tx, j)
		if err != nil {
			return err
		}
		next = consumed + 1
		meta := tx.Bucket(bucketMeta)
		if upgrade {
			// NB: consume the epoch after too, replayed or not, so no byte
			// of the one-slot layout can ever match an epoch written in
			// the two-slot layout.
			next = max(next, was+2)
			if err := meta.Put(keyVersion, encodeVersion(formatVersion)); err != nil {
				return fmt.Errorf("put version: %w", err)
			}
			return meta.Put(keyJournal, encodeJournalEpoch(next-1))
		}
		if n == 0 {
			return errNothingReplayed
		}
		return meta.Put(keyJournal, encodeJournalEpoch(consumed))
	})
	if err != nil && !errors.Is(err, errNothingReplayed) {
		return fmt.Errorf("raftlog: replay journal %s: %w", path, err)
	}
	if upgrade {
		l.journalVersion = formatVersion
		l.logger.Info("raftlog upgraded the format", "path", l.dbPath, "version", formatVersion)
	}
	if n > 0 {
		l.logger.Info("raftlog journal replayed", "path", path, "records", n)
	}
	if l.opts.JournalBytes < 0 {
		// Replayed into raft.db: nothing in it is needed any more.
		cerr := j.close()
		j = nil // closed: not again on the way out
		if cerr != nil {
			return cerr
		}
		if err := l.fs.Remove(path); err != nil && (exists || !errors.Is(err, os.ErrNotExist)) {
			return fmt.Errorf("raftlog: remove disabled journal: %w", err)
		}
		return l.fs.SyncDir(l.dir)
	}
	// Everything the file held is in raft.db now: the slots may move.
	if err := j.grow(l.opts.JournalBytes); err != nil {
		return err
	}
	j.restart(next)
	l.jr = j
	return nil
}

// replayJournal applies to tx the records of j that raft.db lacks: the
// epoch after the consumed one and, if it had records, the next (one
// epoch for the one-slot layout). It returns the number of records, the
// consumed epoch raft.db recorded, and the last epoch the records came
// from (the consumed one if none).
func (l *Log) replayJournal(tx *bolt.Tx, j *journal) (n, consumed, last uint64, err error) {
	meta := tx.Bucket(bucketMeta)
	var prev uint64
	if v := meta.Get(keyJournal); v != nil {
		var detail string
		if consumed, detail = decodeJournalEpoch(v); detail != "" {
			return 0, 0, 0, l.corrupt("journal epoch", 0, detail, nil)
		}
	}
	if v := meta.Get(keyCompacted); v != nil {
		c, detail := decodeCompacted(v)
		if detail != "" {
			return 0, 0, 0, l.corrupt("compacted", 0, detail, nil)
		}
		prev = c.index
	}
	last = consumed
	epochs := uint64(2)
	if j.legacy {
		epochs = 1
	}
	for e := consumed + 1; e <= consumed+epochs; e++ {
		k, torn, err := j.replay(e, func(seq uint64, r journalRecord) error {
			return replayRecord(tx, j.path, seq, prev, r)
		})
		if err != nil {
			return n, consumed, last, err
		}
		n += k
		if k > 0 {
			last = e
		}
		if torn >= 0 {
			l.logger.Warn("raftlog journal ends in a torn record: a Save cut short by a crash or a failed write, never acknowledged",
				"path", j.path, "offset", torn, "epoch", e, "records_replayed", k)
		}
		if k > 0 && torn < 0 {
			continue
		}
		// The epoch ended early (no records, or a torn tail): a Save of
		// it never returned, so no later epoch can have been written.
		if e < consumed+epochs && j.hasRecord(e+1) {
			return n, consumed, last, &CorruptError{Path: j.path, Record: "journal record", Index: 0,
				Detail: fmt.Sprintf("epoch %d holds records although epoch %d ends after %d records", e+1, e, k)}
		}
		break
	}
	return n, consumed, last, nil
}

// replayRecord applies one journal record to raft.db as Save did to memory:
// its entries replace any stored at their indexes and everything after them.
func replayRecord(tx *bolt.Tx, path string, seq, prev uint64, r journalRecord) error {
	b := tx.Bucket(bucketEntries)
	b.FillPercent = 1.0
	if len(r.vals) > 0 {
		c := b.Cursor()
		last := prev
		if k := lastKey(c); k != nil {
			last, _ = keyIndex(k)
		}
		if r.first > last+1 {
			return &CorruptError{Path: path, Record: "journal record", Index: seq,
				Detail: fmt.Sprintf("entries from %d would leave a gap after stored index %d", r.first, last)}
		}
		if err := deleteEntries(b, r.first+uint64(len(r.vals)), last, "replaced"); err != nil {
			return err
		}
	}
	for k, v := range r.vals {
		i := r.first + uint64(k)
		if _, detail, err := decodeEntry(v, i); detail != "" {
			return &CorruptError{Path: path, Record: "journal entry", Index: i, Detail: detail, Err: err}
		}
		if i <= prev {
			continue // compacted since (a checkpoint came first, so cannot happen; harmless)
		}
		if err := b.Put(indexKey(i), v); err != nil {
			return fmt.Errorf("put entry %d: %w", i, err)
		}
	}
	if r.hs != nil {
		if _, err := journalHardState(path, seq, r.hs); err != nil {
			return err
		}
		if err := tx.Bucket(bucketMeta).Put(keyHardState, r.hs); err != nil {
			return fmt.Errorf("put hard state: %w", err)
		}
	}
	return nil
}

// journalPending reports whether the journal holds records raft.db lacks.
// The caller holds wmu or mu.
func (l *Log) journalPending() bool {
	return l.jr != nil && l.jr.seq > 0
}

// journalFits reports whether a Save can go to the journal's current epoch:
// the journal is on, the record fits in the epoch's slot, and the entries
// pending in the epoch afterwards (from pendFrom to last) stay within the
// checkpoint bounds and a quarter of the cache. With the epoch being folded
// bounded the same way, every entry raft.db lacks is still served from
// memory. While the previous epoch is being folded, an epoch past the
// checkpoint bounds still takes the Save up to a quarter of the cache
// (deferred): switching would wait for that fold, a bbolt commit on the
// write path, and the next fold is the larger for it instead. The caller
// holds wmu.
func (l *Log) journalFits(pendFrom, last uint64, dataBytes int64, r *journalRecord) (fits, deferred bool) {
	if l.jr == nil || l.cache.maxEntries <= 0 || !l.jr.fits(r.payloadLen()) {
		return false, false
	}
	pending := l.pendBytes + dataBytes
	if l.epochBounds(pendFrom, last, pending) {
		return true, false
	}
	deferred = l.folding != nil && withinBounds(pendFrom, last, pending, l.cache.maxEntries/4, l.cache.maxBytes/4)
	return deferred, deferred
}

// epochFits reports whether a Save fits an empty epoch: the same bounds as
// journalFits for its record and entries alone. One that does not is a
// checkpoint of its own (a raft.db transaction on the Save path).
func (l *Log) epochFits(ents []raftpb.Entry, dataBytes int64, r *journalRecord) bool {
	if l.jr == nil || l.cache.maxEntries <= 0 || !l.jr.fitsEmpty(r.payloadLen()) {
		return false
	}
	if len(ents) == 0 {
		return l.epochBounds(0, 0, 0)
	}
	return l.epochBounds(ents[0].Index, ents[len(ents)-1].Index, dataBytes)
}

// epochBounds reports whether an epoch holding entries [pendFrom, last]
// (pendFrom 0: none) of dataBytes Data bytes is within the checkpoint
// bounds.
func (l *Log) epochBounds(pendFrom, last uint64, dataBytes int64) bool {
	return withinBounds(pendFrom, last, dataBytes,
		min(l.opts.CheckpointEntries, l.cache.maxEntries/4), min(l.opts.CheckpointBytes, l.cache.maxBytes/4))
}

// withinBounds reports whether entries [pendFrom, last] (pendFrom 0: none)
// of dataBytes Data bytes are at most maxEntries and maxBytes.
func withinBounds(pendFrom, last uint64, dataBytes int64, maxEntries int, maxBytes int64) bool {
	if pendFrom != 0 && last-pendFrom+1 > uint64(maxEntries) {
		return false
	}
	return dataBytes <= maxBytes
}

// flushTx writes what the journal holds and raft.db lacks into tx: the
// pending entries up to upTo, the removal of a stale suffix, a newer hard
// state, and the consumed epoch. The caller holds wmu and calls
// flushedLocked once tx has committed.
func (l *Log) flushTx(tx *bolt.Tx, upTo uint64) error {
	if !l.journalPending() {
		return nil
	}
	b := tx.Bucket(bucketEntries)
	b.FillPercent = 1.0
	if l.pendFrom != 0 {
		for i := l.pendFrom; i <= min(l.last, upTo); i++ {
			if !l.cache.covers(i) {
				return fmt.Errorf("pending entry %d is not cached (cache from %d)", i, l.cache.first())
			}
			if err := b.Put(indexKey(i), encodeEntry(l.cache.get(i))); err != nil {
				return fmt.Errorf("put entry %d: %w", i, err)
			}
		}
	}
	for i := l.last + 1; i <= l.diskLast; i++ {
		if err := b.Delete(indexKey(i)); err != nil {
			return fmt.Errorf("delete entry %d: %w", i, err)
		}
	}
	meta := tx.Bucket(bucketMeta)
	if l.hsDirty {
		if err := meta.Put(keyHardState, encodeHardState(l.hs)); err != nil {
			return fmt.Errorf("put hard state: %w", err)
		}
	}
	return meta.Put(keyJournal, encodeJournalEpoch(l.jr.epoch))
}

// flushedLocked records that a transaction holding flushTx's writes
// committed: raft.db holds the whole log and the journal starts a new epoch.
// The caller holds wmu and mu, and has updated last.
func (l *Log) flushedLocked(flushed bool) {
	if flushed {
		l.jr.restart(l.jr.epoch + 1)
		l.hsDirty = false
		l.checkpoints.Add(1)
		l.storeJournalBytes()
	}
	l.pendFrom, l.pendBytes, l.diskLast = 0, 0, l.last
	l.trimReleasedLocked()
}

// commitTx runs one raft.db write transaction that carries what the
// journal holds (flushTx, entries up to upTo) and then fn: no raft.db
// transaction leaves the journal behind it. flushed tells the caller to call
// flushedLocked once its in-memory view is updated. The caller holds wmu.
func (l *Log) commitTx(step string, upTo uint64, fn func(*bolt.Tx) error) (flushed bool, err error) {
	// The epoch being folded reaches raft.db first: this transaction
	// builds on it.
	if err := l.reapFoldLocked(true, false); err != nil {
		return false, err
	}
	flushed = l.journalPending()
	err = l.update(step, func(tx *bolt.Tx) error {
		if err := l.flushTx(tx, upTo); err != nil {
			return err
		}
		return fn(tx)
	})
	return flushed, err
}

// checkpointLocked folds the journal into raft.db if it holds anything,
// after waiting for a background fold: raft.db alone then holds the whole
// log. The caller holds wmu.
func (l *Log) checkpointLocked() error {
	if err := l.reapFoldLocked(true, false); err != nil {
		return err
	}
	if !l.journalPending() {
		return nil
	}
	if _, err := l.commitTx("checkpoint", l.last, func(*bolt.Tx) error { return nil }); err != nil {
		return err
	}
	l.mu.Lock()
	l.flushedLocked(true)
	l.mu.Unlock()
	return nil
}
