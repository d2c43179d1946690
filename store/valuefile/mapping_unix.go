//go:build linux || darwin || freebsd

package valuefile

import (
	"os"

	"golang.org/x/sys/unix"
)

func mmap(fh *os.File, length int64) ([]byte, error) {
	return unix.Mmap(int(fh.Fd()), 0, int(length), unix.PROT_READ, unix.MAP_SHARED)
}

func munmap(b []byte) error { return unix.Munmap(b) }
