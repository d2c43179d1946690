package store

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/google/btree"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Snapshot stream format, version 1. SNAPSHOT.md is the long form; a
// change here bumps snapshotVersion and edits SNAPSHOT.md in the same PR.
//
//	header   (16 bytes)
//	  0  magic    [8]byte  "LDSTSNAP"
//	  8  version  uint32   big-endian, 1
//	 12  reserved uint32   0 (anything else is refused)
//	records  (repeated, members first by ascending id, then keys by
//	          ascending key bytes, then exactly one trailer record)
//	  0  type     uint8    1 = Member, 2 = KeyValue, 255 = trailer
//	  1  length   uint32   big-endian, payload bytes, <= 64 MiB
//	  5  crc      uint32   big-endian, CRC-32C (Castagnoli) of bytes
//	                       0..4 (type, length) followed by the payload
//	  9  payload  [length]byte
//	                       Member/KeyValue: deterministic protobuf encoding
//	trailer payload (44 bytes, all big-endian)
//	  0  index         uint64  applied index the snapshot was taken at
//	  8  kv_index      uint64  Store.KVIndex at that point
//	 16  members_index uint64  Store.MembersIndex at that point
//	 24  members       uint64  number of Member records
//	 32  keys          uint64  number of KeyValue records
//	 40  body_crc      uint32  CRC-32C of every byte from offset 0 of the
//	                           stream up to the trailer record's type byte
//	after the trailer: end of stream (anything more is refused)
const (
	snapshotMagic   = "LDSTSNAP"
	snapshotVersion = 1

	recMember  = 1
	recKV      = 2
	recTrailer = 255

	headerLen        = 16
	recHeaderLen     = 9
	trailerLen       = 44
	maxRecordPayload = 64 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var _ io.WriterTo = (*Snapshot)(nil)

// Snapshot is a frozen, copy-on-write view of the store at one index. It is
// taken in O(1) by the apply goroutine (Store.Snapshot) and may be encoded
// by any goroutine while Apply goes on: writes after the snapshot copy the
// B-tree nodes they touch instead of changing the shared ones, so the
// snapshot's content (and encoding) never changes. WriteTo may be called
// several times, even concurrently; each call writes the same bytes.
type Snapshot struct {
	index        uint64
	kvIndex      uint64
	membersIndex uint64
	members      []*lodestonepb.Member // sorted by id, immutable
	kv           *btree.BTreeG[item]
}

// Snapshot returns a copy-on-write view of the current state. Call it from
// the apply goroutine (it must not run concurrently with Apply or Restore).
// Holding a Snapshot costs memory for the nodes writes copy since; drop it
// when written.
func (s *Store) Snapshot() *Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	// NB: Clone must not run concurrently with another Clone or a write;
	// the write lock guarantees it even if a caller breaks the one-writer
	// rule.
	return &Snapshot{
		index:        s.index,
		kvIndex:      s.kvIndex,
		membersIndex: s.membersIndex,
		members:      sortedMembers(s.members),
		kv:           s.kv.Clone(),
	}
}

// Index returns the applied index the snapshot was taken at.
func (sn *Snapshot) Index() uint64 { return sn.index }

// WriteTo encodes the snapshot to w in the format above and returns the
// bytes written. It buffers internally; it does not close or sync w.
func (sn *Snapshot) WriteTo(w io.Writer) (int64, error) {
	cw := &countingWriter{w: w}
	bw := bufio.NewWriterSize(cw, 64<<10)
	enc := &encoder{w: bw}

	var hdr [headerLen]byte
	copy(hdr[:], snapshotMagic)
	binary.BigEndian.PutUint32(hdr[8:], snapshotVersion)
	enc.write(hdr[:])

	mo := proto.MarshalOptions{Deterministic: true}
	var buf []byte
	for _, m := range sn.members {
		buf, enc.err = mo.MarshalAppend(buf[:0], m)
		enc.record(recMember, buf)
	}
	var keys uint64
	sn.kv.Ascend(func(it item) bool {
		buf, enc.err = mo.MarshalAppend(buf[:0], it.kv)
		enc.record(recKV, buf)
		keys++
		return enc.err == nil
	})

	var tr [trailerLen]byte
	binary.BigEndian.PutUint64(tr[0:], sn.index)
	binary.BigEndian.PutUint64(tr[8:], sn.kvIndex)
	binary.BigEndian.PutUint64(tr[16:], sn.membersIndex)
	binary.BigEndian.PutUint64(tr[24:], uint64(len(sn.members)))
	binary.BigEndian.PutUint64(tr[32:], keys)
	binary.BigEndian.PutUint32(tr[40:], enc.crc)
	enc.record(recTrailer, tr[:])
	if enc.err == nil {
		enc.err = bw.Flush()
	}
	if enc.err != nil {
		return cw.n, fmt.Errorf("store: write snapshot: %w", enc.err)
	}
	return cw.n, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// encoder writes framed records and keeps the running body CRC. The first
// error sticks and turns later calls into no-ops.
type encoder struct {
	w   *bufio.Writer
	crc uint32
	err error
}

func (e *encoder) write(p []byte) {
	if e.err != nil {
		return
	}
	_, e.err = e.w.Write(p)
	e.crc = crc32.Update(e.crc, castagnoli, p)
}

func (e *encoder) record(typ byte, payload []byte) {
	if e.err != nil {
		return
	}
	if len(payload) > maxRecordPayload {
		e.err = fmt.Errorf("record of %d bytes exceeds %d", len(payload), maxRecordPayload)
		return
	}
	var h [recHeaderLen]byte
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], uint32(len(payload)))
	c := crc32.Update(0, castagnoli, h[:5])
	c = crc32.Update(c, castagnoli, payload)
	binary.BigEndian.PutUint32(h[5:], c)
	if typ == recTrailer {
		// The body CRC in the trailer covers everything before it; write
		// without folding the trailer into it.
		_, e.err = e.w.Write(h[:])
		if e.err == nil {
			_, e.err = e.w.Write(payload)
		}
		return
	}
	e.write(h[:])
	e.write(payload)
}

// Restore replaces the whole state (keys, members, indices) with the
// snapshot read from r, atomically: readers see the old state until the new
// one is complete and verified, then the new one. Call it from the apply
// goroutine. The snapshot's index replaces Index() even if lower (the
// server decides which snapshots to install).
//
// Input that is not a complete, intact version-1 snapshot yields an error
// wrapping ErrCorruptSnapshot (a *CorruptSnapshotError saying what and
// where); a read error from r other than EOF is returned wrapped as is. On
// any error the store is unchanged. Restore reads r to the end of the
// snapshot and checks that nothing follows.
func (s *Store) Restore(r io.Reader) error {
	d := &decoder{r: bufio.NewReaderSize(r, 64<<10)}
	st, err := d.decode()
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kv = st.kv
	s.members = st.members
	s.index = st.index
	s.kvIndex = st.kvIndex
	s.membersIndex = st.membersIndex
	return nil
}

type decoded struct {
	kv                           *btree.BTreeG[item]
	members                      map[uint64]*lodestonepb.Member
	index, kvIndex, membersIndex uint64
}

type decoder struct {
	r       *bufio.Reader
	off     int64
	records int
	crc     uint32
}

// errShort marks a clean or unclean EOF inside read.
var errShort = errors.New("short read")

func (d *decoder) corrupt(off int64, reason string, err error) error {
	return &CorruptSnapshotError{Records: d.records, Offset: off, Reason: reason, Err: err}
}

// read fills p completely. An EOF anywhere yields errShort; other reader
// errors are returned as they are.
func (d *decoder) read(p []byte) error {
	n, err := io.ReadFull(d.r, p)
	d.off += int64(n)
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return errShort
	}
	return err
}

func (d *decoder) readErr(err error, what string) error {
	if err == errShort {
		return d.corrupt(d.off, fmt.Sprintf("truncated after %d records (in %s)", d.records, what), io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("store: read snapshot after %d records: %w", d.records, err)
}

func (d *decoder) decode() (*decoded, error) {
	var hdr [headerLen]byte
	if err := d.read(hdr[:]); err != nil {
		if err == errShort {
			return nil, d.corrupt(0, fmt.Sprintf("truncated header: %d of %d bytes", d.off, headerLen), io.ErrUnexpectedEOF)
		}
		return nil, d.readErr(err, "header")
	}
	if string(hdr[:8]) != snapshotMagic {
		return nil, d.corrupt(0, fmt.Sprintf("bad magic %q, want %q", hdr[:8], snapshotMagic), nil)
	}
	if v := binary.BigEndian.Uint32(hdr[8:]); v != snapshotVersion {
		return nil, d.corrupt(8, fmt.Sprintf("version %d unsupported (this build reads version %d)", v, snapshotVersion), nil)
	}
	if r := binary.BigEndian.Uint32(hdr[12:]); r != 0 {
		return nil, d.corrupt(12, fmt.Sprintf("reserved header field is %#x, want 0", r), nil)
	}
	d.crc = crc32.Update(0, castagnoli, hdr[:])

	st := &decoded{kv: newTree(), members: map[uint64]*lodestonepb.Member{}}
	var (
		lastID  uint64
		lastKey []byte
		nMem    uint64
		nKV     uint64
		maxMod  uint64
		payload []byte
	)
	for {
		recOff := d.off
		var h [recHeaderLen]byte
		if err := d.read(h[:]); err != nil {
			return nil, d.readErr(err, "record header")
		}
		typ := h[0]
		n := binary.BigEndian.Uint32(h[1:])
		if n > maxRecordPayload {
			return nil, d.corrupt(recOff, fmt.Sprintf("record %d length %d exceeds %d", d.records, n, maxRecordPayload), nil)
		}
		if cap(payload) < int(n) {
			// NB: grow from data actually read, not from the claimed
			// length, so a damaged length cannot force a huge allocation.
			var b bytes.Buffer
			if _, err := io.CopyN(&b, d.r, int64(n)); err != nil {
				d.off += int64(b.Len())
				if err == io.EOF {
					err = errShort
				}
				return nil, d.readErr(err, fmt.Sprintf("record %d payload", d.records))
			}
			d.off += int64(n)
			payload = b.Bytes()
		} else {
			payload = payload[:n]
			if err := d.read(payload); err != nil {
				return nil, d.readErr(err, fmt.Sprintf("record %d payload", d.records))
			}
		}
		c := crc32.Update(0, castagnoli, h[:5])
		c = crc32.Update(c, castagnoli, payload)
		if c != binary.BigEndian.Uint32(h[5:]) {
			return nil, d.corrupt(recOff, fmt.Sprintf("record %d checksum mismatch", d.records), nil)
		}

		switch typ {
		case recMember:
			if nKV > 0 {
				return nil, d.corrupt(recOff, fmt.Sprintf("record %d: member after keys", d.records), nil)
			}
			m := &lodestonepb.Member{}
			if err := proto.Unmarshal(payload, m); err != nil {
				return nil, d.corrupt(recOff, fmt.Sprintf("record %d: decode member", d.records), err)
			}
			if m.Id == 0 || m.Id <= lastID {
				return nil, d.corrupt(recOff, fmt.Sprintf("record %d: member id %d not above previous %d", d.records, m.Id, lastID), nil)
			}
			lastID = m.Id
			st.members[m.Id] = m
			nMem++
		case recKV:
			kv := &lodestonepb.KeyValue{}
			if err := proto.Unmarshal(payload, kv); err != nil {
				return nil, d.corrupt(recOff, fmt.Sprintf("record %d: decode key", d.records), err)
			}
			if len(kv.Key) == 0 {
				return nil, d.corrupt(recOff, fmt.Sprintf("record %d: empty key", d.records), nil)
			}
			if nKV > 0 && bytes.Compare(kv.Key, lastKey) <= 0 {
				return nil, d.corrupt(recOff, fmt.Sprintf("record %d: key %q not after %q", d.records, kv.Key, lastKey), nil)
			}
			if len(kv.Value) == 0 {
				kv.Value = nil
			}
			lastKey = kv.Key
			maxMod = max(maxMod, kv.ModifyIndex, kv.CreateIndex)
			// Keys arrive sorted, so each insert goes to the rightmost leaf.
			st.kv.ReplaceOrInsert(itemOf(kv))
			nKV++
		case recTrailer:
			if n != trailerLen {
				return nil, d.corrupt(recOff, fmt.Sprintf("trailer is %d bytes, want %d", n, trailerLen), nil)
			}
			st.index = binary.BigEndian.Uint64(payload[0:])
			st.kvIndex = binary.BigEndian.Uint64(payload[8:])
			st.membersIndex = binary.BigEndian.Uint64(payload[16:])
			wantMem := binary.BigEndian.Uint64(payload[24:])
			wantKV := binary.BigEndian.Uint64(payload[32:])
			if wantMem != nMem || wantKV != nKV {
				return nil, d.corrupt(recOff, fmt.Sprintf("trailer counts %d members and %d keys, read %d and %d", wantMem, wantKV, nMem, nKV), nil)
			}
			if got, want := d.crc, binary.BigEndian.Uint32(payload[40:]); got != want {
				return nil, d.corrupt(recOff, fmt.Sprintf("body checksum mismatch: computed %08x, trailer says %08x", got, want), nil)
			}
			if st.kvIndex > st.index || st.membersIndex > st.index || maxMod > st.index {
				return nil, d.corrupt(recOff, fmt.Sprintf("indices above snapshot index %d (kv %d, members %d, highest key index %d)",
					st.index, st.kvIndex, st.membersIndex, maxMod), nil)
			}
			if _, err := d.r.ReadByte(); err != io.EOF {
				if err != nil {
					return nil, d.readErr(err, "end of stream")
				}
				return nil, d.corrupt(d.off, "unexpected data after trailer", nil)
			}
			return st, nil
		default:
			return nil, d.corrupt(recOff, fmt.Sprintf("record %d: unknown type %d", d.records, typ), nil)
		}
		d.crc = crc32.Update(d.crc, castagnoli, h[:])
		d.crc = crc32.Update(d.crc, castagnoli, payload)
		d.records++
	}
}
