package raftlog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// openBolt opens raft.db with the settings FORMAT.md relies on.
func openBolt(path string, opts Options) (db *bolt.DB, err error) {
	if err := preflight(path, opts.LockTimeout); err != nil {
		return nil, err
	}
	defer func() {
		// NB: bbolt can panic on a malformed file instead of returning an
		// error; damaged disk input must surface as ErrCorrupt, not a crash.
		if r := recover(); r != nil {
			db, err = nil, &CorruptError{Path: path, Record: "bbolt", Detail: fmt.Sprintf("bbolt panicked: %v", r)}
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{
		Timeout: opts.LockTimeout,
		// The hashmap freelist allocates in O(1), and with NoFreelistSync a
		// commit never writes the freelist: its cost cannot grow with the
		// number of free pages (the 7.8 MB-freelist-per-append failure).
		FreelistType:    bolt.FreelistMapType,
		NoFreelistSync:  true,
		InitialMmapSize: opts.InitialMmapSize,
	})
	if err != nil {
		return nil, boltOpenError(path, err, opts.LockTimeout)
	}
	return db, nil
}

// open initializes or checks the buckets and loads the in-memory view.
func (l *Log) open() error {
	// Make raft.db's and snap/'s directory entries durable: bbolt does not
	// sync the directory after creating the file.
	if err := l.fs.SyncDir(l.dir); err != nil {
		return fmt.Errorf("raftlog: sync dir %s: %w", l.dir, err)
	}
	fresh, upgrade := false, false
	l.journalVersion = formatVersion
	if err := l.view(func(tx *bolt.Tx) error {
		meta, ents := tx.Bucket(bucketMeta), tx.Bucket(bucketEntries)
		switch {
		case meta == nil && ents == nil:
			// A new file, unless it is some other program's bbolt file.
			fresh = true
			return tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
				return l.corrupt("bbolt", 0, fmt.Sprintf("not a raft log: holds bucket %q", name), nil)
			})
		case meta == nil || ents == nil:
			return l.corrupt("bbolt", 0, "one of the buckets \"meta\" and \"entries\" is missing", nil)
		}
		v := meta.Get(keyVersion)
		if len(v) != 8 {
			return l.corrupt("version", 0, fmt.Sprintf("version key holds %d bytes, want 8", len(v)), nil)
		}
		switch got := decodeU64(v); got {
		case formatVersion:
		case formatVersionOneSlot:
			// Upgraded by openJournal, in its replay transaction.
			l.journalVersion = got
		case formatVersionNoJournal:
			upgrade = true
		default:
			return fmt.Errorf("%w: %s has format version %d, this build reads %d (and upgrades %d and %d)",
				ErrUnsupportedVersion, l.dbPath, got, formatVersion, formatVersionNoJournal, formatVersionOneSlot)
		}
		return nil
	}); err != nil {
		return err
	}
	if upgrade {
		if err := l.db.Update(func(tx *bolt.Tx) error {
			meta := tx.Bucket(bucketMeta)
			if err := meta.Put(keyJournal, encodeJournalEpoch(firstJournalEpoch())); err != nil {
				return err
			}
			return meta.Put(keyVersion, encodeVersion(formatVersion))
		}); err != nil {
			return fmt.Errorf("raftlog: upgrade %s to format version %d: %w", l.dbPath, formatVersion, err)
		}
	}
	if fresh {
		if err := l.db.Update(func(tx *bolt.Tx) error {
			meta, err := tx.CreateBucket(bucketMeta)
			if err != nil {
				return fmt.Errorf("create meta bucket: %w", err)
			}
			if _, err := tx.CreateBucket(bucketEntries); err != nil {
				return fmt.Errorf("create entries bucket: %w", err)
			}
			if err := meta.Put(keyJournal, encodeJournalEpoch(firstJournalEpoch())); err != nil {
				return fmt.Errorf("put journal epoch: %w", err)
			}
			return meta.Put(keyVersion, encodeVersion(formatVersion))
		}); err != nil {
			return fmt.Errorf("raftlog: initialize %s: %w", l.dbPath, err)
		}
	}
	if err := l.openJournal(); err != nil {
		return err
	}
	if err := l.view(l.load); err != nil {
		return err
	}
	l.diskLast = l.last
	return l.checkLoaded()
}

// load reads every record and entry, verifying checksums, and builds the
// in-memory view. Only Open calls it, before the Log is shared.
func (l *Log) load(tx *bolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if v := meta.Get(keyHardState); v != nil {
		hs, detail, err := decodeHardState(v)
		if detail != "" {
			return l.corrupt("hard state", 0, detail, err)
		}
		l.hs = hs
	}
	if v := meta.Get(keyCompacted); v != nil {
		c, detail := decodeCompacted(v)
		if detail != "" {
			return l.corrupt("compacted", 0, detail, nil)
		}
		l.prev = c
	}
	if v := meta.Get(keySnapshot); v != nil {
		r, detail, err := decodeSnapRecord(v)
		if detail != "" {
			return l.corrupt("snapshot", 0, detail, err)
		}
		l.snap = r
	}
	l.terms.reset(l.prev.index, l.prev.term)
	next, lastTerm := l.prev.index+1, l.prev.term
	// NB: every entry is checked, but only the newest, which the cache
	// keeps, are decoded into entries of their own; the rest go through
	// one reused Entry. Decoding each into its own let a restart allocate
	// and copy the whole log, the catch-up entries behind the snapshot
	// included, to keep the last CacheBytes of it.
	var scratch raftpb.Entry
	var sizes []int
	c := tx.Bucket(bucketEntries).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		i, ok := keyIndex(k)
		switch {
		case !ok:
			return l.corrupt("entry", 0, fmt.Sprintf("key %q of %d bytes in entries bucket, want 8", k, len(k)), nil)
		case v == nil:
			return l.corrupt("entry", i, "nested bucket in entries bucket", nil)
		case i < next:
			return l.corrupt("entry", i, fmt.Sprintf("entry at or below compacted index %d", l.prev.index), nil)
		case i > next:
			return l.corrupt("entry", next, fmt.Sprintf("entry missing (next stored index is %d)", i), nil)
		}
		scratch = raftpb.Entry{Data: scratch.Data[:0]}
		if detail, err := decodeEntryInto(&scratch, v, i); detail != "" {
			return l.corrupt("entry", i, detail, err)
		}
		if scratch.Term < lastTerm {
			return l.corrupt("entry", i, fmt.Sprintf("term %d below previous term %d", scratch.Term, lastTerm), nil)
		}
		l.terms.append(i, scratch.Term)
		sizes = append(sizes, len(scratch.Data))
		next, lastTerm = i+1, scratch.Term
	}
	l.last = next - 1
	return l.loadCache(c, l.cache.window(sizes))
}

// loadCache decodes the last n entries of the log, checked already, into
// the cache.
func (l *Log) loadCache(c *bolt.Cursor, n int) error {
	if n == 0 {
		return nil
	}
	from := l.last - uint64(n) + 1
	for k, v := c.Seek(indexKey(from)); k != nil; k, v = c.Next() {
		i, _ := keyIndex(k)
		e, detail, err := decodeEntry(v, i)
		if detail != "" {
			return l.corrupt("entry", i, detail, err)
		}
		l.cache.append([]raftpb.Entry{e})
	}
	return nil
}

// checkLoaded cross-checks the loaded records and the snapshot data file.
func (l *Log) checkLoaded() error {
	si := l.snap.meta.Index
	switch {
	case l.prev.index > si:
		return l.corrupt("compacted", l.prev.index,
			fmt.Sprintf("log compacted past the snapshot index %d", si), nil)
	case si > l.last:
		return l.corrupt("snapshot", si, fmt.Sprintf("snapshot beyond the last index %d", l.last), nil)
	case !raft.IsEmptyHardState(l.hs) && (l.hs.Commit < l.prev.index || l.hs.Commit > l.last):
		// raft panics on such a hard state; refuse it here with a clear message.
		return l.corrupt("hard state", 0, fmt.Sprintf("commit index %d outside the log [%d, %d]",
			l.hs.Commit, l.prev.index, l.last), nil)
	}
	if si == 0 {
		return nil
	}
	path := filepath.Join(l.snapDir, snapFileName(si, l.snap.meta.Term))
	fi, err := l.fs.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return &CorruptError{Path: path, Record: "snapshot file", Index: si, Detail: "missing", Err: err}
	case err != nil:
		return fmt.Errorf("raftlog: stat %s: %w", path, err)
	case uint64(fi.Size()) != l.snap.dataLen:
		return &CorruptError{Path: path, Record: "snapshot file", Index: si,
			Detail: fmt.Sprintf("size %d, recorded %d", fi.Size(), l.snap.dataLen)}
	}
	return nil
}
