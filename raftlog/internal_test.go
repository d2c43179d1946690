package raftlog

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/raft/v3/raftpb"
)

func TestTermIndex(t *testing.T) {
	type op struct {
		kind  string // "append", "truncate", "compact"
		index uint64
		term  uint64
	}
	tests := []struct {
		name      string
		ops       []op
		wantFirst uint64
		want      []uint64 // terms of [wantFirst, last]
	}{
		{"empty", nil, 0, []uint64{0}},
		{"appends", []op{{"append", 1, 1}, {"append", 2, 1}, {"append", 3, 2}}, 0, []uint64{0, 1, 1, 2}},
		{"truncate mid run", []op{{"append", 1, 1}, {"append", 2, 1}, {"append", 3, 1},
			{"truncate", 2, 0}, {"append", 2, 3}}, 0, []uint64{0, 1, 3}},
		{"truncate at run start", []op{{"append", 1, 1}, {"append", 2, 2}, {"append", 3, 2},
			{"truncate", 2, 0}, {"append", 2, 4}}, 0, []uint64{0, 1, 4}},
		{"truncate beyond last is a no-op", []op{{"append", 1, 1}, {"truncate", 5, 0}}, 0, []uint64{0, 1}},
		{"compact into a run", []op{{"append", 1, 1}, {"append", 2, 2}, {"append", 3, 2}, {"append", 4, 3},
			{"compact", 3, 0}}, 3, []uint64{2, 3}},
		{"compact to last", []op{{"append", 1, 1}, {"append", 2, 2}, {"compact", 2, 0}, {"append", 3, 2}},
			2, []uint64{2, 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ti termIndex
			ti.reset(0, 0)
			for _, o := range tc.ops {
				switch o.kind {
				case "append":
					ti.append(o.index, o.term)
				case "truncate":
					ti.truncateFrom(o.index)
				case "compact":
					ti.compactTo(o.index)
				}
				assertTermIndexInvariants(t, &ti)
			}
			if got, want := ti.runs[0].index, tc.wantFirst; got != want {
				t.Fatalf("first covered index = %d, want %d", got, want)
			}
			var got []uint64
			for i := ti.runs[0].index; i <= ti.last; i++ {
				got = append(got, ti.term(i))
			}
			if !equalU64(got, tc.want) {
				t.Fatalf("terms = %v, want %v", got, tc.want)
			}
		})
	}
}

func assertTermIndexInvariants(t *testing.T, ti *termIndex) {
	t.Helper()
	for k := 1; k < len(ti.runs); k++ {
		if ti.runs[k].index <= ti.runs[k-1].index || ti.runs[k].term == ti.runs[k-1].term {
			t.Fatalf("bad runs %+v", ti.runs)
		}
	}
	if ti.runs[len(ti.runs)-1].index > ti.last {
		t.Fatalf("run starts beyond last %d: %+v", ti.last, ti.runs)
	}
}

func equalU64(a, b []uint64) bool {
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

func cacheEnts(first, n uint64, size int) []raftpb.Entry {
	ents := make([]raftpb.Entry, n)
	for k := range ents {
		ents[k] = raftpb.Entry{Index: first + uint64(k), Term: 1, Data: make([]byte, size)}
	}
	return ents
}

func TestEntryCache(t *testing.T) {
	tests := []struct {
		name             string
		maxEntries       int
		maxBytes         int64
		do               func(c *entryCache)
		wantFirst, wantN uint64
		wantBytes        int64
	}{
		{"append within limits", 10, 1000, func(c *entryCache) { c.append(cacheEnts(1, 5, 10)) }, 1, 5, 50},
		{"trim by count", 4, 1000, func(c *entryCache) { c.append(cacheEnts(1, 3, 10)); c.append(cacheEnts(4, 3, 10)) }, 3, 4, 40},
		{"oversized batch keeps newest", 4, 1000, func(c *entryCache) { c.append(cacheEnts(1, 10, 1)) }, 7, 4, 4},
		{"trim by bytes", 100, 25, func(c *entryCache) { c.append(cacheEnts(1, 5, 10)) }, 4, 2, 20},
		{"one huge entry stays", 100, 25, func(c *entryCache) { c.append(cacheEnts(1, 2, 100)) }, 2, 1, 100},
		{"truncate suffix", 10, 1000, func(c *entryCache) { c.append(cacheEnts(1, 5, 10)); c.truncateFrom(4) }, 1, 3, 30},
		{"truncate before start empties", 10, 1000, func(c *entryCache) { c.append(cacheEnts(5, 5, 10)); c.truncateFrom(3) }, 0, 0, 0},
		{"drop before", 10, 1000, func(c *entryCache) { c.append(cacheEnts(1, 5, 10)); c.dropBefore(3) }, 3, 3, 30},
		{"drop all", 10, 1000, func(c *entryCache) { c.append(cacheEnts(1, 5, 10)); c.dropBefore(9) }, 0, 0, 0},
		{"disabled", -1, 1000, func(c *entryCache) { c.append(cacheEnts(1, 5, 10)) }, 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := entryCache{maxEntries: tc.maxEntries, maxBytes: tc.maxBytes}
			tc.do(&c)
			if got := uint64(len(c.ents)); got != tc.wantN {
				t.Fatalf("cached %d entries, want %d", got, tc.wantN)
			}
			if c.bytes != tc.wantBytes {
				t.Fatalf("cached %d bytes, want %d", c.bytes, tc.wantBytes)
			}
			if tc.wantN > 0 && c.first() != tc.wantFirst {
				t.Fatalf("first cached %d, want %d", c.first(), tc.wantFirst)
			}
			for k := range c.ents {
				if c.ents[k].Index != c.ents[0].Index+uint64(k) {
					t.Fatalf("cache not contiguous: %d at %d", c.ents[k].Index, k)
				}
			}
		})
	}
}

// TestCacheWindowIsWhatAppendKeeps holds window, which Open uses to
// decode only the entries its cache will keep, to what appending every
// entry would have kept.
func TestCacheWindowIsWhatAppendKeeps(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		maxEntries, maxBytes := rng.IntN(20)-1, int64(rng.IntN(200)+1)
		sizes := make([]int, rng.IntN(40))
		c := entryCache{maxEntries: maxEntries, maxBytes: maxBytes}
		for i := range sizes {
			sizes[i] = rng.IntN(60)
			c.append(cacheEnts(uint64(i+1), 1, sizes[i]))
		}
		empty := entryCache{maxEntries: maxEntries, maxBytes: maxBytes}
		if got := empty.window(sizes); got != len(c.ents) {
			t.Fatalf("window(%v) with %d entries, %d bytes = %d; appending keeps %d", sizes, maxEntries, maxBytes, got, len(c.ents))
		}
	}
}

func TestRecordRoundTrip(t *testing.T) {
	e := raftpb.Entry{Index: 42, Term: 7, Type: raftpb.EntryConfChangeV2, Data: []byte("payload")}
	got, detail, err := decodeEntry(encodeEntry(&e), 42)
	if detail != "" || err != nil || got.Index != 42 || got.Term != 7 || got.Type != e.Type || !bytes.Equal(got.Data, e.Data) {
		t.Errorf("entry round trip = %+v, %q, %v", got, detail, err)
	}
	hs := raftpb.HardState{Term: 3, Vote: 2, Commit: 40}
	if got, detail, err := decodeHardState(encodeHardState(hs)); got != hs || detail != "" || err != nil {
		t.Errorf("hard state round trip = %+v, %q, %v", got, detail, err)
	}
	c := compacted{index: 9, term: 4}
	if got, detail := decodeCompacted(encodeCompacted(c)); got != c || detail != "" {
		t.Errorf("compacted round trip = %+v, %q", got, detail)
	}
	r := snapRecord{meta: raftpb.SnapshotMetadata{Index: 9, Term: 4, ConfState: raftpb.ConfState{Voters: []uint64{1, 2}}},
		dataLen: 123, dataCRC: 0xdeadbeef}
	gr, detail, err := decodeSnapRecord(encodeSnapRecord(r))
	if detail != "" || err != nil || gr.dataLen != 123 || gr.dataCRC != 0xdeadbeef || gr.meta.Index != 9 ||
		gr.meta.ConfState.Equivalent(r.meta.ConfState) != nil {
		t.Errorf("snapshot record round trip = %+v, %q, %v", gr, detail, err)
	}
	for _, n := range []struct{ i, t uint64 }{{1, 1}, {0xffffffffffffffff, 3}} {
		if i, tm, ok := parseSnapFileName(snapFileName(n.i, n.t)); !ok || i != n.i || tm != n.t {
			t.Errorf("snap file name round trip %d/%d = %d/%d, %v", n.i, n.t, i, tm, ok)
		}
	}
}

// TestDecodeRejects: every way a stored value can be damaged is reported with
// a detail (never a panic, never a value).
func TestDecodeRejects(t *testing.T) {
	good := encodeEntry(&raftpb.Entry{Index: 5, Term: 1, Data: []byte("x")})
	flipped := bytes.Clone(good)
	flipped[len(flipped)-1] ^= 1
	badCRCGoodBody := bytes.Clone(good)
	badCRCGoodBody[0] ^= 1
	garbage := withCRC([]byte{0xff, 0xff, 0xff})
	tests := []struct {
		name string
		v    []byte
	}{
		{"empty", nil},
		{"shorter than crc", []byte{1, 2, 3}},
		{"body bit flip", flipped},
		{"crc bit flip", badCRCGoodBody},
		{"valid crc, garbage protobuf", garbage},
		{"valid record, wrong index", encodeEntry(&raftpb.Entry{Index: 6, Term: 1})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, detail, _ := decodeEntry(tc.v, 5); detail == "" {
				t.Errorf("decodeEntry accepted %x", tc.v)
			}
			if _, detail, _ := decodeHardState(tc.v); detail == "" && tc.name != "valid record, wrong index" {
				t.Errorf("decodeHardState accepted %x", tc.v)
			}
			if _, detail := decodeCompacted(tc.v); detail == "" {
				t.Errorf("decodeCompacted accepted %x", tc.v)
			}
		})
	}
	for _, name := range []string{"", "x.snap", "0000000000000001-0000000000000001.snapx", "000000000000000g-0000000000000001.snap"} {
		if _, _, ok := parseSnapFileName(name); ok {
			t.Errorf("parseSnapFileName(%q) accepted", name)
		}
	}
}

// TestCommitDoesNotRewriteFreelist is the regression test for the outage
// docs/architecture.md starts from: a freelist of ~1M pages rewritten by
// every commit.
// It frees thousands of pages, then checks that one small Save allocates (and
// so writes) the same few page bytes whether the file has a huge freelist or
// none.
func TestCommitDoesNotRewriteFreelist(t *testing.T) {
	pagesPerSave := func(t *testing.T, l *Log, index uint64) int64 {
		s := l.db.Stats()
		before := s.TxStats.GetPageAlloc()
		if err := l.Save(raftpb.HardState{Term: 1, Commit: index}, []raftpb.Entry{{Index: index, Term: 1, Data: []byte("x")}}); err != nil {
			t.Fatal(err)
		}
		s = l.db.Stats()
		return s.TxStats.GetPageAlloc() - before
	}
	l, err := Open(t.TempDir(), Options{JournalBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.db.NoFreelistSync || l.db.FreelistType != "hashmap" {
		t.Fatalf("bbolt opened with NoFreelistSync=%v FreelistType=%q", l.db.NoFreelistSync, l.db.FreelistType)
	}
	baseline := pagesPerSave(t, l, 1)

	// Churn: ~8000 pages of entries, snapshotted and compacted away.
	big := make([]byte, 3000)
	next := uint64(2)
	for range 20 {
		ents := make([]raftpb.Entry, 400)
		for k := range ents {
			ents[k] = raftpb.Entry{Index: next, Term: 1, Data: big}
			next++
		}
		if err := l.Save(raftpb.HardState{Term: 1, Commit: next - 1}, ents); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.CreateSnapshot(next-1, &raftpb.ConfState{Voters: []uint64{1}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := l.Compact(next - 1); err != nil {
		t.Fatal(err)
	}
	pagesPerSave(t, l, next) // lets the compaction's pending pages become free
	next++
	s := l.Stats()
	if s.FreePages < 5000 {
		t.Fatalf("setup: only %d free pages", s.FreePages)
	}
	got := pagesPerSave(t, l, next)
	// With the freelist synced, this commit would also write FreelistBytes
	// (here ~64 KiB).
	if got > 2*baseline {
		t.Errorf("one Save with %d free pages (freelist %d bytes) wrote %d page bytes; with none it wrote %d",
			s.FreePages, s.FreelistBytes, got, baseline)
	}
	t.Logf("page bytes written per Save: %d with an empty file, %d with %d free pages (a synced freelist would add %d)",
		baseline, got, s.FreePages, s.FreelistBytes)
}

// TestWriteFailureIsSticky makes a bbolt commit fail (the file may not grow)
// and checks fail-stop: the error surfaces, later writes get ErrWriteFailed,
// reads still answer from the last good state, and a reopened log holds that
// state.
func TestWriteFailureIsSticky(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, Options{JournalBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Save(raftpb.HardState{Term: 1, Commit: 1}, []raftpb.Entry{{Index: 1, Term: 1}}); err != nil {
		t.Fatal(err)
	}
	fi := l.Stats().FileBytes
	l.db.MaxSize = int(fi) // NB: bbolt refuses to grow the file past MaxSize
	err = l.Save(raftpb.HardState{Term: 1, Commit: 2}, []raftpb.Entry{{Index: 2, Term: 1, Data: make([]byte, 1<<20)}})
	if err == nil {
		t.Fatal("Save past MaxSize succeeded")
	}
	l.db.MaxSize = 0
	if err := l.Save(raftpb.HardState{Term: 1, Commit: 2}, []raftpb.Entry{{Index: 2, Term: 1}}); !errors.Is(err, ErrWriteFailed) {
		t.Fatalf("Save after a failed commit = %v, want ErrWriteFailed", err)
	}
	if err := l.Compact(1); !errors.Is(err, ErrWriteFailed) {
		t.Fatalf("Compact after a failed commit = %v, want ErrWriteFailed", err)
	}
	if last, err := l.LastIndex(); err != nil || last != 1 {
		t.Fatalf("LastIndex = %d, %v; want 1", last, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = Open(dir, Options{JournalBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	hs, _, _ := l.InitialState()
	if last, _ := l.LastIndex(); last != 1 || hs.Commit != 1 {
		t.Fatalf("after reopen last = %d, commit = %d; want 1, 1", last, hs.Commit)
	}
	if err := l.Save(raftpb.HardState{Term: 1, Commit: 2}, []raftpb.Entry{{Index: 2, Term: 1}}); err != nil {
		t.Fatalf("Save after reopen: %v", err)
	}
}

// TestTrimEntriesEmptiesEveryPage: a trim that deletes every entry of a
// bucket spanning many leaf pages returns, and so does the bounds check
// after it in the same transaction; one that keeps a middle range keeps
// exactly it. bbolt's Cursor.Last never returned once the deletes had
// emptied every page, which hung a rotation's catch-up after a
// compaction past everything the new file held.
func TestTrimEntriesEmptiesEveryPage(t *testing.T) {
	const n = 4096
	for _, tc := range []struct {
		name       string
		prev, last uint64
	}{
		{"everything compacted", n + 10, n + 10},
		{"both ends", 1000, 3000},
		{"only the tail", 0, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, err := bolt.Open(filepath.Join(t.TempDir(), "raft.db"), 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = db.Update(func(tx *bolt.Tx) error {
				b, err := tx.CreateBucket(bucketEntries)
				if err != nil {
					return err
				}
				for i := uint64(1); i <= n; i++ {
					if err := b.Put(indexKey(i), encodeEntry(&raftpb.Entry{Index: i, Term: 1, Data: make([]byte, 100)})); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				done <- db.Update(func(tx *bolt.Tx) error {
					if err := trimEntries(tx, false, tc.prev, tc.last); err != nil {
						return err
					}
					return checkBounds(tx, tc.prev, tc.last)
				})
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(30 * time.Second):
				// NB: no Close, which would wait for the stuck transaction.
				t.Fatal("the trim and its bounds check did not return in 30 s")
			}
			defer db.Close()
			lo, hi := tc.prev+1, min(tc.last, n)
			var kept []uint64
			err = db.View(func(tx *bolt.Tx) error {
				return tx.Bucket(bucketEntries).ForEach(func(k, _ []byte) error {
					i, _ := keyIndex(k)
					kept = append(kept, i)
					return nil
				})
			})
			if err != nil {
				t.Fatal(err)
			}
			if hi < lo {
				if len(kept) != 0 {
					t.Fatalf("kept %d entries (%d..%d), want none", len(kept), kept[0], kept[len(kept)-1])
				}
				return
			}
			if len(kept) != int(hi-lo+1) || kept[0] != lo || kept[len(kept)-1] != hi {
				t.Fatalf("kept %d entries, want exactly [%d, %d]", len(kept), lo, hi)
			}
		})
	}
}
