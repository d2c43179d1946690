package client

import (
	"errors"
	"fmt"
)

// ErrCompacted means a watch asked to resume from an index the server no
// longer retains (its event history was compacted past it). The watch has
// ended; every batch before the error was delivered. Reload the state with
// a read (Range or Get) and watch again with FromIndex(read's Header.Index).
// Returned errors are *CompactedError.
var ErrCompacted = errors.New("client: watch history compacted")

// ErrWatchCanceled means the server ended a watch for a reason other than
// compaction or a resync (for instance it refused the request); the
// *WatchCanceledError carries the server's reason. Resubscribing with the
// same options will most likely fail again.
var ErrWatchCanceled = errors.New("client: watch canceled by the server")

// CompactedError is the terminal error of a watch whose resume index was
// compacted away on the server. It matches ErrCompacted.
type CompactedError struct {
	// Key is the watched key or prefix.
	Key string
	// Requested is the start index the server could not serve: the watch
	// had delivered every matching event up to it.
	Requested uint64
	// CompactedIndex is the server's compacted_index: the oldest index it
	// could resume from. Reload at this index or later.
	CompactedIndex uint64
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("client: watch %q: history compacted: resume index %d is older than %d; reload with a read and watch from its index",
		e.Key, e.Requested, e.CompactedIndex)
}

// Unwrap makes errors.Is(err, ErrCompacted) true.
func (e *CompactedError) Unwrap() error { return ErrCompacted }

// WatchCanceledError is the terminal error of a watch the server canceled
// without a resync or compacted index. It matches ErrWatchCanceled.
type WatchCanceledError struct {
	Key    string // the watched key or prefix
	Reason string // the server's cancel_reason
}

func (e *WatchCanceledError) Error() string {
	return fmt.Sprintf("client: watch %q canceled by the server: %s", e.Key, e.Reason)
}

// Unwrap makes errors.Is(err, ErrWatchCanceled) true.
func (e *WatchCanceledError) Unwrap() error { return ErrWatchCanceled }
