package store

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store/valuefile"
)

// onDisk returns an empty store whose values are in a real file.
func onDisk(t *testing.T) *Store {
	t.Helper()
	v, err := valuefile.Open(filepath.Join(t.TempDir(), "values"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close() })
	return NewWithValues(v)
}

func value(tag string, i int) string {
	return fmt.Sprintf("%s-%03d-%s", tag, i, bytes.Repeat([]byte("v"), 200))
}

// A snapshot encodes the values it was taken with although every key is
// overwritten or deleted while it is held, and the slots it kept come back
// for reuse once it is closed.
func TestSnapshotKeepsItsValuesUntilClosed(t *testing.T) {
	s := onDisk(t)
	const n = 100
	for i := range n {
		s.Apply(uint64(i+1), putCmd(fmt.Sprintf("k%03d", i), value("old", i)))
	}
	sn := s.Snapshot()
	idx := uint64(n)
	for i := range n {
		idx++
		if i%2 == 0 {
			s.Apply(idx, delCmd(fmt.Sprintf("k%03d", i)))
		} else {
			s.Apply(idx, putCmd(fmt.Sprintf("k%03d", i), value("new", i)))
		}
	}
	var buf bytes.Buffer
	if _, err := sn.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	back := New()
	if err := back.Restore(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		kv, _ := back.Get([]byte(fmt.Sprintf("k%03d", i)))
		if kv == nil || string(kv.Value) != value("old", i) {
			t.Fatalf("snapshot's k%03d = %v, want the value from before the snapshot", i, kv)
		}
	}
	if st := s.ValueStats(); st.PendingBytes == 0 || st.Pins != 1 {
		t.Fatalf("with the snapshot held: %+v, want pending slots and one pin", st)
	}
	sn.Close()
	checkInvariants(t, s)
	grown := s.ValueStats().FileBytes
	for i := range n {
		idx++
		s.Apply(idx, putCmd(fmt.Sprintf("k%03d", i), value("fin", i)))
	}
	if st := s.ValueStats(); st.FileBytes != grown || st.Values != n {
		t.Errorf("after the close, %d rewrites grew the file from %d to %d bytes (%+v): freed slots were not reused", n, grown, st.FileBytes, st)
	}
	checkInvariants(t, s)
	for i := range n {
		if kv, _ := s.Get([]byte(fmt.Sprintf("k%03d", i))); string(kv.GetValue()) != value("fin", i) {
			t.Fatalf("k%03d = %q after the rewrite", i, kv.GetValue())
		}
	}
}

// A transaction that fails gives back the slots its sets took, and a
// restore gives back those of the state it replaces.
func TestFailedTxnAndRestoreFreeValues(t *testing.T) {
	s := onDisk(t)
	s.Apply(1, putCmd("a", "1"))
	s.Apply(2, putCmd("b", "2"))
	before := s.ValueStats()
	res, _ := s.Apply(3, txnCmd(
		&lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_SET, Key: []byte("a"), Value: []byte("x")},
		&lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_SET, Key: []byte("c"), Value: []byte("y")},
		&lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_CHECK_NOT_EXISTS, Key: []byte("b")},
	))
	if res.GetTxn().GetSucceeded() {
		t.Fatal("a transaction whose check fails succeeded")
	}
	if after := s.ValueStats(); after.Values != before.Values || after.ValueBytes != before.ValueBytes {
		t.Errorf("a failed transaction changed the value file: %+v, was %+v", after, before)
	}
	checkInvariants(t, s)

	small := New()
	small.Apply(1, putCmd("only", "one"))
	if err := s.Restore(bytes.NewReader(snapshotBytes(t, small))); err != nil {
		t.Fatal(err)
	}
	if st := s.ValueStats(); st.Values != 1 {
		t.Errorf("after restoring a one-key state the value file holds %d values", st.Values)
	}
	checkInvariants(t, s)
	if kv, _ := s.Get([]byte("only")); string(kv.GetValue()) != "one" {
		t.Errorf("restored key reads %q", kv.GetValue())
	}
}

// A snapshot that does not decode leaves the value file as it was.
func TestCorruptRestoreLeavesValues(t *testing.T) {
	s := onDisk(t)
	s.Apply(1, putCmd("a", "1"))
	src := New()
	for i := range 50 {
		src.Apply(uint64(i+1), putCmd(fmt.Sprintf("k%d", i), value("x", i)))
	}
	snap := snapshotBytes(t, src)
	before := s.ValueStats()
	if err := s.Restore(bytes.NewReader(snap[:len(snap)-3])); err == nil {
		t.Fatal("a truncated snapshot restored")
	}
	if after := s.ValueStats(); after != before {
		t.Errorf("a failed restore changed the value file: %+v, was %+v", after, before)
	}
	checkInvariants(t, s)
}

// snapshotFile writes s's snapshot to a file and returns its path.
func snapshotFile(t *testing.T, s *Store) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "snap")
	if err := os.WriteFile(path, snapshotBytes(t, s), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// RestoreShared copies no value: each stays in the snapshot file, which
// the store closes once no key names a value in it.
func TestRestoreSharedLeavesValuesInTheSnapshot(t *testing.T) {
	src := New()
	const n = 200
	for i := range n {
		src.Apply(uint64(i+1), putCmd(fmt.Sprintf("k%03d", i), value("snap", i)))
	}
	path := snapshotFile(t, src)
	stream, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	base, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s := onDisk(t)
	if err := s.RestoreShared(stream, base); err != nil {
		t.Fatal(err)
	}
	if st := s.ValueStats(); st.BaseFiles != 1 || st.Values != n || st.SlotBytes != 0 || st.FileBytes != 0 {
		t.Fatalf("after a shared restore: %+v, want every value in the base and none copied", st)
	}
	if got, want := dump(s), dump(src); got != want {
		t.Fatalf("restored state differs:\n%s\nwant\n%s", got, want)
	}
	if again, orig := snapshotBytes(t, s), snapshotBytes(t, src); !bytes.Equal(again, orig) {
		t.Error("a snapshot of the restored store differs from the one it was restored from")
	}
	checkInvariants(t, s)
	for i := range n {
		s.Apply(uint64(n+i+1), putCmd(fmt.Sprintf("k%03d", i), value("new", i)))
	}
	if st := s.ValueStats(); st.BaseFiles != 0 || st.BaseBytes != 0 {
		t.Errorf("every key overwritten, the base is still held: %+v", st)
	}
	if _, err := base.Stat(); err == nil {
		t.Error("the snapshot file is still open after its last value went")
	}
	checkInvariants(t, s)
}

// A shared restore that fails closes the base and changes nothing.
func TestRestoreSharedOfCorruptSnapshot(t *testing.T) {
	src := New()
	src.Apply(1, putCmd("a", value("x", 1)))
	path := snapshotFile(t, src)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	base, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	s := onDisk(t)
	s.Apply(1, putCmd("kept", "v"))
	before := s.ValueStats()
	if err := s.RestoreShared(bytes.NewReader(data[:len(data)-2]), base); err == nil {
		t.Fatal("a truncated snapshot restored")
	}
	if after := s.ValueStats(); after != before {
		t.Errorf("a failed shared restore changed the value file: %+v, was %+v", after, before)
	}
	if _, err := base.Stat(); err == nil {
		t.Error("the base of a failed restore is still open")
	}
	if kv, _ := s.Get([]byte("kept")); string(kv.GetValue()) != "v" {
		t.Errorf("kept reads %q", kv.GetValue())
	}
}

// TestRowAndSlotSizes holds the per-key heap cost down: a million keys
// cost a million rows and slots, and each byte here is a megabyte there.
// A row is one 48-byte allocation (the lock fields behind a pointer) and
// a slot 24 bytes of a node's array (the key as a string).
func TestRowAndSlotSizes(t *testing.T) {
	if got := unsafe.Sizeof(row{}); got != 48 {
		t.Errorf("row is %d bytes, want 48", got)
	}
	if got := unsafe.Sizeof(item{}); got != 24 {
		t.Errorf("item is %d bytes, want 24", got)
	}
}
