package raftlog_test

import (
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
)

// These tests check the journal (raft.wal, FORMAT.md "Journal"): that what a
// Save put only in the journal survives a crash, that a torn last record is
// dropped and damage before an intact record refused, and that checkpoints
// keep raft.db and the journal in agreement.

// crashCopy copies a live log's files into a new directory: what a process
// killed at this moment leaves on disk (its writes are in the page cache).
func crashCopy(t *testing.T, dir string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o700)
		}
		src, err := os.Open(path)
		if err != nil {
			return err
		}
		defer src.Close()
		out, err := os.Create(filepath.Join(dst, rel))
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, src); err != nil {
			_ = out.Close()
			return err
		}
		return out.Close()
	})
	if err != nil {
		t.Fatalf("copy %s: %v", dir, err)
	}
	return dst
}

// flipJournalByte damages one payload byte of the record at page k.
func flipJournalByte(t *testing.T, dir string, k int) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, "raft.wal"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	off := journalSlotBase(t, f) + int64(k)*4096 + 40
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// journalSlotBase is the offset of the slot that holds the newest epoch's
// records: raft.wal is two slots, its halves (FORMAT.md "Journal").
func journalSlotBase(t *testing.T, f *os.File) int64 {
	t.Helper()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	base, newest := int64(-1), uint64(0)
	for _, off := range []int64{0, fi.Size() / 2 / 4096 * 4096} {
		hdr := make([]byte, 16)
		if _, err := f.ReadAt(hdr, off); err != nil {
			t.Fatal(err)
		}
		if binary.BigEndian.Uint32(hdr) != 0x4c4a524e {
			continue
		}
		if e := binary.BigEndian.Uint64(hdr[8:]); base < 0 || e > newest {
			base, newest = off, e
		}
	}
	if base < 0 {
		t.Fatal("raft.wal holds no record")
	}
	return base
}

func mustSave(t *testing.T, l *raftlog.Log, hs raftpb.HardState, ents []raftpb.Entry) {
	t.Helper()
	if err := l.Save(hs, ents); err != nil {
		t.Fatalf("Save(%v, %d entries): %v", hs, len(ents), err)
	}
}

func checkTerms(t *testing.T, l *raftlog.Log, want map[uint64]uint64) {
	t.Helper()
	for i, wt := range want {
		got, err := l.Term(i)
		if err != nil || got != wt {
			t.Fatalf("Term(%d) = %d, %v; want %d", i, got, err, wt)
		}
	}
}

// journaled writes four Saves, each one journal record on its own page:
// entries 1..5 (term 1), a vote, entries 4..6 of term 2 replacing 4..5, and
// entry 7. It checks that none of them reached raft.db yet.
func journaled(t *testing.T) (*raftlog.Log, string) {
	t.Helper()
	dir := t.TempDir()
	l := mustOpen(t, dir, raftlog.Options{})
	t.Cleanup(func() { _ = l.Close() })
	mustSave(t, l, hardState(1, 1, 0), mkEnts(1, 1, 1, 1, 1, 1))
	mustSave(t, l, hardState(2, 2, 3), nil)
	mustSave(t, l, raftpb.HardState{}, mkEnts(4, 2, 2, 2))
	mustSave(t, l, hardState(2, 2, 6), mkEnts(7, 2))
	s := l.Stats()
	if s.Checkpoints != 0 || s.JournalBytes != 4*4096 {
		t.Fatalf("after four small Saves: %d checkpoints, %d journal bytes; want 0 and %d", s.Checkpoints, s.JournalBytes, 4*4096)
	}
	return l, dir
}

func TestJournalReplayAfterCrash(t *testing.T) {
	_, dir := journaled(t)
	crashed := crashCopy(t, dir)
	in, err := raftlog.Inspect(crashed, time.Second)
	if err != nil || in.JournalRecords != 4 || in.Summary.LastIndex != 0 {
		t.Fatalf("Inspect before replay: %d journal records, raft.db last index %d, %v; want 4, 0",
			in.JournalRecords, in.Summary.LastIndex, err)
	}
	l := mustOpen(t, crashed, raftlog.Options{})
	defer func() {
		mustClose(t, l)
		in, err := raftlog.Inspect(crashed, time.Second)
		if err != nil || in.JournalRecords != 0 || in.Summary.LastIndex != 7 {
			t.Fatalf("Inspect after replay and close: %d journal records, last index %d, %v; want 0, 7",
				in.JournalRecords, in.Summary.LastIndex, err)
		}
	}()
	assertLogInvariants(t, l)
	if last, _ := l.LastIndex(); last != 7 {
		t.Fatalf("LastIndex after replay = %d, want 7", last)
	}
	checkTerms(t, l, map[uint64]uint64{3: 1, 4: 2, 6: 2, 7: 2})
	hs, _, err := l.InitialState()
	if err != nil || hs != hardState(2, 2, 6) {
		t.Fatalf("InitialState = %v, %v; want %v", hs, err, hardState(2, 2, 6))
	}
	if s := l.Stats(); s.JournalBytes != 0 {
		t.Fatalf("journal holds %d bytes after replay, want 0 (replayed into raft.db)", s.JournalBytes)
	}
}

func TestJournalTornTailIsDropped(t *testing.T) {
	_, dir := journaled(t)
	crashed := crashCopy(t, dir)
	flipJournalByte(t, crashed, 3) // the last Save, as if cut short
	l := mustOpen(t, crashed, raftlog.Options{})
	assertLogInvariants(t, l)
	if last, _ := l.LastIndex(); last != 6 {
		t.Fatalf("LastIndex = %d, want 6 (the torn Save of entry 7 dropped)", last)
	}
	if hs, _, _ := l.InitialState(); hs != hardState(2, 2, 3) {
		t.Fatalf("InitialState = %v, want the last intact one %v", hs, hardState(2, 2, 3))
	}
	// Writing goes on after the dropped record, and survives another crash.
	mustSave(t, l, hardState(3, 3, 6), mkEnts(7, 3, 3))
	again := crashCopy(t, crashed)
	mustClose(t, l)
	l = mustOpen(t, again, raftlog.Options{})
	defer mustClose(t, l)
	assertLogInvariants(t, l)
	if last, _ := l.LastIndex(); last != 8 {
		t.Fatalf("LastIndex after the second crash = %d, want 8", last)
	}
	checkTerms(t, l, map[uint64]uint64{7: 3, 8: 3})
}

func TestJournalDamageBeforeIntactRecordIsRefused(t *testing.T) {
	_, dir := journaled(t)
	crashed := crashCopy(t, dir)
	flipJournalByte(t, crashed, 1)
	_, err := raftlog.Open(crashed, raftlog.Options{})
	var ce *raftlog.CorruptError
	if !errors.Is(err, raftlog.ErrCorrupt) || !errors.As(err, &ce) || !strings.HasSuffix(ce.Path, "raft.wal") {
		t.Fatalf("Open with record 1 of 4 damaged: %v; want ErrCorrupt naming raft.wal", err)
	}
}

func TestJournalCheckpointsWhenPendingOutgrowsCache(t *testing.T) {
	dir := t.TempDir()
	l := mustOpen(t, dir, raftlog.Options{CacheEntries: 8})
	defer func() { _ = l.Close() }()
	for i := uint64(1); i <= 40; i++ {
		mustSave(t, l, hardState(1, 1, i-1), mkEnts(i, 1))
	}
	// Half the cache (4 entries) may be pending: a checkpoint at least
	// every fifth Save.
	if s := l.Stats(); s.Checkpoints < 8 {
		t.Fatalf("%d checkpoints after 40 single-entry Saves with an 8-entry cache, want >= 8", s.Checkpoints)
	}
	// Entries 1..32 are read from raft.db, the rest from memory.
	assertLogInvariants(t, l)
	crashed := crashCopy(t, dir)
	c := mustOpen(t, crashed, raftlog.Options{CacheEntries: 8})
	defer mustClose(t, c)
	assertLogInvariants(t, c)
	if last, _ := c.LastIndex(); last != 40 {
		t.Fatalf("LastIndex after crash = %d, want 40", last)
	}
}

func TestJournalFoldedBySnapshotAndCompact(t *testing.T) {
	dir := t.TempDir()
	l := mustOpen(t, dir, raftlog.Options{})
	defer mustClose(t, l)
	mustSave(t, l, hardState(3, 1, 8), mkEnts(1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3))
	if _, err := l.CreateSnapshot(6, cs123, []byte("state at 6")); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Checkpoints != 1 || s.JournalBytes != 0 {
		t.Fatalf("after CreateSnapshot: %d checkpoints, %d journal bytes; want 1 and 0", s.Checkpoints, s.JournalBytes)
	}
	mustSave(t, l, hardState(3, 1, 10), mkEnts(11, 3, 3))
	if err := l.Compact(3); err != nil {
		t.Fatal(err)
	}
	mustSave(t, l, raftpb.HardState{}, mkEnts(13, 4))
	c := mustOpen(t, crashCopy(t, dir), raftlog.Options{})
	defer mustClose(t, c)
	assertLogInvariants(t, c)
	first, _ := c.FirstIndex()
	last, _ := c.LastIndex()
	if first != 4 || last != 13 {
		t.Fatalf("after crash: entries [%d, %d], want [4, 13]", first, last)
	}
	if snap, err := c.Snapshot(); err != nil || snap.Metadata.Index != 6 {
		t.Fatalf("Snapshot = %d, %v; want index 6", snap.Metadata.Index, err)
	}
}

func TestJournalDisabledReplaysLeftover(t *testing.T) {
	_, dir := journaled(t)
	crashed := crashCopy(t, dir)
	l := mustOpen(t, crashed, raftlog.Options{JournalBytes: -1})
	if last, _ := l.LastIndex(); last != 7 {
		t.Fatalf("LastIndex = %d, want 7 (the leftover journal replayed)", last)
	}
	if _, err := os.Stat(filepath.Join(crashed, "raft.wal")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("raft.wal with the journal disabled: %v, want it removed", err)
	}
	mustSave(t, l, raftpb.HardState{}, mkEnts(8, 2))
	if s := l.Stats(); s.JournalBytes != 0 {
		t.Fatalf("journal bytes %d with the journal disabled", s.JournalBytes)
	}
	mustClose(t, l)
	l = mustOpen(t, crashed, raftlog.Options{JournalBytes: -1})
	defer mustClose(t, l)
	assertLogInvariants(t, l)
	if last, _ := l.LastIndex(); last != 8 {
		t.Fatalf("LastIndex = %d, want 8", last)
	}
}

func TestOpenUpgradesFormatVersion1(t *testing.T) {
	dir := t.TempDir()
	l := mustOpen(t, dir, raftlog.Options{})
	mustSave(t, l, hardState(1, 1, 2), mkEnts(1, 1, 1))
	mustClose(t, l)
	inBolt(t, dir, put("meta", []byte("version"), binary.BigEndian.AppendUint64(nil, 1)))
	l = mustOpen(t, dir, raftlog.Options{})
	assertLogInvariants(t, l)
	mustClose(t, l)
	db, err := bolt.Open(filepath.Join(dir, "raft.db"), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket([]byte("meta")).Get([]byte("version")); binary.BigEndian.Uint64(v) != 3 {
			return errors.New("version not upgraded to 3")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
