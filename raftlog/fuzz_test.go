package raftlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"reflect"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// Fuzz targets for every decoder of bytes raftlog reads back from disk
// (FORMAT.md): the entry record, the meta records and the journal. The
// seed corpora are real encodings from the encoders in format.go and
// journal.go plus edge cases; they run with every `go test`, and
// `make fuzz` explores further.

func seedEntries() []raftpb.Entry {
	return []raftpb.Entry{
		{},
		{Index: 1, Term: 1, Type: raftpb.EntryNormal, Data: []byte("put a=1")},
		{Index: 7, Term: 3, Type: raftpb.EntryConfChangeV2, Data: bytes.Repeat([]byte{0xaa}, 300)},
		{Index: 1<<64 - 1, Term: 1<<64 - 1, Type: raftpb.EntryConfChange},
	}
}

// FuzzEntryRecord: decodeEntry never panics; a refusal always says why
// (a protobuf error never comes without a detail); what it accepts is at
// the index asked for and survives encodeEntry → decodeEntry unchanged.
func FuzzEntryRecord(f *testing.F) {
	for _, e := range seedEntries() {
		v := encodeEntry(&e)
		f.Add(v, e.Index)
		f.Add(v, e.Index+1) // stored under another index
		bad := bytes.Clone(v)
		bad[len(bad)-1] ^= 1
		f.Add(bad, e.Index) // checksum mismatch
	}
	f.Add([]byte{}, uint64(0))
	f.Add([]byte{0, 0, 0}, uint64(0))
	f.Add(withCRC([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}), uint64(0)) // a length past the end
	f.Fuzz(func(t *testing.T, v []byte, want uint64) {
		e, detail, err := decodeEntry(v, want)
		if detail == "" {
			if err != nil {
				t.Fatalf("error %v without a detail", err)
			}
		} else {
			return
		}
		if e.Index != want {
			t.Fatalf("accepted an entry claiming index %d under %d", e.Index, want)
		}
		again, detail, err := decodeEntry(encodeEntry(&e), want)
		if detail != "" || err != nil {
			t.Fatalf("re-encoded entry refused: %s: %v", detail, err)
		}
		if !reflect.DeepEqual(normEntry(again), normEntry(e)) {
			t.Fatalf("round trip: %+v, want %+v", again, e)
		}
	})
}

// normEntry makes an empty Data and a nil one compare equal.
func normEntry(e raftpb.Entry) raftpb.Entry {
	if len(e.Data) == 0 {
		e.Data = nil
	}
	return e
}

// Meta record kinds, the first argument of FuzzMetaRecord.
const (
	metaHardState = iota
	metaCompacted
	metaSnapshot
	metaJournal
	metaKinds
)

// FuzzMetaRecord: each meta record decoder (hard state, compacted,
// snapshot, journal epoch) never panics, refuses with a detail (never a
// bare protobuf error), and what it accepts survives its encoder and
// decodes to the same value.
func FuzzMetaRecord(f *testing.F) {
	hs := []raftpb.HardState{{}, {Term: 4, Vote: 2, Commit: 99}, {Term: 1<<64 - 1, Vote: 1<<64 - 1, Commit: 1<<64 - 1}}
	for _, h := range hs {
		f.Add(uint8(metaHardState), encodeHardState(h))
	}
	for _, c := range []compacted{{}, {index: 10, term: 2}, {index: 1<<64 - 1, term: 1}} {
		f.Add(uint8(metaCompacted), encodeCompacted(c))
	}
	for _, r := range []snapRecord{
		{},
		{meta: raftpb.SnapshotMetadata{Index: 100, Term: 3, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}}},
			dataLen: 4096, dataCRC: 0xdeadbeef},
		{meta: raftpb.SnapshotMetadata{Index: 5, Term: 1, ConfState: raftpb.ConfState{Voters: []uint64{1, 2}, VotersOutgoing: []uint64{1, 3}, AutoLeave: true}}},
	} {
		f.Add(uint8(metaSnapshot), encodeSnapRecord(r))
	}
	for _, e := range []uint64{0, firstJournalEpoch(), 1<<64 - 1} {
		f.Add(uint8(metaJournal), encodeJournalEpoch(e))
	}
	for k := range uint8(metaKinds) {
		f.Add(k, []byte{})
		f.Add(k, []byte{1, 2, 3, 4})
		f.Add(k, withCRC([]byte{0xff}))
		f.Add(k, withCRC(bytes.Repeat([]byte{0x80}, 20)))
	}
	f.Fuzz(func(t *testing.T, kind uint8, v []byte) {
		switch kind % metaKinds {
		case metaHardState:
			hs, detail, err := decodeHardState(v)
			if checkRefusal(t, detail, err) {
				return
			}
			again, detail, err := decodeHardState(encodeHardState(hs))
			if detail != "" || err != nil || again != hs {
				t.Fatalf("round trip: %+v (%s, %v), want %+v", again, detail, err, hs)
			}
		case metaCompacted:
			c, detail := decodeCompacted(v)
			if detail != "" {
				return
			}
			if again, detail := decodeCompacted(encodeCompacted(c)); detail != "" || again != c {
				t.Fatalf("round trip: %+v (%s), want %+v", again, detail, c)
			}
			if !bytes.Equal(encodeCompacted(c), v) {
				t.Fatalf("compacted record %x accepted, re-encodes as %x", v, encodeCompacted(c))
			}
		case metaSnapshot:
			r, detail, err := decodeSnapRecord(v)
			if checkRefusal(t, detail, err) {
				return
			}
			again, detail, err := decodeSnapRecord(encodeSnapRecord(r))
			if detail != "" || err != nil || !reflect.DeepEqual(normSnap(again), normSnap(r)) {
				t.Fatalf("round trip: %+v (%s, %v), want %+v", again, detail, err, r)
			}
		case metaJournal:
			e, detail := decodeJournalEpoch(v)
			if detail != "" {
				return
			}
			if !bytes.Equal(encodeJournalEpoch(e), v) {
				t.Fatalf("journal record %x accepted as %d, re-encodes as %x", v, e, encodeJournalEpoch(e))
			}
		}
	})
}

// checkRefusal reports whether a decoder refused its input, failing t if
// it returned an error without saying why.
func checkRefusal(t *testing.T, detail string, err error) bool {
	t.Helper()
	if detail == "" && err != nil {
		t.Fatalf("error %v without a detail", err)
	}
	return detail != ""
}

// normSnap makes empty and nil slices compare equal.
func normSnap(r snapRecord) snapRecord {
	cs := &r.meta.ConfState
	for _, s := range []*[]uint64{&cs.Voters, &cs.Learners, &cs.VotersOutgoing, &cs.LearnersNext} {
		if len(*s) == 0 {
			*s = nil
		}
	}
	return r
}

// FuzzJournalPayload: decodeJournalPayload never panics or reads past
// its input, and a payload it accepts is exactly what journal.append
// writes for the record it returns (decode → encode is the identity).
func FuzzJournalPayload(f *testing.F) {
	for _, r := range seedJournalRecords() {
		f.Add(encodeJournalRecord(t0Journal(), 1, 0, &r)[journalHeader:])
	}
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff}) // count 2^32-1 in 16 bytes
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) // h = 2^32-1
	f.Fuzz(func(t *testing.T, p []byte) {
		r, ok := decodeJournalPayload(p)
		if !ok {
			return
		}
		if got := r.payloadLen(); got != len(p) {
			t.Fatalf("accepted a %d-byte payload whose record needs %d", len(p), got)
		}
		if got := encodeJournalRecord(t0Journal(), 1, 0, &r)[journalHeader:]; !bytes.Equal(got, p) {
			t.Fatalf("payload %x re-encodes as %x", p, got)
		}
	})
}

// FuzzJournalReplay: replaying arbitrary raft.wal contents never panics;
// it ends in a *CorruptError (wrapping ErrCorrupt) or in the records it
// found, which survive being written again by journal.append and
// replayed. With fix set the test first repairs the checksum of every
// header that claims to be a record of the epoch, so the fuzzer gets past
// the CRC to the lengths behind it.
func FuzzJournalReplay(f *testing.F) {
	const epoch = 42
	recs := seedJournalRecords()
	j := t0Journal()
	j.restart(epoch)
	for i := range recs {
		if _, err := j.append(&recs[i]); err != nil {
			f.Fatal(err)
		}
	}
	whole := j.f.(*memFile).b
	f.Add(bytes.Clone(whole), false)
	f.Add(bytes.Clone(whole[:2*journalAlign+100]), false) // cut in the third record: a torn tail
	damaged := bytes.Clone(whole)
	damaged[journalAlign+journalHeader+1] ^= 1 // the second record, with a third after it
	f.Add(damaged, false)
	f.Add(damaged, true)
	stale := bytes.Clone(whole)
	binary.BigEndian.PutUint64(stale[8:], epoch-1)
	f.Add(stale, false)
	f.Add([]byte{}, false)
	f.Add(make([]byte, journalAlign), false)
	hdr := make([]byte, journalHeader+4)
	binary.BigEndian.PutUint32(hdr[0:], journalMagic)
	binary.BigEndian.PutUint32(hdr[4:], 1<<31) // a length past the file
	binary.BigEndian.PutUint64(hdr[8:], epoch)
	f.Add(hdr, true)
	f.Fuzz(func(t *testing.T, file []byte, fix bool) {
		if len(file) > 64*journalAlign {
			return // NB: a bigger file only repeats what 64 pages show
		}
		file = bytes.Clone(file)
		if fix {
			fixJournalCRCs(file, epoch)
		}
		j := &journal{f: &memFile{b: file}, path: "raft.wal", size: int64(len(file))}
		var got []journalRecord
		n, torn, err := j.replay(epoch, func(seq uint64, r journalRecord) error {
			if seq != uint64(len(got)) {
				t.Fatalf("record %d handed over as seq %d", len(got), seq)
			}
			got = append(got, cloneRecord(r))
			return nil
		})
		if err != nil {
			var ce *CorruptError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.Path != "raft.wal" {
				t.Fatalf("replay error %v (%T), want a *CorruptError naming raft.wal", err, err)
			}
			return
		}
		if n != uint64(len(got)) {
			t.Fatalf("replay says %d records, handed over %d", n, len(got))
		}
		var next int64 // where the record after the last one replayed starts
		for i := range got {
			next += recordSpan(got[i].payloadLen())
		}
		if torn >= 0 && torn != next {
			t.Fatalf("torn tail at offset %d, want %d (after %d records)", torn, next, n)
		}
		// Written again, the same records replay the same.
		w := t0Journal()
		w.restart(epoch)
		for i := range got {
			if _, err := w.append(&got[i]); err != nil {
				t.Fatal(err)
			}
		}
		var again []journalRecord
		w.size = int64(len(w.f.(*memFile).b))
		if _, torn, err := w.replay(epoch, func(_ uint64, r journalRecord) error {
			again = append(again, cloneRecord(r))
			return nil
		}); err != nil || torn >= 0 {
			t.Fatalf("replay of re-written records: torn %d, %v", torn, err)
		}
		if !reflect.DeepEqual(again, got) {
			t.Fatalf("round trip: %d records %+v, want %d %+v", len(again), again, len(got), got)
		}
	})
}

func seedJournalRecords() []journalRecord {
	var out []journalRecord
	hs := encodeHardState(raftpb.HardState{Term: 2, Vote: 1, Commit: 3})
	var vals [][]byte
	for _, e := range seedEntries()[1:3] {
		vals = append(vals, encodeEntry(&e))
	}
	out = append(out, journalRecord{hs: hs, first: 1, vals: vals})
	out = append(out, journalRecord{first: 3, vals: [][]byte{encodeEntry(&raftpb.Entry{Index: 3, Term: 2})}})
	out = append(out, journalRecord{hs: hs})
	big := encodeEntry(&raftpb.Entry{Index: 4, Term: 2, Data: bytes.Repeat([]byte("x"), journalAlign)})
	out = append(out, journalRecord{first: 4, vals: [][]byte{big}}) // spans two pages
	return out
}

// t0Journal is an empty journal on a memFile, large enough for any
// record the tests write.
func t0Journal() *journal {
	return &journal{f: &memFile{}, path: "raft.wal", size: 1 << 40}
}

// encodeJournalRecord returns the bytes journal.append writes for r.
func encodeJournalRecord(j *journal, epoch, seq uint64, r *journalRecord) []byte {
	j.epoch, j.seq, j.off = epoch, seq, 0
	j.f = &memFile{}
	if _, err := j.append(r); err != nil {
		panic(err)
	}
	return j.f.(*memFile).b[:journalHeader+r.payloadLen()]
}

// fixJournalCRCs rewrites the checksum of every header at a page boundary
// that claims a record of epoch with a length inside the file.
func fixJournalCRCs(b []byte, epoch uint64) {
	for off := 0; off+journalHeader <= len(b); off += journalAlign {
		h := b[off:]
		if binary.BigEndian.Uint32(h) != journalMagic || binary.BigEndian.Uint64(h[8:]) != epoch {
			continue
		}
		n := int(binary.BigEndian.Uint32(h[4:]))
		if n > len(h)-journalHeader {
			continue
		}
		binary.BigEndian.PutUint32(h[24:], recordCRC(h[:journalHeader+n]))
	}
}

func cloneRecord(r journalRecord) journalRecord {
	out := journalRecord{hs: bytes.Clone(r.hs), first: r.first}
	for _, v := range r.vals {
		out.vals = append(out.vals, bytes.Clone(v))
	}
	return out
}

// memFile is a RandomFile in memory.
type memFile struct{ b []byte }

func (m *memFile) Name() string { return "raft.wal" }

func (m *memFile) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(m.b)) {
		return 0, io.EOF
	}
	n := copy(p, m.b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (m *memFile) WriteAt(p []byte, off int64) (int, error) {
	if end := int(off) + len(p); end > len(m.b) {
		m.b = append(m.b, make([]byte, end-len(m.b))...)
	}
	return copy(m.b[off:], p), nil
}

func (m *memFile) Stat() (fs.FileInfo, error) { return memInfo(len(m.b)), nil }
func (m *memFile) Allocate(size int64) error  { return m.Truncate(max(size, int64(len(m.b)))) }
func (m *memFile) Sync() error                { return nil }
func (m *memFile) Datasync() error            { return nil }
func (m *memFile) Close() error               { return nil }
func (m *memFile) Truncate(size int64) error {
	if int(size) <= len(m.b) {
		m.b = m.b[:size]
		return nil
	}
	m.b = append(m.b, make([]byte, int(size)-len(m.b))...)
	return nil
}

type memInfo int

func (i memInfo) Name() string       { return "raft.wal" }
func (i memInfo) Size() int64        { return int64(i) }
func (i memInfo) Mode() fs.FileMode  { return 0o600 }
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return false }
func (i memInfo) Sys() any           { return nil }
