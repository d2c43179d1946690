package raftlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Defaults for the zero values of Options.
const (
	DefaultCacheEntries      = 8192
	DefaultCacheBytes        = 64 << 20 // 64 MiB
	DefaultSnapshotsRetained = 2
	DefaultLockTimeout       = time.Second
	DefaultJournalBytes      = 8 << 20 // 8 MiB: room for CheckpointEntries one-page records and CheckpointBytes
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
	// DefaultCacheBytes (64 MiB). The newest entry is always cached even if it
	// alone is larger. Lowering it trades memory for bbolt reads when a
	// follower lags.
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

	// FS is the filesystem for snapshot data files (dir/snap) and for the
	// rename and directory sync of a rotation. Nil means the operating system
	// (OSFS). Tests inject faults through it.
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
	// durable with one fdatasync (FORMAT.md "Journal"), in bytes. 0 means
	// DefaultJournalBytes (8 MiB). Negative disables the journal: every
	// Save is then a bbolt commit (two fdatasyncs). The journal is folded
	// into raft.db (a checkpoint) when it is full, when its entries reach
	// CheckpointEntries or CheckpointBytes (at most half of CacheEntries and
	// CacheBytes: entries not yet in raft.db are served from memory), and by
	// every other write transaction; a disabled cache disables it too. Cost:
	// disk, and at Open the time to read and replay what the journal holds.
	JournalBytes int64

	// CheckpointEntries and CheckpointBytes bound what the journal holds
	// that raft.db lacks: entries, and their Data bytes. 0 means
	// DefaultCheckpointEntries (256) and DefaultCheckpointBytes (1 MiB).
	// A checkpoint is one bbolt commit that the Save reaching the bound
	// waits for: raising them makes checkpoints rarer but each one longer
	// (measured here, 300-byte entries: ~1.4 ms at 256, ~4.5 ms at 1024,
	// ~26 ms at 4096), which shows in the write latency tail.
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

// Log is a durable raft.Storage on bbolt. See the package documentation for
// the caller's duties and the concurrency rules.
//
// Locking: rotMu serializes rotations; snapMu serializes snapshot
// operations (and the lazy load of snapshot data); wmu serializes write
// transactions and the reads that go to bbolt; mu guards the in-memory view.
// Lock order is rotMu, snapMu, wmu, mu. A field marked "wmu+mu" is written
// only with both held, so holding either one is enough to read it.
type Log struct {
	dir, dbPath, snapDir string
	opts                 Options
	fs                   FS
	logger               *slog.Logger
	// db is raft.db. Only a rotation replaces it (wmu+mu); the rotation that
	// holds rotMu may also read it without wmu, since nobody else swaps it.
	db       *bolt.DB
	pageSize int // wmu+mu: db's page size

	rotMu  sync.Mutex
	snapMu sync.Mutex
	wmu    sync.Mutex
	mu     sync.RWMutex

	// Rotation: the goroutine started by Open (if automatic rotation is on)
	// waits on rotKick; Close cancels rotCtx, closes rotStop and waits on
	// rotWG.
	rotKick   chan struct{}
	rotStop   chan struct{}
	rotCtx    context.Context
	rotCancel context.CancelFunc
	rotWG     sync.WaitGroup
	stopOnce  sync.Once
	rot       rotationTrack // wmu+mu: what Save and ApplySnapshot changed during a rotation
	retryAt   time.Time     // rotMu: earliest next automatic attempt, after a failure

	// jr is raft.wal; nil if the journal is disabled. pendFrom is the first
	// entry saved in the journal and not yet in raft.db (0: none), diskLast
	// the last index raft.db's entries bucket holds (it may hold a stale
	// suffix past last until the next checkpoint), pendBytes the Data bytes
	// of the pending entries (an upper bound). All wmu+mu.
	jr        *journal
	pendFrom  uint64
	diskLast  uint64
	pendBytes int64

	closed bool             // wmu+mu
	failed error            // wmu+mu: first failed write transaction
	hs     raftpb.HardState // wmu+mu
	// hsDirty means hs holds a commit index newer than the one on disk: a
	// commit-only change is kept in memory and written by the next
	// transaction (wmu+mu).
	hsDirty bool
	prev    compacted  // wmu+mu: entry before FirstIndex
	last    uint64     // wmu+mu: LastIndex
	terms   termIndex  // wmu+mu: terms of [prev.index, last]
	cache   entryCache // wmu+mu: suffix of the log
	snap    snapRecord // snapMu+wmu+mu: current snapshot (meta.Index 0: none)

	snapData   []byte // snapMu+mu: data of snap, once loaded
	snapLoaded bool   // snapMu+mu

	commits          atomic.Uint64 // successful Saves
	checkpoints      atomic.Uint64 // journal folds into raft.db
	journalBytes     atomic.Int64  // journal bytes holding records raft.db lacks
	appended         atomic.Uint64 // entries written by Save
	lastCommitNanos  atomic.Int64
	lastCommitBytes  atomic.Int64
	lastCommitWrite  atomic.Int64 // bytes bbolt wrote for the last Save
	saveSeconds      prometheus.Histogram
	commitWriteBytes prometheus.Histogram

	rotating         atomic.Bool
	rotations        atomic.Uint64
	rotationFailures atomic.Uint64
	lastRotatePause  atomic.Int64 // nanoseconds
	lastRotateTook   atomic.Int64 // nanoseconds
	lastRotateCopied atomic.Int64 // bytes
	rotatePause      prometheus.Histogram
}

var _ raft.Storage = (*Log)(nil)

// Open opens (creating if needed) the log in dir: dir/raft.db and
// dir/snap/. It verifies the checksum of every stored entry and record and the
// presence and size of the current snapshot's data file, so a damaged log is
// refused here, with an error wrapping ErrCorrupt that names the file and the
// index, rather than later inside raft, which panics on storage errors. It
// also removes leftover temporary and superseded snapshot files.
//
// Open takes time proportional to the retained log (snapshots keep it short)
// plus, because the freelist is not persisted, a scan of raft.db's pages.
func Open(dir string, opts Options) (*Log, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	start := time.Now()
	l := &Log{
		dir:     dir,
		dbPath:  filepath.Join(dir, dbFileName),
		snapDir: filepath.Join(dir, snapDirName),
		opts:    opts,
		fs:      opts.FS,
		logger:  opts.Logger,
		cache:   entryCache{maxEntries: opts.CacheEntries, maxBytes: opts.CacheBytes},
		saveSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "lodestone",
			Subsystem: "raftlog",
			Name:      "save_duration_seconds",
			Help:      "Time to commit and fsync one Save (one Ready's entries and hard state) to raft.db.",
			Buckets:   prometheus.ExponentialBuckets(50e-6, 2, 18), // 50µs .. ~6.5s
		}),
		commitWriteBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "lodestone",
			Subsystem: "raftlog",
			Name:      "commit_write_bytes",
			Help:      "Bytes one Save's bbolt commit wrote to raft.db: dirty pages plus the meta page (the freelist is never written).",
			Buckets:   prometheus.ExponentialBuckets(4096, 2, 16), // 4 KiB .. 128 MiB
		}),
		rotatePause: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "lodestone",
			Subsystem: "raftlog",
			Name:      "rotation_pause_seconds",
			Help:      "Time a rotation of raft.db held the write lock (final catch-up, fsync, rename, directory fsync).",
			Buckets:   prometheus.ExponentialBuckets(100e-6, 2, 18), // 100µs .. ~13s
		}),
		rotKick: make(chan struct{}, 1),
		rotStop: make(chan struct{}),
	}
	l.rotCtx, l.rotCancel = context.WithCancel(context.Background())
	l.terms.reset(0, 0)
	if err := l.fs.MkdirAll(l.snapDir, 0o700); err != nil {
		return nil, fmt.Errorf("raftlog: create %s: %w", l.snapDir, err)
	}
	db, err := openBolt(l.dbPath, opts)
	if err != nil {
		return nil, err
	}
	l.db, l.pageSize = db, db.Info().PageSize
	if err := l.open(); err != nil {
		_ = db.Close()
		l.rotCancel()
		return nil, err
	}
	l.pruneSnapshots()
	l.removeRotateLeftover()
	l.logger.Info("raftlog opened", "dir", dir,
		"first_index", l.prev.index+1, "last_index", l.last,
		"snapshot_index", l.snap.meta.Index, "took", time.Since(start))
	if opts.RotateFreeRatio >= 0 {
		l.rotWG.Add(1)
		go l.rotateLoop()
		l.kickRotation() // a file left bloated by an earlier run
	}
	return l, nil
}

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
		if got := decodeU64(v); got != formatVersion && got != formatVersionNoJournal {
			return fmt.Errorf("%w: %s has format version %d, this build reads %d",
				ErrUnsupportedVersion, l.dbPath, got, formatVersion)
		}
		upgrade = decodeU64(v) == formatVersionNoJournal
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
		e, detail, err := decodeEntry(v, i)
		if detail != "" {
			return l.corrupt("entry", i, detail, err)
		}
		if e.Term < lastTerm {
			return l.corrupt("entry", i, fmt.Sprintf("term %d below previous term %d", e.Term, lastTerm), nil)
		}
		l.terms.append(i, e.Term)
		l.cache.append([]raftpb.Entry{e})
		next, lastTerm = i+1, e.Term
	}
	l.last = next - 1
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

// corrupt builds a CorruptError about raft.db.
func (l *Log) corrupt(record string, index uint64, detail string, err error) error {
	return &CorruptError{Path: l.dbPath, Record: record, Index: index, Detail: detail, Err: err}
}

// view runs a read transaction, turning a bbolt panic into ErrCorrupt.
func (l *Log) view(fn func(*bolt.Tx) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = l.corrupt("bbolt", 0, fmt.Sprintf("bbolt panicked while reading: %v", r), nil)
		}
	}()
	return l.db.View(fn)
}

// update runs a write transaction (one commit, which bbolt makes durable with
// fdatasync before returning). Any failure is sticky: see ErrWriteFailed.
// The caller holds wmu.
func (l *Log) update(step string, fn func(*bolt.Tx) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = l.corrupt("bbolt", 0, fmt.Sprintf("bbolt panicked while writing: %v", r), nil)
		}
		if err != nil {
			err = l.fail(step, err)
		}
	}()
	return l.db.Update(fn)
}

// fail records a failed write: the Log refuses further writes (see
// ErrWriteFailed). It returns err wrapped with step.
func (l *Log) fail(step string, err error) error {
	err = fmt.Errorf("raftlog: %s: %w", step, err)
	l.mu.Lock()
	l.failed = err
	l.mu.Unlock()
	l.logger.Error("raftlog write failed; refusing further writes until reopened", "step", step, "err", err)
	return err
}

// writableLocked reports why the Log cannot write. The caller holds wmu or mu.
func (l *Log) writableLocked() error {
	if l.closed {
		return ErrClosed
	}
	if l.failed != nil {
		return fmt.Errorf("%w: %w", ErrWriteFailed, l.failed)
	}
	return nil
}

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

// Save persists one Ready: ents (replacing every stored entry with index >=
// ents[0].Index, the conflicting suffix) and hs (unless
// raft.IsEmptyHardState(hs)), in one bbolt write transaction made durable
// before Save returns. Entries at or below FirstIndex()-1 are skipped, as
// raft.MemoryStorage.Append does. ents must be consecutive and must not leave
// a gap after LastIndex(), and hs.Commit must lie in [FirstIndex()-1, the
// resulting last index] (raft refuses to start otherwise); if not, Save
// returns ErrOutOfOrder and writes nothing.
//
// A Save with no entries whose hard state differs from the saved one only in
// Commit (raft.MustSync is false) writes nothing: the new commit index is
// kept in memory, served by InitialState, and written by the next
// transaction. After a crash the commit index may therefore read lower than
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
		// syncing it would add a full bbolt commit to every write's path.
		// The next transaction writes it.
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
	if l.journalFits(pendFrom, newLast, dataBytes, &rec) {
		start := time.Now()
		written, err := l.jr.append(&rec)
		if err != nil {
			return l.fail("save to journal", err)
		}
		l.observeSave(time.Since(start), len(ents), bytes, written)
		l.journalBytes.Store(l.jr.off)
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
	Checkpoints        uint64
	JournalBytes       int64
	EntriesAppended    uint64        // entries written by Save since Open
	LastCommitDuration time.Duration // commit + fsync time of the last Save
	LastCommitBytes    int64         // encoded entry bytes written by the last Save
	// LastCommitWriteBytes is what the last Save's bbolt commit wrote to
	// raft.db: its dirty pages plus one meta page. It stays near the entry
	// size however many free pages the file has.
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

// Close stops a rotation in progress (its temporary file is removed; the old
// file stays in use), waits for any write or snapshot in progress, then
// closes raft.db. Every later call returns ErrClosed, except Close (nil) and
// Stats.
func (l *Log) Close() error {
	l.stopRotation()
	l.rotMu.Lock()
	defer l.rotMu.Unlock()
	l.snapMu.Lock()
	defer l.snapMu.Unlock()
	l.wmu.Lock()
	defer l.wmu.Unlock()
	var flushErr error
	if (l.hsDirty || l.journalPending()) && l.writableLocked() == nil {
		// A clean shutdown keeps the latest commit index and leaves the
		// journal empty.
		hs := l.hs
		var flushed bool
		flushed, flushErr = l.commitTx("flush on close", l.last, func(tx *bolt.Tx) error {
			return tx.Bucket(bucketMeta).Put(keyHardState, encodeHardState(hs))
		})
		if flushErr == nil {
			l.mu.Lock()
			l.flushedLocked(flushed)
			l.mu.Unlock()
		}
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.hsDirty = false
	l.closed = true
	l.cache.reset()
	l.snapData, l.snapLoaded = nil, false
	l.mu.Unlock()
	if l.jr != nil {
		if err := l.jr.close(); err != nil {
			flushErr = errors.Join(flushErr, err)
		}
	}
	if err := l.db.Close(); err != nil {
		return errors.Join(flushErr, fmt.Errorf("raftlog: close %s: %w", l.dbPath, err))
	}
	return flushErr
}

func decodeU64(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
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
