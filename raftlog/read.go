package raftlog

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// InitialState implements raft.Storage. It returns the last saved hard state
// and the ConfState of the current snapshot (see the package documentation
// for why it is the snapshot's and not the latest applied one).
func (l *Log) InitialState() (raftpb.HardState, raftpb.ConfState, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return raftpb.HardState{}, raftpb.ConfState{}, ErrClosed
	}
	return l.hs, cloneConfState(l.snap.meta.ConfState), nil
}

// Entries implements raft.Storage: the entries in [lo, hi), at least one if
// any, and no more than fit in maxSize bytes (protobuf size, as raft counts).
// It returns raft.ErrCompacted if lo <= FirstIndex()-1, raft.ErrUnavailable if
// the log holds no entries, and an error wrapping raft.ErrUnavailable if
// hi > LastIndex()+1. An entry that fails its checksum is reported with an
// error wrapping ErrCorrupt, never returned.
//
// The caller owns the returned slice and may append to it; the entries'
// Data must not be modified (they are shared with the cache).
func (l *Log) Entries(lo, hi, maxSize uint64) ([]raftpb.Entry, error) {
	l.mu.RLock()
	ents, done, err := l.entriesLocked(lo, hi, maxSize, false)
	l.mu.RUnlock()
	if done {
		return ents, err
	}
	// Part of the range is only on disk. Reading it under wmu means no write
	// transaction can commit between our look at the in-memory view and the
	// bbolt read, so the two agree.
	l.wmu.Lock()
	defer l.wmu.Unlock()
	ents, _, err = l.entriesLocked(lo, hi, maxSize, true)
	return ents, err
}

// entriesLocked serves Entries. The caller holds mu (read) or, if disk is
// true, wmu. done is false if the range needs a disk read and disk is false.
func (l *Log) entriesLocked(lo, hi, maxSize uint64, disk bool) (ents []raftpb.Entry, done bool, err error) {
	switch {
	case l.closed:
		return nil, true, ErrClosed
	case lo <= l.prev.index:
		// NB: raft compares storage errors with ==; return the sentinels
		// unwrapped.
		return nil, true, raft.ErrCompacted
	case hi > l.last+1:
		return nil, true, fmt.Errorf("raftlog: entries [%d, %d) beyond last index %d: %w",
			lo, hi, l.last, raft.ErrUnavailable)
	case l.last == l.prev.index:
		return nil, true, raft.ErrUnavailable
	case lo > hi:
		return nil, true, fmt.Errorf("raftlog: entries [%d, %d): lo > hi", lo, hi)
	case lo == hi:
		return nil, true, nil
	}
	// [lo, split) comes from bbolt, [split, hi) from the cache.
	split := lo
	if !l.cache.covers(lo) {
		split = hi
		if l.cache.covers(hi - 1) {
			split = l.cache.first()
		}
		if !disk {
			return nil, false, nil
		}
	}
	var size uint64
	add := func(e *raftpb.Entry) bool {
		s := uint64(e.Size())
		if len(ents) > 0 && size+s > maxSize {
			return false
		}
		size += s
		ents = append(ents, *e)
		return true
	}
	if split > lo {
		full, err := l.readEntries(lo, split, add)
		if err != nil || !full {
			return ents, true, err
		}
	} else {
		// Cache only: size the result first so it is allocated once.
		n, s := 0, uint64(0)
		for i := lo; i < hi; i++ {
			s += uint64(l.cache.get(i).Size())
			if n > 0 && s > maxSize {
				break
			}
			n++
		}
		ents = make([]raftpb.Entry, 0, n)
	}
	for i := split; i < hi; i++ {
		if !add(l.cache.get(i)) {
			break
		}
	}
	return ents, true, nil
}

// readEntries reads [lo, hi) from bbolt, passing each verified entry to add
// until add returns false (full is then false). The caller holds wmu.
func (l *Log) readEntries(lo, hi uint64, add func(*raftpb.Entry) bool) (full bool, err error) {
	err = l.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketEntries).Cursor()
		k, v := c.Seek(indexKey(lo))
		for i := lo; i < hi; i++ {
			if got, ok := keyIndex(k); k == nil || !ok || got != i || v == nil {
				return l.corrupt("entry", i, "entry missing from entries bucket", nil)
			}
			// NB: decodeEntry copies out of v, which is only valid inside
			// this transaction.
			e, detail, err := decodeEntry(v, i)
			if detail != "" {
				return l.corrupt("entry", i, detail, err)
			}
			if !add(&e) {
				return nil
			}
			k, v = c.Next()
		}
		full = true
		return nil
	})
	return full, err
}

// Term implements raft.Storage: the term of entry i, for i in
// [FirstIndex()-1, LastIndex()]. It returns raft.ErrCompacted below that range
// and raft.ErrUnavailable above it. It never reads disk.
func (l *Log) Term(i uint64) (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	switch {
	case l.closed:
		return 0, ErrClosed
	case i < l.prev.index:
		return 0, raft.ErrCompacted
	case i > l.last:
		return 0, raft.ErrUnavailable
	}
	return l.terms.term(i), nil
}

// LastIndex implements raft.Storage. It never reads disk.
func (l *Log) LastIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, ErrClosed
	}
	return l.last, nil
}

// FirstIndex implements raft.Storage. It never reads disk.
func (l *Log) FirstIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return 0, ErrClosed
	}
	return l.prev.index + 1, nil
}
