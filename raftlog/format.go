package raftlog

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"

	"go.etcd.io/raft/v3/raftpb"
)

// formatVersion is the on-disk format version stored under meta/"version".
// Bump it, and edit FORMAT.md, with any change to the layouts below.
// Version 3 lays raft.wal out in two slots (FORMAT.md "Journal").
const formatVersion uint64 = 3

// formatVersionOneSlot is the format whose raft.wal is a single slot. Open
// replays such a journal with that layout and upgrades the file to
// formatVersion in the same transaction, so a build that knows only one
// slot refuses it from then on.
const formatVersionOneSlot uint64 = 2

// formatVersionNoJournal is the format before raft.wal: the same buckets
// without meta/"journal". Open upgrades such a file in place; a build that
// reads only version 1 must not open a log whose journal it would ignore.
const formatVersionNoJournal uint64 = 1

// Bucket and key names. See FORMAT.md.
var (
	bucketEntries = []byte("entries")
	bucketMeta    = []byte("meta")

	keyVersion   = []byte("version")
	keyHardState = []byte("hardstate")
	keyCompacted = []byte("compacted")
	keySnapshot  = []byte("snapshot")
	keyJournal   = []byte("journal")
)

// castagnoli is the CRC-32C table used for every checksum in the package.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// indexKey encodes a Raft index as an entries-bucket key.
//
//	0                8
//	+----------------+
//	| index (u64 BE) |
//	+----------------+
//
// Big-endian so bbolt's byte order is index order and appends go to the
// right-most leaf.
func indexKey(i uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], i)
	return k[:]
}

// keyIndex decodes an entries-bucket key; ok is false if it is not 8 bytes.
func keyIndex(k []byte) (i uint64, ok bool) {
	if len(k) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(k), true
}

// encodeEntry encodes one entry value.
//
//	0          4                              4+n
//	+----------+------------------------------+
//	| crc (BE) | raftpb.Entry protobuf (n B)  |
//	+----------+------------------------------+
//
// crc is CRC-32C (Castagnoli) of bytes [4:4+n]. The Entry carries its own
// Index and Term; decodeEntry checks that Index matches the key.
func encodeEntry(e *raftpb.Entry) []byte { return appendEntry(nil, e) }

// appendEntry appends e's record (as encodeEntry) to dst.
func appendEntry(dst []byte, e *raftpb.Entry) []byte {
	n := 4 + e.Size()
	dst = slices.Grow(dst, n)
	rec := dst[len(dst) : len(dst)+n]
	m, err := e.MarshalToSizedBuffer(rec[4:])
	assert(err == nil && m == n-4, "marshal entry %d: n=%d err=%v", e.Index, m, err)
	binary.BigEndian.PutUint32(rec, checksum(rec[4:]))
	return dst[:len(dst)+n]
}

// decodeEntry decodes and verifies an entry value stored under index want.
// The returned Entry does not alias v (protobuf Unmarshal copies Data), so it
// stays valid after the bbolt transaction that produced v ends.
func decodeEntry(v []byte, want uint64) (raftpb.Entry, string, error) {
	var e raftpb.Entry
	detail, err := decodeEntryInto(&e, v, want)
	return e, detail, err
}

// decodeEntryInto is decodeEntry into e, which must be empty but for the
// capacity of its Data, which the decoding reuses.
func decodeEntryInto(e *raftpb.Entry, v []byte, want uint64) (string, error) {
	body, detail := checkCRC(v)
	if detail != "" {
		return detail, nil
	}
	if err := e.Unmarshal(body); err != nil {
		return "undecodable entry", err
	}
	if e.Index != want {
		return fmt.Sprintf("entry stored under index %d claims index %d", want, e.Index), nil
	}
	return "", nil
}

// checkCRC splits a crc-prefixed value and verifies it. detail is empty when
// the value is intact.
func checkCRC(v []byte) (body []byte, detail string) {
	if len(v) < 4 {
		return nil, fmt.Sprintf("value is %d bytes, shorter than its checksum", len(v))
	}
	stored, body := binary.BigEndian.Uint32(v), v[4:]
	if got := checksum(body); got != stored {
		return nil, fmt.Sprintf("checksum mismatch (stored %#08x, computed %#08x)", stored, got)
	}
	return body, ""
}

// withCRC prefixes body with its CRC-32C (big-endian u32).
func withCRC(body []byte) []byte {
	buf := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(buf, checksum(body))
	copy(buf[4:], body)
	return buf
}

// encodeHardState encodes meta/"hardstate".
//
//	0          4                                  4+n
//	+----------+----------------------------------+
//	| crc (BE) | raftpb.HardState protobuf (n B)  |
//	+----------+----------------------------------+
func encodeHardState(hs raftpb.HardState) []byte {
	body, err := hs.Marshal()
	assert(err == nil, "marshal hard state: %v", err)
	return withCRC(body)
}

func decodeHardState(v []byte) (raftpb.HardState, string, error) {
	var hs raftpb.HardState
	body, detail := checkCRC(v)
	if detail != "" {
		return hs, detail, nil
	}
	if err := hs.Unmarshal(body); err != nil {
		return hs, "undecodable hard state", err
	}
	return hs, "", nil
}

// compacted is the entry just before the first retained one: its index and
// term are kept so Term(FirstIndex()-1) answers (raft's "dummy entry").
type compacted struct{ index, term uint64 }

// encodeCompacted encodes meta/"compacted".
//
//	0          4                8                12
//	+----------+----------------+----------------+
//	| crc (BE) | index (u64 BE) | term (u64 BE)  |
//	+----------+----------------+----------------+
//
// crc covers bytes [4:20]. Absent means {0, 0}: nothing compacted yet.
func encodeCompacted(c compacted) []byte {
	var body [16]byte
	binary.BigEndian.PutUint64(body[0:], c.index)
	binary.BigEndian.PutUint64(body[8:], c.term)
	return withCRC(body[:])
}

func decodeCompacted(v []byte) (compacted, string) {
	body, detail := checkCRC(v)
	if detail != "" {
		return compacted{}, detail
	}
	if len(body) != 16 {
		return compacted{}, fmt.Sprintf("record is %d bytes, want 16", len(body))
	}
	return compacted{
		index: binary.BigEndian.Uint64(body[0:]),
		term:  binary.BigEndian.Uint64(body[8:]),
	}, ""
}

// snapRecord is meta/"snapshot": the metadata of the current snapshot and
// what its data file must look like.
type snapRecord struct {
	meta    raftpb.SnapshotMetadata // index, term, conf state
	dataLen uint64                  // length of the data file in bytes
	dataCRC uint32                  // CRC-32C of the data file's contents
}

// encodeSnapRecord encodes meta/"snapshot".
//
//	0          4                  12              16                              16+n
//	+----------+------------------+---------------+-------------------------------+
//	| crc (BE) | data len (u64 BE)| data crc (BE) | raftpb.SnapshotMetadata (n B) |
//	+----------+------------------+---------------+-------------------------------+
//
// crc covers bytes [4:16+n]. "data crc" is the CRC-32C of the data file
// snap/<index>-<term>.snap (see snapFileName). Absent means no snapshot.
func encodeSnapRecord(r snapRecord) []byte {
	body := make([]byte, 12+r.meta.Size())
	binary.BigEndian.PutUint64(body[0:], r.dataLen)
	binary.BigEndian.PutUint32(body[8:], r.dataCRC)
	n, err := r.meta.MarshalToSizedBuffer(body[12:])
	assert(err == nil && n == len(body)-12, "marshal snapshot metadata: n=%d err=%v", n, err)
	return withCRC(body)
}

func decodeSnapRecord(v []byte) (snapRecord, string, error) {
	var r snapRecord
	body, detail := checkCRC(v)
	if detail != "" {
		return r, detail, nil
	}
	if len(body) < 12 {
		return r, fmt.Sprintf("record is %d bytes, want at least 12", len(body)), nil
	}
	r.dataLen = binary.BigEndian.Uint64(body[0:])
	r.dataCRC = binary.BigEndian.Uint32(body[8:])
	if err := r.meta.Unmarshal(body[12:]); err != nil {
		return r, "undecodable snapshot metadata", err
	}
	return r, "", nil
}

// encodeJournalEpoch encodes meta/"journal": the last journal epoch whose
// records raft.db holds.
//
//	0          4
//	+----------+----------------+
//	| crc (BE) | epoch (u64 BE) |
//	+----------+----------------+
func encodeJournalEpoch(epoch uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], epoch)
	return withCRC(b[:])
}

func decodeJournalEpoch(v []byte) (uint64, string) {
	body, detail := checkCRC(v)
	if detail != "" {
		return 0, detail
	}
	if len(body) != 8 {
		return 0, fmt.Sprintf("record is %d bytes, want 8", len(body))
	}
	return binary.BigEndian.Uint64(body), ""
}

// encodeVersion encodes meta/"version": the format version as a u64 BE.
func encodeVersion(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func decodeU64(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

// snapFileName names the data file of the snapshot at index/term:
// "<index as 16 hex digits>-<term as 16 hex digits>.snap", so lexical order is
// index order.
func snapFileName(index, term uint64) string {
	return fmt.Sprintf("%016x-%016x.snap", index, term)
}

// parseSnapFileName is the inverse of snapFileName.
func parseSnapFileName(name string) (index, term uint64, ok bool) {
	if len(name) != 16+1+16+len(".snap") || name[16] != '-' || name[33:] != ".snap" {
		return 0, 0, false
	}
	if _, err := fmt.Sscanf(name, "%016x-%016x.snap", &index, &term); err != nil {
		return 0, 0, false
	}
	return index, term, true
}

// assert panics with a formatted message if cond is false. It guards
// invariants that only a bug in this package can break, never disk input.
func assert(cond bool, format string, args ...any) {
	if !cond {
		panic(fmt.Sprintf("raftlog: invariant violated: "+format, args...))
	}
}
