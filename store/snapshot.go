package store

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"runtime"
	"unicode/utf8"

	"github.com/google/btree"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/clusterid"
	"github.com/lodestone-kv/lodestone/store/valuefile"
)

// Snapshot stream format, version 5 (versions 1 to 4 are still read).
// SNAPSHOT.md is the long form; a change here bumps snapshotVersion and
// edits SNAPSHOT.md in the same PR.
//
//	header   (32 bytes; 16 before version 4)
//	  0  magic    [8]byte  "LDSTSNAP"
//	  8  version  uint32   big-endian, 5 (4: no ACL record; 3: no cluster
//	                       id; 2: no admission record; 1: members and keys
//	                       only)
//	 12  reserved uint32   0 (anything else is refused)
//	 16  cluster  [16]byte the cluster id (versions 4 and 5; zero: none)
//	records  (repeated, grouped by type in ascending type order, each
//	          group strictly ascending by its key, then exactly one trailer)
//	  0  type     uint8    see the rec* constants; 255 = trailer
//	  1  length   uint32   big-endian, payload bytes, <= 64 MiB
//	  5  crc      uint32   big-endian, CRC-32C (Castagnoli) of bytes
//	                       0..4 (type, length) followed by the payload
//	  9  payload  [length]byte
//	                       protobuf records: deterministic encoding;
//	                       index records: [8]byte big-endian uint64, then
//	                       the key or name bytes; the admission record
//	                       (at most one): [8]byte index that set it, then
//	                       the AdmissionPolicy; the ACL record (exactly
//	                       one from version 5): an ACLSnapshot
//	trailer payload, version 5 (156 bytes, all big-endian)
//	  0  index          uint64  applied index the snapshot was taken at
//	  8  kv_index       uint64  Store.KVIndex at that point
//	 16  members_index  uint64  Store.MembersIndex
//	 24  nodes_index    uint64  NodesIndex (raw, may be 0)
//	 32  services_index uint64
//	 40  checks_index   uint64
//	 48  sessions_index uint64
//	 56  counts         [12]uint64, records of type 1..12
//	152  body_crc       uint32  CRC-32C of every byte from offset 0 of the
//	                            stream up to the trailer record's type byte
//	trailer payload, versions 3 and 4 (148 bytes): as version 5 with 11
//	  counts, body_crc at 144; version 2 (140 bytes): 10 counts, body_crc
//	  at 136
//	trailer payload, version 1 (44 bytes): index, kv_index, members_index,
//	  members count, keys count (uint64 each), body_crc (uint32)
//	after the trailer: end of stream (anything more is refused)
//
// Migration: versions 1 and 2 hold the admission policy under the KV key
// legacyAdmissionKey; Restore moves it into the admission state and drops
// the key (migrateAdmission).
const (
	snapshotMagic   = "LDSTSNAP"
	snapshotVersion = 5

	recMember       = 1  // lodestone.v1.Member, by id
	recKV           = 2  // lodestone.v1.KeyValue, by key
	recNode         = 3  // lodestone.v1.Node, by name
	recService      = 4  // lodestone.v1.Service, by (node, id)
	recCheck        = 5  // lodestone.v1.Check, by (node, check_id)
	recSession      = 6  // lodestone.v1.SessionEntry, by id
	recTombstone    = 7  // index of the delete + key, by key
	recLockDelay    = 8  // unix nano (int64 as uint64) + key, by key
	recNodeIndex    = 9  // index + node name, by name
	recServiceIndex = 10 // index + service name, by name
	recAdmission    = 11 // index + lodestone.v1.AdmissionPolicy, at most one
	recACL          = 12 // lodestone.v1.ACLSnapshot, exactly one (version 5)
	recTypes        = 12
	recTypesV2      = 10 // record types a version-2 stream may hold
	recTypesV3      = 11 // record types a version-3 or -4 stream may hold
	recTrailer      = 255

	headerLen        = 16
	clusterLen       = 16 // the cluster id after the header, version 4
	recHeaderLen     = 9
	trailerLen       = 44  // version 1
	trailerLenV2     = 140 // version 2
	trailerLenV3     = 148 // versions 3 and 4
	trailerLenV5     = 156 // version 5
	maxRecordPayload = 64 << 20
)

// recNames name record types in corruption reports (singular, plural).
var recNames = [recTypes + 1][2]string{
	{"?", "?"}, {"member", "members"}, {"key", "keys"}, {"node", "nodes"}, {"service", "services"},
	{"check", "checks"}, {"session", "sessions"}, {"tombstone", "tombstones"}, {"lock delay", "lock delays"},
	{"node index", "node indexes"}, {"service index", "service indexes"},
	{"admission policy", "admission policies"}, {"ACL state", "ACL states"},
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var _ io.WriterTo = (*Snapshot)(nil)

// Snapshot is a frozen, copy-on-write view of the store at one index. It is
// taken in O(1) by the apply goroutine (Store.Snapshot) and may be encoded
// by any goroutine while Apply goes on: writes after the snapshot copy the
// B-tree nodes they touch instead of changing the shared ones, so the
// snapshot's content (and encoding) never changes. WriteTo may be called
// several times, even concurrently; each call writes the same bytes.
//
// A Snapshot pins the store's value file (valuefile.File.Pin): slots that
// writes free meanwhile are not reused until it is closed. Close it once
// written; one that is never closed is closed when the collector finds it
// unreachable, but until then the value file only grows.
type Snapshot struct {
	values       *valuefile.File
	unpin        func()
	index        uint64
	kvIndex      uint64
	membersIndex uint64
	members      []*lodestonepb.Member // sorted by id, immutable
	kv           *btree.BTreeG[item]
	tab          tables          // copy-on-write clones
	admission    *admissionState // immutable, nil: none
	acls         *aclState       // immutable
	cluster      clusterid.ID
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
	unpin := s.values.Pin()
	sn := &Snapshot{
		values:       s.values,
		unpin:        unpin,
		index:        s.index,
		kvIndex:      s.kvIndex,
		membersIndex: s.membersIndex,
		members:      sortedMembers(s.members),
		kv:           s.kv.Clone(),
		tab:          s.tab.clone(),
		admission:    s.admission.Load(),
		acls:         s.acls.Load(),
		cluster:      s.ClusterID(),
	}
	runtime.AddCleanup(sn, func(unpin func()) { unpin() }, unpin)
	return sn
}

// Close lets the store reuse the value slots freed since the snapshot was
// taken. WriteTo must not be called after it; a second Close does nothing.
func (sn *Snapshot) Close() { sn.unpin() }

// Index returns the applied index the snapshot was taken at.
func (sn *Snapshot) Index() uint64 { return sn.index }

// WriteTo encodes the snapshot to w in the format above (always the
// current version) and returns the bytes written. It buffers internally;
// it does not close or sync w.
func (sn *Snapshot) WriteTo(w io.Writer) (int64, error) {
	cw := &countingWriter{w: w}
	bw := bufio.NewWriterSize(cw, 64<<10)
	enc := &encoder{w: bw}

	var hdr [headerLen]byte
	copy(hdr[:], snapshotMagic)
	binary.BigEndian.PutUint32(hdr[8:], snapshotVersion)
	enc.write(hdr[:])
	enc.write(sn.cluster[:])

	mo := proto.MarshalOptions{Deterministic: true}
	var buf []byte
	var counts [recTypes + 1]uint64
	msg := func(typ byte, m proto.Message) bool {
		buf, enc.err = mo.MarshalAppend(buf[:0], m)
		enc.record(typ, buf)
		counts[typ]++
		return enc.err == nil
	}
	indexed := func(typ byte, v uint64, key string) bool {
		buf = binary.BigEndian.AppendUint64(buf[:0], v)
		buf = append(buf, key...)
		enc.record(typ, buf)
		counts[typ]++
		return enc.err == nil
	}
	for _, m := range sn.members {
		msg(recMember, m)
	}
	values := sn.values.NewReader()
	sn.kv.Ascend(func(it item) bool {
		v, err := values.Read(it.r.value)
		if err != nil {
			enc.err = err
			return false
		}
		enc.kvRecord(it.key(), it.r, v)
		counts[recKV]++
		return enc.err == nil
	})
	t := sn.tab
	t.nodes.ascend(func(_ string, n *lodestonepb.Node) bool { return msg(recNode, n) })
	t.services.ascend(func(_ string, v *lodestonepb.Service) bool { return msg(recService, v) })
	t.checks.ascend(func(_ string, c *lodestonepb.Check) bool { return msg(recCheck, c) })
	t.sessions.ascend(func(_ string, v *lodestonepb.SessionEntry) bool { return msg(recSession, v) })
	t.tombstones.ascend(func(k string, i uint64) bool { return indexed(recTombstone, i, k) })
	t.lockDelays.ascend(func(k string, u int64) bool { return indexed(recLockDelay, uint64(u), k) })
	t.nodeIdx.ascend(func(k string, i uint64) bool { return indexed(recNodeIndex, i, k) })
	t.serviceIdx.ascend(func(k string, i uint64) bool { return indexed(recServiceIndex, i, k) })
	if a := sn.admission; a != nil && enc.err == nil {
		buf = binary.BigEndian.AppendUint64(buf[:0], a.index)
		buf, enc.err = mo.MarshalAppend(buf, a.policy)
		enc.record(recAdmission, buf)
		counts[recAdmission]++
	}
	if enc.err == nil {
		msg(recACL, sn.acls.snapshot())
	}

	var tr [trailerLenV5]byte
	for i, v := range []uint64{sn.index, sn.kvIndex, sn.membersIndex, t.nodesIndex, t.servicesIndex, t.checksIndex, t.sessionsIndex} {
		binary.BigEndian.PutUint64(tr[8*i:], v)
	}
	for typ := 1; typ <= recTypes; typ++ {
		binary.BigEndian.PutUint64(tr[56+8*(typ-1):], counts[typ])
	}
	binary.BigEndian.PutUint32(tr[56+8*recTypes:], enc.crc)
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
	// head and tail are kvRecord's buffers for what comes before and
	// after a value; hdr is a record's header. NB: in the encoder, since
	// a header written through the buffered writer escapes: on the stack,
	// an allocation per record.
	head, tail []byte
	hdr        [recHeaderLen]byte
}

func (e *encoder) write(p []byte) {
	if e.err != nil {
		return
	}
	_, e.err = e.w.Write(p)
	e.crc = crc32.Update(e.crc, castagnoli, p)
}

// kvRecord writes key's entry r with value as a KeyValue record whose
// payload is the bytes proto's deterministic Marshal gives (the fields in
// number order, zero values left out), the value written from where it
// lies. NB: marshaled into a buffer first, every value was copied once
// more on its way to the file, and a state of large values is mostly
// values.
func (e *encoder) kvRecord(key []byte, kv *row, value []byte) {
	if e.err != nil {
		return
	}
	head := e.head[:0]
	if len(key) > 0 {
		head = protowire.AppendBytes(protowire.AppendTag(head, 1, protowire.BytesType), key)
	}
	if len(value) > 0 {
		head = protowire.AppendVarint(protowire.AppendTag(head, 2, protowire.BytesType), uint64(len(value)))
	}
	tail := e.tail[:0]
	for i, v := range [...]uint64{kv.CreateIndex, kv.ModifyIndex, kv.lockIndex(), kv.Flags} {
		if v != 0 {
			tail = protowire.AppendVarint(protowire.AppendTag(tail, protowire.Number(3+i), protowire.VarintType), v)
		}
	}
	if kv.session() != "" {
		tail = protowire.AppendString(protowire.AppendTag(tail, 7, protowire.BytesType), kv.session())
	}
	e.head, e.tail = head, tail
	e.record(recKV, head, value, tail)
}

// record writes one record whose payload is the parts, in order.
func (e *encoder) record(typ byte, parts ...[]byte) {
	if e.err != nil {
		return
	}
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if n > maxRecordPayload {
		e.err = fmt.Errorf("record of %d bytes exceeds %d", n, maxRecordPayload)
		return
	}
	h := &e.hdr
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], uint32(n))
	c := crc32.Update(0, castagnoli, h[:5])
	for _, p := range parts {
		c = crc32.Update(c, castagnoli, p)
	}
	binary.BigEndian.PutUint32(h[5:], c)
	if typ == recTrailer {
		// The body CRC in the trailer covers everything before it; write
		// without folding the trailer into it.
		_, e.err = e.w.Write(h[:])
		for _, p := range parts {
			if e.err == nil {
				_, e.err = e.w.Write(p)
			}
		}
		return
	}
	e.write(h[:])
	for _, p := range parts {
		e.write(p)
	}
}

// Restore replaces the whole state (keys, members, catalog, sessions,
// indices) with the snapshot read from r, atomically: readers see the old
// state until the new one is complete and verified, then the new one. Call
// it from the apply goroutine. The snapshot's index replaces Index() even
// if lower (the server decides which snapshots to install).
//
// Versions 1 (members and keys only: the catalog and sessions restore
// empty), 2, 3, 4 (no ACL tables: they restore as a new store's) and 5 are
// read. A version 1 or 2 snapshot holds the admission
// policy as the KV key _lodestone/admission: Restore moves it into the
// admission state and drops the key (see SNAPSHOT.md, "Migration from
// versions 1 and 2"). Input that is not a complete, intact snapshot of
// a version this build reads yields an error wrapping ErrCorruptSnapshot (a
// *CorruptSnapshotError saying what and where); a read error from r other
// than EOF is returned wrapped as is. On any error the store is unchanged.
// Restore reads r to the end of the snapshot and checks that nothing
// follows.
func (s *Store) Restore(r io.Reader) error {
	return s.restore(r, 0)
}

// RestoreShared restores the snapshot r streams as Restore does, but
// leaves its values where they lie in base, a file that reads the same
// bytes at the offsets r streams them from (the snapshot file r reads,
// from its start). No value is copied, so a large restore is cheaper by
// about the size of its values; base stays open until every value in it
// is overwritten or deleted. The store owns base from the call on, in
// every case.
func (s *Store) RestoreShared(r io.Reader, base valuefile.Base) error {
	return s.restore(r, s.values.AddBase(base))
}

func (s *Store) restore(r io.Reader, base uint32) error {
	st, err := decodeInto(r, s.values, base)
	if err != nil {
		return err
	}
	der := rebuildDerived(st.kv, st.tab)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.freeValues(s.kv)
	s.kv = st.kv
	s.members = st.members
	s.index = st.index
	s.kvIndex = st.kvIndex
	s.membersIndex = st.membersIndex
	s.tab = st.tab
	s.der = der
	s.admission.Store(st.admission)
	if st.acls == nil {
		st.acls = newACLState() // before version 5: no ACLs yet
	}
	s.acls.Store(st.acls)
	if !st.cluster.IsZero() {
		// NB: a snapshot of version 3 or before names no cluster; the
		// store keeps the id it knows.
		s.SetClusterID(st.cluster)
	}
	return nil
}

// SnapshotInfo is what VerifySnapshot learned of a snapshot.
type SnapshotInfo struct {
	Index   uint64       // the applied index it was taken at
	Cluster clusterid.ID // zero: written before snapshots named a cluster
}

// VerifySnapshot decodes a whole snapshot with every check Restore makes,
// keeps nothing, and says which cluster and index it holds. It lets a
// receiver refuse a snapshot before anything else sees it.
func VerifySnapshot(r io.Reader) (SnapshotInfo, error) {
	st, err := decodeInto(r, valuefile.Discard(), 0)
	if err != nil {
		return SnapshotInfo{}, err
	}
	return SnapshotInfo{Index: st.index, Cluster: st.cluster}, nil
}

// decodeInto decodes the snapshot in r, its values into values: all of
// them, or on an error none. With a non-zero base (valuefile.AddBase),
// the values stay where they lie in it, at the offsets r streams them
// from; on an error the base is dropped.
func decodeInto(r io.Reader, values *valuefile.File, base uint32) (*decoded, error) {
	sink := valueSink{f: values, batch: values.NewBatch(), base: base}
	d := &decoder{r: bufio.NewReaderSize(r, 64<<10), values: sink}
	st, err := d.decode()
	if err != nil {
		sink.batch.Abort()
		if base != 0 {
			err = errors.Join(err, values.DropBase(base))
		}
		return nil, err
	}
	for _, ref := range st.dropped {
		values.Free(ref)
	}
	return st, nil
}

// valueSink takes a decoded value: it counts one that lies in the base at
// a known offset where it is, and copies any other into the slot file.
type valueSink struct {
	f     *valuefile.File
	batch *valuefile.Batch
	base  uint32
}

func (s valueSink) put(v []byte, at int64) (valuefile.Ref, error) {
	if s.base != 0 && at >= 0 {
		return s.f.BaseRef(s.base, at, len(v))
	}
	return s.batch.Put(v)
}

// freeValues frees every value in tree, a tree the store no longer holds.
// A Snapshot that still holds it keeps its values readable (File.Pin).
func (s *Store) freeValues(tree *btree.BTreeG[item]) {
	tree.Ascend(func(it item) bool {
		s.values.Free(it.r.value)
		return true
	})
}

type decoded struct {
	kv                           *btree.BTreeG[item]
	legacyAdmission              []byte          // the value of legacyAdmissionKey (versions 1 and 2)
	dropped                      []valuefile.Ref // values decoded into the file but not kept
	members                      map[uint64]*lodestonepb.Member
	tab                          tables
	admission                    *admissionState // nil: none
	acls                         *aclState       // nil: none in the stream
	index, kvIndex, membersIndex uint64
	cluster                      clusterid.ID // zero before version 4
}

type decoder struct {
	r       *bufio.Reader
	values  valueSink // where the KV records' values go
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
	version := binary.BigEndian.Uint32(hdr[8:])
	if version < 1 || version > snapshotVersion {
		return nil, d.corrupt(8, fmt.Sprintf("version %d unsupported (this build reads versions 1 to %d)", version, snapshotVersion), nil)
	}
	if r := binary.BigEndian.Uint32(hdr[12:]); r != 0 {
		return nil, d.corrupt(12, fmt.Sprintf("reserved header field is %#x, want 0", r), nil)
	}
	d.crc = crc32.Update(0, castagnoli, hdr[:])
	var cluster clusterid.ID
	if version >= 4 {
		if err := d.read(cluster[:]); err != nil {
			if err == errShort {
				return nil, d.corrupt(headerLen, fmt.Sprintf("truncated header: %d of %d bytes", d.off, headerLen+clusterLen), io.ErrUnexpectedEOF)
			}
			return nil, d.readErr(err, "header")
		}
		d.crc = crc32.Update(d.crc, castagnoli, cluster[:])
	}
	maxType := byte(recTypes)
	switch version {
	case 1:
		maxType = recKV
	case 2:
		maxType = recTypesV2
	case 3, 4:
		maxType = recTypesV3
	}

	st := &decoded{kv: newTree(), members: map[uint64]*lodestonepb.Member{}, tab: newTables(), cluster: cluster}
	var (
		lastType byte
		lastID   uint64
		lastKey  string // of the current group (string-keyed types)
		lastKV   []byte
		counts   [recTypes + 1]uint64
		maxMod   uint64 // highest create/modify index of any record
		payload  []byte
		// h is each record's header. NB: declared once, since reading into
		// it moves it to the heap: in the loop, an allocation per record.
		h [recHeaderLen]byte
	)
	for {
		recOff := d.off
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
		bad := func(format string, args ...any) error {
			return d.corrupt(recOff, fmt.Sprintf("record %d: ", d.records)+fmt.Sprintf(format, args...), nil)
		}

		if typ == recTrailer {
			if err := d.trailer(recOff, version, payload, st, &counts, maxMod); err != nil {
				return nil, err
			}
			if version < 3 {
				migrateAdmission(st)
			}
			return st, nil
		}
		if typ == 0 || typ > maxType {
			return nil, bad("unknown type %d", typ)
		}
		if typ < lastType {
			return nil, bad("%s after %s", recNames[typ][0], recNames[lastType][1])
		}
		if typ != lastType {
			lastType, lastKey = typ, ""
		}
		// key is the record's ordering key within its group; insert adds
		// the record once the order is checked.
		var (
			key    string
			insert func()
		)
		switch typ {
		case recMember:
			m := &lodestonepb.Member{}
			if err := proto.Unmarshal(payload, m); err != nil {
				return nil, d.corrupt(recOff, fmt.Sprintf("record %d: decode member", d.records), err)
			}
			if m.Id == 0 || m.Id <= lastID {
				return nil, bad("member id %d not above previous %d", m.Id, lastID)
			}
			lastID = m.Id
			st.members[m.Id] = m
		case recKV:
			kv, err := decodeKV(payload)
			if err != nil {
				return nil, d.corrupt(recOff, fmt.Sprintf("record %d: decode key", d.records), err)
			}
			if len(kv.key) == 0 {
				return nil, bad("empty key")
			}
			// NB: keys are compared as bytes here, not through the string
			// key below, to spare an allocation per key on a large restore.
			if counts[recKV] > 0 && bytes.Compare(kv.key, lastKV) <= 0 {
				return nil, bad("key %q not after %q", kv.key, lastKV)
			}
			lastKV = bytes.Clone(kv.key)
			if version < 3 && string(lastKV) == legacyAdmissionKey {
				st.legacyAdmission = bytes.Clone(kv.value)
			}
			at := int64(-1)
			if kv.valueAt >= 0 {
				at = recOff + recHeaderLen + int64(kv.valueAt)
			}
			ref, err := d.values.put(kv.value, at)
			if err != nil {
				return nil, err
			}
			maxMod = max(maxMod, kv.modifyIndex, kv.createIndex)
			// Keys arrive sorted, so each insert goes to the rightmost leaf.
			// NB: inserted here, not through insert: a closure per key
			// was an allocation per key.
			r := &row{CreateIndex: kv.createIndex, ModifyIndex: kv.modifyIndex, Flags: kv.flags, value: ref}
			if kv.lockIndex != 0 || kv.session != "" {
				r.lock = &lockState{index: kv.lockIndex, session: kv.session}
			}
			st.kv.ReplaceOrInsert(keep(lastKV, r))
		case recNode:
			v := &lodestonepb.Node{}
			if err := proto.Unmarshal(payload, v); err != nil {
				return nil, d.corrupt(recOff, fmt.Sprintf("record %d: decode node", d.records), err)
			}
			if checkName("name", v.Name, true) != nil {
				return nil, bad("node name %q is empty or holds NUL", v.Name)
			}
			key, maxMod = v.Name, max(maxMod, v.CreateIndex, v.ModifyIndex)
			insert = (func() { st.tab.nodes.set(key, v) })
		case recService:
			v := &lodestonepb.Service{}
			if err := proto.Unmarshal(payload, v); err != nil {
				return nil, d.corrupt(recOff, fmt.Sprintf("record %d: decode service", d.records), err)
			}
			if checkName("id", v.Id, true) != nil || checkName("name", v.Name, true) != nil {
				return nil, bad("service id %q or name %q is empty or holds NUL", v.Id, v.Name)
			}
			if _, ok := st.tab.nodes.get(v.Node); !ok {
				return nil, bad("service %q on unknown node %q", v.Id, v.Node)
			}
			key, maxMod = compositeKey(v.Node, v.Id), max(maxMod, v.CreateIndex, v.ModifyIndex)
			insert = (func() { st.tab.services.set(key, v) })
		case recCheck:
			v := &lodestonepb.Check{}
			if err := proto.Unmarshal(payload, v); err != nil {
				return nil, d.corrupt(recOff, fmt.Sprintf("record %d: decode check", d.records), err)
			}
			if checkName("id", v.CheckId, true) != nil || checkName("service_id", v.ServiceId, false) != nil {
				return nil, bad("check id %q or service id %q is empty or holds NUL", v.CheckId, v.ServiceId)
			}
			if _, ok := st.tab.nodes.get(v.Node); !ok {
				return nil, bad("check %q on unknown node %q", v.CheckId, v.Node)
			}
			if _, ok := st.tab.services.get(compositeKey(v.Node, v.ServiceId)); v.ServiceId != "" && !ok {
				return nil, bad("check %q of unknown service %q on node %q", v.CheckId, v.ServiceId, v.Node)
			}
			key, maxMod = compositeKey(v.Node, v.CheckId), max(maxMod, v.CreateIndex, v.ModifyIndex)
			insert = (func() { st.tab.checks.set(key, v) })
		case recAdmission:
			if counts[recAdmission] > 0 {
				return nil, bad("more than one admission policy")
			}
			if len(payload) < 8 {
				return nil, bad("admission record is %d bytes, want at least 8", len(payload))
			}
			a := &admissionState{policy: &lodestonepb.AdmissionPolicy{}, index: binary.BigEndian.Uint64(payload)}
			if a.index == 0 {
				return nil, bad("admission policy set at index 0")
			}
			if err := proto.Unmarshal(payload[8:], a.policy); err != nil {
				return nil, d.corrupt(recOff, fmt.Sprintf("record %d: decode admission policy", d.records), err)
			}
			maxMod = max(maxMod, a.index)
			insert = func() { st.admission = a }
		case recACL:
			if counts[recACL] > 0 {
				return nil, bad("more than one ACL state")
			}
			m := &lodestonepb.ACLSnapshot{}
			if err := proto.Unmarshal(payload, m); err != nil {
				return nil, d.corrupt(recOff, fmt.Sprintf("record %d: decode ACL state", d.records), err)
			}
			acls, why := aclFromSnapshot(m)
			if why != "" {
				return nil, bad("%s", why)
			}
			maxMod = max(maxMod, acls.index, acls.bootstrapIndex)
			insert = func() { st.acls = acls }
		case recSession:
			v := &lodestonepb.SessionEntry{}
			if err := proto.Unmarshal(payload, v); err != nil {
				return nil, d.corrupt(recOff, fmt.Sprintf("record %d: decode session", d.records), err)
			}
			if checkName("id", v.Id, true) != nil {
				return nil, bad("session id %q is empty or holds NUL", v.Id)
			}
			if _, ok := st.tab.nodes.get(v.Node); !ok {
				return nil, bad("session %q on unknown node %q", v.Id, v.Node)
			}
			for _, c := range sessionCheckIDs(v) {
				if _, ok := st.tab.checks.get(compositeKey(v.Node, c)); !ok {
					return nil, bad("session %q bound to unknown check %q", v.Id, c)
				}
			}
			key, maxMod = v.Id, max(maxMod, v.CreateIndex, v.ModifyIndex)
			insert = (func() { st.tab.sessions.set(key, v) })
		default: // the index records: [8]byte value, then the key
			if len(payload) < 9 {
				return nil, bad("%s record is %d bytes, want at least 9", recNames[typ][0], len(payload))
			}
			val := binary.BigEndian.Uint64(payload)
			key = string(payload[8:])
			switch typ {
			case recTombstone:
				maxMod = max(maxMod, val)
				insert = func() { st.tab.tombstones.set(key, val) }
			case recLockDelay:
				insert = func() { st.tab.lockDelays.set(key, int64(val)) }
			case recNodeIndex:
				if _, ok := st.tab.nodes.get(key); !ok {
					return nil, bad("node index of unknown node %q", key)
				}
				maxMod = max(maxMod, val)
				insert = func() { st.tab.nodeIdx.set(key, val) }
			case recServiceIndex:
				maxMod = max(maxMod, val)
				insert = func() { st.tab.serviceIdx.set(key, val) }
			}
		}
		if typ != recMember && typ != recKV && typ != recAdmission && typ != recACL {
			if counts[typ] > 0 && key <= lastKey {
				return nil, bad("%s %q not after %q", recNames[typ][0], key, lastKey)
			}
			lastKey = key
		}
		if insert != nil {
			insert()
		}
		counts[typ]++
		d.crc = crc32.Update(d.crc, castagnoli, h[:])
		d.crc = crc32.Update(d.crc, castagnoli, payload)
		d.records++
	}
}

// trailer checks the trailer record against what was read and fills the
// indices of st.
func (d *decoder) trailer(recOff int64, version uint32, p []byte, st *decoded, counts *[recTypes + 1]uint64, maxMod uint64) error {
	want, types := trailerLenV5, recTypes
	switch version {
	case 1:
		want = trailerLen
	case 2:
		want, types = trailerLenV2, recTypesV2
	case 3, 4:
		want, types = trailerLenV3, recTypesV3
	}
	if len(p) != want {
		return d.corrupt(recOff, fmt.Sprintf("trailer is %d bytes, want %d", len(p), want), nil)
	}
	u := func(off int) uint64 { return binary.BigEndian.Uint64(p[off:]) }
	st.index, st.kvIndex, st.membersIndex = u(0), u(8), u(16)
	var bodyCRC uint32
	if version == 1 {
		if u(24) != counts[recMember] || u(32) != counts[recKV] {
			return d.corrupt(recOff, fmt.Sprintf("trailer counts %d members and %d keys, read %d and %d",
				u(24), u(32), counts[recMember], counts[recKV]), nil)
		}
		bodyCRC = binary.BigEndian.Uint32(p[40:])
	} else {
		t := &st.tab
		t.nodesIndex, t.servicesIndex, t.checksIndex, t.sessionsIndex = u(24), u(32), u(40), u(48)
		for typ := 1; typ <= types; typ++ {
			if got, want := counts[typ], u(56+8*(typ-1)); got != want {
				return d.corrupt(recOff, fmt.Sprintf("trailer counts %d %s, read %d", want, recNames[typ][1], got), nil)
			}
		}
		bodyCRC = binary.BigEndian.Uint32(p[56+8*types:])
	}
	if got, want := d.crc, bodyCRC; got != want {
		return d.corrupt(recOff, fmt.Sprintf("body checksum mismatch: computed %08x, trailer says %08x", got, want), nil)
	}
	t := st.tab
	if top := max(st.kvIndex, st.membersIndex, maxMod, t.nodesIndex, t.servicesIndex, t.checksIndex, t.sessionsIndex); top > st.index {
		return d.corrupt(recOff, fmt.Sprintf("indices above snapshot index %d (kv %d, members %d, catalog %d/%d/%d/%d, highest record index %d)",
			st.index, st.kvIndex, st.membersIndex, t.nodesIndex, t.servicesIndex, t.checksIndex, t.sessionsIndex, maxMod), nil)
	}
	// Every lock must belong to a live session.
	var orphan error
	st.kv.Ascend(func(it item) bool {
		if s := it.r.session(); s != "" {
			if _, ok := t.sessions.get(s); !ok {
				orphan = d.corrupt(recOff, fmt.Sprintf("key %q held by unknown session %q", it.key(), s), nil)
				return false
			}
		}
		return true
	})
	if orphan != nil {
		return orphan
	}
	if version >= 5 && st.acls == nil {
		return d.corrupt(recOff, "no ACL state record", nil)
	}
	if _, err := d.r.ReadByte(); err != io.EOF {
		if err != nil {
			return d.readErr(err, "end of stream")
		}
		return d.corrupt(d.off, "unexpected data after trailer", nil)
	}
	return nil
}

// kvFields is a KeyValue record's content as decodeKV reads it: the byte
// fields alias the payload, which the decoder reuses for the next record.
type kvFields struct {
	key, value                                 []byte
	valueAt                                    int // where value starts in the payload; -1: unknown
	session                                    string
	createIndex, modifyIndex, lockIndex, flags uint64
}

// decodeKV decodes a KeyValue record's payload as proto.Unmarshal does,
// without an allocation. NB: by hand because proto.Unmarshal and its
// three allocations per key were half of a million-key restore's CPU.
// Anything this build does not write (an unknown field, another wire
// type, a session that is not UTF-8) goes to proto.Unmarshal, whose answer
// is then the one returned.
func decodeKV(b []byte) (kvFields, error) {
	f := kvFields{valueAt: -1}
	var session []byte
	for p := b; len(p) > 0; {
		num, typ, n := protowire.ConsumeTag(p)
		if n < 0 {
			return viaProto(b)
		}
		m := protowire.ConsumeFieldValue(num, typ, p[n:])
		if m < 0 {
			return viaProto(b)
		}
		field := p[n : n+m]
		p = p[n+m:]
		switch {
		case typ == protowire.BytesType && (num == 1 || num == 2 || num == 7):
			v, _ := protowire.ConsumeBytes(field)
			switch num {
			case 1:
				f.key = v
			case 2:
				f.value = v
				f.valueAt = len(b) - len(p) - len(v)
			default:
				if !utf8.Valid(v) {
					return viaProto(b) // NB: proto checks every occurrence
				}
				session = v
			}
		case typ == protowire.VarintType && num >= 3 && num <= 6:
			v, _ := protowire.ConsumeVarint(field)
			switch num {
			case 3:
				f.createIndex = v
			case 4:
				f.modifyIndex = v
			case 5:
				f.lockIndex = v
			default:
				f.flags = v
			}
		default:
			return viaProto(b)
		}
	}
	if len(session) > 0 {
		f.session = string(session)
	}
	return f, nil
}

// viaProto is decodeKV's way out for a payload it does not decode itself.
func viaProto(b []byte) (kvFields, error) {
	kv := &lodestonepb.KeyValue{}
	if err := proto.Unmarshal(b, kv); err != nil {
		return kvFields{}, err
	}
	return kvFields{key: kv.Key, value: kv.Value, valueAt: -1, session: kv.Session, createIndex: kv.CreateIndex,
		modifyIndex: kv.ModifyIndex, lockIndex: kv.LockIndex, flags: kv.Flags}, nil
}
