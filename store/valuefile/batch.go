package valuefile

import "fmt"

// Batch appends values at the end of a File, so that a restore that fails
// halfway can give back every slot it took at once. The writer goroutine
// that owns the File uses it, and no other Put runs until the restore is
// done or aborted.
type Batch struct {
	f          *File
	start, end uint64 // the file range the batch reserved
	refs, size uint64 // values and value bytes reserved
	slots      uint64 // slot bytes reserved
}

// NewBatch starts a batch at the file's end.
func (f *File) NewBatch() *Batch {
	f.mu.Lock()
	defer f.mu.Unlock()
	return &Batch{f: f, start: f.end, end: f.end}
}

// Put stores v in a new slot at the end of the file; see File.Put.
func (b *Batch) Put(v []byte) (Ref, error) {
	if len(v) == 0 {
		return Ref{}, nil
	}
	if err := checkLen(v); err != nil {
		return Ref{}, err
	}
	f := b.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.end != b.end {
		return Ref{}, fmt.Errorf("value file: a Put ran during a batch (file end %d, batch end %d)", f.end, b.end)
	}
	r, err := f.append(v)
	if err != nil {
		return Ref{}, err
	}
	b.end = f.end
	b.refs++
	b.size += uint64(len(v))
	b.slots += slotSize(uint64(len(v)))
	return r, nil
}

// Abort gives back every slot the batch reserved; none of its Refs may be
// read afterwards.
func (b *Batch) Abort() {
	f := b.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.end == b.end {
		f.end = b.start
		if w := f.written.Load(); b.start >= w {
			f.tail = f.tail[:b.start-w]
		} else {
			// NB: the flushed part stays in the file as garbage past the
			// end; the next appends overwrite it.
			f.tail = f.tail[:0]
			f.written.Store(b.start)
		}
	}
	f.st.Values -= b.refs
	f.st.ValueBytes -= b.size
	f.st.SlotBytes -= b.slots
	b.refs, b.size, b.slots = 0, 0, 0
	b.start = b.end
}
