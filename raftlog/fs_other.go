//go:build !linux

package raftlog

import (
	"errors"
	"syscall"
)

// preallocate reports errors.ErrUnsupported: the journal then extends the
// file with Truncate, and each write may also allocate blocks.
func preallocate(int, int64) error { return errors.ErrUnsupported }

// datasync falls back to fsync where fdatasync is not available.
func datasync(fd int) error { return syscall.Fsync(fd) }
