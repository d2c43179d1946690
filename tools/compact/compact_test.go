package compact

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"

	"github.com/lodestone-kv/lodestone/raftlog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var cs = &raftpb.ConfState{Voters: []uint64{1, 2, 3}}

// entryData is the data of entry i: a function of i, so a reader can check
// what it gets back.
func entryData(i uint64, size int) []byte {
	b := make([]byte, size)
	for k := range b {
		b[k] = byte(i*31 + uint64(k))
	}
	return b
}

// bloatedNode writes a node's data dir whose log went through rounds*batch
// entries of size bytes and was truncated to the last keep: a raft.db that
// is mostly free pages. It returns the data dir.
func bloatedNode(t *testing.T, rounds, batch, size int, keep uint64) string {
	t.Helper()
	dataDir := t.TempDir()
	l, err := raftlog.Open(filepath.Join(dataDir, "raft"), raftlog.Options{RotateFreeRatio: -1})
	if err != nil {
		t.Fatal(err)
	}
	next := uint64(1)
	for range rounds {
		ents := make([]raftpb.Entry, batch)
		for k := range ents {
			ents[k] = raftpb.Entry{Index: next, Term: 2, Data: entryData(next, size)}
			next++
		}
		if err := l.Save(raftpb.HardState{Term: 2, Vote: 1, Commit: next - 1}, ents); err != nil {
			t.Fatal(err)
		}
	}
	last := next - 1
	if _, err := l.CreateSnapshot(last-keep, cs, []byte("state machine")); err != nil {
		t.Fatal(err)
	}
	if err := l.Compact(last - keep); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return dataDir
}

// readLog opens the node's log and returns every entry, the hard state and
// the snapshot metadata: what must be the same before and after compaction.
func readLog(t *testing.T, dataDir string) ([]raftpb.Entry, raftpb.HardState, raftpb.SnapshotMetadata) {
	t.Helper()
	l, err := raftlog.Open(filepath.Join(dataDir, "raft"), raftlog.Options{RotateFreeRatio: -1, CacheEntries: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	first, _ := l.FirstIndex()
	last, _ := l.LastIndex()
	var ents []raftpb.Entry
	if last >= first {
		if ents, err = l.Entries(first, last+1, ^uint64(0)); err != nil {
			t.Fatal(err)
		}
	}
	hs, _, _ := l.InitialState()
	snap, err := l.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return ents, hs, snap.Metadata
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestRun compacts a bloated log and checks it two ways: the entries, hard
// state and snapshot read back through raftlog equal those read before, and
// the file shrank to about its live data; with a backup the original is kept
// under the timestamped name and still opens as the same log.
func TestRun(t *testing.T) {
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		noBackup bool
		keep     uint64
	}{
		{name: "with backup", keep: 40},
		{name: "no backup", noBackup: true, keep: 40},
		{name: "whole log compacted", keep: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := bloatedNode(t, 24, 64, 4<<10, tc.keep)
			path := filepath.Join(dataDir, "raft", "raft.db")
			wantEnts, wantHS, wantSnap := readLog(t, dataDir)
			before := fileSize(t, path)

			var progress bytes.Buffer
			clock := now
			res, err := Run(context.Background(), Options{DataDir: dataDir, NoBackup: tc.noBackup,
				Now: func() time.Time { clock = clock.Add(10 * time.Millisecond); return clock }}, &progress)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			gotEnts, gotHS, gotSnap := readLog(t, dataDir)
			if len(gotEnts) != len(wantEnts) {
				t.Fatalf("after compaction %d entries, want %d", len(gotEnts), len(wantEnts))
			}
			for k := range wantEnts {
				if g, w := gotEnts[k], wantEnts[k]; g.Index != w.Index || g.Term != w.Term || !bytes.Equal(g.Data, w.Data) {
					t.Fatalf("entry %d differs after compaction", w.Index)
				}
			}
			if gotHS != wantHS || gotSnap.Index != wantSnap.Index || gotSnap.Term != wantSnap.Term {
				t.Errorf("hard state %+v, snapshot %d/%d; want %+v, %d/%d", gotHS, gotSnap.Index, gotSnap.Term, wantHS, wantSnap.Index, wantSnap.Term)
			}
			after := fileSize(t, path)
			if got, want := res.BeforeBytes, before; got != want {
				t.Errorf("Result.BeforeBytes = %d, want %d", got, want)
			}
			if got, want := res.AfterBytes, after; got != want {
				t.Errorf("Result.AfterBytes = %d, want %d", got, want)
			}
			// NB: below 16 MiB bbolt grows a file to its mmap size, the
			// next power of two: up to twice the live data.
			if after*3 > before || after > 2*res.LiveBytes+64<<10 {
				t.Errorf("file %d -> %d bytes with %d live: want it shrunk to about the live data", before, after, res.LiveBytes)
			}
			if got, want := res.Summary.Entries, uint64(len(wantEnts)); got != want {
				t.Errorf("Result.Summary.Entries = %d, want %d", got, want)
			}
			backup := path + ".bak-20260304T050607Z"
			if tc.noBackup {
				if res.BackupPath != "" {
					t.Errorf("BackupPath = %q with NoBackup", res.BackupPath)
				}
				if m, _ := filepath.Glob(path + ".bak-*"); len(m) != 0 {
					t.Errorf("backup files %v with NoBackup", m)
				}
			} else {
				if res.BackupPath != backup {
					t.Errorf("BackupPath = %q, want %q", res.BackupPath, backup)
				}
				if got := fileSize(t, backup); got != before {
					t.Errorf("backup is %d bytes, the original was %d", got, before)
				}
			}
			if _, err := os.Stat(path + ".rotating"); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("temporary file left behind: %v", err)
			}
			p := progress.String()
			for _, want := range []string{"copying entries [", "100%", "entries/s"} {
				if !strings.Contains(p, want) {
					t.Errorf("progress %q does not contain %q", p, want)
				}
			}
			if !strings.HasSuffix(p, "\n") {
				t.Errorf("progress %q does not end the line", p)
			}
		})
	}
}

// TestRunRefuses covers what Run must not touch: a log a live server holds,
// a data dir without a log, a damaged log, and a canceled run. In every case
// raft.db is left exactly as it was and no backup or temporary file exists.
func TestRunRefuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		keep    uint64 // entries left live (of 1024)
		setup   func(t *testing.T, dataDir string) (cleanup func())
		ctx     func() context.Context
		noLog   bool
		wantErr error
		wantMsg string
	}{
		{
			name: "log held by a running server",
			setup: func(t *testing.T, dataDir string) func() {
				l, err := raftlog.Open(filepath.Join(dataDir, "raft"), raftlog.Options{RotateFreeRatio: -1})
				if err != nil {
					t.Fatal(err)
				}
				return func() { _ = l.Close() }
			},
			wantErr: ErrInUse,
			wantMsg: "is in use by a running server; stop it first",
		},
		{name: "no log in the data dir", noLog: true, wantErr: ErrNoLog, wantMsg: "pass the node's --data-dir"},
		{
			name: "damaged log",
			keep: 1000, // nearly every page live, so the damage hits entries
			setup: func(t *testing.T, dataDir string) func() {
				// Overwrite the middle of the file: pages of live entries.
				f, err := os.OpenFile(filepath.Join(dataDir, "raft", "raft.db"), os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				fi, _ := f.Stat()
				if _, err := f.WriteAt(bytes.Repeat([]byte{0xAB}, 64<<10), fi.Size()/2); err != nil {
					t.Fatal(err)
				}
				return func() {}
			},
			wantErr: raftlog.ErrCorrupt,
		},
		{
			name: "canceled",
			ctx: func() context.Context {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx
			},
			wantErr: context.Canceled,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := t.TempDir()
			path := filepath.Join(dataDir, "raft", "raft.db")
			var before []byte
			if !tc.noLog {
				dataDir = bloatedNode(t, 4, 256, 256, max(tc.keep, 300))
				path = filepath.Join(dataDir, "raft", "raft.db")
			}
			if tc.setup != nil {
				defer tc.setup(t, dataDir)()
			}
			if !tc.noLog {
				var err error
				if before, err = os.ReadFile(path); err != nil {
					t.Fatal(err)
				}
			}
			ctx := context.Background()
			if tc.ctx != nil {
				ctx = tc.ctx()
			}
			_, err := Run(ctx, Options{DataDir: dataDir, LockTimeout: 50 * time.Millisecond}, nil)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Run = %v, want %v", err, tc.wantErr)
			}
			if tc.wantMsg != "" && !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not say %q", err, tc.wantMsg)
			}
			if tc.wantErr == ErrInUse {
				if got, want := err.Error(), "raft log at "+dataDir+" is in use by a running server; stop it first"; got != want {
					t.Errorf("error = %q, want %q", got, want)
				}
			}
			if tc.noLog {
				if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("Run created %s: %v", path, err)
				}
				return
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(after, before) {
				t.Errorf("raft.db changed although Run failed")
			}
			if m, _ := filepath.Glob(path + ".*"); len(m) != 0 {
				t.Errorf("files left behind: %v", m)
			}
		})
	}
}

// TestInspect checks the report on a bloated and on a compacted log, and the
// refusal of a log in use.
func TestInspect(t *testing.T) {
	dataDir := bloatedNode(t, 24, 64, 4<<10, 40)
	r, err := Inspect(Options{DataDir: dataDir})
	if err != nil {
		t.Fatal(err)
	}
	// Mostly free, but below the 64 MiB a running server waits for: the
	// verdict uses the server's thresholds, so no recommendation.
	if r.Compact || r.FreeShare < 0.5 || r.Reclaimable <= 0 || r.Summary.Entries != 40 {
		t.Errorf("Inspect = %+v: want > 50%% free, no recommendation below 64 MiB, 40 entries", r)
	}
	if r.CommitWriteBytes < int64(r.PageSize) || r.FreePages == 0 || r.LiveBytes <= 0 {
		t.Errorf("Inspect = %+v: want free pages, live data and a commit estimate", r)
	}
	if _, err := Run(context.Background(), Options{DataDir: dataDir, NoBackup: true}, nil); err != nil {
		t.Fatal(err)
	}
	r2, err := Inspect(Options{DataDir: dataDir})
	if err != nil {
		t.Fatal(err)
	}
	if r2.Compact || r2.FreeShare > 0.1 || r2.Summary != r.Summary {
		t.Errorf("after compaction Inspect = %+v; want no recommendation and the same summary %+v", r2, r.Summary)
	}

	l, err := raftlog.Open(filepath.Join(dataDir, "raft"), raftlog.Options{RotateFreeRatio: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = Inspect(Options{DataDir: dataDir, LockTimeout: 50 * time.Millisecond})
	var iu *InUseError
	if !errors.As(err, &iu) || !errors.Is(err, ErrInUse) || !errors.Is(err, raftlog.ErrLocked) {
		t.Errorf("Inspect of a log in use = %v, want an *InUseError", err)
	}
}

// TestProgressBar pins the bar's rendering with a stepped clock.
func TestProgressBar(t *testing.T) {
	var b bytes.Buffer
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := t0
	bar := newBar(&b, func() time.Time { return clock }, time.Second)
	clock = t0.Add(2 * time.Second)
	bar.update(raftlog.RotateProgress{Copied: 1000, Total: 4000, CopiedBytes: 16 << 20})
	clock = t0.Add(2500 * time.Millisecond) // within ProgressEvery: not drawn
	bar.update(raftlog.RotateProgress{Copied: 2000, Total: 4000, CopiedBytes: 32 << 20})
	clock = t0.Add(4 * time.Second)
	bar.update(raftlog.RotateProgress{Copied: 4000, Total: 4000, CopiedBytes: 64 << 20})
	bar.finish(true)
	want := "\rcopying entries [=======>                      ]  25%  1000/4000 entries  16 MiB  500 entries/s" +
		"\rcopying entries [==============================] 100%  4000/4000 entries  64 MiB  1000 entries/s\n"
	if got := b.String(); got != want {
		t.Errorf("bar drew\n%q\nwant\n%q", got, want)
	}
}

func TestHumanBytes(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1 KiB"}, {1536, "1.5 KiB"},
		{7_800_000, "7.4 MiB"}, {4_200_000_000, "3.9 GiB"}, {512 << 20, "512 MiB"},
	} {
		if got := HumanBytes(tc.n); got != tc.want {
			t.Errorf("HumanBytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
