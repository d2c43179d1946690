package raftlog_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
	"github.com/lodestone-kv/lodestone/raftlog/raftlogtest"
)

// TestCheckpointRunsInBackground holds a fold inside its transaction and
// checks what the Log promises meanwhile: Saves go on in the other slot,
// every entry reads back (the folding epoch from the cache), Saves due for
// the next checkpoint go on in the same epoch up to a quarter of the cache
// (counted), the first one past it waits (counted), a crash meanwhile
// loses none of them, and once the fold is released everything lands in
// raft.db.
func TestCheckpointRunsInBackground(t *testing.T) {
	release := make(chan struct{})
	held := make(chan struct{}, 16)
	var holdOnce sync.Once
	// NB: a quarter of the cache is 8 entries: the hard bound of an epoch
	// while a fold runs.
	opts := raftlog.Options{CheckpointEntries: 4, CacheEntries: 32, RotateFreeRatio: -1}
	opts = raftlog.WithFoldHook(opts, func(step string) {
		if step != "fold-written" {
			return
		}
		holdOnce.Do(func() { // hold the first fold only
			held <- struct{}{}
			<-release
		})
	})
	dir := t.TempDir()
	l := mustOpen(t, dir, opts)
	defer mustClose(t, l)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(raftlog.NewCollector(l))

	// Four single-entry Saves fill the first epoch; the fifth switches.
	for i := uint64(1); i <= 5; i++ {
		mustSave(t, l, hardState(1, 1, i-1), mkEnts(i, 1))
	}
	<-held // the fold of entries 1..4 is inside its transaction
	if s := l.Stats(); !s.CheckpointInProgress || s.Checkpoints != 0 {
		t.Fatalf("with the fold held: Stats() = %+v, want a checkpoint in progress and none done", s)
	}
	if got := gathered(t, reg, "checkpoint_in_progress"); got != 1 {
		t.Fatalf("checkpoint_in_progress = %v with the fold held, want 1", got)
	}
	// The second epoch takes three more Saves, with an overwrite of entry 5
	// that a fold of the first epoch must not undo in memory.
	mustSave(t, l, hardState(2, 2, 4), mkEnts(5, 2, 2, 2))
	assertLogInvariants(t, l)
	checkTerms(t, l, map[uint64]uint64{1: 1, 4: 1, 5: 2, 7: 2})

	// The second epoch is due while the first fold still runs: these
	// Saves go on in it instead of waiting, up to 8 entries (5..12).
	mustSave(t, l, hardState(2, 2, 6), mkEnts(8, 2, 2))
	mustSave(t, l, hardState(2, 2, 7), mkEnts(10, 2, 2, 2))
	if s := l.Stats(); s.CheckpointDeferrals != 2 || s.CheckpointWaits != 0 || s.Checkpoints != 0 {
		t.Fatalf("with the fold held, past the checkpoint bound: Stats() = %+v, want 2 deferrals, no wait, no checkpoint", s)
	}
	// A crash now replays both epochs, the longer one whole.
	crashed := mustOpen(t, crashCopy(t, dir), raftlog.Options{RotateFreeRatio: -1})
	assertLogInvariants(t, crashed)
	checkTerms(t, crashed, map[uint64]uint64{4: 1, 5: 2, 12: 2})
	if last, _ := crashed.LastIndex(); last != 12 {
		t.Fatalf("LastIndex after a crash with a deferred epoch = %d, want 12", last)
	}
	mustClose(t, crashed)

	// A ninth entry would pass a quarter of the cache: this Save switches
	// and so waits for the held fold, counted.
	saved := make(chan error, 1)
	go func() { saved <- l.Save(hardState(2, 2, 8), mkEnts(13, 2)) }()
	deadline := time.Now().Add(10 * time.Second)
	for l.Stats().CheckpointWaits == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the Save due for a checkpoint never waited for the running one")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-saved:
		t.Fatalf("Save returned (%v) while the previous checkpoint was held", err)
	default:
	}
	close(release)
	if err := <-saved; err != nil {
		t.Fatal(err)
	}
	if err := l.WaitCheckpoint(); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.CheckpointInProgress || s.Checkpoints != 2 || s.CheckpointWaits != 1 || s.CheckpointDeferrals != 2 {
		t.Fatalf("after the release: Stats() = %+v, want 2 checkpoints, 1 wait, 2 deferrals, none running", s)
	}
	for name, want := range map[string]float64{
		"checkpoint_waits_total": 1, "checkpoint_deferrals_total": 2, "checkpoint_in_progress": 0,
		"checkpoint_duration_seconds": 2, "checkpoints_total": 2,
	} {
		if got := gathered(t, reg, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	assertLogInvariants(t, l)
	checkTerms(t, l, map[uint64]uint64{4: 1, 5: 2, 13: 2})

	// A crash now replays only the third epoch: raft.db has the first two.
	in, err := raftlog.Inspect(crashCopy(t, dir), time.Second)
	if err != nil || in.Summary.LastIndex != 12 || in.JournalRecords != 1 {
		t.Fatalf("Inspect: raft.db last index %d, %d journal records, %v; want 12, 1",
			in.Summary.LastIndex, in.JournalRecords, err)
	}
}

// TestSwitchingSaveWritesBeforeItsFold: the Save that switches epochs
// writes and fdatasyncs its own record before the fold it hands over
// begins, so that record never waits behind the fold's writes to raft.db.
// NB: a fold begun at the hand-over would reach its first step within
// microseconds; the switch gives it 50 ms to show itself, and a fold that
// rightly waits costs the test that much.
func TestSwitchingSaveWritesBeforeItsFold(t *testing.T) {
	ffs := &raftlogtest.FaultFS{}
	var atSwitch, atBegin atomic.Int64
	atBegin.Store(-1)
	began := make(chan struct{})
	var earlyFold atomic.Bool
	opts := raftlog.Options{FS: ffs, CheckpointEntries: 4, CacheEntries: 32, RotateFreeRatio: -1}
	opts = raftlog.WithFoldHook(opts, func(step string) {
		switch step {
		case "slot-switched":
			atSwitch.Store(int64(ffs.Calls(raftlogtest.OpDatasync)))
			select {
			case <-began:
				earlyFold.Store(true)
			case <-time.After(50 * time.Millisecond):
			}
		case "fold-begin":
			if atBegin.CompareAndSwap(-1, int64(ffs.Calls(raftlogtest.OpDatasync))) {
				close(began)
			}
		}
	})
	l := mustOpen(t, t.TempDir(), opts)
	defer mustClose(t, l)
	// Four single-entry Saves fill the first epoch; the fifth switches.
	for i := uint64(1); i <= 5; i++ {
		mustSave(t, l, hardState(1, 1, i-1), mkEnts(i, 1))
	}
	if err := l.WaitCheckpoint(); err != nil {
		t.Fatal(err)
	}
	if l.Stats().Checkpoints != 1 {
		t.Fatalf("checkpoints = %d after the switch, want 1", l.Stats().Checkpoints)
	}
	if earlyFold.Load() {
		t.Fatal("the fold began while the Save that switched was still writing its record")
	}
	if sw, begin := atSwitch.Load(), atBegin.Load(); begin != sw+1 {
		t.Fatalf("journal fdatasyncs: %d at the switch, %d when the fold began; want the switching record's one between", sw, begin)
	}
}

// gathered returns the value (a histogram's sample count) of one
// lodestone_raftlog_ series from reg.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lodestone_raftlog_"+name {
			continue
		}
		m := mf.GetMetric()[0]
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		}
		return float64(m.Histogram.GetSampleCount())
	}
	t.Fatalf("metric %s not exported", name)
	return 0
}

// TestOpenUpgradesFormatVersion2 turns a crashed log into the version 2
// layout (one slot: the records from offset 0) and checks that Open
// replays it, writes version 3, and that the log then works and survives
// another crash.
func TestOpenUpgradesFormatVersion2(t *testing.T) {
	_, dir := journaled(t)
	crashed := crashCopy(t, dir)
	f, err := os.OpenFile(filepath.Join(crashed, "raft.wal"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	base := journalSlotBase(t, f)
	recs := make([]byte, 4*4096)
	if _, err := f.ReadAt(recs, base); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(recs, 0); err != nil {
		t.Fatal(err)
	}
	if base != 0 {
		// NB: the other slot's copy must not be what replay finds.
		if _, err := f.WriteAt(make([]byte, len(recs)), base); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	inBolt(t, crashed, put("meta", []byte("version"), binary.BigEndian.AppendUint64(nil, 2)))

	l := mustOpen(t, crashed, raftlog.Options{})
	assertLogInvariants(t, l)
	if last, _ := l.LastIndex(); last != 7 {
		t.Fatalf("LastIndex after the upgrade = %d, want 7 (the journal replayed)", last)
	}
	if got := formatVersionOf(t, crashed, l); got != 3 {
		t.Fatalf("format version after Open = %d, want 3", got)
	}
	for i := uint64(8); i <= 40; i++ { // several checkpoints in the new layout
		mustSave(t, l, hardState(3, 3, 7), mkEnts(i, 3))
	}
	again := crashCopy(t, crashed)
	mustClose(t, l)
	l = mustOpen(t, again, raftlog.Options{})
	defer mustClose(t, l)
	assertLogInvariants(t, l)
	checkTerms(t, l, map[uint64]uint64{7: 2, 8: 3, 40: 3})
}

// formatVersionOf reads meta/"version" of the raft.db in dir, through a
// crash copy when l holds it.
func formatVersionOf(t *testing.T, dir string, l *raftlog.Log) uint64 {
	t.Helper()
	if l != nil {
		dir = crashCopy(t, dir)
	}
	db, err := bolt.Open(filepath.Join(dir, "raft.db"), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v uint64
	if err := db.View(func(tx *bolt.Tx) error {
		v = binary.BigEndian.Uint64(tx.Bucket([]byte("meta")).Get([]byte("version")))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// imageSave is one Save of the crash-image workload.
type imageSave struct {
	hs   raftpb.HardState
	ents []raftpb.Entry
}

// imageWorkload is a deterministic run of appends with a hard state and,
// now and then, an overwrite of the uncommitted tail with a higher term.
// models[n] is the terms of entries 1.. and the hard state after the
// first n Saves.
func imageWorkload(n int) (saves []imageSave, models []imageModel) {
	rng := rand.New(rand.NewPCG(40, 4))
	var m imageModel
	models = append(models, m)
	term, commit := uint64(1), uint64(0)
	for range n {
		last := uint64(len(m.terms))
		first := last + 1
		if last > commit+3 && rng.IntN(6) == 0 {
			term++
			first = last - 1 // overwrite the last two, uncommitted
		}
		k := 1 + rng.IntN(3)
		ents := make([]raftpb.Entry, k)
		for i := range ents {
			idx := first + uint64(i)
			ents[i] = raftpb.Entry{Index: idx, Term: term, Data: payload(idx, term)}
		}
		newLast := first + uint64(k) - 1
		if newLast > 5 && newLast-5 > commit && newLast-5 < first {
			commit = newLast - 5
		}
		hs := raftpb.HardState{Term: term, Vote: 1, Commit: commit}
		saves = append(saves, imageSave{hs: hs, ents: ents})
		m.terms = append(slices.Clone(m.terms[:first-1]), slices.Repeat([]uint64{term}, k)...)
		m.hs = hs
		models = append(models, m)
	}
	return saves, models
}

type imageModel struct {
	terms []uint64
	hs    raftpb.HardState
}

// crashImage is a copy of a log directory as a crash at one step would
// leave it; the Saves acknowledged when it was taken are at least lo and at
// most hi (those begun by then).
type crashImage struct {
	step   string
	dir    string
	lo, hi int
}

// TestCheckpointCrashImages takes a crash image at every write and fsync
// of the journal (and a torn copy of every record write), at every step of
// a slot switch and of a background fold, and of raft.db holding a fold's
// pages without its meta page, while a workload with overwrites runs
// through many checkpoints and both slots. Each image must reopen to
// exactly the Saves acknowledged when it was taken (or those plus the one
// in flight, whole): nothing acknowledged lost, nothing half applied.
func TestCheckpointCrashImages(t *testing.T) {
	saves, models := imageWorkload(60)
	dir := t.TempDir()
	root := t.TempDir()
	var acked, begun atomic.Int64
	var imgMu sync.Mutex
	var images []crashImage
	take := func(step string) string {
		lo := int(acked.Load())
		img := filepath.Join(root, fmt.Sprintf("%04d-%s", len(images), step))
		copyTree(t, dir, img)
		images = append(images, crashImage{step: step, dir: img, lo: lo, hi: int(begun.Load())})
		return img
	}
	// pre holds the last image taken before a journal write or a fold's
	// commit, to build the torn variants from.
	var preWAL, preFold string
	ffs := &raftlogtest.FaultFS{Fail: func(op raftlogtest.Op, path string) error {
		if filepath.Base(path) != "raft.wal" || (op != raftlogtest.OpWrite && op != raftlogtest.OpDatasync) {
			return nil
		}
		imgMu.Lock()
		defer imgMu.Unlock()
		if op == raftlogtest.OpWrite {
			preWAL = take("journal-write")
			return nil
		}
		post := take("journal-datasync")
		if preWAL != "" {
			torn := filepath.Join(root, fmt.Sprintf("%04d-journal-torn", len(images)))
			copyTree(t, post, torn)
			tearLike(t, filepath.Join(preWAL, "raft.wal"), filepath.Join(torn, "raft.wal"), 0)
			last := images[len(images)-1]
			images = append(images, crashImage{step: "journal-torn", dir: torn, lo: last.lo, hi: last.hi})
		}
		return nil
	}}
	opts := raftlog.Options{FS: ffs, CheckpointEntries: 6, JournalBytes: 64 << 10, RotateFreeRatio: -1}
	opts = raftlog.WithFoldHook(opts, func(step string) {
		imgMu.Lock()
		defer imgMu.Unlock()
		img := take(step)
		switch step {
		case "fold-written":
			preFold = img
		case "fold-committed":
			// The fold's pages written and synced, its meta page not:
			// bbolt must fall back to the previous commit.
			torn := filepath.Join(root, fmt.Sprintf("%04d-fold-no-meta", len(images)))
			copyTree(t, img, torn)
			tearLike(t, filepath.Join(preFold, "raft.db"), filepath.Join(torn, "raft.db"), 2*os.Getpagesize())
			last := images[len(images)-1]
			images = append(images, crashImage{step: "fold-no-meta", dir: torn, lo: last.lo, hi: last.hi})
		}
	})
	l := mustOpen(t, dir, opts)
	for _, s := range saves {
		begun.Add(1)
		mustSave(t, l, s.hs, s.ents)
		acked.Add(1)
	}
	if err := l.WaitCheckpoint(); err != nil {
		t.Fatal(err)
	}
	st := l.Stats()
	mustClose(t, l)
	if st.Checkpoints < 8 {
		t.Fatalf("only %d checkpoints: the workload must cross both slots several times", st.Checkpoints)
	}
	steps := map[string]int{}
	for _, img := range images {
		steps[img.step]++
		checkImage(t, img, models)
	}
	for _, s := range append(raftlog.FoldSteps, "journal-write", "journal-datasync", "journal-torn", "fold-no-meta") {
		if steps[s] == 0 {
			t.Errorf("no crash image at step %s", s)
		}
	}
	t.Logf("%d crash images over %d Saves and %d checkpoints: %v", len(images), len(saves), st.Checkpoints, steps)
}

// checkImage opens img and checks it holds exactly the state after n Saves
// for some n in [img.lo, img.hi].
func checkImage(t *testing.T, img crashImage, models []imageModel) {
	t.Helper()
	l, err := raftlog.Open(img.dir, raftlog.Options{JournalBytes: 64 << 10, RotateFreeRatio: -1})
	if err != nil {
		t.Errorf("%s: Open: %v", filepath.Base(img.dir), err)
		return
	}
	defer mustClose(t, l)
	hs, _, _ := l.InitialState()
	last, _ := l.LastIndex()
	var ents []raftpb.Entry
	if last > 0 {
		if ents, err = l.Entries(1, last+1, ^uint64(0)); err != nil {
			t.Errorf("%s: Entries: %v", filepath.Base(img.dir), err)
			return
		}
	}
	if err := checkPayloads(ents); err != nil {
		t.Errorf("%s: %v", filepath.Base(img.dir), err)
		return
	}
	terms := make([]uint64, len(ents))
	for i := range ents {
		terms[i] = ents[i].Term
	}
	for n := img.lo; n <= img.hi; n++ {
		if slices.Equal(terms, models[n].terms) && hs == models[n].hs {
			return
		}
	}
	t.Errorf("%s: reopened to %d entries, hard state %v; want the state after %d..%d acknowledged Saves (%d entries, %v)",
		filepath.Base(img.dir), len(terms), hs, img.lo, img.hi, len(models[img.lo].terms), models[img.lo].hs)
}

// tearLike makes the file at dst a torn version of itself relative to the
// older copy at src: within the range where they differ, the second half
// reverts to src's bytes (a write cut short). With keepFirst > 0, the first
// keepFirst bytes revert instead (bbolt's meta pages: a commit whose data
// pages reached the disk and whose meta page did not).
func tearLike(t *testing.T, src, dst string, keepFirst int) {
	t.Helper()
	old, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	n := min(len(old), len(cur))
	if keepFirst > 0 {
		copy(cur[:min(keepFirst, n)], old)
	} else {
		lo, hi := -1, -1
		for i := range n {
			if old[i] != cur[i] {
				if lo < 0 {
					lo = i
				}
				hi = i
			}
		}
		if lo >= 0 {
			mid := lo + (hi-lo+1)/2
			copy(cur[mid:hi+1], old[mid:hi+1])
		}
	}
	if err := os.WriteFile(dst, cur, 0o600); err != nil {
		t.Fatal(err)
	}
}

// copyTree copies the regular files under src to dst (no fsync: a crash
// image only needs what a reader sees, as SIGKILL leaves the page cache).
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil // a snapshot temp file removed meanwhile
			}
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o700)
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		var buf bytes.Buffer
		if _, err := io.Copy(&buf, in); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), buf.Bytes(), 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}
