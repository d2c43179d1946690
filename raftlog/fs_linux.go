package raftlog

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// preallocate allocates the first size bytes of the file behind fd, so
// that writes inside them change no file size or block map for fdatasync
// to record. Where the filesystem cannot, the error wraps
// errors.ErrUnsupported.
func preallocate(fd int, size int64) error {
	err := unix.Fallocate(fd, 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("fallocate: %w: %w", errors.ErrUnsupported, err)
	}
	return err
}

// datasync flushes the file's data (and only the metadata needed to read
// it back) to stable storage.
func datasync(fd int) error { return unix.Fdatasync(fd) }
