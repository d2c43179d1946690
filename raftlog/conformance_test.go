package raftlog_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
)

// storage is what the conformance suite drives: raft.Storage plus the write
// side of raftlog.Log.
type storage interface {
	raft.Storage
	Save(hs raftpb.HardState, ents []raftpb.Entry) error
	ApplySnapshot(snap raftpb.Snapshot) error
	CreateSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (raftpb.Snapshot, error)
	Compact(compactIndex uint64) error
}

var _ storage = (*raftlog.Log)(nil)

// memStorage adapts raft.MemoryStorage, the reference implementation, to
// storage. The one documented difference of raftlog.Log is reproduced here:
// ApplySnapshot raises the hard state's commit to the snapshot index.
type memStorage struct{ *raft.MemoryStorage }

func (m memStorage) Save(hs raftpb.HardState, ents []raftpb.Entry) error {
	if !raft.IsEmptyHardState(hs) {
		if err := m.SetHardState(hs); err != nil {
			return err
		}
	}
	return m.Append(ents)
}

func (m memStorage) ApplySnapshot(snap raftpb.Snapshot) error {
	if err := m.MemoryStorage.ApplySnapshot(snap); err != nil {
		return err
	}
	hs, _, _ := m.InitialState()
	if hs.Commit < snap.Metadata.Index {
		hs.Commit = snap.Metadata.Index
		return m.SetHardState(hs)
	}
	return nil
}

type step struct {
	name string
	do   func(s storage) error
}

func save(hs raftpb.HardState, ents []raftpb.Entry) step {
	name := fmt.Sprintf("Save(hs=%+v", hs)
	if len(ents) > 0 {
		name += fmt.Sprintf(", [%d..%d]", ents[0].Index, ents[len(ents)-1].Index)
	}
	return step{name + ")", func(s storage) error { return s.Save(hs, ents) }}
}

func appendAt(first uint64, terms ...uint64) step {
	return save(raftpb.HardState{}, mkEnts(first, terms...))
}

// committed appends entries and commits them all, as raft does before the
// state machine can snapshot them.
func committed(first uint64, terms ...uint64) step {
	return save(hardState(9, 1, first+uint64(len(terms))-1), mkEnts(first, terms...))
}

func createSnap(i uint64, cs *raftpb.ConfState) step {
	return step{fmt.Sprintf("CreateSnapshot(%d)", i), func(s storage) error {
		_, err := s.CreateSnapshot(i, cs, fmt.Appendf(nil, "state at %d", i))
		return err
	}}
}

func compact(i uint64) step {
	return step{fmt.Sprintf("Compact(%d)", i), func(s storage) error { return s.Compact(i) }}
}

func applySnap(i, t uint64, voters ...uint64) step {
	snap := raftpb.Snapshot{
		Data:     fmt.Appendf(nil, "leader state at %d", i),
		Metadata: raftpb.SnapshotMetadata{Index: i, Term: t, ConfState: raftpb.ConfState{Voters: voters}},
	}
	return step{fmt.Sprintf("ApplySnapshot(%d, %d)", i, t), func(s storage) error { return s.ApplySnapshot(snap) }}
}

func hardState(term, vote, commit uint64) raftpb.HardState {
	return raftpb.HardState{Term: term, Vote: vote, Commit: commit}
}

var cs123 = &raftpb.ConfState{Voters: []uint64{1, 2, 3}}

// conformanceCases are raft.Storage behaviours, each a sequence of writes.
// After each case the suite compares every observable answer of raftlog.Log
// with raft.MemoryStorage's.
var conformanceCases = []struct {
	name  string
	steps []step
}{
	{"empty", nil},
	{"append one batch", []step{appendAt(1, 1, 1, 1, 2, 2, 3, 3, 3, 3, 3)}},
	{"append in batches", []step{appendAt(1, 1, 1), appendAt(3, 1), appendAt(4, 2, 2, 2), appendAt(7, 3)}},
	{"hard state only", []step{save(hardState(3, 2, 0), nil)}},
	{"hard state with entries", []step{save(hardState(2, 1, 3), mkEnts(1, 1, 1, 2, 2))}},
	{"hard state replaced", []step{save(hardState(1, 1, 2), mkEnts(1, 1, 1, 1)), save(hardState(4, 0, 3), nil)}},
	{"overwrite conflicting suffix", []step{appendAt(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), appendAt(6, 2, 2, 2)}},
	{"overwrite with longer suffix", []step{appendAt(1, 1, 1, 1, 1, 1), appendAt(3, 2, 2, 2, 2, 2, 2, 2)}},
	{"overwrite from first index", []step{appendAt(1, 1, 1, 1, 1, 1), appendAt(1, 3, 3)}},
	{"overwrite same terms", []step{appendAt(1, 1, 1, 2, 2), appendAt(3, 2, 2, 2)}},
	{"overwrite twice", []step{appendAt(1, 1, 1, 1, 1, 1, 1, 1), appendAt(5, 2, 2, 2, 2, 2), appendAt(4, 3)}},
	{"create snapshot keeps log", []step{committed(1, 1, 1, 2, 2, 2, 3, 3), createSnap(5, cs123)}},
	{"create snapshot without conf state keeps previous", []step{
		committed(1, 1, 1, 2, 2, 2, 3, 3), createSnap(3, cs123), createSnap(5, nil)}},
	{"create snapshot at last index", []step{committed(1, 1, 1, 2), createSnap(3, cs123)}},
	{"create snapshot out of date", []step{
		committed(1, 1, 1, 2, 2, 2, 3, 3), createSnap(5, cs123), createSnap(5, cs123), createSnap(4, cs123)}},
	{"compact", []step{committed(1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3), createSnap(7, cs123), compact(4)}},
	{"compact to snapshot index", []step{committed(1, 1, 1, 2, 2, 2, 3, 3, 3), createSnap(7, cs123), compact(7)}},
	{"compact whole log", []step{committed(1, 1, 1, 2, 2), createSnap(4, cs123), compact(4)}},
	{"compact twice and already compacted", []step{
		committed(1, 1, 1, 2, 2, 2, 3, 3, 3), createSnap(8, cs123), compact(3), compact(6), compact(6), compact(2)}},
	{"append after compact", []step{
		committed(1, 1, 1, 2, 2, 2, 3), createSnap(6, cs123), compact(5), appendAt(7, 3, 4, 4)}},
	{"append overlapping compacted prefix", []step{
		committed(1, 1, 1, 2, 2, 2, 3), createSnap(6, cs123), compact(5), appendAt(3, 2, 2, 2, 3, 3, 4)}},
	{"append entirely compacted", []step{
		committed(1, 1, 1, 2, 2, 2, 3), createSnap(6, cs123), compact(5), appendAt(2, 1, 2, 2)}},
	{"overwrite after compact", []step{
		appendAt(1, 1, 1, 2, 2, 2, 3, 3, 3, 3), save(hardState(3, 1, 5), nil), createSnap(5, cs123), compact(4),
		appendAt(7, 4, 4)}},
	{"apply snapshot on empty log", []step{applySnap(10, 4, 1, 2, 3)}},
	{"apply snapshot then append", []step{applySnap(10, 4, 1, 2, 3), save(hardState(5, 1, 12), mkEnts(11, 4, 5, 5))}},
	{"apply snapshot discards longer log", []step{appendAt(1, 1, 1, 2, 2, 2, 3, 3, 3, 3), applySnap(6, 2, 1, 2)}},
	{"apply snapshot beyond log", []step{appendAt(1, 1, 1, 2, 2), save(hardState(2, 1, 2), nil), applySnap(20, 5, 1)}},
	{"apply snapshot at commit index", []step{
		save(hardState(3, 1, 6), mkEnts(1, 1, 1, 2, 2, 2, 3, 3, 3, 3)), applySnap(6, 2, 1, 2)}},
	{"apply out of date snapshot", []step{
		committed(1, 1, 1, 2, 2, 2, 3, 3), createSnap(7, cs123), applySnap(6, 3, 1), applySnap(7, 3, 1)}},
	{"apply snapshot after compact", []step{
		committed(1, 1, 1, 2, 2, 2, 3, 3), createSnap(5, cs123), compact(5), applySnap(30, 6, 1, 2, 3, 4)}},
	{"create snapshot after apply", []step{
		applySnap(10, 4, 1, 2, 3), committed(11, 4, 4, 5, 5), createSnap(13, nil), compact(12)}},
	{"conf change entries", []step{save(hardState(1, 1, 3), []raftpb.Entry{
		{Index: 1, Term: 1, Type: raftpb.EntryConfChange, Data: payload(1, 1)},
		{Index: 2, Term: 1, Type: raftpb.EntryConfChangeV2, Data: payload(2, 1)},
		{Index: 3, Term: 1, Data: payload(3, 1)},
	})}},
}

// logVariants are the Log configurations every case runs against: the cache
// on (every read from memory), a one-entry cache (reads split between bbolt
// and memory) and the cache off (every read from bbolt). Three derivations of
// the same answers.
//
// reopen says whether the case also reopens the log and compares again; the
// file is the same whatever the cache, so two variants suffice: one that
// reloads the cache from disk and one that reads every entry from bbolt.
//
// rotate rotates raft.db (Rotate with Verify) after the steps, so every
// answer is read from the rotated file: rotation must not change any.
var logVariants = []struct {
	name   string
	opts   raftlog.Options
	reopen bool
	rotate bool
}{
	{"cache", raftlog.Options{}, true, false},
	{"cache=off", raftlog.Options{CacheEntries: -1}, true, false},
	{"cache=1", raftlog.Options{CacheEntries: 1}, false, false},
	{"cache=100B", raftlog.Options{CacheEntries: 4, CacheBytes: 100}, false, false},
	{"cache=off,rotated", raftlog.Options{CacheEntries: -1}, true, true},
}

// TestConformance runs every case against raft.MemoryStorage and each Log
// variant, compares all answers after each case, then reopens the Log and
// compares again (reopen gives an identical state).
func TestConformance(t *testing.T) {
	for _, tc := range conformanceCases {
		t.Run(tc.name, func(t *testing.T) {
			for _, v := range logVariants {
				t.Run(v.name, func(t *testing.T) {
					dir := t.TempDir()
					ref := memStorage{raft.NewMemoryStorage()}
					l := mustOpen(t, dir, v.opts)
					for _, st := range tc.steps {
						if got, want := errClass(st.do(l)), errClass(st.do(ref)); got != want {
							t.Errorf("%s: got %s, want %s", st.name, got, want)
						}
					}
					if v.rotate {
						if _, err := l.Rotate(context.Background(), raftlog.RotateOptions{Verify: true}); err != nil {
							t.Fatalf("Rotate: %v", err)
						}
					}
					assertSameStorage(t, ref, l)
					assertLogInvariants(t, l)
					mustClose(t, l)
					if !v.reopen {
						return
					}
					l = mustOpen(t, dir, v.opts)
					defer mustClose(t, l)
					assertSameStorage(t, ref, l)
					assertLogInvariants(t, l)
				})
			}
		})
	}
}

// snapshotWithData is s's snapshot with its data: a Log's Snapshot carries
// the metadata only, its data is read from the file.
func snapshotWithData(s raft.Storage) (raftpb.Snapshot, error) {
	if l, ok := s.(*raftlog.Log); ok {
		snap, err := l.Snapshot()
		if err != nil || len(snap.Data) != 0 {
			return snap, fmt.Errorf("Snapshot() carries %d bytes of data: %w", len(snap.Data), err)
		}
		return l.ReadSnapshotData()
	}
	return s.Snapshot()
}

// assertSameStorage compares every answer got gives with want's: indexes,
// Term around and across the log, Entries for every range [lo, hi) the
// reference can answer with several size limits, Snapshot and InitialState.
func assertSameStorage(t *testing.T, want, got raft.Storage) {
	t.Helper()
	wf, _ := want.FirstIndex()
	wl, _ := want.LastIndex()
	gf, err := got.FirstIndex()
	if err != nil || gf != wf {
		t.Fatalf("FirstIndex() = %d, %v; want %d", gf, err, wf)
	}
	gl, err := got.LastIndex()
	if err != nil || gl != wl {
		t.Fatalf("LastIndex() = %d, %v; want %d", gl, err, wl)
	}
	for i := max(wf, 2) - 2; i <= wl+2; i++ {
		wt, werr := want.Term(i)
		gt, gerr := got.Term(i)
		if gt != wt || errClass(gerr) != errClass(werr) {
			t.Errorf("Term(%d) = %d, %s; want %d, %s", i, gt, errClass(gerr), wt, errClass(werr))
		}
	}
	sizes := []uint64{0, 150, 400, math.MaxUint64}
	for lo := max(wf, 1) - 1; lo <= wl+1; lo++ {
		for hi := lo; hi <= wl+1; hi++ { // hi > LastIndex+1 makes MemoryStorage panic
			// Also the exact sizes of the first one and two entries, and one
			// byte less: the boundaries of "at least one entry, no more
			// than maxSize".
			sizes := sizes
			if all, err := want.Entries(lo, hi, math.MaxUint64); err == nil && len(all) >= 2 {
				s1, s2 := uint64(all[0].Size()), uint64(all[0].Size()+all[1].Size())
				sizes = append(sizes[:len(sizes):len(sizes)], s1, s2-1, s2, s2+1)
			}
			for _, maxSize := range sizes {
				we, werr := want.Entries(lo, hi, maxSize)
				ge, gerr := got.Entries(lo, hi, maxSize)
				if errClass(gerr) != errClass(werr) {
					t.Errorf("Entries(%d, %d, %d) error %s, want %s", lo, hi, maxSize, errClass(gerr), errClass(werr))
					continue
				}
				if !sameEntries(ge, we) {
					t.Errorf("Entries(%d, %d, %d) = %s, want %s", lo, hi, maxSize, describe(ge), describe(we))
				}
			}
		}
	}
	ws, werr := snapshotWithData(want)
	gs, gerr := snapshotWithData(got)
	if errClass(gerr) != errClass(werr) || gs.Metadata.Index != ws.Metadata.Index ||
		gs.Metadata.Term != ws.Metadata.Term || !bytes.Equal(gs.Data, ws.Data) ||
		gs.Metadata.ConfState.Equivalent(ws.Metadata.ConfState) != nil {
		t.Errorf("Snapshot() = %+v, %v; want %+v, %v", gs, gerr, ws, werr)
	}
	whs, wcs, _ := want.InitialState()
	ghs, gcs, err := got.InitialState()
	if err != nil || ghs != whs || gcs.Equivalent(wcs) != nil {
		t.Errorf("InitialState() = %+v, %+v, %v; want %+v, %+v", ghs, gcs, err, whs, wcs)
	}
}

func sameEntries(a, b []raftpb.Entry) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if a[k].Index != b[k].Index || a[k].Term != b[k].Term || a[k].Type != b[k].Type ||
			!bytes.Equal(a[k].Data, b[k].Data) {
			return false
		}
	}
	return true
}

func describe(ents []raftpb.Entry) string {
	s := "["
	for k, e := range ents {
		if k > 0 {
			s += " "
		}
		s += fmt.Sprintf("%d/%d(%dB)", e.Index, e.Term, len(e.Data))
	}
	return s + "]"
}
