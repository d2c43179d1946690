package raftlog_test

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
	"github.com/lodestone-kv/lodestone/raftlog/raftlogtest"
)

var errInjected = errors.New("injected fault")

// TestSnapshotFileFaults injects a failure into each step of writing a
// snapshot data file (temp, write, fsync, close, rename, dir fsync) under
// CreateSnapshot and ApplySnapshot, and checks that the error surfaces, that
// nothing is half-applied (same snapshot, same log, before and after reopen),
// that no stray file is left once the log is reopened, and that a retry
// without the fault succeeds. FORMAT.md "Crash-safe file write".
func TestSnapshotFileFaults(t *testing.T) {
	faults := []struct {
		name       string
		op         raftlogtest.Op
		shortWrite bool
		wantErr    error
	}{
		{name: "create temp fails", op: raftlogtest.OpCreateTemp, wantErr: errInjected},
		{name: "write fails", op: raftlogtest.OpWrite, wantErr: errInjected},
		{name: "short write", shortWrite: true, wantErr: io.ErrShortWrite},
		{name: "fsync fails", op: raftlogtest.OpSync, wantErr: errInjected},
		{name: "close fails", op: raftlogtest.OpClose, wantErr: errInjected},
		{name: "rename fails", op: raftlogtest.OpRename, wantErr: errInjected},
		{name: "dir fsync fails", op: raftlogtest.OpSyncDir, wantErr: errInjected},
	}
	ops := []struct {
		name string
		do   func(l *raftlog.Log) error
	}{
		{"CreateSnapshot", func(l *raftlog.Log) error {
			_, err := l.CreateSnapshot(8, cs123, []byte("state at 8"))
			return err
		}},
		{"ApplySnapshot", func(l *raftlog.Log) error {
			return l.ApplySnapshot(raftpb.Snapshot{
				Data:     []byte("leader state at 40"),
				Metadata: raftpb.SnapshotMetadata{Index: 40, Term: 7, ConfState: *cs123},
			})
		}},
	}
	for _, f := range faults {
		for _, op := range ops {
			t.Run(f.name+"/"+op.name, func(t *testing.T) {
				dir := t.TempDir()
				ffs := &raftlogtest.FaultFS{}
				opts := raftlog.Options{FS: ffs}
				l := mustOpen(t, dir, opts)
				if err := l.Save(hardState(3, 1, 9), mkEnts(1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3)); err != nil {
					t.Fatal(err)
				}
				if _, err := l.CreateSnapshot(5, cs123, []byte("state at 5")); err != nil {
					t.Fatal(err)
				}
				before := observe(t, l)

				armed := true
				ffs.Fail = func(o raftlogtest.Op, path string) error {
					if armed && o == f.op && strings.HasPrefix(path, filepath.Join(dir, "snap")) {
						return errInjected
					}
					return nil
				}
				ffs.ShortWrite = func(string) bool { return armed && f.shortWrite }

				err := op.do(l)
				if !errors.Is(err, f.wantErr) {
					t.Fatalf("%s error = %v, want %v", op.name, err, f.wantErr)
				}
				if got := observe(t, l); got != before {
					t.Fatalf("after failed %s the log changed:\n got %+v\nwant %+v", op.name, got, before)
				}
				if got, want := snapFiles(t, dir), []string{"0000000000000005-0000000000000002.snap"}; !equalStrings(got, want) {
					t.Errorf("snap/ holds %v, want %v", got, want)
				}
				mustClose(t, l)

				armed = false
				l = mustOpen(t, dir, opts)
				if got := observe(t, l); got != before {
					t.Fatalf("after reopen the log changed:\n got %+v\nwant %+v", got, before)
				}
				if got, want := snapFiles(t, dir), []string{"0000000000000005-0000000000000002.snap"}; !equalStrings(got, want) {
					t.Errorf("after reopen snap/ holds %v, want %v", got, want)
				}
				if err := op.do(l); err != nil {
					t.Fatalf("retry without the fault: %v", err)
				}
				assertLogInvariants(t, l)
				mustClose(t, l)
			})
		}
	}
}

// observation is what a failed operation must leave unchanged.
type observation struct {
	first, last, snapIndex, snapTerm uint64
	snapData                         string
	hs                               raftpb.HardState
}

func observe(t *testing.T, l *raftlog.Log) observation {
	t.Helper()
	first, err := l.FirstIndex()
	if err != nil {
		t.Fatal(err)
	}
	last, _ := l.LastIndex()
	snap, err := l.ReadSnapshotData()
	if err != nil {
		t.Fatal(err)
	}
	hs, _, _ := l.InitialState()
	return observation{first, last, snap.Metadata.Index, snap.Metadata.Term, string(snap.Data), hs}
}

func snapFiles(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(filepath.Join(dir, "snap"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if a[k] != b[k] {
			return false
		}
	}
	return true
}

// TestOpenFaults checks that filesystem failures during Open surface as
// errors naming the step.
func TestOpenFaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   raftlogtest.Op
	}{
		{"mkdir fails", raftlogtest.OpMkdirAll},
		{"dir fsync fails", raftlogtest.OpSyncDir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ffs := &raftlogtest.FaultFS{Fail: func(o raftlogtest.Op, _ string) error {
				if o == tc.op {
					return errInjected
				}
				return nil
			}}
			l, err := raftlog.Open(t.TempDir(), raftlog.Options{FS: ffs})
			if !errors.Is(err, errInjected) {
				if l != nil {
					_ = l.Close()
				}
				t.Fatalf("Open error = %v, want %v", err, errInjected)
			}
		})
	}
}

// These Saves are acknowledged before the fault in TestJournalFaults: two
// journal records, entries 1..11, nothing in raft.db yet.
func saveAcked(t *testing.T, l *raftlog.Log) {
	t.Helper()
	mustSave(t, l, hardState(2, 1, 5), mkEnts(1, 1, 1, 1, 2, 2, 2, 2, 2))
	mustSave(t, l, hardState(3, 1, 9), mkEnts(9, 3, 3, 3))
}

// contents describes everything a Log answers: indexes, hard state,
// snapshot, and each entry's index and term (payloads are checked).
func contents(t *testing.T, l *raftlog.Log) string {
	t.Helper()
	o := observe(t, l)
	var b strings.Builder
	fmt.Fprintf(&b, "%+v entries:", o)
	if o.last >= o.first {
		ents, err := l.Entries(o.first, o.last+1, math.MaxUint64)
		if err != nil {
			t.Fatalf("Entries(%d, %d): %v", o.first, o.last+1, err)
		}
		if err := checkPayloads(ents); err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			fmt.Fprintf(&b, " %d/%d", e.Index, e.Term)
		}
	}
	return b.String()
}

// TestJournalFaults injects a failure into the write, or the fdatasync, of
// one Save's raft.wal record and checks FORMAT.md "Failure cases": the Save
// returns the fault; the Log refuses every later write with ErrWriteFailed
// (also once the fault is gone) and keeps serving reads from the state
// before the failed Save; Close succeeds and folds nothing into raft.db; and
// the reopened log holds every acknowledged Save, plus the failed one
// exactly when its record reached raft.wal whole. What the reopened log
// holds is compared with logs that never saw a fault, given the acknowledged
// Saves without and with the failed one.
func TestJournalFaults(t *testing.T) {
	faults := []struct {
		name       string
		op         raftlogtest.Op
		shortWrite bool
		wantErr    error
		// replayed is whether the failed Save's record is whole in raft.wal,
		// so that the next Open replays it. FaultFS fails an operation
		// before performing it, so only a failed fdatasync leaves it whole
		// (as the page cache does after a failed writeback).
		replayed bool
	}{
		{name: "write fails", op: raftlogtest.OpWrite, wantErr: errInjected},
		{name: "short write", shortWrite: true, wantErr: io.ErrShortWrite},
		{name: "fdatasync fails", op: raftlogtest.OpDatasync, wantErr: errInjected, replayed: true},
	}
	saves := []struct {
		name string
		hs   raftpb.HardState
		ents []raftpb.Entry
	}{
		{"entries", hardState(3, 1, 10), mkEnts(12, 3, 3)},
		{"conflicting entries", hardState(4, 2, 9), mkEnts(10, 4)}, // replaces 10 and 11
		{"term and vote", hardState(4, 2, 9), nil},
	}
	// reference is what a log that never saw a fault holds after the
	// acknowledged Saves and, with failed, the failed one.
	reference := func(t *testing.T, hs raftpb.HardState, ents []raftpb.Entry, failed bool) string {
		t.Helper()
		l := mustOpen(t, t.TempDir(), raftlog.Options{})
		defer mustClose(t, l)
		saveAcked(t, l)
		if failed {
			mustSave(t, l, hs, ents)
		}
		return contents(t, l)
	}
	for _, f := range faults {
		for _, s := range saves {
			t.Run(f.name+"/"+s.name, func(t *testing.T) {
				without := reference(t, s.hs, s.ents, false)
				with := reference(t, s.hs, s.ents, true)
				dir := t.TempDir()
				wal := filepath.Join(dir, "raft.wal")
				ffs := &raftlogtest.FaultFS{}
				opts := raftlog.Options{FS: ffs}
				l := mustOpen(t, dir, opts)
				saveAcked(t, l)
				if st := l.Stats(); st.Checkpoints != 0 || st.JournalBytes != 2*4096 {
					t.Fatalf("setup: %d checkpoints, %d journal bytes; want 0 and %d", st.Checkpoints, st.JournalBytes, 2*4096)
				}
				if got := contents(t, l); got != without {
					t.Fatalf("before the fault:\n got %s\nwant %s", got, without)
				}

				armed := true
				ffs.Fail = func(o raftlogtest.Op, path string) error {
					if armed && o == f.op && path == wal {
						return errInjected
					}
					return nil
				}
				ffs.ShortWrite = func(path string) bool { return armed && f.shortWrite && path == wal }
				err := l.Save(s.hs, s.ents)
				if !errors.Is(err, f.wantErr) || errors.Is(err, raftlog.ErrWriteFailed) {
					t.Fatalf("Save with the fault = %v, want %v itself", err, f.wantErr)
				}
				armed = false

				// Fail-stop: no write succeeds until the log is reopened.
				if err := l.Save(s.hs, s.ents); !errors.Is(err, raftlog.ErrWriteFailed) || !errors.Is(err, f.wantErr) {
					t.Errorf("Save after the fault = %v, want ErrWriteFailed wrapping %v", err, f.wantErr)
				}
				if _, err := l.CreateSnapshot(5, cs123, []byte("state at 5")); !errors.Is(err, raftlog.ErrWriteFailed) {
					t.Errorf("CreateSnapshot after the fault = %v, want ErrWriteFailed", err)
				}
				if err := l.Compact(3); !errors.Is(err, raftlog.ErrWriteFailed) {
					t.Errorf("Compact after the fault = %v, want ErrWriteFailed", err)
				}
				if got := contents(t, l); got != without {
					t.Fatalf("reads after the fault:\n got %s\nwant the state before it %s", got, without)
				}
				mustClose(t, l)
				records := uint64(2)
				if f.replayed {
					records++
				}
				in, err := raftlog.Inspect(dir, time.Second)
				if err != nil || in.Summary.LastIndex != 0 || in.JournalRecords != records {
					t.Fatalf("Inspect after Close: raft.db last index %d, %d journal records, %v; want 0 and %d (Close folds nothing after a failed write)",
						in.Summary.LastIndex, in.JournalRecords, err, records)
				}

				l = mustOpen(t, dir, opts)
				want := without
				if f.replayed {
					want = with
				}
				if got := contents(t, l); got != want {
					t.Fatalf("after reopen:\n got %s\nwant %s", got, want)
				}
				assertLogInvariants(t, l)
				// Writable again: the retried Save lands (or, replayed, is
				// already there) and survives another reopen.
				mustSave(t, l, s.hs, s.ents)
				mustClose(t, l)
				l = mustOpen(t, dir, raftlog.Options{})
				defer mustClose(t, l)
				if got := contents(t, l); got != with {
					t.Fatalf("after the retried Save and a reopen:\n got %s\nwant %s", got, with)
				}
			})
		}
	}
}

// TestJournalOpenFaults injects a failure into each raft.wal operation of
// Open, on a new log and on one a crash left with four Saves in the journal
// only, and checks that Open returns the fault and that the next Open,
// without it, holds every acknowledged Save (FORMAT.md "Failure cases").
func TestJournalOpenFaults(t *testing.T) {
	for _, tc := range []struct {
		name         string
		crashed      bool
		journalBytes int64
		op           raftlogtest.Op
	}{
		{name: "new log/open", op: raftlogtest.OpOpenFile},
		{name: "new log/stat", op: raftlogtest.OpStat},
		{name: "new log/preallocate", op: raftlogtest.OpAllocate},
		{name: "new log/zero-fill", op: raftlogtest.OpWrite},
		{name: "new log/fsync", op: raftlogtest.OpSync},
		{name: "crashed log/open", crashed: true, op: raftlogtest.OpOpenFile},
		{name: "crashed log/stat", crashed: true, op: raftlogtest.OpStat},
		{name: "crashed log/read", crashed: true, op: raftlogtest.OpRead},
		// A stat error is not a missing file: with the journal disabled,
		// taking it for one skipped the replay of acknowledged Saves.
		{name: "crashed log, journal disabled/stat", crashed: true, journalBytes: -1, op: raftlogtest.OpStat},
		// The replay has committed when the removal fails; the next Open
		// finds the file's epoch consumed and only removes it.
		{name: "crashed log, journal disabled/remove", crashed: true, journalBytes: -1, op: raftlogtest.OpRemove},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			wantLast, wantHS := uint64(0), raftpb.HardState{}
			if tc.crashed {
				_, live := journaled(t)
				dir = crashCopy(t, live)
				wantLast, wantHS = 7, hardState(2, 2, 6)
			}
			wal := filepath.Join(dir, "raft.wal")
			ffs := &raftlogtest.FaultFS{Fail: func(o raftlogtest.Op, path string) error {
				if o == tc.op && path == wal {
					return errInjected
				}
				return nil
			}}
			opts := raftlog.Options{FS: ffs, JournalBytes: tc.journalBytes}
			if l, err := raftlog.Open(dir, opts); !errors.Is(err, errInjected) {
				if l != nil {
					_ = l.Close()
				}
				t.Fatalf("Open with the fault = %v, want %v", err, errInjected)
			}
			if got := ffs.Calls(tc.op); got == 0 {
				t.Fatalf("setup: Open never attempted %s", tc.op)
			}
			ffs.Fail = nil
			l := mustOpen(t, dir, opts)
			defer mustClose(t, l)
			assertLogInvariants(t, l)
			last, _ := l.LastIndex()
			hs, _, _ := l.InitialState()
			if last != wantLast || hs != wantHS {
				t.Fatalf("after a failed Open and a good one: last index %d, hard state %v; want %d, %v", last, hs, wantLast, wantHS)
			}
			_, err := os.Stat(wal)
			if exists := err == nil; exists != (tc.journalBytes >= 0) {
				t.Fatalf("raft.wal exists = %v (%v) with JournalBytes %d", exists, err, tc.journalBytes)
			}
		})
	}
}

// TestJournalWithoutFallocate opens a log on a filesystem that cannot
// preallocate (Allocate fails with errors.ErrUnsupported, as it does off
// Linux or without fallocate) and checks that raft.wal is extended with
// Truncate instead, to its full size, and that Saves in it survive a crash.
func TestJournalWithoutFallocate(t *testing.T) {
	dir := t.TempDir()
	ffs := &raftlogtest.FaultFS{Fail: func(o raftlogtest.Op, _ string) error {
		if o == raftlogtest.OpAllocate {
			return fmt.Errorf("fallocate: %w", errors.ErrUnsupported)
		}
		return nil
	}}
	const size = 1 << 20
	l := mustOpen(t, dir, raftlog.Options{FS: ffs, JournalBytes: size})
	defer mustClose(t, l)
	if got := ffs.Calls(raftlogtest.OpTruncate); got != 1 {
		t.Fatalf("Truncate called %d times, want 1 (the fallback)", got)
	}
	if fi, err := os.Stat(filepath.Join(dir, "raft.wal")); err != nil || fi.Size() != size {
		t.Fatalf("raft.wal: %v; want %d bytes", err, size)
	}
	saveAcked(t, l)
	if st := l.Stats(); st.Checkpoints != 0 || st.JournalBytes == 0 {
		t.Fatalf("setup: %d checkpoints, %d journal bytes; want the Saves in the journal", st.Checkpoints, st.JournalBytes)
	}
	c := mustOpen(t, crashCopy(t, dir), raftlog.Options{})
	defer mustClose(t, c)
	assertLogInvariants(t, c)
	if last, _ := c.LastIndex(); last != 11 {
		t.Fatalf("LastIndex after a crash = %d, want 11", last)
	}
}
