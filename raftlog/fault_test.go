package raftlog_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
	snap, err := l.Snapshot()
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
