package raftnode

import (
	"bytes"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
)

// TestCompactInSteps: a snapshot's compaction goes compactStep entries at
// a time with a pause between two, ends where it was asked to, and stops
// early, leaving a valid log, when the pause says the node is stopping.
func TestCompactInSteps(t *testing.T) {
	const last = 3*compactStep + 100
	open := func(t *testing.T) *raftlog.Log {
		t.Helper()
		l, err := raftlog.Open(t.TempDir(), raftlog.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := l.Close(); err != nil {
				t.Error(err)
			}
		})
		ents := make([]raftpb.Entry, last)
		for i := range ents {
			ents[i] = raftpb.Entry{Index: uint64(i + 1), Term: 1, Data: []byte("v")}
		}
		if err := l.Save(raftpb.HardState{Term: 1, Commit: last}, ents); err != nil {
			t.Fatal(err)
		}
		cs := raftpb.ConfState{Voters: []uint64{1}}
		if _, err := l.CreateSnapshot(last, &cs, []byte("state")); err != nil {
			t.Fatal(err)
		}
		return l
	}
	first := func(t *testing.T, l *raftlog.Log) uint64 {
		t.Helper()
		i, err := l.FirstIndex()
		if err != nil {
			t.Fatal(err)
		}
		return i
	}

	l := open(t)
	var at []uint64 // first index at each pause
	to := uint64(last - 50)
	if err := compactInSteps(l, to, func() bool { at = append(at, first(t, l)); return true }); err != nil {
		t.Fatal(err)
	}
	chunk := uint64(compactStep)
	want := []uint64{chunk + 1, 2*chunk + 1, 3*chunk + 1}
	if len(at) != len(want) || at[0] != want[0] || at[1] != want[1] || at[2] != want[2] || first(t, l) != to+1 {
		t.Fatalf("pauses at first index %v, ending at %d; want %v, ending at %d", at, first(t, l), want, to+1)
	}
	if err := compactInSteps(l, to, func() bool { t.Fatal("paused with nothing to do"); return true }); err != nil {
		t.Fatalf("compacting again to the same index: %v", err)
	}

	l = open(t)
	if err := compactInSteps(l, to, func() bool { return false }); err != nil {
		t.Fatal(err)
	}
	if got := first(t, l); got != chunk+1 {
		t.Fatalf("a stopping node's compaction went on to %d; want it to stop after one chunk, at %d", got-1, chunk)
	}
}

// TestYieldingWriterWritesThrough: the writer that lets other goroutines
// run between a snapshot's chunks passes every byte on.
func TestYieldingWriterWritesThrough(t *testing.T) {
	var buf bytes.Buffer
	for _, p := range []string{"abc", "", "defg"} {
		if n, err := (yieldingWriter{&buf}).Write([]byte(p)); n != len(p) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", p, n, err)
		}
	}
	if buf.String() != "abcdefg" {
		t.Fatalf("wrote %q, want abcdefg", buf.String())
	}
}

// TestSnapshotBytesDue: by bytes, a snapshot is due once the bytes since
// the last one reach both the floor and the last snapshot's size; a floor
// of 0 never makes one due.
func TestSnapshotBytesDue(t *testing.T) {
	for _, tc := range []struct {
		since, floor, last uint64
		want               bool
	}{
		{since: 1 << 30, floor: 0, last: 0, want: false},
		{since: 99, floor: 100, last: 0, want: false},
		{since: 100, floor: 100, last: 0, want: true},
		{since: 100, floor: 100, last: 101, want: false},
		{since: 101, floor: 100, last: 101, want: true},
	} {
		if got := snapshotBytesDue(tc.since, tc.floor, tc.last); got != tc.want {
			t.Errorf("snapshotBytesDue(since %d, floor %d, last %d) = %v, want %v", tc.since, tc.floor, tc.last, got, tc.want)
		}
	}
}
