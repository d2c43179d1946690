package raftlog

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// preflight walks every page reachable in the bbolt file at path, on the
// calling goroutine, before the file is opened for real.
//
// NB: with NoFreelistSync, bbolt's Open (and a read-only Open with
// PreLoadFreelist) rebuilds the freelist by walking the B+tree on a
// goroutine of its own; a damaged page makes that goroutine panic, which no
// recover can catch, and the process dies. Walking the same pages here first,
// where a panic (or, with SetPanicOnFault, a fault on a wild pointer) is
// recovered, turns that damage into ErrCorrupt. A missing or empty file (a
// new log) passes. The read-only open takes a shared lock, so a file another
// process holds yields ErrLocked after timeout.
func preflight(path string, timeout time.Duration) (err error) {
	if fi, err := os.Stat(path); errors.Is(err, os.ErrNotExist) || (err == nil && fi.Size() == 0) {
		return nil
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = &CorruptError{Path: path, Record: "bbolt", Detail: fmt.Sprintf("bbolt panicked while walking the file: %v", r)}
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: timeout})
	if err != nil {
		return boltOpenError(path, err, timeout)
	}
	defer func() {
		if cerr := db.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("raftlog: close %s: %w", path, cerr)
		}
	}()
	return db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(_ []byte, b *bolt.Bucket) error {
			_ = b.Stats() // visits every page of the bucket and its sub-buckets
			return nil
		})
	})
}

// boltOpenError maps an error of bolt.Open on path to this package's.
func boltOpenError(path string, err error, timeout time.Duration) error {
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("%w: %s (waited %s)", ErrLocked, path, timeout)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum),
		errors.Is(err, berrors.ErrVersionMismatch), errors.Is(err, berrors.ErrInvalidMapping):
		return &CorruptError{Path: path, Record: "bbolt", Detail: "bbolt refused the file", Err: err}
	default:
		return fmt.Errorf("raftlog: open %s: %w", path, err)
	}
}
