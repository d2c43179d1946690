package raftlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

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

	// jr is raft.wal; nil if the journal is disabled. pendFrom is the first
	// entry saved in the journal and not yet in raft.db (0: none), diskLast
	// the last index raft.db's entries bucket holds (it may hold a stale
	// suffix past last until the next checkpoint), pendBytes the Data bytes
	// of the pending entries (an upper bound). All wmu+mu.
	jr        *journal
	pendFrom  uint64
	diskLast  uint64
	pendBytes int64
	// journalVersion is the format version raft.db had at Open, until
	// openJournal has replayed raft.wal with that version's layout.
	journalVersion uint64
	// folding is the journal epoch handed to the fold goroutine and not yet
	// reaped (wmu+mu; nil: none). foldCh feeds the goroutine (nil if the
	// journal is off, or after Close); Close waits on foldWG.
	folding *fold
	foldCh  chan *fold
	foldWG  sync.WaitGroup
	foldBuf []byte // the fold goroutine's record buffer (foldRecords)

	closed bool             // wmu+mu
	failed error            // wmu+mu: first failed write (journal record or raft.db transaction)
	hs     raftpb.HardState // wmu+mu
	// hsDirty means hs holds a commit index newer than the one on disk: a
	// commit-only change is kept in memory and written by the next
	// transaction (wmu+mu).
	hsDirty bool
	prev    compacted  // wmu+mu: entry before FirstIndex
	last    uint64     // wmu+mu: LastIndex
	terms   termIndex  // wmu+mu: terms of [prev.index, last]
	cache   entryCache // wmu+mu: suffix of the log
	// released is the highest index the caller let go of (Release): the
	// cache holds no entry up to it that raft.db holds (wmu+mu).
	released uint64
	snap     snapRecord // snapMu+wmu+mu: current snapshot (meta.Index 0: none)

	commits           atomic.Uint64 // successful Saves
	checkpoints       atomic.Uint64 // journal folds into raft.db
	checkpointWaits   atomic.Uint64 // Saves that waited for the previous fold
	foldActive        atomic.Bool   // a fold is running in the background
	checkpointSeconds prometheus.Histogram
	journalBytes      atomic.Int64  // journal bytes holding records raft.db lacks
	appended          atomic.Uint64 // entries written by Save
	lastCommitNanos   atomic.Int64
	lastCommitBytes   atomic.Int64
	lastCommitWrite   atomic.Int64 // bytes bbolt wrote for the last Save
	saveSeconds       prometheus.Histogram
	commitWriteBytes  prometheus.Histogram
	// checkpointDeferrals counts Saves that found the epoch due while the
	// previous fold ran and wrote to the same epoch instead of waiting.
	checkpointDeferrals atomic.Uint64

	rotating         atomic.Bool
	rotations        atomic.Uint64
	rotationFailures atomic.Uint64
	lastRotatePause  atomic.Int64 // nanoseconds
	lastRotateTook   atomic.Int64 // nanoseconds
	lastRotateCopied atomic.Int64 // bytes
	rotatePause      prometheus.Histogram
}

var _ raft.Storage = (*Log)(nil)

// Open opens (creating if needed) the log in dir: dir/raft.db, dir/raft.wal
// and dir/snap/. It first replays into raft.db the Saves that raft.wal holds
// and raft.db lacks (left there by a crash). It verifies the checksum of every stored entry and record and the
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
			Help:      "Time to make one Save (one Ready's entries and hard state) durable: its raft.wal record written and fdatasynced, or its raft.db commit when it checkpoints.",
			Buckets:   prometheus.ExponentialBuckets(50e-6, 2, 18), // 50µs .. ~6.5s
		}),
		commitWriteBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "lodestone",
			Subsystem: "raftlog",
			Name:      "commit_write_bytes",
			Help:      "Bytes one Save wrote: the raft.wal space its record takes, or, when it checkpoints, its raft.db commit's dirty pages plus the meta page (the freelist is never written).",
			Buckets:   prometheus.ExponentialBuckets(4096, 2, 16), // 4 KiB .. 128 MiB
		}),
		rotatePause: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "lodestone",
			Subsystem: "raftlog",
			Name:      "rotation_pause_seconds",
			Help:      "Time a rotation of raft.db held the write lock (final catch-up, fsync, rename, directory fsync).",
			Buckets:   prometheus.ExponentialBuckets(100e-6, 2, 18), // 100µs .. ~13s
		}),
		checkpointSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "lodestone",
			Subsystem: "raftlog",
			Name:      "checkpoint_duration_seconds",
			Help:      "Time one background fold of a journal epoch into raft.db took (one bbolt commit, off the Save path).",
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
	if l.jr != nil {
		l.foldCh = make(chan *fold, 1)
		l.foldWG.Add(1)
		go l.foldLoop()
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

// Close stops a rotation in progress (its temporary file is removed; the old
// file stays in use), waits for any write, snapshot or background checkpoint
// in progress, folds the journal and a commit index held only in memory into raft.db (unless an
// earlier write failed), then closes raft.wal and raft.db. Every later call
// returns ErrClosed, except Close (nil) and Stats.
func (l *Log) Close() error {
	l.stopRotation()
	l.rotMu.Lock()
	defer l.rotMu.Unlock()
	l.snapMu.Lock()
	defer l.snapMu.Unlock()
	l.wmu.Lock()
	defer l.wmu.Unlock()
	// A fold in progress finishes first; if it failed, writableLocked
	// below refuses the flush.
	flushErr := l.stopFolds()
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
