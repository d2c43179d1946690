package watch

import (
	"errors"
	"fmt"
)

// ErrCompacted means the watcher asked to start before the oldest index the
// hub can still replay, or its stream was interrupted by a snapshot restore.
// The client must reload its state with a read (at any index ≥ the
// CompactedError's Oldest) and watch again from that read's index. Returned
// errors wrap it in a *CompactedError.
var ErrCompacted = errors.New("watch: compacted")

// ErrOverflow means the watcher was cut loose: its buffer filled (its
// consumer was too slow) or its shard fell behind the log. Every matching
// event up to the *OverflowError's ResumeIndex was delivered; watch again
// with StartIndex = ResumeIndex to continue without a gap.
var ErrOverflow = errors.New("watch: overflow")

// ErrClosed is returned by Next after Close, and by Watch and Next once the
// Hub is closed.
var ErrClosed = errors.New("watch: closed")

// ErrBadRequest means a Request was malformed (for instance an empty exact
// key). Returned errors wrap it.
var ErrBadRequest = errors.New("watch: bad request")

// CompactedError says which start index was refused and where the client
// can reload. It matches ErrCompacted with errors.Is.
type CompactedError struct {
	// Requested is the start index that could not be served (for a restore,
	// the watcher's start index).
	Requested uint64
	// Oldest is the smallest StartIndex the hub accepts now: reload the
	// state at or after it, then watch from the reload's index.
	Oldest uint64
	// Current is the hub's index when the error was made.
	Current uint64
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("watch: compacted: start index %d is older than %d, reload at index %d or later (current %d)",
		e.Requested, e.Oldest, e.Oldest, e.Current)
}

// Unwrap makes errors.Is(err, ErrCompacted) true.
func (e *CompactedError) Unwrap() error { return ErrCompacted }

// OverflowError is the terminal error of a watcher that was cut loose. It
// matches ErrOverflow with errors.Is.
type OverflowError struct {
	// ResumeIndex is the index to resume after: all matching events with
	// index ≤ ResumeIndex were delivered (they are in the batches Next
	// returned before this error), none after it.
	ResumeIndex uint64
	// Reason is "overflow" (buffer full), "replay" (the catch-up from the
	// start index did not fit the buffer; resuming continues it) or "lag"
	// (the watcher's shard fell behind the log's retention).
	Reason string
}

func (e *OverflowError) Error() string {
	return fmt.Sprintf("watch: overflow (%s): resync from index %d", e.Reason, e.ResumeIndex)
}

// Unwrap makes errors.Is(err, ErrOverflow) true.
func (e *OverflowError) Unwrap() error { return ErrOverflow }

// ConfigError names the Config field that failed Validate.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("watch: invalid config: %s: %s", e.Field, e.Reason)
}

// assert panics on a broken invariant: a bug in the caller or in this
// package, never a condition reachable from input.
func assert(cond bool, format string, args ...any) {
	if !cond {
		panic(fmt.Sprintf("watch: invariant violated: "+format, args...))
	}
}
