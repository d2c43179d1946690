package raftlog_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
	"github.com/lodestone-kv/lodestone/raftlog/raftlogtest"
)

// TestRotationDue is the automatic rotation policy (Options.RotateFreeRatio,
// RotateMinBytes, RotateRetryInterval): rotate a big enough file whose free
// share passed the threshold, unless a failure asked to wait.
func TestRotationDue(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const mib = 1 << 20
	for _, tc := range []struct {
		name            string
		ratio           float64
		min, file, free int64
		retryAt         time.Time
		want            bool
	}{
		{"bloated file", 0.5, 64 * mib, 4096 * mib, 3800 * mib, time.Time{}, true},
		{"just past the threshold", 0.5, 64 * mib, 100 * mib, 50*mib + 1, time.Time{}, true},
		{"at the threshold", 0.5, 64 * mib, 100 * mib, 50 * mib, time.Time{}, false},
		{"mostly live", 0.5, 64 * mib, 4096 * mib, 100 * mib, time.Time{}, false},
		{"too small", 0.5, 64 * mib, 63 * mib, 60 * mib, time.Time{}, false},
		{"exactly the minimum", 0.5, 64 * mib, 64 * mib, 60 * mib, time.Time{}, true},
		{"disabled", -1, 64 * mib, 4096 * mib, 4000 * mib, time.Time{}, false},
		{"waiting after a failure", 0.5, 64 * mib, 4096 * mib, 3800 * mib, now.Add(time.Second), false},
		{"retry time reached", 0.5, 64 * mib, 4096 * mib, 3800 * mib, now, true},
		{"no file", 0.5, 0, 0, 0, time.Time{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, want := raftlog.RotationPolicy(tc.ratio, tc.min, tc.file, tc.free, now, tc.retryAt), tc.want; got != want {
				t.Errorf("RotationPolicy = %v, want %v", got, want)
			}
		})
	}
	// The exported form applies Options' defaults (50%, 64 MiB).
	for _, tc := range []struct {
		opts       raftlog.Options
		file, free int64
		want       bool
	}{
		{raftlog.Options{}, 4096 * mib, 3800 * mib, true},
		{raftlog.Options{}, 32 * mib, 30 * mib, false},
		{raftlog.Options{RotateMinBytes: 1 * mib}, 32 * mib, 30 * mib, true},
		{raftlog.Options{RotateFreeRatio: 0.95}, 4096 * mib, 3800 * mib, false},
		{raftlog.Options{RotateFreeRatio: -1}, 4096 * mib, 4000 * mib, false},
	} {
		if got := raftlog.RotationDue(tc.opts, tc.file, tc.free); got != tc.want {
			t.Errorf("RotationDue(%+v, %d, %d) = %v, want %v", tc.opts, tc.file, tc.free, got, tc.want)
		}
	}
}

// rotateCase is a log history, writes made while a rotation copies (on the
// rotating goroutine, at the "copy" step, when it holds no lock, and again
// at the "copied" step), and what the rotation is asked.
type rotateCase struct {
	name     string
	before   []step
	duringA  []step // at step "copy": after the first chunk
	duringB  []step // at step "copied": after the bulk copy's fsync
	verify   bool
	backup   bool
	cacheOff bool
}

var rotateCases = []rotateCase{
	{name: "empty log"},
	{name: "entries only", before: []step{committed(1, ones(40)...)}},
	{name: "compacted log with snapshot", before: []step{
		committed(1, ones(60)...), createSnap(50, cs123), compact(45)}},
	{name: "appends during copy", before: []step{committed(1, ones(40)...)},
		duringA: []step{committed(41, 1, 1, 2)}, duringB: []step{committed(44, 2, 2)}},
	{name: "suffix overwritten during copy", before: []step{appendAt(1, ones(40)...), save(hardState(1, 1, 10), nil)},
		duringA: []step{appendAt(12, 2, 2, 2)}},
	{name: "suffix overwritten below what was copied", before: []step{appendAt(1, ones(40)...), save(hardState(1, 1, 2), nil)},
		duringB: []step{appendAt(3, 3, 3)}},
	{name: "compaction during copy", before: []step{committed(1, ones(40)...)},
		duringA: []step{createSnap(30, cs123), compact(25)}, duringB: []step{committed(41, 1)}},
	{name: "snapshot from the leader during copy", before: []step{committed(1, ones(40)...)},
		duringA: []step{applySnap(100, 5, 1, 2, 3)}, duringB: []step{committed(101, 5, 5)}},
	{name: "hard state only during copy", before: []step{committed(1, ones(20)...)},
		duringA: []step{save(hardState(7, 2, 20), nil)}},
	{name: "verified with backup", before: []step{committed(1, ones(30)...), createSnap(20, cs123), compact(10)},
		verify: true, backup: true},
	{name: "verified, cache off", before: []step{committed(1, 1, 1, 2, 2, 3), createSnap(4, cs123), compact(2)},
		duringA: []step{committed(6, 3)}, verify: true, cacheOff: true},
}

func ones(n int) []uint64 {
	t := make([]uint64, n)
	for k := range t {
		t[k] = 1
	}
	return t
}

// TestRotate rotates each history while the case's writes land mid-copy and
// checks that every answer of the Log equals raft.MemoryStorage's given the
// same writes, before and after a reopen (the rotated file alone), that the
// temporary file is gone and the stats counted it.
func TestRotate(t *testing.T) {
	for _, tc := range rotateCases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ref := memStorage{raft.NewMemoryStorage()}
			var l *raftlog.Log
			run := func(steps []step) {
				for _, st := range steps {
					if got, want := errClass(st.do(l)), errClass(st.do(ref)); got != want {
						t.Errorf("%s: got %s, want %s", st.name, got, want)
					}
				}
			}
			var seen []string
			opts := raftlog.Options{RotateFreeRatio: -1}
			if tc.cacheOff {
				opts.CacheEntries = -1
			}
			opts = raftlog.WithRotateHook(opts, 4, func(s string) {
				seen = append(seen, s)
				switch s {
				case "copy":
					run(tc.duringA)
				case "copied":
					run(tc.duringB)
				}
			})
			l = mustOpen(t, dir, opts)
			run(tc.before)
			ro := raftlog.RotateOptions{Verify: tc.verify}
			if tc.backup {
				ro.BackupPath = filepath.Join(dir, "raft.db.bak-test")
			}
			var progress []raftlog.RotateProgress
			ro.Progress = func(p raftlog.RotateProgress) { progress = append(progress, p) }
			res, err := l.Rotate(context.Background(), ro)
			if err != nil {
				t.Fatalf("Rotate: %v", err)
			}
			if tc.duringA != nil && !contains(seen, "copy") {
				t.Fatalf("steps %v: the copy step never ran, so the mid-copy writes did not happen", seen)
			}
			assertSameStorage(t, ref, l)
			assertLogInvariants(t, l)
			first, _ := l.FirstIndex()
			last, _ := l.LastIndex()
			if got, want := res.Entries, last+1-first; got != want {
				t.Errorf("RotateResult.Entries = %d, want %d", got, want)
			}
			if tc.verify && (res.Summary.Entries != res.Entries || res.Summary.LastIndex != last && res.Entries > 0) {
				t.Errorf("RotateResult.Summary = %+v, want %d entries up to %d", res.Summary, res.Entries, last)
			}
			if len(progress) == 0 || progress[len(progress)-1].Copied != progress[len(progress)-1].Total {
				t.Errorf("progress %+v: want a final report with Copied == Total", progress)
			}
			s := l.Stats()
			if s.Rotations != 1 || s.RotationFailures != 0 || s.Rotating || s.LastRotationDuration <= 0 {
				t.Errorf("Stats() = %+v; want one rotation, no failure, none in progress", s)
			}
			if _, err := os.Stat(filepath.Join(dir, "raft.db.rotating")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("raft.db.rotating left behind: %v", err)
			}
			// The log keeps working on the new file.
			next := last + 1
			run([]step{committed(next, 9, 9)})
			assertSameStorage(t, ref, l)
			mustClose(t, l)

			l = mustOpen(t, dir, raftlog.Options{CacheEntries: -1})
			assertSameStorage(t, ref, l)
			assertLogInvariants(t, l)
			mustClose(t, l)

			if tc.backup {
				// The backup is the file as it was before the rotation.
				bdir := t.TempDir()
				if err := os.Rename(ro.BackupPath, filepath.Join(bdir, "raft.db")); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(filepath.Join(dir, "snap"), filepath.Join(bdir, "snap")); err != nil {
					t.Fatal(err)
				}
				b := mustOpen(t, bdir, raftlog.Options{CacheEntries: -1})
				if got, want := mustLast(t, b), last; got != want {
					t.Errorf("backup LastIndex = %d, want %d", got, want)
				}
				mustClose(t, b)
			}
		})
	}
}

func contains(xs []string, x string) bool {
	for _, s := range xs {
		if s == x {
			return true
		}
	}
	return false
}

func mustLast(t *testing.T, l *raftlog.Log) uint64 {
	t.Helper()
	i, err := l.LastIndex()
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// bigEnts are n consecutive entries of size bytes each, term 1, from first.
func bigEnts(first uint64, n, size int) []raftpb.Entry {
	data := make([]byte, size)
	for k := range data {
		data[k] = byte(k)
	}
	ents := make([]raftpb.Entry, n)
	for k := range ents {
		ents[k] = raftpb.Entry{Index: first + uint64(k), Term: 1, Data: data}
	}
	return ents
}

// churn appends rounds*batch 16 KiB entries in batches, then snapshots and
// compacts all but the last keep: a file with many free pages.
func churn(t *testing.T, l *raftlog.Log, rounds, batch int, keep uint64) {
	t.Helper()
	next := mustLast(t, l) + 1
	for range rounds {
		ents := bigEnts(next, batch, 16<<10)
		next += uint64(batch)
		if err := l.Save(hardState(1, 1, next-1), ents); err != nil {
			t.Fatal(err)
		}
	}
	last := next - 1
	if _, err := l.CreateSnapshot(last-keep, cs123, []byte("state")); err != nil {
		t.Fatal(err)
	}
	if err := l.Compact(last - keep); err != nil {
		t.Fatal(err)
	}
}

// assertBigEntries checks that the log holds bigEnts data at every index
// from FirstIndex to LastIndex.
func assertBigEntries(t *testing.T, l *raftlog.Log) {
	t.Helper()
	first, _ := l.FirstIndex()
	last := mustLast(t, l)
	ents, err := l.Entries(first, last+1, ^uint64(0))
	if err != nil {
		t.Fatalf("Entries(%d, %d): %v", first, last+1, err)
	}
	if got, want := uint64(len(ents)), last+1-first; got != want {
		t.Fatalf("Entries returned %d entries, want %d", got, want)
	}
	want := bigEnts(0, 1, 16<<10)[0].Data
	for k, e := range ents {
		if e.Index != first+uint64(k) || !bytes.Equal(e.Data, want) {
			t.Fatalf("entry %d: index %d, %d bytes of data; want index %d with the written data",
				k, e.Index, len(e.Data), first+uint64(k))
		}
	}
}

// fakeClock is a Clock the test steps by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestAutomaticRotation checks that a Compact which leaves raft.db mostly
// free makes the Log rotate on its own goroutine, that a failed rotation
// keeps the old file in use and is retried only after RotateRetryInterval by
// the Clock, and that the rotated log holds the same entries
// (docs/architecture.md, "Append latency does not depend on the log file's
// history": free pages are reclaimed by online rotation).
func TestAutomaticRotation(t *testing.T) {
	dir := t.TempDir()
	clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	var failRename sync.Mutex
	failing := true
	ffs := &raftlogtest.FaultFS{Fail: func(op raftlogtest.Op, path string) error {
		failRename.Lock()
		defer failRename.Unlock()
		if failing && op == raftlogtest.OpRename && filepath.Base(path) == "raft.db.rotating" {
			return errInjected
		}
		return nil
	}}
	steps := make(chan string, 64)
	const minBytes = 4 << 20
	opts := raftlog.Options{FS: ffs, Clock: clock, RotateMinBytes: minBytes, RotateRetryInterval: time.Hour, CacheEntries: -1}
	opts = raftlog.WithRotateHook(opts, 0, func(s string) { steps <- s })
	l := mustOpen(t, dir, opts)
	defer func() { mustClose(t, l) }() // NB: l is reopened below
	// waitStep returns once the rotation goroutine reports want, skipping
	// earlier steps. Each Compact makes the goroutine check the policy once
	// and report "not-due", or rotate and report "done" or "failed".
	waitStep := func(want string) {
		t.Helper()
		for {
			select {
			case s := <-steps:
				if s == want {
					return
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("rotation goroutine never reported %q", want)
			}
		}
	}
	waitStep("not-due") // Open checks: a fresh file is below RotateMinBytes

	churn(t, l, 8, 64, 16) // ~8 MiB written, all but 16 entries compacted
	waitStep("failed")     // the rename fails
	if s := l.Stats(); s.Rotations != 0 || s.RotationFailures != 1 || s.Rotating {
		t.Fatalf("after a failed rename: Stats() = %+v, want 0 rotations, 1 failure", s)
	}
	if _, err := os.Stat(filepath.Join(dir, "raft.db.rotating")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("raft.db.rotating left behind after the failure: %v", err)
	}
	assertBigEntries(t, l) // the old file still serves

	failRename.Lock()
	failing = false
	failRename.Unlock()
	// Within the retry interval a new Compact does not rotate...
	churn(t, l, 1, 8, 4)
	waitStep("not-due")
	clock.Add(time.Hour - time.Second)
	churn(t, l, 1, 8, 4)
	waitStep("not-due")
	// ...once it has passed, the next one does.
	clock.Add(time.Second)
	before := l.Stats().FileBytes
	churn(t, l, 1, 8, 4)
	waitStep("done")
	s := l.Stats()
	if s.Rotations != 1 || s.FileBytes >= before || s.Rotating {
		t.Fatalf("Stats() = %+v, want 1 rotation and a file smaller than %d bytes", s, before)
	}
	assertBigEntries(t, l)
	first, last := s.FirstIndex, s.LastIndex
	mustClose(t, l)
	l = mustOpen(t, dir, raftlog.Options{RotateFreeRatio: -1})
	if got, _ := l.FirstIndex(); got != first {
		t.Errorf("after reopen FirstIndex = %d, want %d", got, first)
	}
	if got := mustLast(t, l); got != last {
		t.Errorf("after reopen LastIndex = %d, want %d", got, last)
	}
}

// TestRotateFaults injects a failure at each fallible step of a rotation and
// checks what the Log promises: before the rename the old file stays in use
// and writable, nothing is left behind; a failed directory fsync after the
// rename makes the Log refuse writes (ErrWriteFailed); in every case a reopen
// finds the whole log.
func TestRotateFaults(t *testing.T) {
	for _, tc := range []struct {
		name          string
		failOp        raftlogtest.Op // failed on raft.db.rotating (rename) or the log dir (syncdir)
		cancelAt      string         // cancel the context at this step instead
		wantErr       error
		wantWriteable bool
	}{
		{name: "rename fails", failOp: raftlogtest.OpRename, wantErr: errInjected, wantWriteable: true},
		{name: "remove of a leftover fails", failOp: raftlogtest.OpRemove, wantErr: errInjected, wantWriteable: true},
		{name: "dir fsync after rename fails", failOp: raftlogtest.OpSyncDir, wantErr: errInjected, wantWriteable: false},
		{name: "canceled mid-copy", cancelAt: "copy", wantErr: context.Canceled, wantWriteable: true},
		{name: "canceled after the bulk copy", cancelAt: "copied", wantErr: context.Canceled, wantWriteable: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var armed bool
			var mu sync.Mutex
			ffs := &raftlogtest.FaultFS{Fail: func(op raftlogtest.Op, path string) error {
				mu.Lock()
				defer mu.Unlock()
				if armed && op == tc.failOp {
					return errInjected
				}
				return nil
			}}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			opts := raftlog.WithRotateHook(raftlog.Options{FS: ffs, RotateFreeRatio: -1, CacheEntries: -1}, 4, func(s string) {
				if s == tc.cancelAt {
					cancel()
				}
			})
			l := mustOpen(t, dir, opts)
			defer l.Close()
			ref := memStorage{raft.NewMemoryStorage()}
			for _, st := range []step{committed(1, ones(30)...), createSnap(20, cs123), compact(10)} {
				if err := st.do(l); err != nil {
					t.Fatal(err)
				}
				_ = st.do(ref)
			}
			mu.Lock()
			armed = true
			mu.Unlock()
			_, err := l.Rotate(ctx, raftlog.RotateOptions{})
			mu.Lock()
			armed = false
			mu.Unlock()
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Rotate = %v, want %v", err, tc.wantErr)
			}
			assertSameStorage(t, ref, l)
			werr := committed(31, 1).do(l)
			if tc.wantWriteable {
				if werr != nil {
					t.Fatalf("Save after failed rotation: %v", werr)
				}
				_ = committed(31, 1).do(ref)
				if s := l.Stats(); s.RotationFailures != 1 && tc.cancelAt == "" {
					t.Errorf("RotationFailures = %d, want 1", s.RotationFailures)
				}
			} else if !errors.Is(werr, raftlog.ErrWriteFailed) {
				t.Fatalf("Save after failed dir fsync = %v, want ErrWriteFailed", werr)
			}
			_ = l.Close()
			l2 := mustOpen(t, dir, raftlog.Options{CacheEntries: -1})
			defer mustClose(t, l2)
			assertSameStorage(t, ref, l2)
			if _, err := os.Stat(filepath.Join(dir, "raft.db.rotating")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("raft.db.rotating still there after reopen: %v", err)
			}
		})
	}
}

// TestCommitWriteIgnoresHistory is the byte-level form of "Append latency
// does not depend on the log file's history" (docs/architecture.md): a 16 KiB
// append writes as much to a file with thousands of free pages as to a fresh
// one, although the freelist it is spared writing (FreelistBytes) grew with
// the history. It also checks Inspect's estimate of a commit against the
// measured number.
func TestCommitWriteIgnoresHistory(t *testing.T) {
	measure := func(l *raftlog.Log, n int) (maxWrite int64) {
		next := mustLast(t, l) + 1
		for k := range n {
			if err := l.Save(hardState(1, 1, next+uint64(k)), bigEnts(next+uint64(k), 1, 16<<10)); err != nil {
				t.Fatal(err)
			}
			maxWrite = max(maxWrite, l.Stats().LastCommitWriteBytes)
		}
		return maxWrite
	}
	freshDir, churnedDir := t.TempDir(), t.TempDir()
	fresh := mustOpen(t, freshDir, raftlog.Options{RotateFreeRatio: -1, JournalBytes: -1})
	churn(t, fresh, 1, 64, 32)
	freshWrite := measure(fresh, 32)

	churned := mustOpen(t, churnedDir, raftlog.Options{RotateFreeRatio: -1, JournalBytes: -1})
	churn(t, churned, 16, 128, 32) // 32 MiB through the log
	s := churned.Stats()
	if s.FreePages+s.PendingPages < 5000 || s.FreelistBytes < 40000 {
		t.Fatalf("churned file has %d free pages, freelist %d bytes; want thousands", s.FreePages, s.FreelistBytes)
	}
	churnedWrite := measure(churned, 32)
	if churnedWrite > freshWrite*5/4 {
		t.Errorf("a 16 KiB append writes %d bytes to the churned file, %d to the fresh one; want the same", churnedWrite, freshWrite)
	}
	// NB: had the freelist been written, each commit would carry its
	// FreelistBytes (over 40 KB here) on top of the fresh file's figure,
	// which the 25% margin above does not allow.
	mustClose(t, churned)
	mustClose(t, fresh)

	in, err := raftlog.Inspect(churnedDir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if in.CommitWriteBytes < churnedWrite/2 || in.CommitWriteBytes > churnedWrite*2 {
		t.Errorf("Inspect estimates %d bytes per commit, measured %d: want within 2x", in.CommitWriteBytes, churnedWrite)
	}
}

// TestInspect compares what Inspect reads from a stopped log's file with what
// the Log reports about the same file after Open (two derivations of the
// free pages and sizes), and checks its refusals.
func TestInspect(t *testing.T) {
	dir := t.TempDir()
	l := mustOpen(t, dir, raftlog.Options{RotateFreeRatio: -1})
	churn(t, l, 4, 64, 20)
	if err := l.Save(hardState(2, 3, mustLast(t, l)), nil); err != nil {
		t.Fatal(err)
	}
	// A running log holds the lock.
	if _, err := raftlog.Inspect(dir, 50*time.Millisecond); !errors.Is(err, raftlog.ErrLocked) {
		t.Errorf("Inspect of a log in use = %v, want ErrLocked", err)
	}
	mustClose(t, l)

	in, err := raftlog.Inspect(dir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, dir, raftlog.Options{RotateFreeRatio: -1})
	s := l.Stats()
	hs, _, _ := l.InitialState()
	mustClose(t, l)
	for _, c := range []struct {
		name      string
		got, want int64
	}{
		{"FileBytes", in.FileBytes, s.FileBytes},
		{"FreePages", int64(in.FreePages), int64(s.FreePages)},
		{"FreeBytes", in.FreeBytes, s.FreeBytes},
		{"LiveBytes", in.LiveBytes, s.LiveBytes},
		{"FreelistBytes", in.FreelistBytes, s.FreelistBytes},
		{"PageSize", int64(in.PageSize), int64(s.PageSize)},
		{"Summary.Entries", int64(in.Summary.Entries), int64(s.LastIndex - s.FirstIndex + 1)},
		{"Summary.FirstIndex", int64(in.Summary.FirstIndex), int64(s.FirstIndex)},
		{"Summary.LastIndex", int64(in.Summary.LastIndex), int64(s.LastIndex)},
		{"Summary.SnapshotIndex", int64(in.Summary.SnapshotIndex), int64(s.SnapshotIndex)},
	} {
		if c.got != c.want {
			t.Errorf("Inspect %s = %d, Stats says %d", c.name, c.got, c.want)
		}
	}
	if in.Summary.HardState != hs {
		t.Errorf("Inspect hard state %+v, InitialState %+v", in.Summary.HardState, hs)
	}

	if _, err := raftlog.Inspect(t.TempDir(), time.Second); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Inspect of an empty dir = %v, want os.ErrNotExist", err)
	}
	bad := damagedLog(t)
	inBolt(t, bad, flipLastByte("entries", key(5)))
	if _, err := raftlog.Inspect(bad, time.Second); !errors.Is(err, raftlog.ErrCorrupt) {
		t.Errorf("Inspect of a damaged entry = %v, want ErrCorrupt", err)
	}
}

// TestRotateReleasesOldFileOnlyIfUnlinked checks the space release after a
// swap (releaseOld): the old file is shrunk through the Log's own descriptor
// only when nothing else names it; a hard link an operator made to raft.db
// before the rotation still holds the whole old file afterwards.
func TestRotateReleasesOldFileOnlyIfUnlinked(t *testing.T) {
	for _, tc := range []struct {
		name string
		link bool
	}{
		{"unlinked", false},
		{"hard link kept", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l := mustOpen(t, dir, raftlog.Options{RotateFreeRatio: -1})
			defer mustClose(t, l)
			churn(t, l, 4, 64, 8)
			before := l.Stats().FileBytes
			link := filepath.Join(t.TempDir(), "raft.db.operator-copy")
			if tc.link {
				if err := os.Link(filepath.Join(dir, "raft.db"), link); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := l.Rotate(context.Background(), raftlog.RotateOptions{}); err != nil {
				t.Fatal(err)
			}
			if got := l.Stats().FileBytes; got >= before {
				t.Fatalf("raft.db is %d bytes after rotation, %d before", got, before)
			}
			if !tc.link {
				return
			}
			fi, err := os.Stat(link)
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Size(); got != before {
				t.Errorf("the hard link holds %d bytes after the rotation, want the old file's %d", got, before)
			}
			// And it is still a whole log.
			odir := t.TempDir()
			if err := os.Rename(link, filepath.Join(odir, "raft.db")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(filepath.Join(dir, "snap"), filepath.Join(odir, "snap")); err != nil {
				t.Fatal(err)
			}
			o := mustOpen(t, odir, raftlog.Options{RotateFreeRatio: -1, CacheEntries: -1})
			assertBigEntries(t, o)
			mustClose(t, o)
		})
	}
}
