package raftlog_test

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
)

// seeded returns a log with hard state commit 8, entries 1..10, a snapshot at
// 6 and entries up to 3 compacted.
func seeded(t *testing.T, opts raftlog.Options) (*raftlog.Log, string) {
	t.Helper()
	dir := t.TempDir()
	l := mustOpen(t, dir, opts)
	if err := l.Save(hardState(3, 1, 8), mkEnts(1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3)); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateSnapshot(6, cs123, []byte("state at 6")); err != nil {
		t.Fatal(err)
	}
	if err := l.Compact(3); err != nil {
		t.Fatal(err)
	}
	return l, dir
}

// TestRejectedWrites checks that every misuse is refused with its named error
// and changes nothing, in memory or on disk.
func TestRejectedWrites(t *testing.T) {
	tests := []struct {
		name    string
		do      func(l *raftlog.Log) error
		wantErr error
	}{
		{"save non-consecutive batch", func(l *raftlog.Log) error {
			return l.Save(raftpb.HardState{}, append(mkEnts(11, 3), mkEnts(13, 3)...))
		}, raftlog.ErrOutOfOrder},
		{"save leaving a gap", func(l *raftlog.Log) error {
			return l.Save(raftpb.HardState{}, mkEnts(12, 3))
		}, raftlog.ErrOutOfOrder},
		{"save commit beyond last index", func(l *raftlog.Log) error {
			return l.Save(hardState(3, 1, 12), mkEnts(11, 3))
		}, raftlog.ErrOutOfOrder},
		{"save commit below compacted index", func(l *raftlog.Log) error {
			return l.Save(hardState(3, 1, 2), nil)
		}, raftlog.ErrOutOfOrder},
		{"create snapshot beyond last index", func(l *raftlog.Log) error {
			_, err := l.CreateSnapshot(11, nil, nil)
			return err
		}, raft.ErrUnavailable},
		{"create snapshot of uncommitted entry", func(l *raftlog.Log) error {
			_, err := l.CreateSnapshot(9, nil, nil)
			return err
		}, raftlog.ErrNotCommitted},
		{"create snapshot out of date", func(l *raftlog.Log) error {
			_, err := l.CreateSnapshot(6, nil, nil)
			return err
		}, raft.ErrSnapOutOfDate},
		{"compact beyond snapshot", func(l *raftlog.Log) error { return l.Compact(7) }, raftlog.ErrCompactBeyondSnapshot},
		{"compact already compacted", func(l *raftlog.Log) error { return l.Compact(3) }, raft.ErrCompacted},
		{"apply snapshot below commit index", func(l *raftlog.Log) error {
			return l.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 7, Term: 3}})
		}, raft.ErrSnapOutOfDate},
		{"apply snapshot out of date", func(l *raftlog.Log) error {
			return l.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 6, Term: 3}})
		}, raft.ErrSnapOutOfDate},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, dir := seeded(t, raftlog.Options{})
			before := observe(t, l)
			if err := tc.do(l); !errors.Is(err, tc.wantErr) {
				t.Fatalf("error = %v, want %v", err, tc.wantErr)
			}
			if got := observe(t, l); got != before {
				t.Fatalf("state changed:\n got %+v\nwant %+v", got, before)
			}
			assertLogInvariants(t, l)
			mustClose(t, l)
			l = mustOpen(t, dir, raftlog.Options{})
			defer mustClose(t, l)
			if got := observe(t, l); got != before {
				t.Fatalf("state changed on disk:\n got %+v\nwant %+v", got, before)
			}
		})
	}
}

func TestEntriesOutOfRange(t *testing.T) {
	l, _ := seeded(t, raftlog.Options{})
	defer mustClose(t, l)
	tests := []struct {
		name    string
		lo, hi  uint64
		wantErr error
	}{
		{"hi beyond last index", 5, 12, raft.ErrUnavailable},
		{"lo compacted", 3, 5, raft.ErrCompacted},
		{"lo above hi", 6, 5, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := l.Entries(tc.lo, tc.hi, 0)
			if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("Entries(%d, %d) error = %v, want %v", tc.lo, tc.hi, err, tc.wantErr)
			}
		})
	}
	// raft compares with ==: the sentinel must come back unwrapped.
	if _, err := l.Entries(2, 5, 0); err != raft.ErrCompacted { //nolint:errorlint
		t.Errorf("Entries(2, 5) error = %v, want raft.ErrCompacted itself", err)
	}
	if _, err := l.Term(2); err != raft.ErrCompacted { //nolint:errorlint
		t.Errorf("Term(2) error = %v, want raft.ErrCompacted itself", err)
	}
	if _, err := l.Term(11); err != raft.ErrUnavailable { //nolint:errorlint
		t.Errorf("Term(11) error = %v, want raft.ErrUnavailable itself", err)
	}
}

func TestClosed(t *testing.T) {
	l, _ := seeded(t, raftlog.Options{})
	mustClose(t, l)
	if err := l.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	calls := map[string]error{}
	_, _, calls["InitialState"] = l.InitialState()
	_, calls["Entries"] = l.Entries(4, 5, 0)
	_, calls["Term"] = l.Term(4)
	_, calls["FirstIndex"] = l.FirstIndex()
	_, calls["LastIndex"] = l.LastIndex()
	_, calls["Snapshot"] = l.Snapshot()
	calls["Save"] = l.Save(hardState(3, 1, 9), nil)
	_, calls["CreateSnapshot"] = l.CreateSnapshot(7, nil, nil)
	calls["ApplySnapshot"] = l.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 20, Term: 4}})
	calls["Compact"] = l.Compact(5)
	for name, err := range calls {
		if !errors.Is(err, raftlog.ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", name, err)
		}
	}
	if got, want := l.Stats().LastIndex, uint64(10); got != want {
		t.Errorf("Stats().LastIndex after Close = %d, want %d", got, want)
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name      string
		opts      raftlog.Options
		wantField string
	}{
		{"zero value", raftlog.Options{}, ""},
		{"cache disabled", raftlog.Options{CacheEntries: -1}, ""},
		{"negative cache bytes", raftlog.Options{CacheBytes: -1}, "CacheBytes"},
		{"negative retention", raftlog.Options{SnapshotsRetained: -1}, "SnapshotsRetained"},
		{"negative lock timeout", raftlog.Options{LockTimeout: -time.Second}, "LockTimeout"},
		{"negative mmap size", raftlog.Options{InitialMmapSize: -1}, "InitialMmapSize"},
		{"rotation disabled", raftlog.Options{RotateFreeRatio: -1}, ""},
		{"rotation ratio of 1", raftlog.Options{RotateFreeRatio: 1}, "RotateFreeRatio"},
		{"negative rotation minimum", raftlog.Options{RotateMinBytes: -1}, "RotateMinBytes"},
		{"negative retry interval", raftlog.Options{RotateRetryInterval: -time.Second}, "RotateRetryInterval"},
		{"journal disabled", raftlog.Options{JournalBytes: -1}, ""},
		{"negative checkpoint entries", raftlog.Options{CheckpointEntries: -1}, "CheckpointEntries"},
		{"negative checkpoint bytes", raftlog.Options{CheckpointBytes: -1}, "CheckpointBytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.opts.Validate()
			var oe *raftlog.OptionsError
			switch {
			case tc.wantField == "" && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tc.wantField != "" && (!errors.As(err, &oe) || oe.Field != tc.wantField):
				t.Fatalf("Validate() = %v, want an OptionsError for %s", err, tc.wantField)
			}
			if tc.wantField != "" {
				if _, err := raftlog.Open(t.TempDir(), tc.opts); !errors.As(err, &oe) {
					t.Fatalf("Open accepted invalid options: %v", err)
				}
			}
		})
	}
}

func TestLockedByAnotherHandle(t *testing.T) {
	l, dir := seeded(t, raftlog.Options{})
	defer mustClose(t, l)
	l2, err := raftlog.Open(dir, raftlog.Options{LockTimeout: 20 * time.Millisecond})
	if !errors.Is(err, raftlog.ErrLocked) {
		if l2 != nil {
			_ = l2.Close()
		}
		t.Fatalf("second Open error = %v, want ErrLocked", err)
	}
}

// TestSnapshotRetention checks which data files survive in snap/.
func TestSnapshotRetention(t *testing.T) {
	name := func(i, term uint64) string { return fmt.Sprintf("%016x-%016x.snap", i, term) }
	tests := []struct {
		name   string
		retain int
		want   []string
	}{
		{"default keeps two", 0, []string{name(8, 3), name(9, 3)}},
		{"one keeps the current", 1, []string{name(9, 3)}},
		{"five keeps all four", 5, []string{name(6, 2), name(7, 3), name(8, 3), name(9, 3)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			opts := raftlog.Options{SnapshotsRetained: tc.retain}
			l := mustOpen(t, dir, opts)
			if err := l.Save(hardState(3, 1, 10), mkEnts(1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3)); err != nil {
				t.Fatal(err)
			}
			for i := uint64(6); i <= 9; i++ {
				if _, err := l.CreateSnapshot(i, cs123, fmt.Appendf(nil, "state %d", i)); err != nil {
					t.Fatal(err)
				}
			}
			if got := snapFiles(t, dir); !equalStrings(got, tc.want) {
				t.Errorf("snap/ = %v, want %v", got, tc.want)
			}
			mustClose(t, l)

			// Leftovers of a crash: a temp file and a data file never
			// recorded. Open removes both; a foreign file stays.
			for _, n := range []string{name(10, 3) + ".123.tmp", name(10, 3), "README"} {
				if err := os.WriteFile(filepath.Join(dir, "snap", n), []byte("x"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			l = mustOpen(t, dir, opts)
			defer mustClose(t, l)
			if got, want := snapFiles(t, dir), append(append([]string(nil), tc.want...), "README"); !equalStrings(got, want) {
				t.Errorf("after reopen snap/ = %v, want %v", got, want)
			}
		})
	}
}

// TestConcurrentReadsDuringWrites runs the raft.Storage readers and Stats
// against a writer that appends, overwrites, snapshots and compacts, and
// checks every answer is self-consistent (run with -race). Readers must see
// the state before or after each write, never a mixture.
func TestConcurrentReadsDuringWrites(t *testing.T) {
	for _, v := range logVariants[:3] {
		t.Run(v.name, func(t *testing.T) {
			l := mustOpen(t, t.TempDir(), v.opts)
			defer mustClose(t, l)
			var stop atomic.Bool
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for r := range readersN {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(r), 2))
					for !stop.Load() {
						if err := readOnce(l, rng); err != nil {
							errs <- err
							return
						}
						// NB: yield, so spinning readers on a 2-CPU machine
						// do not starve the writer of scheduler time.
						runtime.Gosched()
					}
				}()
			}
			// NB: one more goroutine releases cached entries at random, as
			// the Raft loop does when members catch up.
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(9, 9))
				for !stop.Load() {
					if last, err := l.LastIndex(); err == nil && last > 0 {
						l.Release(rng.Uint64N(last + 1))
					}
					runtime.Gosched()
				}
			}()
			hs := raftpb.HardState{Term: 1}
			last, term := uint64(0), uint64(1)
			for i := range 250 {
				var err error
				switch {
				case i%50 == 49 && hs.Commit > 5:
					if _, err = l.CreateSnapshot(hs.Commit, cs123, []byte("s")); err == nil {
						err = l.Compact(hs.Commit - 5)
					}
				case i%17 == 16 && last > hs.Commit+2:
					term++
					last = hs.Commit + 2
					hs.Term = term
					err = l.Save(hs, mkEnts(last-1, term, term))
				default:
					n := uint64(1 + i%5)
					hs.Commit = last
					err = l.Save(hs, mkEnts(last+1, slicesRepeat(term, n)...))
					last += n
				}
				if err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
			}
			stop.Store(true)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			assertLogInvariants(t, l)
		})
	}
}

// readersN is the number of concurrent readers; the Ready loop has one, the
// metrics scrape another.
const readersN = 2

// readOnce reads a random range and checks it against itself.
func readOnce(l *raftlog.Log, rng *rand.Rand) error {
	first, err := l.FirstIndex()
	if err != nil {
		return err
	}
	last, err := l.LastIndex()
	if err != nil {
		return err
	}
	_ = l.Stats()
	if first > last {
		return nil
	}
	lo := first + rng.Uint64N(last-first+1)
	ents, err := l.Entries(lo, last+1, uint64(rng.IntN(4000)))
	switch {
	case errors.Is(err, raft.ErrCompacted):
		return nil // a Compact ran in between, as raft allows
	case errors.Is(err, raft.ErrUnavailable):
		return nil // an overwrite shortened the log in between
	case err != nil:
		return fmt.Errorf("Entries(%d, %d): %w", lo, last+1, err)
	case len(ents) == 0:
		return fmt.Errorf("Entries(%d, %d) returned nothing", lo, last+1)
	}
	for k, e := range ents {
		if e.Index != lo+uint64(k) {
			return fmt.Errorf("Entries(%d, ...)[%d] has index %d", lo, k, e.Index)
		}
		if k > 0 && e.Term < ents[k-1].Term {
			return fmt.Errorf("entry %d term %d below previous %d", e.Index, e.Term, ents[k-1].Term)
		}
	}
	if err := checkPayloads(ents); err != nil {
		return err
	}
	_, err = l.Snapshot()
	return err
}

func TestStatsAndMetrics(t *testing.T) {
	l, _ := seeded(t, raftlog.Options{})
	defer mustClose(t, l)
	for i := uint64(11); i <= 20; i++ {
		if err := l.Save(hardState(3, 1, i), mkEnts(i, 3)); err != nil {
			t.Fatal(err)
		}
	}
	s := l.Stats()
	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"FirstIndex", s.FirstIndex, 4},
		{"LastIndex", s.LastIndex, 20},
		{"SnapshotIndex", s.SnapshotIndex, 6},
		{"SnapshotTerm", s.SnapshotTerm, 3},
		{"Commits", s.Commits, 11},
		{"EntriesAppended", s.EntriesAppended, 20},
	} {
		if c.got != c.want {
			t.Errorf("Stats().%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if s.FileBytes <= 0 || s.LastCommitBytes <= 0 || s.LastCommitDuration <= 0 {
		t.Errorf("Stats() = %+v: FileBytes, LastCommitBytes and LastCommitDuration must be positive", s)
	}
	if s.FreePages+s.PendingPages == 0 {
		t.Errorf("Stats() = %+v: compaction and appends must have freed pages", s)
	}
	if s.PageSize <= 0 || s.LastCommitWriteBytes < int64(s.PageSize) || s.LiveBytes <= 0 || s.LiveBytes > s.FileBytes {
		t.Errorf("Stats() = %+v: want a page size, a commit of at least one page, 0 < LiveBytes <= FileBytes", s)
	}
	if got, want := s.FreeBytes, int64(s.FreePages+s.PendingPages)*int64(s.PageSize); got != want {
		t.Errorf("Stats().FreeBytes = %d, want (free + pending pages) x page size = %d", got, want)
	}

	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(prometheus.WrapCollectorWith(prometheus.Labels{"node": "n1"}, raftlog.NewCollector(l))); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*dto.Metric{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf.GetMetric()[0]
	}
	value := func(name string) float64 {
		m := got["lodestone_raftlog_"+name]
		switch {
		case m == nil:
			t.Errorf("metric %s missing", name)
			return -1
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		}
		return float64(m.Histogram.GetSampleCount())
	}
	for _, c := range []struct {
		name string
		want float64
	}{
		{"first_index", 4},
		{"last_index", 20},
		{"snapshot_index", 6},
		{"entries_appended_total", 20},
		{"saves_total", 11},
		{"save_duration_seconds", 11}, // sample count
		{"commit_write_bytes", 11},    // sample count
		{"cached_entries", 17},
		{"rotations_total", 0},
		{"rotation_failures_total", 0},
		{"rotation_in_progress", 0},
		{"rotation_pause_seconds", 0}, // sample count
		{"last_rotation_duration_seconds", 0},
		{"live_bytes", float64(s.LiveBytes)},
		{"last_commit_write_bytes", float64(s.LastCommitWriteBytes)},
	} {
		if got := value(c.name); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
	for _, name := range []string{"file_bytes", "free_pages", "pending_pages", "free_bytes", "freelist_bytes"} {
		if value(name) < 0 {
			t.Errorf("%s negative", name)
		}
	}
	if m := got["lodestone_raftlog_last_index"]; m != nil && (len(m.Label) != 1 || m.Label[0].GetValue() != "n1") {
		t.Errorf("labels = %v, want node=n1", m.Label)
	}
}

// TestCacheLimits checks the cache never holds more than its limits and that
// reads beyond it are served from bbolt with the same answers.
func TestCacheLimits(t *testing.T) {
	dir, opts := t.TempDir(), raftlog.Options{CacheEntries: 16, CacheBytes: 1000}
	l := mustOpen(t, dir, opts)
	for i := uint64(1); i <= 200; i += 4 {
		if err := l.Save(raftpb.HardState{}, mkEnts(i, 1, 1, 1, 1)); err != nil {
			t.Fatal(err)
		}
		s := l.Stats()
		if s.CachedEntries > 16 || (s.CachedBytes > 1000 && s.CachedEntries > 1) || s.CachedEntries == 0 {
			t.Fatalf("after %d entries cache holds %d entries, %d bytes", i+3, s.CachedEntries, s.CachedBytes)
		}
	}
	assertLogInvariants(t, l)
	before := l.Stats()
	mustClose(t, l)

	// Open decodes into the cache only what it keeps: as many of the
	// newest entries, of as many bytes, as appending them all kept.
	l = mustOpen(t, dir, opts)
	defer mustClose(t, l)
	if after := l.Stats(); after.CachedEntries != before.CachedEntries || after.CachedBytes != before.CachedBytes {
		t.Errorf("reopened cache holds %d entries, %d bytes; before close %d, %d",
			after.CachedEntries, after.CachedBytes, before.CachedEntries, before.CachedBytes)
	}
	assertLogInvariants(t, l)
}

// TestLogsStateChanges checks the injected logger hears about state changes.
func TestLogsStateChanges(t *testing.T) {
	var buf strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, nil))
	l, _ := seeded(t, raftlog.Options{Logger: logger})
	mustClose(t, l)
	mu.Lock()
	defer mu.Unlock()
	for _, want := range []string{"raftlog opened", "raftlog snapshot created", "raftlog compacted", "index=6", "index=3"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log output lacks %q:\n%s", want, buf.String())
		}
	}
}

type lockedWriter struct {
	w  *strings.Builder
	mu *sync.Mutex
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

// A commit-only hard state change costs no bbolt commit: it rides on the
// next transaction, and a clean Close writes it.
func TestCommitOnlyHardStateIsDeferred(t *testing.T) {
	dir := t.TempDir()
	l := mustOpen(t, dir, raftlog.Options{})
	if err := l.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: 1}, mkEnts(1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	commits := l.Stats().Commits
	if err := l.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: 3}, nil); err != nil {
		t.Fatal(err)
	}
	if got := l.Stats().Commits; got != commits {
		t.Fatalf("commit-only save ran %d bbolt commits, want 0", got-commits)
	}
	hs, _, err := l.InitialState()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hs.Commit, uint64(3); got != want {
		t.Fatalf("in-memory commit: got %d, want %d", got, want)
	}
	// A vote change must sync.
	if err := l.Save(raftpb.HardState{Term: 2, Vote: 2, Commit: 3}, nil); err != nil {
		t.Fatal(err)
	}
	if got := l.Stats().Commits; got != commits+1 {
		t.Fatalf("term change ran %d bbolt commits, want 1", got-commits)
	}
	if err := l.Save(raftpb.HardState{Term: 2, Vote: 2, Commit: 3}, nil); err != nil {
		t.Fatal(err)
	}
	mustClose(t, l)
	l = mustOpen(t, dir, raftlog.Options{})
	defer mustClose(t, l)
	hs, _, err = l.InitialState()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hs, (raftpb.HardState{Term: 2, Vote: 2, Commit: 3}); got != want {
		t.Fatalf("after reopen: got %+v, want %+v", got, want)
	}
}

func TestCloseFlushesDeferredCommit(t *testing.T) {
	dir := t.TempDir()
	l := mustOpen(t, dir, raftlog.Options{})
	if err := l.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: 1}, mkEnts(1, 1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	if err := l.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: 3}, nil); err != nil {
		t.Fatal(err)
	}
	mustClose(t, l)
	l = mustOpen(t, dir, raftlog.Options{})
	defer mustClose(t, l)
	hs, _, err := l.InitialState()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := hs.Commit, uint64(3); got != want {
		t.Fatalf("commit after clean close: got %d, want %d", got, want)
	}
}

// TestCompactInChunks: a Compact of more than one chunk deletes
// CompactChunkEntries entries per write and lets a Save through between
// two of them; the log ends compacted as asked, also after a reopen.
func TestCompactInChunks(t *testing.T) {
	const last, compactTo = 10_000, 9_000 // three chunks
	dir := t.TempDir()
	var l *raftlog.Log
	var pauses int
	var firstIndexes []uint64
	opts := raftlog.WithCompactHook(raftlog.Options{}, func() {
		pauses++
		first, err := l.FirstIndex()
		if err != nil {
			t.Error(err)
		}
		firstIndexes = append(firstIndexes, first)
		if pauses > 1 {
			return
		}
		saved := make(chan error, 1)
		go func() { saved <- l.Save(hardState(2, 1, last+1), mkEnts(last+1, 2)) }()
		select {
		case err := <-saved:
			if err != nil {
				t.Errorf("a Save between two chunks: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("a Save between two chunks waited for the whole Compact")
		}
	})
	l = mustOpen(t, dir, opts)
	terms := make([]uint64, last)
	for k := range terms {
		terms[k] = 2
	}
	if err := l.Save(hardState(2, 1, last), mkEnts(1, terms...)); err != nil {
		t.Fatal(err)
	}
	if _, err := l.CreateSnapshot(9_500, cs123, []byte("state at 9500")); err != nil {
		t.Fatal(err)
	}
	if err := l.Compact(compactTo); err != nil {
		t.Fatal(err)
	}
	chunk := uint64(raftlog.CompactChunkEntries)
	if pauses != 2 || firstIndexes[0] != chunk+1 || firstIndexes[1] != 2*chunk+1 {
		t.Fatalf("%d pauses with first indexes %v; want 2, at %d and %d", pauses, firstIndexes, chunk+1, 2*chunk+1)
	}
	check := func(l *raftlog.Log) {
		t.Helper()
		if first, _ := l.FirstIndex(); first != compactTo+1 {
			t.Fatalf("FirstIndex %d, want %d", first, compactTo+1)
		}
		if lastIndex, _ := l.LastIndex(); lastIndex != last+1 {
			t.Fatalf("LastIndex %d, want %d (the Save between chunks)", lastIndex, last+1)
		}
		if term, err := l.Term(compactTo); err != nil || term != 2 {
			t.Fatalf("Term(%d) = %d, %v; want 2", compactTo, term, err)
		}
		ents, err := l.Entries(compactTo+1, last+2, 1<<30)
		if err != nil || len(ents) != last+1-compactTo {
			t.Fatalf("Entries after the compaction: %d, %v; want %d", len(ents), err, last+1-compactTo)
		}
		if err := checkPayloads(ents); err != nil {
			t.Fatal(err)
		}
	}
	check(l)
	if err := l.Compact(compactTo); !errors.Is(err, raft.ErrCompacted) {
		t.Fatalf("Compact(%d) again: %v, want raft.ErrCompacted", compactTo, err)
	}
	mustClose(t, l)
	l = mustOpen(t, dir, raftlog.Options{})
	defer mustClose(t, l)
	check(l)
}

// TestReleaseDropsOnlyWhatRaftDBHolds: Release empties the cache up to the
// index it is given, never of the entries raft.db does not hold yet (the
// journal's pending ones), and every entry still reads back, from raft.db
// where it is no longer cached. With the journal off every entry is in
// raft.db once saved.
func TestReleaseDropsOnlyWhatRaftDBHolds(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts raftlog.Options
	}{
		{"journal", raftlog.Options{CheckpointEntries: 16}},
		{"no journal", raftlog.Options{JournalBytes: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := mustOpen(t, t.TempDir(), tc.opts)
			defer mustClose(t, l)
			for i := uint64(1); i <= 100; i += 4 {
				if err := l.Save(raftpb.HardState{Term: 1, Commit: i + 3}, mkEnts(i, 1, 1, 1, 1)); err != nil {
					t.Fatal(err)
				}
			}
			if got := l.Stats().CachedEntries; got != 100 {
				t.Fatalf("cache holds %d entries before any release, want 100", got)
			}
			// NB: the folds run in the background, so how much of the log
			// raft.db holds is read back, under the write lock Release takes.
			cachedAfter := func(index uint64) int {
				t.Helper()
				if !l.Release(index) {
					t.Fatal("Release with no write running did nothing")
				}
				return 100 - int(min(index, l.OnDiskThrough()))
			}
			if want := cachedAfter(40); l.Stats().CachedEntries != want {
				t.Fatalf("cache holds %d entries after Release(40), want %d (those after 40 or not in raft.db)", l.Stats().CachedEntries, want)
			}
			if tc.opts.JournalBytes < 0 && l.Stats().CachedEntries != 60 {
				t.Fatalf("without a journal, cache holds %d entries after Release(40), want 60 (41..100)", l.Stats().CachedEntries)
			}
			want := cachedAfter(100)
			if got := l.Stats().CachedEntries; got != want {
				t.Fatalf("cache holds %d entries after Release(100), want %d (those not in raft.db)", got, want)
			}
			if tc.opts.JournalBytes < 0 && want != 0 {
				t.Fatalf("without a journal, raft.db lacks %d entries after a Save", want)
			}
			assertLogInvariants(t, l) // every entry reads back with its data
			// Saves go on after a release: the cache takes the new entries,
			// and the checkpoints that put the released pending ones into
			// raft.db drop those.
			for i := uint64(101); i <= 200; i += 4 {
				if err := l.Save(raftpb.HardState{Term: 1, Commit: i + 3}, mkEnts(i, 1, 1, 1, 1)); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.WaitCheckpoint(); err != nil {
				t.Fatal(err)
			}
			got, want := l.Stats().CachedEntries, 200-int(min(100, l.OnDiskThrough()))
			if got != want {
				t.Fatalf("cache holds %d entries after 100 more and a checkpoint, want %d: none of the released 1..100 raft.db holds", got, want)
			}
			if tc.opts.JournalBytes < 0 && got != 100 {
				t.Fatalf("without a journal, cache holds %d entries after 100 more, want those 100", got)
			}
			assertLogInvariants(t, l)
		})
	}
}
