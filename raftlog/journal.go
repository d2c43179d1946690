package raftlog

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"go.etcd.io/raft/v3/raftpb"
)

// The journal (raft.wal) makes a Save durable with one fdatasync of one
// preallocated file instead of a bbolt commit, which costs two (dirty pages,
// then the meta page) plus the tree's page writes. raft.db stays the home of
// the log: the journal holds only what was saved since raft.db's last write
// transaction, and every write transaction of raft.db (a checkpoint) carries
// the journal's pending records with it and records their epoch as consumed
// (meta/"journal"), so the journal can start over. Layout, replay and the
// torn-tail rule: FORMAT.md "Journal".

const (
	journalAlign  = 4096       // records start on page boundaries
	journalHeader = 32         // bytes before a record's payload
	journalMagic  = 0x4c4a524e // "LJRN"
)

// journal appends records to raft.wal. It is used under the Log's wmu only
// (and by Open before the Log is shared).
//
// The file holds two slots, its halves: epoch e writes to slot e%2, so the
// records of the epoch being folded into raft.db stay intact while the next
// epoch is written to the other slot (FORMAT.md "Journal"). A file written
// by format version 2 has a single slot, the whole file (legacy), and is
// only ever replayed.
type journal struct {
	f      RandomFile
	path   string
	size   int64 // bytes preallocated
	slot   int64 // bytes per slot; a record must end within its slot
	legacy bool  // version 2 layout: one slot, the whole file

	epoch uint64 // epoch of the records written now
	seq   uint64 // number of the next record within epoch
	off   int64  // offset of the next record within the slot, a multiple of journalAlign
	buf   []byte // reused encode buffer
}

// slotBytes is the slot size of a file of size bytes: half of it, whole
// pages.
func slotBytes(size int64) int64 { return size / 2 / journalAlign * journalAlign }

// base is the file offset of the current epoch's slot.
func (j *journal) base() int64 {
	if j.legacy {
		return 0
	}
	return int64(j.epoch%2) * j.slot
}

// limit is the size of the current epoch's slot.
func (j *journal) limit() int64 {
	if j.legacy {
		return j.size
	}
	return j.slot
}

// openJournal opens or creates path through fsys as it is, laid out in two
// slots, or in one if legacy. Nothing is written: the records it holds must
// be replayed with the layout they were written in before grow changes it.
func openJournal(fsys FS, path string, legacy bool) (*journal, error) {
	f, err := fsys.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("raftlog: open journal: %w", err)
	}
	j := &journal{f: f, path: path, legacy: legacy}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("raftlog: stat journal %s: %w", path, err)
	}
	j.size = fi.Size()
	j.slot = slotBytes(j.size)
	return j, nil
}

// grow makes the file at least size bytes, allocated, so that an fdatasync
// after a write within it has no file size to update, and switches to the
// two-slot layout. Only call it when no record is pending replay: the slot
// boundaries move.
func (j *journal) grow(size int64) error {
	j.legacy = false
	if j.size < size {
		if err := j.f.Allocate(size); err != nil {
			// NB: a filesystem without fallocate gets a sparse file; writes
			// then also allocate blocks, which fdatasync must record.
			if !errors.Is(err, errors.ErrUnsupported) {
				return fmt.Errorf("raftlog: preallocate journal %s to %d bytes: %w", j.path, size, err)
			}
			if err := j.f.Truncate(size); err != nil {
				return fmt.Errorf("raftlog: extend journal %s to %d bytes: %w", j.path, size, err)
			}
		}
		if err := j.zeroFill(j.size, size); err != nil {
			return err
		}
		if err := j.f.Sync(); err != nil {
			return fmt.Errorf("raftlog: sync journal %s: %w", j.path, err)
		}
		j.size = size
	}
	j.slot = slotBytes(j.size)
	return nil
}

// zeroFillChunk is how many bytes of zeros zeroFill writes per call.
const zeroFillChunk = 1 << 20

// zeroFill writes zeros over [from, to). fallocate leaves its blocks
// "unwritten" (read as zeros without being written), and the first write to
// such a block changes the file's block map, so its fdatasync must commit
// the filesystem's journal too; writing them once here keeps that off every
// Save that first reaches a block.
func (j *journal) zeroFill(from, to int64) error {
	zeros := make([]byte, min(zeroFillChunk, to-from))
	for off := from; off < to; off += int64(len(zeros)) {
		n := min(int64(len(zeros)), to-off)
		if _, err := j.f.WriteAt(zeros[:n], off); err != nil {
			return fmt.Errorf("raftlog: zero journal %s at %d: %w", j.path, off, err)
		}
	}
	return nil
}

// journalRecord is one Save: a hard state (hs nil if none) and the encoded
// entries first, first+1, ...
type journalRecord struct {
	hs    []byte
	first uint64
	vals  [][]byte
}

// recordSpan is how far a record with a payload of n bytes advances the
// write offset.
func recordSpan(n int) int64 {
	return (int64(journalHeader+n) + journalAlign - 1) / journalAlign * journalAlign
}

// payloadLen is the payload size of r (FORMAT.md "Journal record").
func (r *journalRecord) payloadLen() int {
	n := 4 + len(r.hs) + 8 + 4
	for _, v := range r.vals {
		n += 4 + len(v)
	}
	return n
}

// fits reports whether a record with an n-byte payload fits after the
// records already written in the current slot.
func (j *journal) fits(n int) bool {
	return j.off+int64(journalHeader+n) <= j.limit()
}

// fitsEmpty reports whether a record with an n-byte payload fits in an
// empty slot.
func (j *journal) fitsEmpty(n int) bool {
	return int64(journalHeader+n) <= j.limit()
}

// append writes r as the next record and fdatasyncs it. It returns the bytes
// the record occupies. On error the journal must not be used again: what
// reached the disk is unknown (none, part or all of the record), and the
// Log refuses further writes (FORMAT.md "Failure cases").
func (j *journal) append(r *journalRecord) (int64, error) {
	n := r.payloadLen()
	total := journalHeader + n
	if cap(j.buf) < total {
		j.buf = make([]byte, total)
	}
	b := j.buf[:total]
	binary.BigEndian.PutUint32(b[0:], journalMagic)
	binary.BigEndian.PutUint32(b[4:], uint32(n))
	binary.BigEndian.PutUint64(b[8:], j.epoch)
	binary.BigEndian.PutUint64(b[16:], j.seq)
	clear(b[24:32])
	p := b[journalHeader:]
	binary.BigEndian.PutUint32(p, uint32(len(r.hs)))
	p = p[4:]
	p = p[copy(p, r.hs):]
	binary.BigEndian.PutUint64(p, r.first)
	binary.BigEndian.PutUint32(p[8:], uint32(len(r.vals)))
	p = p[12:]
	for _, v := range r.vals {
		binary.BigEndian.PutUint32(p, uint32(len(v)))
		p = p[4+copy(p[4:], v):]
	}
	binary.BigEndian.PutUint32(b[24:], recordCRC(b))
	wrote, err := j.f.WriteAt(b, j.base()+j.off)
	if err == nil && wrote < len(b) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return 0, fmt.Errorf("write journal %s at %d: %w", j.path, j.base()+j.off, err)
	}
	if err := j.f.Datasync(); err != nil {
		return 0, fmt.Errorf("fdatasync journal %s: %w", j.path, err)
	}
	span := recordSpan(n)
	j.off += span
	j.seq++
	return span, nil
}

// recordCRC is the checksum of a record's header fields and payload.
func recordCRC(b []byte) uint32 {
	c := checksum(b[4:24])
	return crc32.Update(c, castagnoli, b[journalHeader:])
}

// restart starts epoch at the beginning of its slot: everything written
// there before belongs to an older, consumed epoch.
func (j *journal) restart(epoch uint64) {
	j.epoch, j.seq, j.off = epoch, 0, 0
}

// replay calls fn with each record of epoch in order, from the start of its
// slot, and leaves the journal positioned after the last one. A record that
// fails its checksum ends the journal if it is its torn tail (no valid record
// of the same epoch follows); otherwise it is corruption. It returns the
// number of records and, for a torn tail, the offset where it was found
// (-1 if none).
func (j *journal) replay(epoch uint64, fn func(seq uint64, r journalRecord) error) (n uint64, torn int64, err error) {
	j.restart(epoch)
	torn = -1
	hdr := make([]byte, journalHeader)
	for j.off+journalHeader <= j.limit() {
		rec, ok, err := j.readAt(j.off, j.seq, hdr)
		if err != nil {
			return n, torn, err
		}
		if !ok {
			if j.claims(hdr, j.seq) {
				if later := j.validAfter(j.off, j.seq); later >= 0 {
					return n, torn, &CorruptError{Path: j.path, Record: "journal record", Index: j.seq,
						Detail: fmt.Sprintf("record %d of epoch %d at offset %d is damaged but record at offset %d follows it",
							j.seq, epoch, j.base()+j.off, j.base()+later)}
				}
				torn = j.base() + j.off
			}
			break
		}
		if err := fn(j.seq, rec); err != nil {
			return n, torn, err
		}
		j.off += recordSpan(len(j.buf))
		j.seq++
		n++
	}
	return n, torn, nil
}

// hasRecord reports whether the slot of epoch holds its first record,
// intact. It leaves the journal positioned at the start of epoch.
func (j *journal) hasRecord(epoch uint64) bool {
	j.restart(epoch)
	_, ok, err := j.readAt(0, 0, make([]byte, journalHeader))
	return err == nil && ok
}

// claims reports whether hdr claims to be record seq of the current epoch
// (so a failed check of it means damage, not the end of the journal).
func (j *journal) claims(hdr []byte, seq uint64) bool {
	return binary.BigEndian.Uint32(hdr[0:]) == journalMagic &&
		binary.BigEndian.Uint64(hdr[8:]) == j.epoch &&
		binary.BigEndian.Uint64(hdr[16:]) == seq
}

// validAfter returns the slot offset of an intact record of the current
// epoch numbered above seq at or after off+journalAlign, or -1.
func (j *journal) validAfter(off int64, seq uint64) int64 {
	hdr := make([]byte, journalHeader)
	for o := off + journalAlign; o+journalHeader <= j.limit(); o += journalAlign {
		if _, err := j.f.ReadAt(hdr, j.base()+o); err != nil {
			return -1
		}
		n := binary.BigEndian.Uint64(hdr[16:])
		if n <= seq || !j.claims(hdr, n) {
			continue
		}
		if _, ok, err := j.readAt(o, n, hdr); err == nil && ok {
			return o
		}
	}
	return -1
}

// readAt reads and checks the record at slot offset off as record seq of
// j.epoch, leaving its payload in j.buf. ok is false if there is no such
// intact record there; hdr then holds the header bytes read.
func (j *journal) readAt(off int64, seq uint64, hdr []byte) (journalRecord, bool, error) {
	at := j.base() + off
	if _, err := j.f.ReadAt(hdr, at); err != nil {
		return journalRecord{}, false, fmt.Errorf("raftlog: read journal %s at %d: %w", j.path, at, err)
	}
	if !j.claims(hdr, seq) {
		return journalRecord{}, false, nil
	}
	n := int64(binary.BigEndian.Uint32(hdr[4:]))
	if off+journalHeader+n > j.limit() {
		return journalRecord{}, false, nil
	}
	full := make([]byte, journalHeader+n)
	copy(full, hdr)
	if _, err := j.f.ReadAt(full[journalHeader:], at+journalHeader); err != nil && !errors.Is(err, io.EOF) {
		return journalRecord{}, false, fmt.Errorf("raftlog: read journal %s at %d: %w", j.path, at, err)
	}
	if recordCRC(full) != binary.BigEndian.Uint32(hdr[24:]) {
		return journalRecord{}, false, nil
	}
	j.buf = full[journalHeader:]
	rec, ok := decodeJournalPayload(j.buf)
	return rec, ok, nil
}

// decodeJournalPayload splits a checksummed payload; ok is false if its
// lengths do not add up (a bug or a checksum collision).
func decodeJournalPayload(p []byte) (r journalRecord, ok bool) {
	if len(p) < 4 {
		return r, false
	}
	h := int(binary.BigEndian.Uint32(p))
	p = p[4:]
	if len(p) < h+12 {
		return r, false
	}
	if h > 0 {
		r.hs = p[:h]
	}
	p = p[h:]
	r.first = binary.BigEndian.Uint64(p)
	count := int(binary.BigEndian.Uint32(p[8:]))
	p = p[12:]
	if count > len(p)/4 {
		return r, false
	}
	r.vals = make([][]byte, 0, count)
	for range count {
		if len(p) < 4 {
			return r, false
		}
		m := int(binary.BigEndian.Uint32(p))
		if len(p) < 4+m {
			return r, false
		}
		r.vals = append(r.vals, p[4:4+m])
		p = p[4+m:]
	}
	return r, len(p) == 0
}

// countJournal counts the intact records that raft.db (format version, its
// consumed epoch) lacks in the journal at path, read-only through fsys: those
// of the next two epochs (one, for a version 2 file). A missing file holds
// none.
func countJournal(fsys FS, path string, version, consumed uint64) (uint64, error) {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("raftlog: open journal: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("raftlog: stat journal %s: %w", path, err)
	}
	j := &journal{f: f, path: path, size: fi.Size(), slot: slotBytes(fi.Size()), legacy: version < formatVersion}
	var total uint64
	for e := consumed + 1; e <= consumed+2; e++ {
		n, _, err := j.replay(e, func(uint64, journalRecord) error { return nil })
		total += n
		if err != nil || n == 0 || j.legacy {
			return total, err
		}
	}
	return total, nil
}

// close closes raft.wal.
func (j *journal) close() error {
	if err := j.f.Close(); err != nil {
		return fmt.Errorf("raftlog: close journal %s: %w", j.path, err)
	}
	return nil
}

// journalHardState decodes a record's hard state for replay.
func journalHardState(path string, seq uint64, b []byte) (raftpb.HardState, error) {
	hs, detail, err := decodeHardState(b)
	if detail != "" {
		return hs, &CorruptError{Path: path, Record: "journal hard state", Index: seq, Detail: detail, Err: err}
	}
	return hs, nil
}

// firstJournalEpoch is where a new raft.db starts counting journal epochs:
// a random number, so that a raft.wal left beside a different raft.db (a
// file replaced by hand) never matches its epochs and is never replayed.
func firstJournalEpoch() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])                    // NB: crypto/rand.Read never returns an error
	return binary.BigEndian.Uint64(b[:]) >> 1 // room to count up
}
