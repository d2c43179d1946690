package valuefile

import (
	"fmt"
	"io"
)

// Reader reads values in the order a snapshot walks them. Where one value's
// slot follows the last one's, as after a restore, it reads ahead a window
// at a time; elsewhere it reads the value alone. One goroutine uses it.
type Reader struct {
	f    *File
	buf  []byte
	off  uint64 // the file offset of buf[0]
	next uint64 // where the slot after the last value read starts
}

// readAhead is the window a Reader reads where values lie in order.
const readAhead = 256 << 10

// NewReader returns a Reader of f.
func (f *File) NewReader() *Reader { return &Reader{f: f} }

// Read returns r's bytes; they are valid until the next Read.
func (rd *Reader) Read(r Ref) ([]byte, error) {
	if r.n == 0 {
		return nil, nil
	}
	end := r.off + uint64(r.n)
	sequential := r.off == rd.next
	rd.next = r.off + slotSize(uint64(r.n))
	if r.off >= rd.off && end <= rd.off+uint64(len(rd.buf)) {
		return rd.buf[r.off-rd.off : end-rd.off], nil
	}
	w := rd.f.written.Load()
	if end > w {
		return rd.f.Read(r, nil) // NB: in the tail buffer, or just flushed
	}
	want := int(r.n)
	if sequential {
		want = max(want, min(readAhead, int(w-r.off)))
	}
	if cap(rd.buf) < want {
		rd.buf = make([]byte, want)
	}
	rd.buf = rd.buf[:want]
	n, err := rd.f.b.ReadAt(rd.buf, int64(r.off))
	if n < int(r.n) {
		rd.buf = rd.buf[:0]
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("value file: reading %s: %w", r, err)
	}
	rd.buf, rd.off = rd.buf[:n], r.off
	return rd.buf[:r.n], nil
}
