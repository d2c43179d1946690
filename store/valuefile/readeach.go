package valuefile

// runGap is how far apart two values may lie and still be read in one
// pread by ReadEach, and runMax the most one such read spans.
const (
	runGap = 1 << 10
	runMax = 1 << 20
)

// ReadEach reads every ref, in order. Values that lie close behind each
// other in one file, as the values of neighbouring keys written in order
// do, come in one pread. NB: a range of 100 keys made 100 preads, which
// cost more than the rest of the range. The returned values may share one
// allocation; each is capped at its length.
func (f *File) ReadEach(refs []Ref) ([][]byte, error) {
	out := make([][]byte, len(refs))
	for i := 0; i < len(refs); {
		j := f.runEnd(refs, i)
		if err := f.readRun(refs[i:j], out[i:j]); err != nil {
			return nil, err
		}
		i = j
	}
	return out, nil
}

// runEnd returns the end of the run of refs that starts at i.
func (f *File) runEnd(refs []Ref, i int) int {
	first := refs[i]
	if first.n == 0 {
		return i + 1
	}
	end := first.off + uint64(first.n)
	limit := f.readable(first.base)
	if end > limit {
		return i + 1 // NB: in the tail buffer: Read takes it from there
	}
	j := i + 1
	for ; j < len(refs); j++ {
		r := refs[j]
		e := r.off + uint64(r.n)
		if r.n == 0 || r.base != first.base || r.off < end || r.off-end > runGap || e-first.off > runMax || e > limit {
			break
		}
		end = e
	}
	return j
}

// readRun reads refs, one run, into out.
func (f *File) readRun(refs []Ref, out [][]byte) error {
	if len(refs) == 1 {
		v, err := f.Read(refs[0])
		out[0] = v
		return err
	}
	first, last := refs[0], refs[len(refs)-1]
	buf := make([]byte, last.off+uint64(last.n)-first.off)
	if !f.readMapped(first, buf, first.off) {
		src, err := f.source(first)
		if err != nil {
			return err
		}
		if _, err := readAtLeast(src, buf, first.off, len(buf), first); err != nil {
			return err
		}
	}
	for i, r := range refs {
		at := r.off - first.off
		out[i] = buf[at : at+uint64(r.n) : at+uint64(r.n)]
	}
	return nil
}
