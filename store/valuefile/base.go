package valuefile

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
)

// Base is a read-only file that already holds values where they lie, such
// as the snapshot a member restored from: a Ref may point into it instead
// of into a slot, so a restore need not copy every value into the slot
// file. NB: copying them cost a restarting member more CPU than decoding
// the snapshot, nearly all of it the kernel's copy into the page cache.
type Base interface {
	io.ReaderAt
	io.Closer
}

// base is one Base and the live values that lie in it.
type base struct {
	b           Base
	m           *mapping // b's mapping, if b is a file; nil: pread
	live, bytes uint64
}

// AddBase takes b over and returns the id its Refs carry (BaseRef). The
// File closes b once no value lies in it any more, or at DropBase or Close.
func (f *File) AddBase(b Base) uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextBase++
	m := maps.Clone(*f.bases.Load())
	m[f.nextBase] = &base{b: b, m: mapBase(b)}
	f.bases.Store(&m)
	f.st.BaseFiles++
	return f.nextBase
}

// BaseRef counts a value of n bytes at offset off of base id as held, and
// returns its Ref. The writer goroutine calls it.
func (f *File) BaseRef(id uint32, off int64, n int) (Ref, error) {
	if n == 0 {
		return Ref{}, nil
	}
	if n < 0 || uint64(n) > MaxValue || off < 0 {
		return Ref{}, fmt.Errorf("value file: no value of %d bytes at offset %d", n, off)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	b := (*f.bases.Load())[id]
	if b == nil {
		return Ref{}, fmt.Errorf("value file: no base %d", id)
	}
	b.live++
	b.bytes += uint64(n)
	f.st.Values++
	f.st.ValueBytes += uint64(n)
	f.st.BaseBytes += uint64(n)
	return Ref{off: uint64(off), n: uint32(n), base: id}, nil
}

// DropBase forgets base id and every value counted in it, and closes it:
// a restore that failed calls it. None of its Refs may be read afterwards.
func (f *File) DropBase(id uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closeBase(id)
}

// releaseBase gives back one value of n bytes in base id. f.mu is held.
func (f *File) releaseBase(id uint32, n uint32) {
	b := (*f.bases.Load())[id]
	if b == nil {
		return // NB: dropped already
	}
	f.st.Values--
	f.st.ValueBytes -= uint64(n)
	f.st.BaseBytes -= uint64(n)
	b.bytes -= uint64(n)
	if b.live--; b.live == 0 {
		_ = f.closeBase(id) // NB: read-only: a failed close loses nothing
	}
}

// closeBase forgets base id, uncounts what is left in it and closes it.
// f.mu is held.
func (f *File) closeBase(id uint32) error {
	b := (*f.bases.Load())[id]
	if b == nil {
		return nil
	}
	m := maps.Clone(*f.bases.Load())
	delete(m, id)
	f.bases.Store(&m)
	f.st.BaseFiles--
	// NB: values still counted are those of a dropped base.
	f.st.Values -= b.live
	f.st.ValueBytes -= b.bytes
	f.st.BaseBytes -= b.bytes
	return errors.Join(b.m.close(), b.b.Close())
}

// mapBase maps b if it is a file, for Read.
func mapBase(b Base) *mapping {
	fh, ok := b.(*os.File)
	if !ok {
		return nil
	}
	fi, err := fh.Stat()
	if err != nil {
		return nil
	}
	return mapFile(fh, fi.Size())
}
