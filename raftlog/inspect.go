package raftlog

import (
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
)

// LogSummary describes the contents of one raft.db, enough to tell whether
// two files hold the same log. Every field is derived from a full, verified
// read of the file.
type LogSummary struct {
	Entries    uint64 // entries stored
	FirstIndex uint64 // first stored entry; 0 if none
	LastIndex  uint64 // last stored entry; 0 if none
	// EntriesCRC is the CRC-32C of every entry's key and stored value, in
	// index order: equal logs have equal EntriesCRC.
	EntriesCRC     uint32
	Version        uint64           // format version record
	HardState      raftpb.HardState // hard state record; empty if none
	CompactedIndex uint64           // compacted record (the entry before FirstIndex)
	CompactedTerm  uint64
	SnapshotIndex  uint64 // snapshot record; 0 if none
	SnapshotTerm   uint64
	// MetaCRC is the CRC-32C of every meta record's key and value, in key
	// order (it covers the snapshot's conf state and data checksum).
	MetaCRC uint32
}

// diff describes the first difference between want (the old file) and got
// (the new one), or returns "".
func (want LogSummary) diff(got LogSummary) string {
	switch {
	case got.Entries != want.Entries || got.FirstIndex != want.FirstIndex || got.LastIndex != want.LastIndex:
		return fmt.Sprintf("new file holds %d entries [%d, %d], old %d [%d, %d]",
			got.Entries, got.FirstIndex, got.LastIndex, want.Entries, want.FirstIndex, want.LastIndex)
	case got.EntriesCRC != want.EntriesCRC:
		return fmt.Sprintf("entries checksum %#08x, old file %#08x", got.EntriesCRC, want.EntriesCRC)
	case got.HardState != want.HardState:
		return fmt.Sprintf("hard state %+v, old file %+v", got.HardState, want.HardState)
	case got.SnapshotIndex != want.SnapshotIndex || got.SnapshotTerm != want.SnapshotTerm:
		return fmt.Sprintf("snapshot %d/%d, old file %d/%d", got.SnapshotIndex, got.SnapshotTerm, want.SnapshotIndex, want.SnapshotTerm)
	case got != want:
		return fmt.Sprintf("records differ: %+v, old file %+v", got, want)
	}
	return ""
}

// summarize reads and verifies the whole file behind tx (path names it in
// errors): the version, every record's checksum, every entry's checksum,
// index and term order, and that the entries follow the compacted record
// without holes.
func summarize(tx *bolt.Tx, path string) (LogSummary, error) {
	var s LogSummary
	bad := func(record string, index uint64, detail string, err error) error {
		return &CorruptError{Path: path, Record: record, Index: index, Detail: detail, Err: err}
	}
	meta, ents := tx.Bucket(bucketMeta), tx.Bucket(bucketEntries)
	if meta == nil || ents == nil {
		return s, bad("bbolt", 0, "the buckets \"meta\" and \"entries\" are not both present", nil)
	}
	v := meta.Get(keyVersion)
	if len(v) != 8 {
		return s, bad("version", 0, fmt.Sprintf("version key holds %d bytes, want 8", len(v)), nil)
	}
	if s.Version = decodeU64(v); s.Version != formatVersion && s.Version != formatVersionNoJournal {
		return s, fmt.Errorf("%w: %s has format version %d, this build reads %d", ErrUnsupportedVersion, path, s.Version, formatVersion)
	}
	if v := meta.Get(keyHardState); v != nil {
		hs, detail, err := decodeHardState(v)
		if detail != "" {
			return s, bad("hard state", 0, detail, err)
		}
		s.HardState = hs
	}
	if v := meta.Get(keyCompacted); v != nil {
		c, detail := decodeCompacted(v)
		if detail != "" {
			return s, bad("compacted", 0, detail, nil)
		}
		s.CompactedIndex, s.CompactedTerm = c.index, c.term
	}
	if v := meta.Get(keySnapshot); v != nil {
		r, detail, err := decodeSnapRecord(v)
		if detail != "" {
			return s, bad("snapshot", 0, detail, err)
		}
		s.SnapshotIndex, s.SnapshotTerm = r.meta.Index, r.meta.Term
	}
	if err := meta.ForEach(func(k, v []byte) error {
		s.MetaCRC = crc32.Update(s.MetaCRC, castagnoli, k)
		s.MetaCRC = crc32.Update(s.MetaCRC, castagnoli, v)
		return nil
	}); err != nil {
		return s, fmt.Errorf("read meta bucket: %w", err)
	}
	next, lastTerm := s.CompactedIndex+1, s.CompactedTerm
	c := ents.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		i, ok := keyIndex(k)
		switch {
		case !ok:
			return s, bad("entry", 0, fmt.Sprintf("key %q of %d bytes in entries bucket, want 8", k, len(k)), nil)
		case v == nil:
			return s, bad("entry", i, "nested bucket in entries bucket", nil)
		case i != next:
			return s, bad("entry", next, fmt.Sprintf("entry missing (next stored index is %d)", i), nil)
		}
		e, detail, err := decodeEntry(v, i)
		if detail != "" {
			return s, bad("entry", i, detail, err)
		}
		if e.Term < lastTerm {
			return s, bad("entry", i, fmt.Sprintf("term %d below previous term %d", e.Term, lastTerm), nil)
		}
		if s.FirstIndex == 0 {
			s.FirstIndex = i
		}
		s.EntriesCRC = crc32.Update(s.EntriesCRC, castagnoli, k)
		s.EntriesCRC = crc32.Update(s.EntriesCRC, castagnoli, v)
		s.Entries++
		s.LastIndex, next, lastTerm = i, i+1, e.Term
	}
	return s, nil
}

// Inspection is what Inspect reports about a stopped log's raft.db.
type Inspection struct {
	Path      string // raft.db
	FileBytes int64  // size on disk
	PageSize  int    // bbolt page size
	// HighWaterBytes is the part of the file bbolt has handed out as pages;
	// the rest is preallocated growth.
	HighWaterBytes int64
	// LiveBytes is HighWaterBytes minus free pages: what a compacted file
	// needs.
	LiveBytes int64
	FreePages int   // bbolt free pages (a stopped file has no pending ones)
	FreeBytes int64 // their bytes
	// FreelistBytes is what the freelist would take on disk. Lodestone never
	// writes it (NoFreelistSync); a BoltDB log with a synced freelist writes
	// it on every commit.
	FreelistBytes int64
	// CommitWriteBytes estimates what one commit of a 16 KiB entry writes:
	// the right-most leaf of the entries B+tree (as large as the file's
	// average leaf), one page per branch level above it, the root page that
	// holds the meta bucket, and the meta page. No freelist.
	CommitWriteBytes int64
	// EntriesDepth is the height of the entries B+tree.
	EntriesDepth int
	// Summary describes the log; Inspect verified every checksum to make it.
	// It covers raft.db alone: see JournalRecords.
	Summary LogSummary
	// JournalRecords is how many records raft.wal holds that raft.db does
	// not (Saves a crash left in the journal); the next Open replays them.
	// 0 after a clean shutdown.
	JournalRecords uint64
}

// Inspect reports on the raft.db in dir without changing it: sizes, free
// pages and freelist size, what one commit writes, and a verified summary
// of the log. It opens the file read-only, which waits up to lockTimeout for
// a server holding it and then fails with ErrLocked: inspect a stopped node
// (a running one reports the same numbers in Stats). A missing file is an
// error wrapping os.ErrNotExist. Damage is reported wrapping ErrCorrupt. It
// reads the whole live log.
func Inspect(dir string, lockTimeout time.Duration) (in Inspection, err error) {
	path := filepath.Join(dir, dbFileName)
	in.Path = path
	fi, err := os.Stat(path)
	if err != nil {
		return in, fmt.Errorf("raftlog: inspect: %w", err)
	}
	in.FileBytes = fi.Size()
	defer func() {
		// NB: bbolt panics on some malformed files instead of returning an
		// error, also while it rebuilds the freelist in Open.
		if r := recover(); r != nil {
			err = &CorruptError{Path: path, Record: "bbolt", Detail: fmt.Sprintf("bbolt panicked: %v", r)}
		}
	}()
	if err := preflight(path, lockTimeout); err != nil {
		return in, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		ReadOnly:     true,
		Timeout:      lockTimeout,
		FreelistType: bolt.FreelistMapType,
		// Read-only bbolt loads the freelist lazily; we want its count.
		PreLoadFreelist: true,
	})
	if err != nil {
		return in, boltOpenError(path, err, lockTimeout)
	}
	defer func() {
		if cerr := db.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("raftlog: close %s: %w", path, cerr)
		}
	}()
	in.PageSize = db.Info().PageSize
	in.FreePages = db.Stats().FreePageN
	in.FreeBytes = int64(in.FreePages) * int64(in.PageSize)
	in.FreelistBytes = freelistBytes(in.FreePages, in.PageSize)
	err = db.View(func(tx *bolt.Tx) error {
		in.HighWaterBytes = tx.Size()
		in.LiveBytes = max(in.HighWaterBytes-in.FreeBytes, 0)
		if tx.Bucket(bucketMeta) == nil && tx.Bucket(bucketEntries) == nil {
			return &CorruptError{Path: path, Record: "bbolt", Detail: "not a raft log: no meta or entries bucket"}
		}
		s, err := summarize(tx, path)
		if err != nil {
			return err
		}
		in.Summary = s
		bs := tx.Bucket(bucketEntries).Stats()
		in.EntriesDepth = bs.Depth
		leaf := int64(1)
		if bs.LeafPageN > 0 {
			leaf = int64((bs.LeafPageN + bs.LeafOverflowN + bs.LeafPageN - 1) / bs.LeafPageN)
		}
		if min16k := int64((16<<10)/in.PageSize + 1); leaf < min16k {
			leaf = min16k // an empty or small-entry log still writes the new entry
		}
		in.CommitWriteBytes = int64(in.PageSize) * (leaf + int64(max(bs.Depth-1, 0)) + 2)
		if v := tx.Bucket(bucketMeta).Get(keyJournal); v != nil {
			consumed, detail := decodeJournalEpoch(v)
			if detail != "" {
				return &CorruptError{Path: path, Record: "journal epoch", Detail: detail}
			}
			version := formatVersion
			if v := tx.Bucket(bucketMeta).Get(keyVersion); len(v) == 8 {
				version = decodeU64(v)
			}
			in.JournalRecords, err = countJournal(OSFS{}, filepath.Join(dir, journalFileName), version, consumed)
		}
		return err
	})
	return in, err
}
