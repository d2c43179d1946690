package raftlog

import (
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
)

// A checkpoint runs off the Save path: when the journal's current epoch is
// due for one, Save hands the epoch to the fold goroutine and writes on in
// the other slot, under the next epoch; the goroutine folds the handed-over
// epoch into raft.db in one transaction. At most one fold runs: a Save that
// is due for the next one while it still runs writes to the same epoch
// instead (checkpoint_deferrals_total) and waits for it only when the epoch
// has no more room (checkpoint_waits_total), so the journal never holds more
// than two epochs.
// Until the fold commits, the entries it carries are served from the cache,
// which the checkpoint bounds keep covering both epochs (journalFits).
// FORMAT.md "Journal" has the order of writes and every crash case.

// Named steps of a fold and of a slot switch, for the crash tests.
const (
	stepFoldBegin     = "fold-begin"     // the fold's transaction is about to start
	stepFoldWritten   = "fold-written"   // its writes are done, not committed
	stepFoldCommitted = "fold-committed" // committed; the Log has not seen it yet
	stepSlotSwitched  = "slot-switched"  // a Save switched epochs, before its first record
)

// foldBufKeep is the largest record buffer a fold leaves for the next.
const foldBufKeep = 4 << 20

// fold is one epoch of the journal handed to the fold goroutine. Everything
// but err and took is fixed when Save hands it over.
type fold struct {
	db    *bolt.DB
	epoch uint64
	// ents are the entries raft.db lacks, as of the hand-over: a copy of
	// the cached entries from the epoch's first pending index to the last
	// index (the cache may drop or replace them meanwhile).
	ents []raftpb.Entry
	// last is the log's last index at the hand-over; entries
	// (last, diskLast] in raft.db are a stale suffix to delete.
	last, diskLast uint64
	hs             []byte // hard state record, nil if raft.db's is current
	journalBytes   int64  // bytes of the epoch's slot in use

	done chan struct{} // closed when the fold is over
	err  error
	took time.Duration
}

// foldLoop runs folds one at a time until foldCh is closed. Open starts it
// when the journal is on.
//
// NB: an ordinary goroutine, at the process's priority. A thread of lower
// priority does not yield the CPU to the Saves: a Go thread runs Go code
// only while it holds a P, and on a busy core the kernel leaves such a
// thread waiting while it holds one; with GOMAXPROCS 1 (a server pinned to
// one CPU) every goroutine of the process then waits with it.
func (l *Log) foldLoop() {
	defer l.foldWG.Done()
	for f := range l.foldCh {
		start := time.Now()
		f.err = l.runFold(f)
		f.took = time.Since(start)
		if f.err == nil {
			l.checkpointSeconds.Observe(f.took.Seconds())
			l.checkpoints.Add(1)
		}
		l.foldActive.Store(false)
		close(f.done)
	}
}

// runFold writes f into raft.db in one transaction. It touches no Log state
// guarded by a lock: the Save that next needs the outcome reaps it.
func (l *Log) runFold(f *fold) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = l.corrupt("bbolt", 0, fmt.Sprintf("bbolt panicked while writing: %v", r), nil)
		}
	}()
	l.foldHook(stepFoldBegin)
	recs := l.foldRecords(f.ents)
	err = f.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketEntries)
		b.FillPercent = 1.0
		for i := range f.ents {
			e := &f.ents[i]
			start := len(recs)
			recs = appendEntry(recs, e)
			if err := b.Put(indexKey(e.Index), recs[start:]); err != nil {
				return fmt.Errorf("put entry %d: %w", e.Index, err)
			}
		}
		for i := f.last + 1; i <= f.diskLast; i++ {
			if err := b.Delete(indexKey(i)); err != nil {
				return fmt.Errorf("delete entry %d: %w", i, err)
			}
		}
		meta := tx.Bucket(bucketMeta)
		if f.hs != nil {
			if err := meta.Put(keyHardState, f.hs); err != nil {
				return fmt.Errorf("put hard state: %w", err)
			}
		}
		if err := meta.Put(keyJournal, encodeJournalEpoch(f.epoch)); err != nil {
			return err
		}
		l.foldHook(stepFoldWritten)
		return nil
	})
	if err == nil {
		l.foldHook(stepFoldCommitted)
	}
	return err
}

// foldRecords returns an empty buffer with room for the records of ents.
// bbolt keeps a Put's value until its transaction ends, so a fold's
// records share one buffer, which the next fold reuses (the fold goroutine
// alone touches it): one allocation per entry was the fold's largest, and
// every entry is folded once. A buffer past foldBufKeep is not kept.
// NB: sized up front, so a fold past foldBufKeep allocates once, exactly,
// where growing by appends would allocate its doublings too.
func (l *Log) foldRecords(ents []raftpb.Entry) []byte {
	n := 0
	for i := range ents {
		n += 4 + ents[i].Size()
	}
	if cap(l.foldBuf) < n {
		l.foldBuf = make([]byte, 0, n)
	}
	buf := l.foldBuf[:0]
	if cap(l.foldBuf) > foldBufKeep {
		l.foldBuf = nil
	}
	return buf
}

// foldHook calls the test hook for a fold or switch step, if any.
func (l *Log) foldHook(step string) {
	if h := l.opts.hooks; h != nil && h.foldStep != nil {
		h.foldStep(step)
	}
}

// handOverLocked takes the journal's current epoch for a fold and starts the
// next epoch in the other slot. The caller writes its record there and then,
// whatever the write's outcome, starts the fold (startFold).
//
// NB: in that order, so the Save that switches epochs shares nothing with
// its fold. Started at the hand-over, the fold's transaction ran beside
// that Save's write and fdatasync, which then took two to four times as
// long as any other Save's.
//
// No fold may be outstanding (reapFoldLocked first). The caller holds wmu.
func (l *Log) handOverLocked() *fold {
	f := &fold{
		db:           l.db,
		epoch:        l.jr.epoch,
		last:         l.last,
		diskLast:     l.diskLast,
		journalBytes: l.jr.off,
		done:         make(chan struct{}),
	}
	if l.pendFrom != 0 {
		assert(l.cache.covers(l.pendFrom), "pending entry %d is not cached", l.pendFrom)
		for i := l.pendFrom; i <= l.last; i++ {
			f.ents = append(f.ents, *l.cache.get(i))
		}
	}
	if l.hsDirty {
		f.hs = encodeHardState(l.hs)
	}
	l.mu.Lock()
	l.folding = f
	l.hsDirty = false
	l.pendFrom, l.pendBytes = 0, 0
	l.jr.restart(l.jr.epoch + 1)
	l.mu.Unlock()
	l.foldActive.Store(true)
	l.foldHook(stepSlotSwitched)
	return f
}

// startFold has the fold goroutine run f. The caller holds wmu.
func (l *Log) startFold(f *fold) {
	l.foldCh <- f // NB: buffered, and the previous fold was reaped: never blocks
}

// reapFoldLocked takes the outcome of the outstanding fold, if any: if wait
// is false only when it is over, else waiting for it (counted as a
// checkpoint wait if count). A failed fold makes the Log refuse further
// writes, as any failed raft.db transaction does. The caller holds wmu.
func (l *Log) reapFoldLocked(wait, count bool) error {
	f := l.folding
	if f == nil {
		return nil
	}
	select {
	case <-f.done:
	default:
		if !wait {
			return nil
		}
		if count {
			l.checkpointWaits.Add(1)
		}
		<-f.done
	}
	l.mu.Lock()
	l.folding = nil
	if f.err == nil {
		l.diskLast = f.last
		l.trimReleasedLocked()
	}
	l.mu.Unlock()
	if f.err != nil {
		return l.fail("checkpoint", f.err)
	}
	l.storeJournalBytes()
	return nil
}

// storeJournalBytes updates the journal_bytes gauge: the bytes of both
// slots that hold records raft.db lacks. The caller holds wmu.
func (l *Log) storeJournalBytes() {
	n := l.jr.off
	if l.folding != nil {
		n += l.folding.journalBytes
	}
	l.journalBytes.Store(n)
}

// stopFolds waits for the outstanding fold (reaping it) and stops the fold
// goroutine. The caller holds wmu; Close calls it once.
func (l *Log) stopFolds() error {
	if l.foldCh == nil {
		return nil
	}
	err := l.reapFoldLocked(true, false)
	close(l.foldCh)
	l.foldWG.Wait()
	l.foldCh = nil
	return err
}

// WaitCheckpoint waits until no checkpoint runs in the background: the
// journal epoch handed over last is in raft.db, or the fold failed, and
// then the error is returned and the Log refuses further writes. Saves
// never need to call it; benchmarks and tests do, to keep one log's
// background work out of the next measurement.
func (l *Log) WaitCheckpoint() error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if l.closed {
		return ErrClosed
	}
	return l.reapFoldLocked(true, false)
}
