package raftlog

import (
	"errors"
	"fmt"
)

// ErrCorrupt is wrapped by every error that reports damaged on-disk state: a
// checksum mismatch, an undecodable record, a missing or misplaced entry, a
// snapshot data file that is missing or does not match its recorded size or
// checksum, or a bbolt file whose pages bbolt itself refuses. Use errors.As
// with *CorruptError to learn the file and the index.
var ErrCorrupt = errors.New("raftlog: corrupt")

// ErrClosed is returned by every method called after Close.
var ErrClosed = errors.New("raftlog: log closed")

// ErrWriteFailed is returned by every write method after an earlier write
// failed: a journal record (raft.wal) or a raft.db transaction, for example
// on an fsync error. After a failed fsync the
// kernel may have dropped the dirty pages and the state of the file is
// unknown, so the Log refuses further writes instead of guessing ("fail-stop");
// the caller must stop the node and reopen the Log, which recovers from what
// is actually on disk. Reads keep working from the last successful state.
var ErrWriteFailed = errors.New("raftlog: an earlier write failed; close and reopen the log")

// ErrOutOfOrder is returned by Save when the entries are not consecutive,
// would leave a gap after the last index, or when the hard state commits an
// index the log does not hold. Nothing is written.
var ErrOutOfOrder = errors.New("raftlog: entries out of order")

// ErrNotCommitted is returned by CreateSnapshot when asked to snapshot an
// index above the saved commit index. Nothing is changed.
var ErrNotCommitted = errors.New("raftlog: index not committed")

// ErrCompactBeyondSnapshot is returned by Compact when asked to discard
// entries that no snapshot covers yet. Nothing is changed.
var ErrCompactBeyondSnapshot = errors.New("raftlog: compaction beyond snapshot index")

// ErrUnsupportedVersion is returned by Open when raft.db was written with a
// format version this code does not understand (see FORMAT.md).
var ErrUnsupportedVersion = errors.New("raftlog: unsupported format version")

// ErrLocked is returned by Open when another process holds raft.db open for
// writing and the lock was not released within Options.LockTimeout.
var ErrLocked = errors.New("raftlog: raft.db is locked by another process")

// ErrVerify is returned by Rotate with RotateOptions.Verify when the new file
// does not hold the same log as the old one. The old file stays in use and
// the new one is removed.
var ErrVerify = errors.New("raftlog: rotated file differs from the original")

// CorruptError describes one damaged record. It wraps ErrCorrupt.
type CorruptError struct {
	// Path is the file that holds the damaged record: raft.db or a snapshot
	// data file under snap/.
	Path string
	// Record names the record kind: "entry", "hard state", "compacted",
	// "snapshot", "version", "snapshot file" or "bbolt".
	Record string
	// Index is the Raft index of the damaged entry or snapshot; 0 when the
	// record has no index.
	Index uint64
	// Detail says what is wrong, e.g. "checksum mismatch".
	Detail string
	// Err is the underlying error, if any (e.g. a bbolt or protobuf error).
	Err error
}

func (e *CorruptError) Error() string {
	s := fmt.Sprintf("raftlog: corrupt %s in %s", e.Record, e.Path)
	if e.Index != 0 {
		s += fmt.Sprintf(" at index %d", e.Index)
	}
	s += ": " + e.Detail
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns ErrCorrupt and the underlying error, so errors.Is works for
// both.
func (e *CorruptError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrCorrupt, e.Err}
	}
	return []error{ErrCorrupt}
}

// OptionsError reports an invalid Options field.
type OptionsError struct {
	Field  string // the Options field name, e.g. "CacheBytes"
	Reason string // what is wrong with it
}

func (e *OptionsError) Error() string {
	return fmt.Sprintf("raftlog: invalid option %s: %s", e.Field, e.Reason)
}
