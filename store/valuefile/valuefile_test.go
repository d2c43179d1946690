package valuefile

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

func TestSlotSizeWastesAtMostAnEighth(t *testing.T) {
	prev := uint64(0)
	for n := uint64(1); n <= 1<<20; n++ {
		s := slotSize(n)
		if s < n || s < 16 {
			t.Fatalf("slotSize(%d) = %d: smaller than the value or than 16", n, s)
		}
		if n > 16 && (s-n)*8 > n {
			t.Fatalf("slotSize(%d) = %d wastes %d bytes, more than an eighth", n, s, s-n)
		}
		if s < prev {
			t.Fatalf("slotSize(%d) = %d below slotSize(%d) = %d", n, s, n-1, prev)
		}
		prev = s
	}
	if got := slotSize(256); got != 256 {
		t.Errorf("slotSize(256) = %d, want 256", got)
	}
	if got := slotSize(257); got != 288 {
		t.Errorf("slotSize(257) = %d, want 288", got)
	}
}

func files(t *testing.T) map[string]*File {
	t.Helper()
	f, err := Open(filepath.Join(t.TempDir(), "values"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return map[string]*File{"disk": f, "memory": Memory()}
}

func put(t *testing.T, f *File, v []byte) Ref {
	t.Helper()
	r, err := f.Put(v)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func read(t *testing.T, f *File, r Ref) []byte {
	t.Helper()
	b, err := f.Read(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPutReadFreeReuse(t *testing.T) {
	for name, f := range files(t) {
		t.Run(name, func(t *testing.T) {
			vals := [][]byte{[]byte("a"), bytes.Repeat([]byte("b"), 256), bytes.Repeat([]byte("c"), 300), bytes.Repeat([]byte("d"), 3<<20)}
			refs := make([]Ref, len(vals))
			for i, v := range vals {
				refs[i] = put(t, f, v)
			}
			for i, r := range refs {
				if got := read(t, f, r); !bytes.Equal(got, vals[i]) {
					t.Fatalf("value %d read back %d bytes, want %d", i, len(got), len(vals[i]))
				}
			}
			before := f.Stats()
			f.Free(refs[1])
			again := put(t, f, bytes.Repeat([]byte("e"), 250)) // the same 256 B class
			if again.off != refs[1].off {
				t.Errorf("a freed 256 B slot at %d was not reused: the new value went to %d", refs[1].off, again.off)
			}
			if after := f.Stats(); after.FileBytes != before.FileBytes {
				t.Errorf("file grew from %d to %d bytes although a free slot fitted", before.FileBytes, after.FileBytes)
			}
			if got := read(t, f, refs[2]); !bytes.Equal(got, vals[2]) {
				t.Error("a neighbour's value changed when a freed slot was reused")
			}
			empty := put(t, f, nil)
			if empty != (Ref{}) || len(read(t, f, empty)) != 0 {
				t.Errorf("an empty value took a slot: %v", empty)
			}
		})
	}
}

func TestPinDelaysReuseUntilLastUnpin(t *testing.T) {
	f := Memory()
	old := put(t, f, []byte("frozen"))
	unpinA := f.Pin()
	unpinB := f.Pin()
	f.Free(old)
	fresh := put(t, f, []byte("thawed"))
	if fresh.off == old.off {
		t.Fatal("a slot freed while pinned was reused at once")
	}
	if got := read(t, f, old); string(got) != "frozen" {
		t.Fatalf("pinned value reads %q", got)
	}
	if s := f.Stats(); s.PendingBytes != 16 || s.Pins != 2 {
		t.Fatalf("stats with two pins: %+v", s)
	}
	unpinA()
	unpinA() // a second call does nothing
	if s := f.Stats(); s.PendingBytes != 16 || s.Pins != 1 {
		t.Fatalf("stats with one pin left: %+v", s)
	}
	unpinB()
	if s := f.Stats(); s.PendingBytes != 0 || s.FreeBytes != 16 || s.Values != 1 || s.ValueBytes != 6 {
		t.Fatalf("stats after the last unpin: %+v", s)
	}
	if again := put(t, f, []byte("reused")); again.off != old.off {
		t.Errorf("the slot freed under a pin was not reused after the last unpin")
	}
}

func TestConcurrentReadsWhilePutAndFree(t *testing.T) {
	for name, f := range files(t) {
		t.Run(name, func(t *testing.T) {
			stable := make([]Ref, 64)
			for i := range stable {
				stable[i] = put(t, f, []byte(fmt.Sprintf("stable-%03d-%s", i, bytes.Repeat([]byte("x"), i*7))))
			}
			var wg sync.WaitGroup
			stop := make(chan struct{})
			errs := make(chan error, 4)
			for g := 0; g < 4; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						r := stable[i%len(stable)]
						b, err := f.Read(r)
						if err != nil || !bytes.HasPrefix(b, []byte(fmt.Sprintf("stable-%03d-", i%len(stable)))) {
							errs <- fmt.Errorf("read %v: %q, %v", r, b, err)
							return
						}
					}
				}()
			}
			for i := 0; i < 5000; i++ {
				r := put(t, f, bytes.Repeat([]byte{byte(i)}, 1+i%700))
				f.Free(r)
			}
			close(stop)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

// Without a mapping a read cut short fails. (Through one, a truncation
// by another process reads zeros in the file's last page or faults past
// it: the package doc's Failures.)
func TestReadOfTruncatedFileFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "values")
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.m.close(); err != nil {
		t.Fatal(err)
	}
	f.m = nil
	r := put(t, f, bytes.Repeat([]byte("v"), 100))
	if err := f.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 50); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Read(r); err == nil {
		t.Fatal("reading a value cut short by a truncation succeeded")
	}
}

func TestOpenTruncates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "values")
	if err := os.WriteFile(path, []byte("left by an earlier process"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if fi, err := os.Stat(path); err != nil || fi.Size() != 0 {
		t.Fatalf("Open kept an earlier file's content: %v, %v", fi.Size(), err)
	}
}

func TestDiscardKeepsNothing(t *testing.T) {
	f := Discard()
	r := put(t, f, []byte("gone"))
	if err := f.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Read(r); err == nil {
		t.Fatal("a discarding file read a value back")
	}
}

// countingBacking counts the reads and writes that reach the backing.
type countingBacking struct {
	memory
	reads, writes int
}

func (c *countingBacking) WriteAt(p []byte, off int64) (int, error) {
	c.writes++
	return c.memory.WriteAt(p, off)
}

func (c *countingBacking) ReadAt(p []byte, off int64) (int, error) {
	c.reads++
	return c.memory.ReadAt(p, off)
}

// Appends reach the backing a tail buffer at a time, and every value reads
// back whether it is still buffered, just flushed or reused in place.
func TestAppendsAreCombined(t *testing.T) {
	b := &countingBacking{}
	f := newFile(b)
	const n = 10_000
	refs := make([]Ref, n)
	for i := range refs {
		refs[i] = put(t, f, bytes.Repeat([]byte{byte(i)}, 256))
	}
	if b.writes > n*256/tailFlush+1 {
		t.Errorf("%d appends of 256 B made %d writes, want at most %d", n, b.writes, n*256/tailFlush+1)
	}
	f.Free(refs[n-1]) // in the tail buffer still
	reused := put(t, f, bytes.Repeat([]byte("r"), 256))
	if reused.off != refs[n-1].off {
		t.Fatal("the freed tail slot was not reused")
	}
	refs[n-1] = reused
	rd := f.NewReader()
	for i, r := range refs {
		want := bytes.Repeat([]byte{byte(i)}, 256)
		if i == n-1 {
			want = bytes.Repeat([]byte("r"), 256)
		}
		if got := read(t, f, r); !bytes.Equal(got, want) {
			t.Fatalf("value %d reads %q", i, got[:8])
		}
		if got, err := rd.Read(r); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("value %d through a Reader: %q, %v", i, got, err)
		}
	}
}

// closeCounter is a Base that counts its closes.
type closeCounter struct {
	*bytes.Reader
	closes int
}

func (c *closeCounter) Close() error { c.closes++; return nil }

// A value left in a base reads from there; the base closes when its last
// value is freed, and not while a pin taken before that free is held.
func TestBaseValuesAndClose(t *testing.T) {
	f := Memory()
	data := []byte("head|alpha|beta|tail")
	b := &closeCounter{Reader: bytes.NewReader(data)}
	id := f.AddBase(b)
	alpha, err := f.BaseRef(id, 5, 5)
	if err != nil {
		t.Fatal(err)
	}
	beta, err := f.BaseRef(id, 11, 4)
	if err != nil {
		t.Fatal(err)
	}
	if got := read(t, f, alpha); string(got) != "alpha" {
		t.Fatalf("base value reads %q", got)
	}
	rd := f.NewReader()
	for _, c := range []struct {
		r    Ref
		want string
	}{{alpha, "alpha"}, {beta, "beta"}} {
		if got, err := rd.Read(c.r); err != nil || string(got) != c.want {
			t.Fatalf("Reader on a base: %q, %v; want %q", got, err, c.want)
		}
	}
	if s := f.Stats(); s.BaseFiles != 1 || s.BaseBytes != 9 || s.Values != 2 || s.SlotBytes != 0 {
		t.Fatalf("stats with two base values: %+v", s)
	}
	f.Free(alpha)
	unpin := f.Pin()
	f.Free(beta)
	if b.closes != 0 || string(read(t, f, beta)) != "beta" {
		t.Fatalf("the base closed (%d) or lost its pinned value", b.closes)
	}
	unpin()
	if s := f.Stats(); b.closes != 1 || s.BaseFiles != 0 || s.BaseBytes != 0 || s.Values != 0 || s.ValueBytes != 0 {
		t.Fatalf("after its last value went: %d closes, %+v", b.closes, s)
	}
	if _, err := f.Read(beta); err == nil {
		t.Error("a value of a closed base read back")
	}
}

// DropBase uncounts a failed restore's values; Close closes what is left.
func TestDropBaseAndClose(t *testing.T) {
	f := Memory()
	dropped := &closeCounter{Reader: bytes.NewReader([]byte("0123456789"))}
	id := f.AddBase(dropped)
	for i := range 3 {
		if _, err := f.BaseRef(id, int64(i*3), 3); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.DropBase(id); err != nil {
		t.Fatal(err)
	}
	if s := f.Stats(); dropped.closes != 1 || s != (Stats{}) {
		t.Fatalf("after DropBase: %d closes, %+v", dropped.closes, s)
	}
	if _, err := f.BaseRef(id, 0, 1); err == nil {
		t.Error("a value was counted in a dropped base")
	}
	kept := &closeCounter{Reader: bytes.NewReader([]byte("xyz"))}
	if _, err := f.BaseRef(f.AddBase(kept), 0, 3); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil || kept.closes != 1 {
		t.Fatalf("Close: %v, base closed %d times", err, kept.closes)
	}
}

// ReadEach reads neighbouring values in one read, and still reads each
// value right: across gaps, from a base, from the tail buffer, empty ones.
func TestReadEachCombinesNeighbours(t *testing.T) {
	b := &countingBacking{}
	f := newFile(b)
	var refs []Ref
	var want [][]byte
	for i := range 100 {
		v := bytes.Repeat([]byte{byte('a' + i%26)}, 100+i)
		refs = append(refs, put(t, f, v))
		want = append(want, v)
	}
	if err := f.Flush(); err != nil {
		t.Fatal(err)
	}
	far := put(t, f, bytes.Repeat([]byte("z"), 3000)) // in the tail buffer
	base := f.AddBase(&closeCounter{Reader: bytes.NewReader([]byte("..base-one..base-two.."))})
	b1, _ := f.BaseRef(base, 2, 8)
	b2, _ := f.BaseRef(base, 12, 8)
	refs = append(refs, far, Ref{}, b1, b2, refs[3])
	want = append(want, bytes.Repeat([]byte("z"), 3000), nil, []byte("base-one"), []byte("base-two"), want[3])
	b.reads = 0
	got, err := f.ReadEach(refs)
	if err != nil {
		t.Fatal(err)
	}
	for i := range refs {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("value %d: %q, want %q", i, got[i], want[i])
		}
	}
	if b.reads != 2 { // NB: the 100 neighbours, then refs[3] again
		t.Errorf("%d reads of the slot file for 100 neighbours and one more, want 2", b.reads)
	}
	got[0] = append(got[0], 'X')
	if !bytes.Equal(got[1], want[1]) {
		t.Error("appending to one value changed its neighbour")
	}
}

// Reads of the slot file and of a file base come through their mappings,
// and agree with what was written, also once the slot file grew past its
// length when mapped; after Close a read fails rather than faults.
func TestReadsThroughMappings(t *testing.T) {
	dir := t.TempDir()
	f, err := Open(filepath.Join(dir, "values"))
	if err != nil {
		t.Fatal(err)
	}
	if f.m == nil {
		t.Skipf("no mapping on %s: reads use pread", runtime.GOOS)
	}
	var refs []Ref
	var want [][]byte
	for i := range 4000 { // about 3 MiB: three tail flushes
		v := fmt.Appendf(nil, "%d:%s", i, bytes.Repeat([]byte{byte('a' + i%26)}, i%1500))
		refs, want = append(refs, put(t, f, v)), append(want, v)
	}
	basePath := filepath.Join(dir, "base")
	if err := os.WriteFile(basePath, []byte("head|alpha|beta|tail"), 0o600); err != nil {
		t.Fatal(err)
	}
	bf, err := os.Open(basePath)
	if err != nil {
		t.Fatal(err)
	}
	beta, err := f.BaseRef(f.AddBase(bf), 11, 4)
	if err != nil {
		t.Fatal(err)
	}
	refs, want = append(refs, beta), append(want, []byte("beta"))
	for i, r := range refs {
		if r.base == 0 && r.off+uint64(r.n) > f.readable(0) {
			continue // in the tail buffer, not in the file yet
		}
		out := make([]byte, r.n)
		if !f.readMapped(r, out, r.off) {
			t.Fatalf("value %d (%s) not read through a mapping", i, r)
		}
		if !bytes.Equal(out, want[i]) {
			t.Fatalf("value %d through the mapping: %.40q, want %.40q", i, out, want[i])
		}
		if got := read(t, f, r); !bytes.Equal(got, want[i]) {
			t.Fatalf("value %d: %.40q, want %.40q", i, got, want[i])
		}
		if got, err := f.ReadOnce(r); err != nil || !bytes.Equal(got, want[i]) {
			t.Fatalf("value %d read once: %.40q, %v; want %.40q", i, got, err, want[i])
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []Ref{refs[0], beta} {
		if _, err := f.Read(r); err == nil {
			t.Errorf("%s read back after Close", r)
		}
	}
}
