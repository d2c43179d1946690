//go:build !(linux || darwin || freebsd)

package valuefile

import (
	"errors"
	"os"
)

func mmap(*os.File, int64) ([]byte, error) { return nil, errors.ErrUnsupported }

func munmap([]byte) error { return nil }
