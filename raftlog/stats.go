package raftlog

import (
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Stats is a point-in-time view of the Log, for metrics and operators.
type Stats struct {
	FirstIndex    uint64 // FirstIndex()
	LastIndex     uint64 // LastIndex()
	SnapshotIndex uint64 // index of the current snapshot; 0 if none
	SnapshotTerm  uint64 // term of the current snapshot; 0 if none

	CachedEntries int   // entries served from memory
	CachedBytes   int64 // their Data bytes

	// FileBytes is the size of raft.db on disk, in bytes.
	FileBytes int64
	// LiveBytes is the part of raft.db that holds data, in bytes: bbolt's
	// high-water mark minus free and pending pages. A rotation leaves a file
	// of about this size (plus bbolt's growth step).
	LiveBytes int64
	// PageSize is raft.db's bbolt page size in bytes.
	PageSize int
	// FreePages and PendingPages are bbolt's free pages (reusable now) and
	// pending pages (freed by a recent transaction, reusable once no reader
	// needs them), as of Open or the last write transaction.
	FreePages    int
	PendingPages int
	// FreeBytes is the bytes in free and pending pages: space a rotation of
	// raft.db gives back. FreeBytes / FileBytes is the share that
	// Options.RotateFreeRatio is compared with.
	FreeBytes int64
	// FreelistBytes is what the freelist would take on disk if it were
	// written. With NoFreelistSync it never is; the number shows what each
	// commit is spared (a BoltDB log with a synced freelist writes it on
	// every commit).
	FreelistBytes int64

	Commits uint64 // successful Saves since Open
	// Checkpoints is how many times since Open the journal (raft.wal) was
	// folded into raft.db; JournalBytes is how much of it holds records
	// raft.db lacks.
	Checkpoints  uint64
	JournalBytes int64
	// CheckpointWaits is how many Saves since Open found the journal's
	// epoch due for a checkpoint while the previous one still ran in the
	// background, and waited for it. CheckpointInProgress is true while one
	// runs.
	CheckpointWaits      uint64
	CheckpointInProgress bool
	// CheckpointDeferrals is how many Saves since Open found the epoch due
	// for a checkpoint while the previous one still ran, and wrote to the
	// same epoch instead of waiting, as long as it had room (FORMAT.md
	// "Journal").
	CheckpointDeferrals uint64
	EntriesAppended     uint64        // entries written by Save since Open
	LastCommitDuration  time.Duration // time the last Save took to become durable (journal record or checkpoint)
	LastCommitBytes     int64         // encoded entry bytes written by the last Save
	// LastCommitWriteBytes is what the last Save wrote: the raft.wal space
	// its record takes (whole 4 KiB pages) or, if it was a checkpoint, its
	// raft.db commit's dirty pages plus one meta page. It stays near the
	// entry size however many free pages raft.db has.
	LastCommitWriteBytes int64

	// Rotation (FORMAT.md "Rotation").
	Rotating                bool          // a rotation is in progress
	Rotations               uint64        // rotations completed since Open
	RotationFailures        uint64        // rotations that failed (the old file stays in use)
	LastRotationPause       time.Duration // how long the last rotation held the write lock
	LastRotationDuration    time.Duration // the last rotation from start to swap
	LastRotationCopiedBytes int64         // entry and record bytes the last rotation copied
}

// Stats returns current statistics. It is cheap (one stat syscall and one
// short bbolt read transaction) and safe to call concurrently with
// everything, also after Close.
func (l *Log) Stats() Stats {
	l.mu.RLock()
	s := Stats{
		FirstIndex:    l.prev.index + 1,
		LastIndex:     l.last,
		SnapshotIndex: l.snap.meta.Index,
		SnapshotTerm:  l.snap.meta.Term,
		CachedEntries: len(l.cache.ents),
		CachedBytes:   l.cache.bytes,
	}
	db, closed := l.db, l.closed
	s.PageSize = l.pageSize
	l.mu.RUnlock()
	bs := db.Stats()
	s.FreePages = bs.FreePageN
	s.PendingPages = bs.PendingPageN
	s.FreeBytes = int64(bs.FreePageN+bs.PendingPageN) * int64(s.PageSize)
	s.FreelistBytes = freelistBytes(bs.FreePageN+bs.PendingPageN, s.PageSize)
	if fi, err := os.Stat(l.dbPath); err == nil {
		s.FileBytes = fi.Size()
	}
	s.LiveBytes = max(s.FileBytes-s.FreeBytes, 0)
	if !closed {
		// NB: a rotation may close db once we let go of mu; then Begin
		// fails and the estimate above stands.
		if tx, err := db.Begin(false); err == nil {
			s.LiveBytes = max(tx.Size()-s.FreeBytes, 0)
			_ = tx.Rollback()
		}
	}
	s.Commits = l.commits.Load()
	s.Checkpoints = l.checkpoints.Load()
	s.JournalBytes = l.journalBytes.Load()
	s.CheckpointWaits = l.checkpointWaits.Load()
	s.CheckpointDeferrals = l.checkpointDeferrals.Load()
	s.CheckpointInProgress = l.foldActive.Load()
	s.EntriesAppended = l.appended.Load()
	s.LastCommitDuration = time.Duration(l.lastCommitNanos.Load())
	s.LastCommitBytes = l.lastCommitBytes.Load()
	s.LastCommitWriteBytes = l.lastCommitWrite.Load()
	s.Rotating = l.rotating.Load()
	s.Rotations = l.rotations.Load()
	s.RotationFailures = l.rotationFailures.Load()
	s.LastRotationPause = time.Duration(l.lastRotatePause.Load())
	s.LastRotationDuration = time.Duration(l.lastRotateTook.Load())
	s.LastRotationCopiedBytes = l.lastRotateCopied.Load()
	return s
}

// pageAlloc is bbolt's running count of bytes allocated to pages by write
// transactions.
func pageAlloc(db *bolt.DB) int64 {
	s := db.Stats()
	return s.TxStats.GetPageAlloc()
}

// freelistBytes is the size bbolt would give the freelist of n pages on disk
// (a page header plus 8 bytes per page id, one more when the count overflows
// the header's 16-bit field), as bbolt's EstimatedWritePageSize computes it.
func freelistBytes(n, pageSize int) int64 {
	if n == 0 || pageSize == 0 {
		return 0
	}
	if n >= 0xFFFF {
		n++
	}
	return int64(16 + 8*n)
}
