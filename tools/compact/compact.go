// Package compact is offline compaction of a stopped node's Raft log
// (`lodestone compact`) and the report an operator reads first
// (`lodestone compact --inspect`).
//
// A node keeps its log in <data-dir>/raft (raft.db and snap/, see
// raftlog/FORMAT.md). Truncation frees pages inside raft.db but never shrinks
// it; a running server rotates the file on its own (raftlog
// Options.RotateFreeRatio), and this package does the same for a node that
// is stopped: it copies the live entries and records to a new file,
// verifies the copy against the original (entry count, every entry's bytes
// and checksum, format version, hard state, compacted and snapshot records),
// keeps the original as raft.db.bak-<timestamp>, and swaps the files with
// temp → fsync → rename → fsync dir.
//
// It refuses a log a running server holds: bbolt's lock is tried for
// Options.LockTimeout and then the command fails with ErrInUse, whose
// message says to stop the server first. The copying and verification are
// raftlog's (Log.Rotate, Inspect); this package adds the lock check, the
// backup naming, the progress bar and the report.
package compact

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/lodestone-kv/lodestone/raftlog"
)

// ErrInUse is returned when a running server holds the log's lock.
var ErrInUse = errors.New("compact: raft log in use")

// ErrNoLog is returned when the data dir holds no raft log.
var ErrNoLog = errors.New("compact: no raft log")

// InUseError is the refusal to touch a log a live server holds. It wraps
// ErrInUse and raftlog.ErrLocked.
type InUseError struct {
	DataDir string
	Err     error
}

func (e *InUseError) Error() string {
	return fmt.Sprintf("raft log at %s is in use by a running server; stop it first", e.DataDir)
}

// Unwrap returns ErrInUse and the lock error.
func (e *InUseError) Unwrap() []error { return []error{ErrInUse, e.Err} }

// DefaultLockTimeout is how long Run and Inspect wait for a server's lock.
const DefaultLockTimeout = 500 * time.Millisecond

// Options says which log to compact and how.
type Options struct {
	// DataDir is the node's --data-dir; the log is DataDir/raft. Required.
	DataDir string
	// NoBackup removes the original file instead of keeping it as
	// raft/raft.db.bak-<timestamp>. Saves its size in disk, loses the way
	// back.
	NoBackup bool
	// LockTimeout is how long to wait for a server's lock on raft.db before
	// failing with ErrInUse. 0 means DefaultLockTimeout (500ms); a server
	// that holds it never releases it, so longer only delays the error.
	LockTimeout time.Duration
	// Now supplies timestamps: the backup's name and the progress bar's
	// rate. Nil means time.Now.
	Now func() time.Time
	// ProgressEvery is the least time between two redraws of the progress
	// bar. 0 means 200ms.
	ProgressEvery time.Duration
}

func (o Options) withDefaults() Options {
	if o.LockTimeout == 0 {
		o.LockTimeout = DefaultLockTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ProgressEvery == 0 {
		o.ProgressEvery = 200 * time.Millisecond
	}
	return o
}

// logDir is where a node keeps its raft log (server/node.go).
func logDir(dataDir string) string { return filepath.Join(dataDir, "raft") }

// Result describes a completed compaction.
type Result struct {
	Path        string // raft.db
	BeforeBytes int64  // its size before
	AfterBytes  int64  // and after
	FreedBytes  int64  // BeforeBytes - AfterBytes
	// LiveBytes is the data in the compacted file (bbolt's high-water mark
	// minus free pages).
	LiveBytes int64
	// Summary is what was verified equal in both files before the swap.
	Summary raftlog.LogSummary
	// BackupPath is the original file, kept; "" with NoBackup.
	BackupPath string
	Took       time.Duration
}

// Run compacts the raft log of the stopped node in o.DataDir, drawing a
// progress bar on progress (entries copied / total, bytes, rate; nil draws
// none). On success the compacted file is raft.db and the original is kept
// as raft.db.bak-<UTC timestamp> unless o.NoBackup. On any error before the
// swap the original is untouched and in place. Canceling ctx stops the copy.
func Run(ctx context.Context, o Options, progress io.Writer) (res Result, err error) {
	o = o.withDefaults()
	if o.DataDir == "" {
		return res, errors.New("compact: no data dir given")
	}
	dir := logDir(o.DataDir)
	res.Path = filepath.Join(dir, "raft.db")
	if err := checkLog(o.DataDir, res.Path); err != nil {
		return res, err
	}
	start := o.Now()
	l, err := raftlog.Open(dir, raftlog.Options{
		LockTimeout:     o.LockTimeout,
		RotateFreeRatio: -1, // this command is the rotation
		CacheEntries:    -1, // nothing is served: keep memory flat
	})
	switch {
	case errors.Is(err, raftlog.ErrLocked):
		return res, &InUseError{DataDir: o.DataDir, Err: err}
	case err != nil:
		return res, fmt.Errorf("compact: open raft log at %s: %w", dir, err)
	}
	defer func() {
		if cerr := l.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("compact: close raft log: %w", cerr)
		}
	}()
	before := l.Stats()
	res.BeforeBytes = before.FileBytes
	backup := ""
	if !o.NoBackup {
		backup = res.Path + ".bak-" + start.UTC().Format("20060102T150405Z")
		if _, err := os.Lstat(backup); err == nil {
			return res, fmt.Errorf("compact: backup %s already exists: move it away or pass --no-backup", backup)
		}
	}
	bar := newBar(progress, o.Now, o.ProgressEvery)
	rr, err := l.Rotate(ctx, raftlog.RotateOptions{Verify: true, BackupPath: backup, Progress: bar.update})
	bar.finish(err == nil)
	if err != nil {
		return res, fmt.Errorf("compact: %w", err)
	}
	after := l.Stats()
	res.AfterBytes, res.LiveBytes = after.FileBytes, after.LiveBytes
	res.FreedBytes = res.BeforeBytes - res.AfterBytes
	res.Summary, res.BackupPath = rr.Summary, backup
	res.Took = o.Now().Sub(start)
	return res, nil
}

// checkLog fails with ErrNoLog unless path (dataDir/raft/raft.db) exists:
// opening a missing log would create an empty one.
func checkLog(dataDir, path string) error {
	_, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%w at %s (no %s): pass the node's --data-dir", ErrNoLog, dataDir, path)
	case err != nil:
		return fmt.Errorf("compact: %w", err)
	}
	return nil
}

// Report is what Inspect found, with the verdict an operator acts on.
type Report struct {
	raftlog.Inspection
	// FreeShare is FreeBytes / FileBytes.
	FreeShare float64
	// Compact says whether the file is past the thresholds at which a
	// running server rotates it on its own (raftlog defaults: more than 50%
	// free, at least 64 MiB), i.e. whether `lodestone compact` would pay off.
	Compact bool
	// Reclaimable is what compacting would give back: the file size minus
	// the live data.
	Reclaimable int64
}

// Inspect reports on the raft log of the stopped node in o.DataDir without
// changing it (only DataDir and LockTimeout are used). It reads and
// checksums the whole live log. A log a running server holds is refused
// with an *InUseError.
func Inspect(o Options) (Report, error) {
	o = o.withDefaults()
	var r Report
	path := filepath.Join(logDir(o.DataDir), "raft.db")
	if err := checkLog(o.DataDir, path); err != nil {
		return r, err
	}
	in, err := raftlog.Inspect(logDir(o.DataDir), o.LockTimeout)
	switch {
	case errors.Is(err, raftlog.ErrLocked):
		return r, &InUseError{DataDir: o.DataDir, Err: err}
	case err != nil:
		return r, fmt.Errorf("compact: inspect %s: %w", path, err)
	}
	r.Inspection = in
	if in.FileBytes > 0 {
		r.FreeShare = float64(in.FreeBytes) / float64(in.FileBytes)
	}
	r.Reclaimable = max(in.FileBytes-in.LiveBytes, 0)
	r.Compact = raftlog.RotationDue(raftlog.Options{}, in.FileBytes, in.FreeBytes)
	return r, nil
}

// bar is the compaction's progress: "copying entries [=====>    ]  45%
// 12034/26700 entries  183.2 MiB  2400 entries/s".
type bar struct{ *Bar }

func newBar(w io.Writer, now func() time.Time, every time.Duration) bar {
	return bar{NewBar(w, now, every, "copying entries")}
}

func (b bar) update(p raftlog.RotateProgress) {
	b.Update(int64(p.Copied), int64(p.Total), func(elapsed time.Duration) string {
		return fmt.Sprintf("%d/%d entries  %s  %s", p.Copied, p.Total, HumanBytes(p.CopiedBytes), rate(float64(p.Copied), elapsed, "entries/s"))
	})
}

func (b bar) finish(ok bool) { b.Finish(ok) }

// HumanBytes renders n with a binary unit: 512 B, 32 KiB, 7.8 MiB.
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	v := float64(n) / float64(div)
	suffix := "KMGTPE"[exp : exp+1]
	if v >= 100 || v == float64(int64(v)) {
		return fmt.Sprintf("%.0f %siB", v, suffix)
	}
	return fmt.Sprintf("%.1f %siB", v, suffix)
}
