package valuefile

import (
	"math"
	"os"
	"runtime"
	"sync/atomic"
)

// mapping is a read-only shared mapping of a file that Read copies values
// out of, instead of making a pread for each. NB: the need is measured: on
// a leader serving linearizable gets at 64 clients, the pread of each
// value (about 5 us of system time for 256 B) was an eighth of the
// process's CPU.
//
// Only clients' reads (Read, ReadEach) use it: pages read through the
// mapping count in the process's resident memory (file-backed, which the
// kernel may reclaim), so the reads that touch a value once keep to
// pread: a write's previous value (ReadOnce), which would map in a page
// for each key a bulk overwrite touches, and a snapshot's Reader, which
// would map in the whole file each time.
//
// The slot file's mapping reserves mapReserve bytes of address space at
// Open, beyond the file's end, so the file grows under it without a
// remap; a read lies below what was written, so never past the end (where
// a mapped page faults). A value at or past mapReserve is read with
// pread. A base's mapping covers the base's length.
//
// close waits for the reads in the mapping to finish before unmapping it,
// so a read that raced with closing copies from pages still mapped.
type mapping struct {
	data    []byte
	readers atomic.Int64
	closed  atomic.Bool
}

// mapReserve is the address space a slot file's mapping reserves.
const mapReserve = 1 << 36

// mapFile maps length bytes of fh read-only; nil where the platform or
// the process's limits allow no mapping (reads then use pread).
func mapFile(fh *os.File, length int64) *mapping {
	if length <= 0 || length > math.MaxInt {
		return nil
	}
	data, err := mmap(fh, length)
	if err != nil {
		return nil
	}
	return &mapping{data: data}
}

// read copies len(out) bytes at off into out; false if m cannot (nil,
// closed, or off past the mapping).
func (m *mapping) read(out []byte, off uint64) bool {
	if m == nil || off+uint64(len(out)) > uint64(len(m.data)) {
		return false
	}
	m.readers.Add(1)
	defer m.readers.Add(-1)
	if m.closed.Load() {
		return false
	}
	copy(out, m.data[off:])
	return true
}

// close unmaps m once no read is in it; reads from then on return false.
func (m *mapping) close() error {
	if m == nil || m.closed.Swap(true) {
		return nil
	}
	for m.readers.Load() != 0 {
		runtime.Gosched()
	}
	return munmap(m.data)
}
