package raftlog

import (
	"errors"

	"golang.org/x/sys/unix"
)

// preallocate allocates the first size bytes of the file behind fd, so
// that writes inside them change no file size or block map for fdatasync
// to record. unsupported is true where the filesystem cannot.
func preallocate(fd int, size int64) (unsupported bool, err error) {
	err = unix.Fallocate(fd, 0, 0, size)
	return errors.Is(err, unix.EOPNOTSUPP), err
}

// datasync flushes the file's data (and only the metadata needed to read
// it back) to stable storage.
func datasync(fd int) error { return unix.Fdatasync(fd) }
