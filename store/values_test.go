package store

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"

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
