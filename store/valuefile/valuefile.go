package valuefile

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"sync"
	"sync/atomic"
)

// Ref names one value in a File: where its slot starts (in the slot file,
// or in a Base) and how long the value is. The zero Ref is the empty
// value, which takes no slot.
type Ref struct {
	off  uint64
	n    uint32
	base uint32 // 0: the slot file; else the id AddBase gave
}

// Len is the value's length in bytes.
func (r Ref) Len() int { return int(r.n) }

func (r Ref) String() string {
	if r.base != 0 {
		return fmt.Sprintf("value of %d bytes at offset %d of base %d", r.n, r.off, r.base)
	}
	return fmt.Sprintf("value of %d bytes at offset %d", r.n, r.off)
}

// MaxValue is the longest value a File holds.
const MaxValue = 1<<32 - 1

// File is a heap of value slots; see the package doc.
type File struct {
	b backing
	m *mapping // b's mapping, for Read (mapping.go); nil: pread

	mu   sync.Mutex
	end  uint64              // the file's length: where a new slot goes
	free map[uint64][]uint64 // slot offsets by slot size
	// tail holds the bytes of [written, end): slots appended but not yet
	// written, so that appends make one pwrite per tailFlush bytes, not
	// one per value. NB: a pwrite per value cost a member more CPU than
	// the rest of a million-key restart's replay.
	tail    []byte
	written atomic.Uint64 // everything below it is in the backing
	// bases are the read-only files values may lie in (base.go), by id;
	// the map is replaced, never changed, so reads need no lock.
	bases    atomic.Pointer[map[uint32]*base]
	nextBase uint32
	pins     int
	pending  []Ref // freed while pinned
	st       Stats
}

// Stats is what a File holds, for metrics.
type Stats struct {
	Values       uint64 // values held (freed ones waiting on a pin included)
	ValueBytes   uint64 // their bytes
	SlotBytes    uint64 // bytes of the slots they take
	FreeBytes    uint64 // bytes of free slots, ready for reuse
	PendingBytes uint64 // bytes of slots freed while a pin is held
	// PendingValues is how many of Values were freed while a pin is held.
	PendingValues uint64
	FileBytes     uint64 // the file's length
	Pins          int    // pins held
	BaseFiles     int    // Base files held open (AddBase)
	BaseBytes     uint64 // bytes of the values that lie in them
}

type backing interface {
	io.ReaderAt
	io.WriterAt
	io.Closer
}

// Open creates the file at path, or truncates what is there (a File's
// content never outlives its process), and returns it empty.
func Open(path string) (*File, error) {
	fh, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("value file: %w", err)
	}
	f := newFile(fh)
	f.m = mapFile(fh, mapReserve)
	return f, nil
}

// Memory returns a File held in process memory: the same slots and rules,
// for tests and tools that have no data directory.
func Memory() *File { return newFile(&memory{}) }

// Discard returns a File that keeps nothing: Put succeeds and Read fails.
// It serves decoders that check a snapshot without keeping its values.
func Discard() *File { return newFile(discard{}) }

func newFile(b backing) *File {
	f := &File{b: b, free: map[uint64][]uint64{}}
	f.bases.Store(&map[uint32]*base{})
	return f
}

// slotSize is the size class of a value of n > 0 bytes: n rounded up to a
// multiple of an eighth of the power of two below it, at least 16.
func slotSize(n uint64) uint64 {
	if n <= 16 {
		return 16
	}
	step := uint64(1) << (bits.Len64(n-1) - 4)
	return (n + step - 1) &^ (step - 1)
}

// Put stores v in a slot and returns its Ref. v is copied; the caller may
// reuse it. On error nothing is held.
func (f *File) Put(v []byte) (Ref, error) {
	if len(v) == 0 {
		return Ref{}, nil
	}
	if err := checkLen(v); err != nil {
		return Ref{}, err
	}
	size := slotSize(uint64(len(v)))
	f.mu.Lock()
	l := f.free[size]
	if len(l) == 0 {
		defer f.mu.Unlock()
		return f.append(v)
	}
	off := l[len(l)-1]
	f.free[size] = l[:len(l)-1]
	f.st.FreeBytes -= size
	f.count(v, size)
	r := Ref{off: off, n: uint32(len(v))}
	if w := f.written.Load(); off >= w {
		copy(f.tail[off-w:], v) // NB: a slot not written yet
		f.mu.Unlock()
		return r, nil
	}
	f.mu.Unlock()
	if _, err := f.b.WriteAt(v, int64(off)); err != nil {
		f.mu.Lock()
		f.release(r)
		f.mu.Unlock()
		return Ref{}, fmt.Errorf("value file: writing %s: %w", r, err)
	}
	return r, nil
}

func checkLen(v []byte) error {
	if uint64(len(v)) > MaxValue {
		return fmt.Errorf("value file: a value of %d bytes exceeds the most a slot holds, %d", len(v), uint64(MaxValue))
	}
	return nil
}

// tailFlush is how many appended bytes a File buffers before writing them.
const tailFlush = 1 << 20

// append puts v in a new slot at the end of the file, through the tail
// buffer. f.mu is held.
func (f *File) append(v []byte) (Ref, error) {
	size := slotSize(uint64(len(v)))
	r := Ref{off: f.end, n: uint32(len(v))}
	f.end += size
	f.count(v, size)
	f.tail = append(f.tail, v...)
	f.tail = append(f.tail, make([]byte, size-uint64(len(v)))...)
	if len(f.tail) < tailFlush {
		return r, nil
	}
	if err := f.flush(); err != nil {
		return Ref{}, err // NB: the slot stays taken; the file is failing anyway
	}
	return r, nil
}

// Flush writes the values still buffered to the backing file. Reads never
// need it; it serves tests and tools that look at the file itself.
func (f *File) Flush() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.flush()
}

// flush writes the tail buffer. f.mu is held.
func (f *File) flush() error {
	w := f.written.Load()
	if _, err := f.b.WriteAt(f.tail, int64(w)); err != nil {
		return fmt.Errorf("value file: writing %d bytes at offset %d: %w", len(f.tail), w, err)
	}
	f.written.Store(w + uint64(len(f.tail)))
	f.tail = f.tail[:0]
	return nil
}

func (f *File) count(v []byte, size uint64) {
	f.st.Values++
	f.st.ValueBytes += uint64(len(v))
	f.st.SlotBytes += size
}

// Read returns r's bytes in a new slice, through the mapping if there is
// one.
func (f *File) Read(r Ref) ([]byte, error) { return f.read(r, true) }

// ReadOnce is Read for a value read once, not again and again as clients
// read a hot key: the previous value a write's event carries. It keeps to
// pread, so the page r lies in is not mapped into the process (counted in
// its resident memory) for one read.
func (f *File) ReadOnce(r Ref) ([]byte, error) { return f.read(r, false) }

func (f *File) read(r Ref, mapped bool) ([]byte, error) {
	if r.n == 0 {
		return nil, nil
	}
	out := make([]byte, r.n)
	if r.base == 0 && r.off+uint64(r.n) > f.readable(0) && f.readTail(r, out) {
		return out, nil
	}
	if mapped && f.readMapped(r, out, r.off) {
		return out, nil
	}
	src, err := f.source(r)
	if err == nil {
		_, err = readAtLeast(src, out, r.off, len(out), r)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// readable is how far reads of the file a Ref with this base lies in may
// go: the written part of the slot file, or the whole of a base.
func (f *File) readable(base uint32) uint64 {
	if base != 0 {
		return ^uint64(0)
	}
	return f.written.Load()
}

// readMapped copies the bytes at off of the file r lies in into out
// through its mapping; false if it has none or cannot. The bytes must lie
// below readable(r.base).
func (f *File) readMapped(r Ref, out []byte, off uint64) bool {
	if r.base == 0 {
		return f.m.read(out, off)
	}
	b := (*f.bases.Load())[r.base]
	return b != nil && b.m.read(out, off)
}

// source is the file r lies in: the backing or r's base.
func (f *File) source(r Ref) (io.ReaderAt, error) {
	if r.base == 0 {
		return f.b, nil
	}
	b := (*f.bases.Load())[r.base]
	if b == nil {
		return nil, fmt.Errorf("value file: reading %s: its base is closed", r)
	}
	return b.b, nil
}

// readAtLeast reads p from src at off and fails, naming r, if fewer than
// least bytes came.
func readAtLeast(src io.ReaderAt, p []byte, off uint64, least int, r Ref) (int, error) {
	n, err := src.ReadAt(p, int64(off))
	if n < least {
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return n, fmt.Errorf("value file: reading %s: %w", r, err)
	}
	return n, nil
}

// readTail copies r from the tail buffer into out if it is there still.
func (f *File) readTail(r Ref, out []byte) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.written.Load()
	if r.off < w {
		return false // NB: flushed meanwhile
	}
	copy(out, f.tail[r.off-w:])
	return true
}

// Free gives r's slot back. While a pin is held the slot waits for the
// last unpin, so a snapshot taken before the Free still reads r.
func (f *File) Free(r Ref) {
	if r.n == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pins > 0 {
		f.pending = append(f.pending, r)
		f.st.PendingValues++
		if r.base == 0 {
			f.st.PendingBytes += slotSize(uint64(r.n))
		}
		return
	}
	f.release(r)
}

// release puts r's slot on its free list, or uncounts it in its base.
// f.mu is held.
func (f *File) release(r Ref) {
	if r.base != 0 {
		f.releaseBase(r.base, r.n)
		return
	}
	size := slotSize(uint64(r.n))
	f.free[size] = append(f.free[size], r.off)
	f.st.FreeBytes += size
	f.st.Values--
	f.st.ValueBytes -= uint64(r.n)
	f.st.SlotBytes -= size
}

// Pin keeps every Ref readable that is readable now until unpin is
// called. unpin may be called from any goroutine; calls after the first do
// nothing.
func (f *File) Pin() (unpin func()) {
	f.mu.Lock()
	f.pins++
	f.mu.Unlock()
	var once sync.Once
	return func() { once.Do(f.unpin) }
}

func (f *File) unpin() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pins--
	if f.pins > 0 {
		return
	}
	for _, r := range f.pending {
		f.release(r)
	}
	f.pending = nil
	f.st.PendingBytes, f.st.PendingValues = 0, 0
}

// Stats returns what the File holds now.
func (f *File) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.st
	s.FileBytes = f.end
	s.Pins = f.pins
	return s
}

// Close closes the backing file and every base. The store's owner calls it
// once nothing reads the File any more.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var errs []error
	for id := range *f.bases.Load() {
		errs = append(errs, f.closeBase(id))
	}
	return errors.Join(append(errs, f.m.close(), f.b.Close())...)
}

// memory is a backing in process memory, in chunks so that growing it
// never moves what readers read.
type memory struct {
	mu     sync.RWMutex
	chunks [][]byte
}

const chunkSize = 1 << 20

func (m *memory) ReadAt(p []byte, off int64) (int, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	n := 0
	for n < len(p) {
		c, o := int((off+int64(n))/chunkSize), int((off+int64(n))%chunkSize)
		if c >= len(m.chunks) {
			return n, io.EOF
		}
		n += copy(p[n:], m.chunks[c][o:])
	}
	return n, nil
}

func (m *memory) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for n < len(p) {
		c, o := int((off+int64(n))/chunkSize), int((off+int64(n))%chunkSize)
		for c >= len(m.chunks) {
			m.chunks = append(m.chunks, make([]byte, chunkSize))
		}
		n += copy(m.chunks[c][o:], p[n:])
	}
	return n, nil
}

func (m *memory) Close() error { return nil }

// discard keeps nothing.
type discard struct{}

var errDiscarded = errors.New("a discarding value file keeps no values")

func (discard) ReadAt([]byte, int64) (int, error)      { return 0, errDiscarded }
func (discard) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }
func (discard) Close() error                           { return nil }
