package valuefile

// Reader reads values in the order a snapshot walks them. Where one value
// lies a little after the last one in the same file, as after a restore,
// it reads ahead a window at a time; elsewhere it reads the value alone.
// One goroutine uses it.
type Reader struct {
	f    *File
	buf  []byte
	base uint32 // the file buf was read from
	off  uint64 // the offset of buf[0] in it
	next uint64 // where the last value read ends
}

// readAhead is the window a Reader reads where values lie in order, and
// nearGap how far past the last value the next may start to count as in
// order (a snapshot's record headers and keys lie between its values).
const (
	readAhead = 256 << 10
	nearGap   = 4 << 10
)

// NewReader returns a Reader of f.
func (f *File) NewReader() *Reader { return &Reader{f: f} }

// Read returns r's bytes; they are valid until the next Read.
func (rd *Reader) Read(r Ref) ([]byte, error) {
	if r.n == 0 {
		return nil, nil
	}
	end := r.off + uint64(r.n)
	inOrder := r.base == rd.base && r.off >= rd.next && r.off-rd.next <= nearGap
	rd.next = end
	if r.base == rd.base && r.off >= rd.off && end <= rd.off+uint64(len(rd.buf)) {
		return rd.buf[r.off-rd.off : end-rd.off], nil
	}
	rd.base = r.base
	limit := rd.f.readable(r.base)
	if end > limit {
		rd.buf = rd.buf[:0]
		return rd.f.Read(r) // NB: in the tail buffer, or just flushed
	}
	src, err := rd.f.source(r)
	if err != nil {
		return nil, err
	}
	want := int(r.n)
	if inOrder {
		want = max(want, int(min(readAhead, limit-r.off)))
	}
	if cap(rd.buf) < want {
		rd.buf = make([]byte, want)
	}
	rd.buf = rd.buf[:want]
	n, err := readAtLeast(src, rd.buf, r.off, int(r.n), r)
	if err != nil {
		rd.buf = rd.buf[:0]
		return nil, err
	}
	rd.buf, rd.off = rd.buf[:n], r.off
	return rd.buf[:r.n], nil
}
