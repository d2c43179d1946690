package raftlog

import (
	"log/slog"
	"time"
)

// Defaults for the zero values of Options.
const (
	DefaultCacheEntries      = 8192
	DefaultCacheBytes        = 16 << 20 // 16 MiB
	DefaultSnapshotsRetained = 2
	DefaultLockTimeout       = time.Second
	DefaultJournalBytes      = 8 << 20 // 8 MiB: two slots, each with room for CheckpointEntries one-page records and CheckpointBytes
	DefaultCheckpointEntries = 256
	DefaultCheckpointBytes   = 1 << 20 // 1 MiB

	// Rotation (online compaction of raft.db): see Options.RotateFreeRatio
	// and FORMAT.md "Rotation".
	DefaultRotateFreeRatio     = 0.5
	DefaultRotateMinBytes      = 64 << 20 // 64 MiB
	DefaultRotateRetryInterval = time.Minute
)

// File names inside the directory passed to Open.
const (
	dbFileName      = "raft.db"
	rotateFileName  = "raft.db.rotating" // a rotation's new file until it is renamed over raft.db
	journalFileName = "raft.wal"
	snapDirName     = "snap"
)

// Options configures a Log. The zero value is a good production default.
type Options struct {
	// Logger receives state changes (open, snapshot created or applied,
	// compaction, rotation) at Info, removed files at Debug, and failures at
	// Warn and Error. Keys: index, term. Nil discards.
	Logger *slog.Logger

	// CacheEntries is how many of the most recent entries are kept in memory
	// so Entries on the replication hot path does not read bbolt. 0 means
	// DefaultCacheEntries (8192). Negative disables the cache: every Entries
	// call opens a bbolt read transaction (tests use this to check the disk
	// path). Term, FirstIndex and LastIndex never read disk either way. Cost:
	// memory, bounded also by CacheBytes.
	CacheEntries int

	// CacheBytes caps the Entry.Data bytes the cache holds, in bytes. 0 means
	// DefaultCacheBytes (16 MiB). The newest entry is always cached even if it
	// alone is larger. Lowering it trades memory for bbolt reads when a
	// follower lags. The default holds thousands of batched entries, more
	// than a follower that keeps up is ever behind; each cached byte costs
	// about two of resident memory (the GC's headroom).
	CacheBytes int64

	// SnapshotsRetained is how many snapshot data files are kept in dir/snap,
	// newest first, the current one included. 0 means
	// DefaultSnapshotsRetained (2). 1 keeps only the current snapshot. Older
	// files are never read by the Log; they are kept for operators.
	SnapshotsRetained int

	// LockTimeout is how long Open waits for another process to release its
	// lock on raft.db before failing with ErrLocked. 0 means
	// DefaultLockTimeout (1s).
	LockTimeout time.Duration

	// InitialMmapSize is passed to bbolt, in bytes. 0 lets bbolt grow the
	// mapping on demand. Setting it above the expected file size avoids
	// remaps, each of which waits for open read transactions.
	InitialMmapSize int

	// FS is the filesystem for every file in dir but raft.db: the journal
	// (raft.wal), the snapshot data files (dir/snap), the directory syncs of
	// Open, and the rename and directory sync of a rotation. Nil means the
	// operating system (OSFS). Tests inject faults through it
	// (raftlogtest.FaultFS).
	FS FS

	// RotateFreeRatio is the share of raft.db, in [0, 1), held by free and
	// pending pages (Stats.FreeBytes / Stats.FileBytes) above which the Log
	// rotates raft.db online: it copies the live entries and records to a
	// fresh file on a goroutine of its own while it keeps serving, then swaps
	// the files under the write lock (FORMAT.md "Rotation"). It is checked
	// after Open, Compact and ApplySnapshot, which are what free pages.
	// 0 means DefaultRotateFreeRatio (0.5); negative disables automatic
	// rotation (Rotate still works). Cost of lowering it: more rotations,
	// each reading and writing the live log once and pausing writes for the
	// catch-up; of raising it: more disk held by free pages (which cost
	// appends nothing: the freelist is never written).
	RotateFreeRatio float64

	// RotateMinBytes is the size raft.db must reach, in bytes, before
	// automatic rotation is considered, so small logs are never rotated.
	// 0 means DefaultRotateMinBytes (64 MiB). Must not be negative.
	RotateMinBytes int64

	// RotateRetryInterval is how long, by Clock, automatic rotation waits
	// after a failed attempt (e.g. a full disk) before it tries again.
	// 0 means DefaultRotateRetryInterval (1 minute). Lowering it retries a
	// persistent failure more often, each time copying the live log.
	RotateRetryInterval time.Duration

	// JournalBytes is the size of raft.wal, the journal that makes a Save
	// durable with one fdatasync (FORMAT.md "Journal"), in bytes: two slots
	// of half that each, one written while the other's epoch is folded into
	// raft.db in the background (a checkpoint). 0 means DefaultJournalBytes
	// (8 MiB). Negative disables the journal: every Save is then a bbolt
	// commit (two fdatasyncs). An epoch is due for a checkpoint when the next
	// record does not fit in its slot, when its entries reach
	// CheckpointEntries or CheckpointBytes (at most a quarter of
	// CacheEntries and CacheBytes: entries not yet in raft.db are served from
	// memory), and it is folded by every other write transaction; a disabled
	// cache disables the journal too. Cost: disk, and at Open the time to
	// read and replay what the journal holds.
	JournalBytes int64

	// CheckpointEntries and CheckpointBytes bound what one journal epoch
	// holds that raft.db lacks: entries, and their Data bytes. 0 means
	// DefaultCheckpointEntries (256) and DefaultCheckpointBytes (1 MiB).
	// A checkpoint is one bbolt commit in the background; while it runs,
	// an epoch due for the next one grows past these bounds
	// (Stats.CheckpointDeferrals), and a Save waits for it only when the
	// epoch would pass its slot or a quarter of the cache
	// (Stats.CheckpointWaits). Raising them makes checkpoints rarer but
	// each one longer (measured here, 300-byte entries: ~1.4 ms at 256,
	// ~4.5 ms at 1024, ~26 ms at 4096), and holds more in memory and in
	// raft.wal (raise JournalBytes to match).
	CheckpointEntries int
	CheckpointBytes   int64

	// Clock supplies the time for the rotation policy (RotateRetryInterval).
	// Nil means the system clock. Durations the Log reports (Stats, metrics)
	// are measured with the monotonic clock regardless.
	Clock Clock

	// hooks are test-only fault points (export_test.go); nil in production.
	hooks *testHooks
}

// Clock is the source of time for policy decisions, so tests can step time
// by hand.
type Clock interface {
	Now() time.Time
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// testHooks lets tests stop a rotation at a named step (crash tests kill the
// process there) and shrink its copy chunks.
type testHooks struct {
	rotateStep   func(step string)
	chunkEntries int
	compactChunk func() // between two chunks of a Compact, write lock released
	foldStep     func(step string)
}

// Validate reports the first invalid field as an *OptionsError.
func (o Options) Validate() error {
	switch {
	case o.CacheBytes < 0:
		return &OptionsError{Field: "CacheBytes", Reason: "must not be negative"}
	case o.CheckpointEntries < 0:
		return &OptionsError{Field: "CheckpointEntries", Reason: "must not be negative"}
	case o.CheckpointBytes < 0:
		return &OptionsError{Field: "CheckpointBytes", Reason: "must not be negative"}
	case o.SnapshotsRetained < 0:
		return &OptionsError{Field: "SnapshotsRetained", Reason: "must not be negative"}
	case o.LockTimeout < 0:
		return &OptionsError{Field: "LockTimeout", Reason: "must not be negative"}
	case o.InitialMmapSize < 0:
		return &OptionsError{Field: "InitialMmapSize", Reason: "must not be negative"}
	case o.RotateFreeRatio >= 1:
		return &OptionsError{Field: "RotateFreeRatio", Reason: "must be below 1 (negative disables rotation)"}
	case o.RotateMinBytes < 0:
		return &OptionsError{Field: "RotateMinBytes", Reason: "must not be negative"}
	case o.RotateRetryInterval < 0:
		return &OptionsError{Field: "RotateRetryInterval", Reason: "must not be negative"}
	}
	return nil
}

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.CacheEntries == 0 {
		o.CacheEntries = DefaultCacheEntries
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	if o.SnapshotsRetained == 0 {
		o.SnapshotsRetained = DefaultSnapshotsRetained
	}
	if o.LockTimeout == 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.FS == nil {
		o.FS = OSFS{}
	}
	if o.JournalBytes == 0 {
		o.JournalBytes = DefaultJournalBytes
	}
	if o.CheckpointEntries == 0 {
		o.CheckpointEntries = DefaultCheckpointEntries
	}
	if o.CheckpointBytes == 0 {
		o.CheckpointBytes = DefaultCheckpointBytes
	}
	if o.RotateFreeRatio == 0 {
		o.RotateFreeRatio = DefaultRotateFreeRatio
	}
	if o.RotateMinBytes == 0 {
		o.RotateMinBytes = DefaultRotateMinBytes
	}
	if o.RotateRetryInterval == 0 {
		o.RotateRetryInterval = DefaultRotateRetryInterval
	}
	if o.Clock == nil {
		o.Clock = systemClock{}
	}
	return o
}
