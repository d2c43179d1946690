package raftlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Steps of a rotation, in order, as named to test hooks (export_test.go) and
// in FORMAT.md "Rotation". A crash test kills the process at each one.
const (
	stepBegin    = "begin"     // tracking started; no new file yet
	stepCopy     = "copy"      // the first chunk is in the new file, more to come
	stepCopied   = "copied"    // the bulk copy is in the new file and fsynced
	stepCaughtUp = "caught-up" // final catch-up and records committed and fsynced, write lock held, before the rename
	stepRenamed  = "renamed"   // new file renamed over raft.db, before the directory fsync
	stepSwapped  = "swapped"   // directory fsynced, handle swapped; the old file is not yet closed
)

// Outcomes of one check by the automatic rotation goroutine, also reported
// to test hooks.
const (
	stepNotDue = "not-due" // the policy said no
	stepDone   = "done"    // a rotation completed
	stepFailed = "failed"  // a rotation failed; the next waits RotateRetryInterval
)

// rotateSteps lists the steps in order.
var rotateSteps = []string{stepBegin, stepCopy, stepCopied, stepCaughtUp, stepRenamed, stepSwapped}

const (
	// defaultChunkEntries and defaultChunkBytes bound one copy chunk: one
	// short read transaction on the old file and one fsynced write
	// transaction on the new one. Short read transactions keep the old
	// file's writer from waiting on a remap and let it reuse pages freed
	// meanwhile.
	//
	// NB: each chunk is fsynced on its own. Left to the page cache, the copy
	// piles up the whole live log as dirty pages (the kernel starts writing
	// back only at dirty_background_ratio, gigabytes on a big machine) and
	// the final fsync flushes it in one burst, behind which every append's
	// fsync on the old file queues: appends stalled for half a second in
	// the benchmark. A 256 KiB chunk keeps what an append can queue behind
	// to about a millisecond (the benchmark's append p99 during a rotation
	// went from 20-35 ms with 1 MiB chunks to 6-7 ms), at the price of more
	// fsyncs: a rotation of 170 MiB of live data took about 2 s.
	defaultChunkEntries = 4096
	defaultChunkBytes   = 256 << 10
	// catchUpEntries: catch-up rounds run outside the write lock until one
	// copies no more than this many entries (or maxCatchUpRounds ran); the
	// rest is copied under the lock. It bounds the pause.
	catchUpEntries   = 64
	maxCatchUpRounds = 16
	// releaseStep is how much of the old file releaseOld frees at a time.
	releaseStep = 16 << 20
)

// rotationTrack is what writes did, while a rotation runs, to the range the
// rotation copies (wmu+mu).
type rotationTrack struct {
	active bool
	// dirtyFrom is the lowest index a Save wrote since the rotation last
	// took the track (0: none). The rotation copies [dirtyFrom, last] again,
	// which covers appends, overwritten suffixes and truncated ones.
	dirtyFrom uint64
	// reset says an ApplySnapshot replaced the whole log: every entry in the
	// new file is stale.
	reset bool
}

func (r *rotationTrack) markDirty(i uint64) {
	if r.dirtyFrom == 0 || i < r.dirtyFrom {
		r.dirtyFrom = i
	}
}

// RotateOptions configures one Rotate call. The zero value is what automatic
// rotation uses.
type RotateOptions struct {
	// Progress, if set, is called on the rotating goroutine after each copied
	// chunk and once at the end (Copied == Total).
	Progress func(RotateProgress)
	// Verify compares the new file with the old one before the swap, under
	// the write lock: every entry (key, bytes and checksum), the entry count,
	// the format version, hard state, compacted and snapshot records. A
	// mismatch fails the rotation with ErrVerify and leaves the old file in
	// use. It reads both files once more, so the pause grows with the live
	// log: meant for offline compaction (lodestone compact).
	Verify bool
	// BackupPath, if set, keeps the old file under this name (a hard link
	// made just before the rename), for offline compaction. It must be in
	// the log's directory's filesystem and must not exist.
	BackupPath string
}

// RotateProgress is how far a rotation's copy has come.
type RotateProgress struct {
	Copied      uint64 // entries copied so far (catch-up copies count again)
	Total       uint64 // entries to copy, as known now (grows with appends)
	CopiedBytes int64  // bytes of entry values copied so far
}

// RotateResult describes a completed rotation.
type RotateResult struct {
	Entries     uint64        // entries in the new file
	CopiedBytes int64         // entry and record bytes copied, catch-up included
	BeforeBytes int64         // size of raft.db before
	AfterBytes  int64         // size of raft.db after
	Pause       time.Duration // time the write lock was held (catch-up, fsync, rename, dir fsync)
	Took        time.Duration // from start to swap
	// Summary describes the new file, checked equal to the old file's; only
	// with RotateOptions.Verify (it reads the whole file).
	Summary LogSummary
}

// Rotate rewrites raft.db online: it copies the live entries and records to
// raft.db.rotating on the calling goroutine while the Log keeps serving
// (reads and Saves run concurrently; Saves during the copy are copied again
// by catch-up rounds), fsyncs it, then under the write lock copies the last
// changes, fsyncs, renames it over raft.db, fsyncs the directory and swaps
// the handle. The pause (RotateResult.Pause, Stats.LastRotationPause, metric
// rotation_pause_seconds) is bounded by the entries written during the last
// catch-up round, never by the file's size. Rotations are serialized;
// automatic ones (Options.RotateFreeRatio) run on the Log's own goroutine.
//
// On an error before the rename, the old file stays in use, the temporary
// file is removed and writes continue. If the directory fsync after the
// rename fails, the Log refuses further writes (ErrWriteFailed): the
// directory may name either file and only a reopen can tell. Canceling ctx
// or Close stops a rotation before its final step. Errors wrap the step that
// failed and: ErrClosed (closed, or closing meanwhile), ErrWriteFailed (an
// earlier write failed), ErrCorrupt (a stored value failed its checksum on
// the way), ErrVerify (with Verify), ctx.Err(). It needs free disk for one
// copy of the live log. Crash recovery: FORMAT.md "Rotation".
func (l *Log) Rotate(ctx context.Context, ro RotateOptions) (RotateResult, error) {
	return l.rotate(ctx, ro)
}

// rotator holds one rotation's state. Only the rotating goroutine uses it.
type rotator struct {
	l       *Log
	ctx     context.Context
	ro      RotateOptions
	src     *bolt.DB // l.db when the rotation began
	dst     *bolt.DB // the new file, open at tmpPath
	tmpPath string
	swapped bool     // dst became l.db: nothing to clean up
	oldFile *os.File // the old raft.db, opened just before the rename; see releaseOld

	copiedTo    uint64 // dst holds the entries up to here (plus stale ones the next round deletes)
	copied      uint64
	total       uint64
	copiedBytes int64
	chunk       int
}

func (l *Log) rotate(ctx context.Context, ro RotateOptions) (res RotateResult, err error) {
	l.rotMu.Lock()
	defer l.rotMu.Unlock()
	start := time.Now()
	r := &rotator{l: l, ctx: ctx, ro: ro, tmpPath: filepath.Join(l.dir, rotateFileName), chunk: defaultChunkEntries}
	if h := l.opts.hooks; h != nil && h.chunkEntries > 0 {
		r.chunk = h.chunkEntries
	}
	l.wmu.Lock()
	if err := l.writableLocked(); err != nil {
		l.wmu.Unlock()
		return res, err
	}
	r.src = l.db
	l.mu.Lock()
	l.rot = rotationTrack{active: true}
	r.total = l.last - l.prev.index
	l.mu.Unlock()
	l.wmu.Unlock()
	l.rotating.Store(true)
	if fi, err := os.Stat(l.dbPath); err == nil {
		res.BeforeBytes = fi.Size()
	}
	defer func() {
		l.rotating.Store(false)
		if err == nil {
			return
		}
		r.abort()
		if ctx.Err() == nil && l.rotCtx.Err() == nil {
			l.rotationFailures.Add(1)
		}
		err = fmt.Errorf("raftlog: rotate %s: %w", l.dbPath, err)
	}()
	l.hook(stepBegin)

	if err := r.create(); err != nil {
		return res, err
	}
	// The bulk copy is the first catch-up round.
	n, err := r.catchUp()
	if err != nil {
		return res, err
	}
	if err := r.dst.Sync(); err != nil {
		return res, fmt.Errorf("sync %s: %w", r.tmpPath, err)
	}
	l.hook(stepCopied)
	for round := 0; n > catchUpEntries && round < maxCatchUpRounds; round++ {
		if n, err = r.catchUp(); err != nil {
			return res, err
		}
	}
	old, pause, err := r.finish(&res)
	if old != nil {
		// Swapped (even if the directory fsync then failed): the old file
		// is unlinked and no longer used.
		if cerr := old.Close(); cerr != nil {
			l.logger.Warn("raftlog: close the rotated-out file", "err", cerr)
		}
		r.releaseOld()
	}
	if err != nil {
		return res, err
	}
	res.Took = time.Since(start)
	if fi, err := os.Stat(l.dbPath); err == nil {
		res.AfterBytes = fi.Size()
	}
	res.Pause, res.CopiedBytes = pause, r.copiedBytes
	l.rotations.Add(1)
	l.lastRotatePause.Store(int64(pause))
	l.lastRotateTook.Store(int64(res.Took))
	l.lastRotateCopied.Store(r.copiedBytes)
	l.rotatePause.Observe(pause.Seconds())
	l.logger.Info("raftlog rotated", "before_bytes", res.BeforeBytes, "after_bytes", res.AfterBytes,
		"entries", res.Entries, "copied_bytes", r.copiedBytes, "pause", pause, "took", res.Took)
	return res, nil
}

// hook calls the test hook for step, if any.
func (l *Log) hook(step string) {
	if h := l.opts.hooks; h != nil && h.rotateStep != nil {
		h.rotateStep(step)
	}
}

// create opens the new file (removing a leftover one) and writes its
// buckets and version.
func (r *rotator) create() error {
	if err := r.l.fs.Remove(r.tmpPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove leftover %s: %w", r.tmpPath, err)
	}
	opts := r.l.opts
	dst, err := bolt.Open(r.tmpPath, 0o600, &bolt.Options{
		Timeout:         opts.LockTimeout,
		FreelistType:    bolt.FreelistMapType,
		NoFreelistSync:  true,
		InitialMmapSize: opts.InitialMmapSize,
	})
	if err != nil {
		return fmt.Errorf("create %s: %w", r.tmpPath, err)
	}
	r.dst = dst
	if err := dst.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucket(bucketMeta)
		if err != nil {
			return fmt.Errorf("create meta bucket: %w", err)
		}
		if _, err := tx.CreateBucket(bucketEntries); err != nil {
			return fmt.Errorf("create entries bucket: %w", err)
		}
		return meta.Put(keyVersion, encodeVersion(formatVersion))
	}); err != nil {
		return fmt.Errorf("initialize %s: %w", r.tmpPath, err)
	}
	return nil
}

// releaseOld frees the old raft.db's disk blocks a slice at a time, after
// bbolt closed it.
//
// NB: renamed over, the old file is unlinked; its blocks are freed when the
// last descriptor closes. Freeing gigabytes in one go (one truncation, and
// with online discard one huge discard) held the filesystem journal long
// enough to stall every append's fsync on the new file by ~100 ms, back to
// back for most of a second, in the benchmark. Shrinking it from the end in
// releaseStep slices through our own descriptor lets appends' fsyncs
// interleave. Skipped if the inode still has a name — a backup's hard link,
// or one an operator made — since truncating would destroy that copy.
func (r *rotator) releaseOld() {
	f := r.oldFile
	if f == nil {
		return
	}
	r.oldFile = nil
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Nlink != 0 {
		return
	}
	for size := fi.Size(); size > 0; {
		size = max(size-releaseStep, 0)
		if err := f.Truncate(size); err != nil {
			r.l.logger.Warn("raftlog: release the rotated-out file's space", "err", err)
			return
		}
	}
}

// abort undoes a rotation that did not swap: it stops the tracking, closes
// and removes the new file.
func (r *rotator) abort() {
	l := r.l
	l.wmu.Lock()
	l.mu.Lock()
	if !r.swapped {
		l.rot = rotationTrack{}
	}
	l.mu.Unlock()
	l.wmu.Unlock()
	if r.oldFile != nil && !r.swapped {
		_ = r.oldFile.Close()
		r.oldFile = nil
	}
	if r.swapped || r.dst == nil {
		return
	}
	if err := r.dst.Close(); err != nil {
		l.logger.Warn("raftlog: close abandoned rotation file", "path", r.tmpPath, "err", err)
	}
	if err := l.fs.Remove(r.tmpPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		l.logger.Warn("raftlog: remove abandoned rotation file (the next Open removes it)", "path", r.tmpPath, "err", err)
	}
}

// canceled reports why the rotation must stop early, if it must.
func (r *rotator) canceled() error {
	if err := r.ctx.Err(); err != nil {
		return err
	}
	if r.l.rotCtx.Err() != nil {
		return ErrClosed
	}
	return nil
}

// takeTrack returns what changed since the last call and the log's bounds,
// and starts a new track. The caller holds wmu.
func (r *rotator) takeTrack() (tr rotationTrack, prev, last uint64) {
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	tr = l.rot
	l.rot.dirtyFrom, l.rot.reset = 0, false
	if last := l.last - l.prev.index; last > r.total {
		r.total = last
	}
	return tr, l.prev.index, l.last
}

// copyFrom is the first index a round must copy: after what dst holds, or
// from the lowest index written since, and never a compacted one.
func (r *rotator) copyFrom(tr rotationTrack, prev uint64) uint64 {
	from := r.copiedTo + 1
	if tr.reset {
		from = 0
	}
	if tr.dirtyFrom != 0 && tr.dirtyFrom < from {
		from = tr.dirtyFrom
	}
	return max(from, prev+1)
}

// catchUp runs one round outside the write lock: it brings dst to the log as
// it was when the round began, reading the old file in short read
// transactions. Writes racing with the round are recorded in the track and
// copied by the next round. It returns the number of entries copied.
func (r *rotator) catchUp() (uint64, error) {
	l := r.l
	l.wmu.Lock()
	if err := l.writableLocked(); err != nil {
		l.wmu.Unlock()
		return 0, err
	}
	if err := l.checkpointLocked(); err != nil {
		l.wmu.Unlock()
		return 0, err
	}
	tr, prev, last := r.takeTrack()
	l.wmu.Unlock()
	from := r.copyFrom(tr, prev)
	if err := r.dst.Update(func(tx *bolt.Tx) error {
		return trimEntries(tx, tr.reset, prev, last)
	}); err != nil {
		return 0, fmt.Errorf("trim %s: %w", r.tmpPath, err)
	}
	var n uint64
	for from <= last {
		if err := r.canceled(); err != nil {
			return n, err
		}
		var first uint64
		var vals [][]byte
		var size int
		if err := l.view(func(tx *bolt.Tx) error {
			var err error
			first, vals, size, err = readChunk(tx, l.dbPath, from, last, r.chunk, defaultChunkBytes)
			return err
		}); err != nil {
			return n, fmt.Errorf("read entries from %d: %w", from, err)
		}
		if len(vals) == 0 {
			break // compacted past last, or truncated: the next round sees it
		}
		if err := r.dst.Update(func(tx *bolt.Tx) error {
			return putEntries(tx, first, vals)
		}); err != nil {
			return n, fmt.Errorf("write entries from %d to %s: %w", first, r.tmpPath, err)
		}
		k := uint64(len(vals))
		n += k
		r.copied += k
		r.copiedBytes += int64(size)
		from = first + k
		r.copiedTo = from - 1
		if r.ro.Progress != nil {
			r.ro.Progress(RotateProgress{Copied: r.copied, Total: max(r.total, r.copied), CopiedBytes: r.copiedBytes})
		}
		if r.copied == k {
			l.hook(stepCopy)
		}
	}
	r.copiedTo = max(r.copiedTo, last)
	return n, nil
}

// finish runs the final round under the write lock: copy what changed since
// the last round and every meta record in one fsynced transaction, verify if
// asked, keep a backup if asked, rename over raft.db, fsync the directory and
// swap the handle. It returns the old handle, to be closed by the caller
// without locks held, and how long the lock was held.
func (r *rotator) finish(res *RotateResult) (old *bolt.DB, pause time.Duration, err error) {
	l := r.l
	l.wmu.Lock()
	t0 := time.Now()
	defer func() {
		pause = time.Since(t0)
		l.wmu.Unlock()
	}()
	if err := r.canceled(); err != nil {
		return nil, 0, err
	}
	if err := l.writableLocked(); err != nil {
		return nil, 0, err
	}
	// The new file is copied from raft.db alone.
	if err := l.checkpointLocked(); err != nil {
		return nil, 0, err
	}
	tr, prev, last := r.takeTrack()
	from := r.copyFrom(tr, prev)
	var metaBytes int
	err = l.view(func(stx *bolt.Tx) error {
		return r.dst.Update(func(dtx *bolt.Tx) error {
			if err := trimEntries(dtx, tr.reset, prev, last); err != nil {
				return err
			}
			for from <= last {
				first, vals, size, err := readChunk(stx, l.dbPath, from, last, r.chunk, defaultChunkBytes)
				if err != nil {
					return fmt.Errorf("read entries from %d: %w", from, err)
				}
				if len(vals) == 0 || first != from {
					return fmt.Errorf("entries [%d, %d] missing from %s under the write lock", from, last, l.dbPath)
				}
				if err := putEntries(dtx, first, vals); err != nil {
					return err
				}
				r.copied += uint64(len(vals))
				r.copiedBytes += int64(size)
				from = first + uint64(len(vals))
			}
			var err error
			metaBytes, err = copyMeta(stx, dtx)
			if err != nil {
				return err
			}
			return checkBounds(dtx, prev, last)
		})
	})
	if err != nil {
		return nil, 0, fmt.Errorf("final catch-up into %s: %w", r.tmpPath, err)
	}
	r.copiedBytes += int64(metaBytes)
	res.Entries = last - prev
	if r.ro.Progress != nil {
		r.ro.Progress(RotateProgress{Copied: r.copied, Total: r.copied, CopiedBytes: r.copiedBytes})
	}
	l.hook(stepCaughtUp)

	if r.ro.Verify {
		// NB: reads both files whole under the write lock; offline only.
		if err := r.dst.View(func(tx *bolt.Tx) error {
			res.Summary, err = summarize(tx, r.tmpPath)
			return err
		}); err != nil {
			return nil, 0, fmt.Errorf("verify %s: %w", r.tmpPath, err)
		}
		var want LogSummary
		if err := l.view(func(tx *bolt.Tx) error {
			want, err = summarize(tx, l.dbPath)
			return err
		}); err != nil {
			return nil, 0, fmt.Errorf("summarize %s: %w", l.dbPath, err)
		}
		if d := want.diff(res.Summary); d != "" {
			return nil, 0, fmt.Errorf("%w: %s", ErrVerify, d)
		}
	}
	if r.ro.BackupPath != "" {
		if err := os.Link(l.dbPath, r.ro.BackupPath); err != nil {
			return nil, 0, fmt.Errorf("keep backup: %w", err)
		}
	}
	// A descriptor of our own on the old file, so that its blocks are not
	// all freed at once when bbolt closes it (releaseOld).
	if f, err := os.OpenFile(l.dbPath, os.O_RDWR, 0); err == nil {
		r.oldFile = f
	}
	if err := l.fs.Rename(r.tmpPath, l.dbPath); err != nil {
		if r.ro.BackupPath != "" {
			_ = os.Remove(r.ro.BackupPath)
		}
		return nil, 0, fmt.Errorf("rename %s: %w", r.tmpPath, err)
	}
	l.hook(stepRenamed)
	syncErr := l.fs.SyncDir(l.dir)
	// The name now refers to the new file in the kernel's view: the next
	// writes must go to it.
	l.mu.Lock()
	old = l.db
	l.db, l.pageSize = r.dst, r.dst.Info().PageSize
	l.rot = rotationTrack{}
	if syncErr != nil {
		// NB: until the rename is durable a crash may bring back the old
		// file, which lacks every write made after this point. Both files
		// hold the same log now, so stopping here loses nothing.
		l.failed = fmt.Errorf("raftlog: sync dir %s after rotation: %w", l.dir, syncErr)
	}
	l.mu.Unlock()
	r.swapped = true
	if syncErr != nil {
		l.logger.Error("raftlog write failed; refusing further writes until reopened", "step", "rotate", "err", syncErr)
		return old, 0, fmt.Errorf("sync dir %s: %w", l.dir, syncErr)
	}
	l.hook(stepSwapped)
	return old, 0, nil
}

// trimEntries deletes the entries of a rotation's new file that the log no
// longer holds: all of them after an ApplySnapshot (reset), those at or
// below prev (compacted), and those above last (truncated).
func trimEntries(tx *bolt.Tx, reset bool, prev, last uint64) error {
	if reset {
		if err := tx.DeleteBucket(bucketEntries); err != nil {
			return fmt.Errorf("drop entries bucket: %w", err)
		}
		if _, err := tx.CreateBucket(bucketEntries); err != nil {
			return fmt.Errorf("create entries bucket: %w", err)
		}
		return nil
	}
	// NB: the bounds are read before any delete, and the deletes go by
	// key. Re-reading First or Last after each delete walked the leaf pages
	// the earlier deletes had emptied: quadratic in a large trim, and Last
	// never returns once every page is empty (lastKey).
	b := tx.Bucket(bucketEntries)
	c := b.Cursor()
	fk, _ := c.First()
	lk, _ := c.Last()
	first, okFirst := keyIndex(fk)
	end, okLast := keyIndex(lk)
	if !okFirst || !okLast {
		return nil
	}
	if err := deleteEntries(b, first, min(prev, end), "compacted"); err != nil {
		return err
	}
	return deleteEntries(b, max(last+1, first), end, "truncated")
}

// deleteEntries deletes the entries at indexes [from, to] from b; what
// names them in an error.
func deleteEntries(b *bolt.Bucket, from, to uint64, what string) error {
	for i := from; i <= to; i++ {
		if err := b.Delete(indexKey(i)); err != nil {
			return fmt.Errorf("delete %s entry %d: %w", what, i, err)
		}
	}
	return nil
}

// lastKey is the cursor's last key, nil if none. bbolt's Cursor.Last
// never returns once a transaction's deletes have emptied every leaf
// page of the bucket (it steps back over empty pages, and from the first
// one starts over), as a trim or a journal replay can leave it; First
// stops, so Last is asked only after First found a key.
func lastKey(c *bolt.Cursor) []byte {
	if k, _ := c.First(); k == nil {
		return nil
	}
	k, _ := c.Last()
	return k
}

// readChunk reads up to maxEntries consecutive entries (and about maxBytes)
// of [from, last] from tx, starting at the first stored index >= from, and
// returns their index and copies of their values, checksums verified. Values
// are copied because bbolt's are only valid inside the transaction.
func readChunk(tx *bolt.Tx, path string, from, last uint64, maxEntries, maxBytes int) (first uint64, vals [][]byte, size int, err error) {
	c := tx.Bucket(bucketEntries).Cursor()
	next := uint64(0)
	for k, v := c.Seek(indexKey(from)); k != nil && len(vals) < maxEntries && size < maxBytes; k, v = c.Next() {
		i, ok := keyIndex(k)
		switch {
		case !ok:
			return 0, nil, 0, &CorruptError{Path: path, Record: "entry", Detail: fmt.Sprintf("key %q of %d bytes in entries bucket, want 8", k, len(k))}
		case i > last:
			return first, vals, size, nil
		case next != 0 && i != next:
			return 0, nil, 0, &CorruptError{Path: path, Record: "entry", Index: next, Detail: fmt.Sprintf("entry missing (next stored index is %d)", i)}
		case v == nil:
			return 0, nil, 0, &CorruptError{Path: path, Record: "entry", Index: i, Detail: "nested bucket in entries bucket"}
		}
		if _, detail := checkCRC(v); detail != "" {
			return 0, nil, 0, &CorruptError{Path: path, Record: "entry", Index: i, Detail: detail}
		}
		if next == 0 {
			first = i
		}
		vals = append(vals, bytes.Clone(v))
		size += len(v)
		next = i + 1
	}
	return first, vals, size, nil
}

// putEntries stores vals at first, first+1, ... in tx's entries bucket.
func putEntries(tx *bolt.Tx, first uint64, vals [][]byte) error {
	b := tx.Bucket(bucketEntries)
	b.FillPercent = 1.0 // ascending keys: fill pages completely
	for k, v := range vals {
		if err := b.Put(indexKey(first+uint64(k)), v); err != nil {
			return fmt.Errorf("put entry %d: %w", first+uint64(k), err)
		}
	}
	return nil
}

// copyMeta makes dst's meta bucket a copy of src's and returns the bytes
// copied.
func copyMeta(src, dst *bolt.Tx) (int, error) {
	sm, dm := src.Bucket(bucketMeta), dst.Bucket(bucketMeta)
	var stale [][]byte
	if err := dm.ForEach(func(k, _ []byte) error {
		if sm.Get(k) == nil {
			stale = append(stale, bytes.Clone(k))
		}
		return nil
	}); err != nil {
		return 0, fmt.Errorf("list meta keys: %w", err)
	}
	for _, k := range stale {
		if err := dm.Delete(k); err != nil {
			return 0, fmt.Errorf("delete meta %q: %w", k, err)
		}
	}
	n := 0
	err := sm.ForEach(func(k, v []byte) error {
		if v == nil {
			return fmt.Errorf("nested bucket %q in meta bucket", k)
		}
		n += len(k) + len(v)
		// Put copies key and value into dst's pages at commit; the slices
		// are src's, valid until src's transaction ends, which is after.
		if err := dm.Put(k, v); err != nil {
			return fmt.Errorf("put meta %q: %w", k, err)
		}
		return nil
	})
	return n, err
}

// checkBounds checks that the entries bucket holds exactly [prev+1, last].
func checkBounds(tx *bolt.Tx, prev, last uint64) error {
	c := tx.Bucket(bucketEntries).Cursor()
	fk, _ := c.First()
	lk := lastKey(c)
	if prev == last {
		if fk != nil {
			return fmt.Errorf("new file holds entries, the log none")
		}
		return nil
	}
	f, fok := keyIndex(fk)
	l, lok := keyIndex(lk)
	if !fok || !lok || f != prev+1 || l != last {
		return fmt.Errorf("new file holds entries [%d, %d], the log [%d, %d]", f, l, prev+1, last)
	}
	return nil
}

// removeRotateLeftover removes the new file of a rotation a crash or a
// failure interrupted (FORMAT.md "Rotation"). Only Open calls it, holding
// raft.db's lock, so no rotation of this log is running.
func (l *Log) removeRotateLeftover() {
	path := filepath.Join(l.dir, rotateFileName)
	err := l.fs.Remove(path)
	switch {
	case err == nil:
		l.logger.Info("raftlog: removed the file of an interrupted rotation", "path", path)
	case !errors.Is(err, os.ErrNotExist):
		l.logger.Warn("raftlog: remove the file of an interrupted rotation", "path", path, "err", err)
	}
}

// RotationDue reports whether a raft.db of fileBytes with freeBytes in free
// and pending pages is past the automatic rotation thresholds of opts
// (Options.RotateFreeRatio and RotateMinBytes; zero fields mean their
// defaults): whether a running Log would rotate it, and so whether an
// offline compaction pays off.
func RotationDue(opts Options, fileBytes, freeBytes int64) bool {
	opts = opts.withDefaults()
	return rotationDue(opts.RotateFreeRatio, opts.RotateMinBytes, fileBytes, freeBytes, time.Time{}, time.Time{})
}

// rotationDue is the automatic rotation policy: rotate when raft.db is at
// least minBytes and free and pending pages make up more than ratio of it,
// unless a failed attempt asked to wait until retryAt. A negative ratio
// disables it.
func rotationDue(ratio float64, minBytes, fileBytes, freeBytes int64, now, retryAt time.Time) bool {
	if ratio < 0 || fileBytes <= 0 || fileBytes < minBytes || now.Before(retryAt) {
		return false
	}
	return float64(freeBytes)/float64(fileBytes) > ratio
}

// kickRotation asks the rotation goroutine to check the policy. It never
// blocks.
func (l *Log) kickRotation() {
	if l.opts.RotateFreeRatio < 0 {
		return
	}
	select {
	case l.rotKick <- struct{}{}:
	default:
	}
}

// rotateLoop is the goroutine that runs automatic rotations. It is a thin
// shell: the policy is rotationDue, the work is rotate.
func (l *Log) rotateLoop() {
	defer l.rotWG.Done()
	var retryAt time.Time
	for {
		select {
		case <-l.rotStop:
			return
		case <-l.rotKick:
		}
		s := l.Stats()
		if !rotationDue(l.opts.RotateFreeRatio, l.opts.RotateMinBytes, s.FileBytes, s.FreeBytes, l.opts.Clock.Now(), retryAt) {
			l.hook(stepNotDue)
			continue
		}
		l.logger.Info("raftlog rotating", "file_bytes", s.FileBytes, "free_bytes", s.FreeBytes, "live_bytes", s.LiveBytes)
		if _, err := l.rotate(l.rotCtx, RotateOptions{}); err != nil {
			if l.rotCtx.Err() != nil {
				return
			}
			retryAt = l.opts.Clock.Now().Add(l.opts.RotateRetryInterval)
			l.logger.Warn("raftlog rotation failed; the old file stays in use", "err", err, "retry_after", l.opts.RotateRetryInterval)
			l.hook(stepFailed)
			continue
		}
		l.hook(stepDone)
	}
}

// stopRotation stops the rotation goroutine and any rotation in progress
// and waits for the goroutine to exit.
func (l *Log) stopRotation() {
	l.stopOnce.Do(func() {
		l.rotCancel()
		close(l.rotStop)
	})
	l.rotWG.Wait()
}
