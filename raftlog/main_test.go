package raftlog_test

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"

	"github.com/lodestone-kv/lodestone/raftlog"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// payload is the deterministic Data of the entry at index i with term t, so
// any reader can check an entry it gets back without a copy of what was
// written. Its length varies (0..~300 bytes) to exercise maxSize.
func payload(i, t uint64) []byte {
	h := crc32.ChecksumIEEE(fmt.Appendf(nil, "%d/%d", i, t))
	n := int(h % 300)
	if h%11 == 0 {
		return nil // some entries carry no data (like leader no-ops)
	}
	b := fmt.Appendf(nil, "i=%d t=%d ", i, t)
	for len(b) < n {
		b = append(b, byte('a'+(uint64(len(b))+i)%26))
	}
	return b
}

// mkEnts returns consecutive entries starting at first, one per term given.
func mkEnts(first uint64, terms ...uint64) []raftpb.Entry {
	ents := make([]raftpb.Entry, len(terms))
	for k, t := range terms {
		i := first + uint64(k)
		ents[k] = raftpb.Entry{Index: i, Term: t, Type: raftpb.EntryNormal, Data: payload(i, t)}
	}
	return ents
}

// checkPayloads fails unless every entry carries payload(Index, Term).
func checkPayloads(ents []raftpb.Entry) error {
	for _, e := range ents {
		if got, want := e.Data, payload(e.Index, e.Term); !bytes.Equal(got, want) {
			return fmt.Errorf("entry %d term %d: data %q, want %q", e.Index, e.Term, got, want)
		}
	}
	return nil
}

func mustOpen(t testing.TB, dir string, opts raftlog.Options) *raftlog.Log {
	t.Helper()
	l, err := raftlog.Open(dir, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	return l
}

func mustClose(t testing.TB, l *raftlog.Log) {
	t.Helper()
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// errClass names the raft-visible class of err, so results of two storages
// can be compared.
func errClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, raft.ErrCompacted):
		return "ErrCompacted"
	case errors.Is(err, raft.ErrUnavailable):
		return "ErrUnavailable"
	case errors.Is(err, raft.ErrSnapOutOfDate):
		return "ErrSnapOutOfDate"
	default:
		return "error: " + err.Error()
	}
}

// assertLogInvariants checks what must hold for any Log at rest: indexes
// contiguous from FirstIndex to LastIndex with non-decreasing terms and the
// data that was written, Entries agreeing with Term, and
// FirstIndex-1 <= snapshot index <= LastIndex.
func assertLogInvariants(t *testing.T, l *raftlog.Log) {
	t.Helper()
	first, err := l.FirstIndex()
	if err != nil {
		t.Fatalf("FirstIndex: %v", err)
	}
	last, err := l.LastIndex()
	if err != nil {
		t.Fatalf("LastIndex: %v", err)
	}
	if first > last+1 {
		t.Fatalf("FirstIndex %d > LastIndex+1 %d", first, last+1)
	}
	prevTerm, err := l.Term(first - 1)
	if err != nil {
		t.Fatalf("Term(FirstIndex-1=%d): %v", first-1, err)
	}
	if first <= last {
		ents, err := l.Entries(first, last+1, ^uint64(0))
		if err != nil {
			t.Fatalf("Entries(%d, %d): %v", first, last+1, err)
		}
		if got, want := uint64(len(ents)), last+1-first; got != want {
			t.Fatalf("Entries(%d, %d) returned %d entries, want %d", first, last+1, got, want)
		}
		for k, e := range ents {
			if got, want := e.Index, first+uint64(k); got != want {
				t.Fatalf("entry %d has index %d, want %d", k, got, want)
			}
			if e.Term < prevTerm {
				t.Fatalf("entry %d term %d below previous %d", e.Index, e.Term, prevTerm)
			}
			prevTerm = e.Term
			if tm, err := l.Term(e.Index); err != nil || tm != e.Term {
				t.Fatalf("Term(%d) = %d, %v; entry says %d", e.Index, tm, err, e.Term)
			}
		}
		if err := checkPayloads(ents); err != nil {
			t.Fatal(err)
		}
	}
	s := l.Stats()
	if s.SnapshotIndex != 0 && (s.SnapshotIndex < first-1 || s.SnapshotIndex > last) {
		t.Fatalf("snapshot index %d outside [%d, %d]", s.SnapshotIndex, first-1, last)
	}
	if s.FirstIndex != first || s.LastIndex != last {
		t.Fatalf("Stats first/last = %d/%d, want %d/%d", s.FirstIndex, s.LastIndex, first, last)
	}
}
