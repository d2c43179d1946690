package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/lodestone-kv/lodestone/internal/clusterid"
	"hash/crc32"
	"io"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// TestSnapshotRoundTrip restores a snapshot taken mid-stream into a fresh
// store, replays the rest of the stream on it, and compares with a store
// that applied the whole stream: the same answer two ways.
func TestSnapshotRoundTrip(t *testing.T) {
	seed := testSeed(t)
	steps := randomSteps(seed, 2000)
	for _, cut := range []int{0, 1, 700, len(steps)} {
		t.Run(fmt.Sprintf("cut at %d", cut), func(t *testing.T) {
			direct := New()
			run(t, direct, steps[:cut])
			b := encode(t, direct)

			restored := New()
			restored.Apply(1, putCmd("stale", "state")) // must be replaced, not merged
			restored.SetMember(2, &lodestonepb.Member{Id: 77, Name: "stale"})
			if err := restored.Restore(bytes.NewReader(b)); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			checkInvariants(t, restored)
			compareStores(t, restored, direct)
			if got, want := encode(t, restored), b; !bytes.Equal(got, want) {
				t.Errorf("re-encoding a restored store gives different bytes")
			}

			// Replaying the whole log on the restored store: the part up
			// to the cut is a no-op, the rest must match the direct path.
			tr := run(t, restored, steps)
			td := run(t, direct, steps[cut:])
			if got, want := tr[len(tr)-len(td):], td; strings.Join(got, "\n") != strings.Join(want, "\n") {
				t.Errorf("results after restore differ from direct application")
			}
			checkInvariants(t, restored)
			compareStores(t, restored, direct)
		})
	}
}

// compareStores checks every key, member, catalog row, side table and
// index.
func compareStores(t *testing.T, got, want *Store) {
	t.Helper()
	if g, w := got.Index(), want.Index(); g != w {
		t.Errorf("Index = %d, want %d", g, w)
	}
	if g, w := got.KVIndex(), want.KVIndex(); g != w {
		t.Errorf("KVIndex = %d, want %d", g, w)
	}
	if g, w := got.MembersIndex(), want.MembersIndex(); g != w {
		t.Errorf("MembersIndex = %d, want %d", g, w)
	}
	gp, gi := got.Admission()
	wp, wi := want.Admission()
	if gi != wi || !proto.Equal(gp, wp) || (gp == nil) != (wp == nil) {
		t.Errorf("Admission = %d %s, want %d %s", gi, fmtPolicy(gp), wi, fmtPolicy(wp))
	}
	gk, _, _ := got.Range(nil, nil, 0, false)
	wk, _, _ := want.Range(nil, nil, 0, false)
	if g, w := len(gk), len(wk); g != w {
		t.Errorf("%d keys, want %d", g, w)
	}
	for i := 0; i < min(len(gk), len(wk)); i++ {
		if !proto.Equal(gk[i], wk[i]) {
			t.Errorf("key %d: %s, want %s", i, fmtKV(gk[i]), fmtKV(wk[i]))
		}
	}
	if g, w := dumpCatalog(got), dumpCatalog(want); g != w {
		t.Errorf("catalog differs:\n%s\nwant\n%s", g, w)
	}
	gm, wm := got.Members(), want.Members()
	if g, w := len(gm), len(wm); g != w {
		t.Errorf("%d members, want %d", g, w)
	}
	for i := 0; i < min(len(gm), len(wm)); i++ {
		if !proto.Equal(gm[i], wm[i]) {
			t.Errorf("member %d: %v, want %v", i, gm[i], wm[i])
		}
	}
}

func TestSnapshotIsCopyOnWrite(t *testing.T) {
	d := newDriver(t)
	for i := 0; i < 500; i++ { // enough keys for a multi-level tree
		d.apply(putCmd(fmt.Sprintf("k/%04d", i), "v"))
	}
	d.s.SetMember(d.s.Index(), &lodestonepb.Member{Id: 1, Name: "n1"})
	sn := d.s.Snapshot()
	if got, want := sn.Index(), uint64(500); got != want {
		t.Errorf("snapshot index = %d, want %d", got, want)
	}
	var first bytes.Buffer
	if _, err := sn.WriteTo(&first); err != nil {
		t.Fatal(err)
	}

	// Every kind of write after the snapshot.
	d.applyAll(
		putCmd("k/0000", "changed"),
		putCmd("k/9999", "new"),
		delCmd("k/0100"),
		delPrefix("k/02"),
		txnCmd(opSet("k/0300", "t"), op(DELETE, "k/0301"), op(DELETE_PREFIX, "k/04")),
	)
	d.s.SetMember(d.s.Index()+1, &lodestonepb.Member{Id: 2, Name: "n2"})
	d.s.RemoveMember(d.s.Index()+1, 1)
	if err := d.s.Restore(bytes.NewReader(encode(t, New()))); err != nil { // even a full replace
		t.Fatal(err)
	}

	var second bytes.Buffer
	if _, err := sn.WriteTo(&second); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first.Bytes(), second.Bytes()) {
		t.Fatalf("snapshot encoding changed after later writes (%d vs %d bytes)", first.Len(), second.Len())
	}
	fresh := New()
	if err := fresh.Restore(&second); err != nil {
		t.Fatal(err)
	}
	if got, want := fresh.Len(), 500; got != want {
		t.Errorf("restored %d keys, want %d", got, want)
	}
	if kv, _ := fresh.Get([]byte("k/0000")); string(kv.GetValue()) != "v" {
		t.Errorf("k/0000 = %q in the snapshot, want %q", kv.GetValue(), "v")
	}
}

// rawSnapshot builds a stream record by record, with valid framing and
// checksums unless the test breaks them afterwards.
type rawSnapshot struct {
	buf bytes.Buffer
	crc uint32
}

func newRaw(version uint32) *rawSnapshot {
	r := &rawSnapshot{}
	var h [headerLen]byte
	copy(h[:], snapshotMagic)
	binary.BigEndian.PutUint32(h[8:], version)
	r.buf.Write(h[:])
	r.crc = crc32.Update(0, castagnoli, h[:])
	if version >= 4 {
		var id [clusterLen]byte // no cluster
		r.buf.Write(id[:])
		r.crc = crc32.Update(r.crc, castagnoli, id[:])
	}
	return r
}

func (r *rawSnapshot) record(typ byte, payload []byte) *rawSnapshot {
	var h [recHeaderLen]byte
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], uint32(len(payload)))
	c := crc32.Update(crc32.Update(0, castagnoli, h[:5]), castagnoli, payload)
	binary.BigEndian.PutUint32(h[5:], c)
	r.buf.Write(h[:])
	r.buf.Write(payload)
	if typ != recTrailer {
		r.crc = crc32.Update(crc32.Update(r.crc, castagnoli, h[:]), castagnoli, payload)
	}
	return r
}

func (r *rawSnapshot) kv(key string, modify uint64) *rawSnapshot {
	b, _ := proto.Marshal(&lodestonepb.KeyValue{Key: []byte(key), Value: []byte("v"), CreateIndex: modify, ModifyIndex: modify})
	return r.record(recKV, b)
}

func (r *rawSnapshot) member(id uint64) *rawSnapshot {
	b, _ := proto.Marshal(&lodestonepb.Member{Id: id, Name: fmt.Sprint("n", id)})
	return r.record(recMember, b)
}

func (r *rawSnapshot) trailer(index, members, keys uint64) *rawSnapshot {
	var p [trailerLen]byte
	binary.BigEndian.PutUint64(p[0:], index)
	binary.BigEndian.PutUint64(p[8:], index)
	binary.BigEndian.PutUint64(p[24:], members)
	binary.BigEndian.PutUint64(p[32:], keys)
	binary.BigEndian.PutUint32(p[40:], r.crc)
	return r.record(recTrailer, p[:])
}

func (r *rawSnapshot) bytes() []byte { return r.buf.Bytes() }

func TestRestoreRefusesDamage(t *testing.T) {
	good := newDriver(t)
	good.applyAll(putCmd("a", "1"), putCmd("b", "2"), putCmd("c", "3"))
	good.s.SetMember(4, &lodestonepb.Member{Id: 9, Name: "n9"})
	valid := encode(t, good.s)
	mutate := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(valid)) }
	const kvRecOff = headerLen + clusterLen // first record is the member
	tests := []struct {
		name  string
		input []byte
		want  string // substring of the reason
	}{
		{"empty input", nil, "truncated header: 0 of 16 bytes"},
		{"short header", valid[:10], "truncated header: 10 of 16 bytes"},
		{"bad magic", mutate(func(b []byte) []byte { copy(b, "NOTASNAP"); return b }), `bad magic "NOTASNAP", want "LDSTSNAP"`},
		{"future version", mutate(func(b []byte) []byte { binary.BigEndian.PutUint32(b[8:], 6); return b }), "version 6 unsupported (this build reads versions 1 to 5)"},
		{"reserved set", mutate(func(b []byte) []byte { b[15] = 1; return b }), "reserved header field is 0x1, want 0"},
		{"truncated in cluster id", valid[:headerLen+3], "truncated header: 19 of 32 bytes"},
		{"truncated after header", valid[:kvRecOff], "truncated after 0 records (in record header)"},
		{"truncated inside second record", valid[:kvRecOff+recHeaderLen+20], "truncated after 1 records (in record 1 payload)"},
		{"cluster id changed", mutate(func(b []byte) []byte { b[headerLen] ^= 1; return b }), "body checksum mismatch"},
		{"no trailer", valid[:len(valid)-recHeaderLen-trailerLenV5], "truncated after 5 records (in record header)"},
		{"cut in trailer", valid[:len(valid)-1], "truncated after 5 records (in record 5 payload)"},
		{"payload bit flip", mutate(func(b []byte) []byte { b[len(b)-recHeaderLen-trailerLenV5-2] ^= 0x01; return b }), "record 4 checksum mismatch"},
		{"crc damaged", mutate(func(b []byte) []byte { b[kvRecOff+5] ^= 0xff; return b }), "record 0 checksum mismatch"},
		{"type damaged", mutate(func(b []byte) []byte { b[kvRecOff] = 7; return b }), "record 0 checksum mismatch"},
		{"huge length", mutate(func(b []byte) []byte { binary.BigEndian.PutUint32(b[kvRecOff+1:], 1<<30); return b }), "record 0 length 1073741824 exceeds 67108864"},
		{"trailing garbage", append(bytes.Clone(valid), 0), "unexpected data after trailer"},
		{"unknown record type", newRaw(1).record(9, []byte("x")).bytes(), "record 0: unknown type 9"},
		{"undecodable key", newRaw(1).record(recKV, []byte{0xff, 0xff}).bytes(), "record 0: decode key"},
		{"empty key", newRaw(1).record(recKV, nil).bytes(), "record 0: empty key"},
		{"keys out of order", newRaw(1).kv("b", 1).kv("a", 1).trailer(5, 0, 2).bytes(), `record 1: key "a" not after "b"`},
		{"duplicate key", newRaw(1).kv("a", 1).kv("a", 1).trailer(5, 0, 2).bytes(), `record 1: key "a" not after "a"`},
		{"member after keys", newRaw(1).kv("a", 1).member(1).trailer(5, 1, 1).bytes(), "record 1: member after keys"},
		{"member id 0", newRaw(1).member(0).trailer(5, 1, 0).bytes(), "record 0: member id 0 not above previous 0"},
		{"members out of order", newRaw(1).member(2).member(1).trailer(5, 2, 0).bytes(), "record 1: member id 1 not above previous 2"},
		{"key count disagrees", newRaw(1).kv("a", 1).trailer(5, 0, 2).bytes(), "trailer counts 0 members and 2 keys, read 0 and 1"},
		{"dropped record", func() []byte {
			r := newRaw(1).kv("a", 1).kv("b", 1)
			r.crc ^= 1 // as if a record had been lost and another duplicated
			return r.trailer(5, 0, 2).bytes()
		}(), "body checksum mismatch"},
		{"entry index above snapshot index", newRaw(1).kv("a", 9).trailer(5, 0, 1).bytes(), "indices above snapshot index 5"},
		{"short trailer", newRaw(1).record(recTrailer, make([]byte, 8)).bytes(), "trailer is 8 bytes, want 44"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newDriver(t)
			s.applyAll(putCmd("keep", "me"))
			s.s.SetMember(1, &lodestonepb.Member{Id: 5, Name: "n5"})
			before := dump(s.s)
			err := s.s.Restore(bytes.NewReader(tt.input))
			if err == nil {
				t.Fatalf("Restore accepted damaged input")
			}
			if !errors.Is(err, ErrCorruptSnapshot) {
				t.Errorf("error %v does not wrap ErrCorruptSnapshot", err)
			}
			var ce *CorruptSnapshotError
			if !errors.As(err, &ce) {
				t.Fatalf("error %T is not *CorruptSnapshotError", err)
			}
			if !strings.Contains(ce.Reason, tt.want) {
				t.Errorf("reason = %q, want it to contain %q", ce.Reason, tt.want)
			}
			if got, want := dump(s.s), before; got != want {
				t.Errorf("store changed by a failed restore:\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// TestRestoreRefusesEveryTruncationAndFlip is the exhaustive form of the
// table above: no prefix of a valid snapshot and no single damaged byte is
// accepted.
func TestRestoreRefusesEveryTruncationAndFlip(t *testing.T) {
	d := newDriver(t)
	d.applyAll(putCmd("a", "1"), putFlags("b/c", "two", 3), putCmd("d", ""))
	d.s.SetMember(4, &lodestonepb.Member{Id: 3, Name: "n3", PeerAddr: "x:1"})
	valid := encode(t, d.s)
	for n := 0; n < len(valid); n++ {
		if err := New().Restore(bytes.NewReader(valid[:n])); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("prefix of %d/%d bytes: err = %v, want ErrCorruptSnapshot", n, len(valid), err)
		}
	}
	for i := range valid {
		for _, mask := range []byte{0x01, 0x80, 0xff} {
			b := bytes.Clone(valid)
			b[i] ^= mask
			if err := New().Restore(bytes.NewReader(b)); !errors.Is(err, ErrCorruptSnapshot) {
				t.Errorf("byte %d ^ %#x: err = %v, want ErrCorruptSnapshot", i, mask, err)
			}
		}
	}
}

type failingReader struct {
	r   io.Reader
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, f.err
	}
	return n, err
}

func TestRestoreReadErrorIsNotCorruption(t *testing.T) {
	valid := encode(t, New())
	boom := errors.New("connection reset")
	s := New()
	err := s.Restore(&failingReader{r: bytes.NewReader(valid[:20]), err: boom})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want it to wrap the reader's error", err)
	}
	if errors.Is(err, ErrCorruptSnapshot) {
		t.Errorf("a transport error is reported as corruption: %v", err)
	}
}

type failingWriter struct{ after int }

func (f *failingWriter) Write(p []byte) (int, error) {
	if f.after < len(p) {
		n := f.after
		f.after = 0
		return n, errors.New("disk full")
	}
	f.after -= len(p)
	return len(p), nil
}

func TestSnapshotWriteError(t *testing.T) {
	d := newDriver(t)
	for i := 0; i < 3000; i++ {
		d.apply(putCmd(fmt.Sprintf("key/%05d", i), strings.Repeat("v", 100)))
	}
	n, err := d.s.Snapshot().WriteTo(&failingWriter{after: 100000})
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("WriteTo err = %v, want disk full", err)
	}
	if got, want := n, int64(100000); got != want {
		t.Errorf("WriteTo n = %d, want %d", got, want)
	}
}

func TestEmptySnapshot(t *testing.T) {
	b := encode(t, New())
	// An empty store still holds the built-in ACL objects: one ACL record.
	acls, _ := proto.MarshalOptions{Deterministic: true}.Marshal(newACLState().snapshot())
	if got, want := len(b), headerLen+clusterLen+2*recHeaderLen+len(acls)+trailerLenV5; got != want {
		t.Errorf("empty snapshot is %d bytes, want %d", got, want)
	}
	s := New()
	s.Apply(3, putCmd("x", "y"))
	if err := s.Restore(bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	if got, want := dump(s), "index=0 kvindex=0 membersindex=0\n"; got != want {
		t.Errorf("after restoring empty snapshot: %q, want %q", got, want)
	}
}

func TestSnapshotNamesItsCluster(t *testing.T) {
	s := New()
	s.Apply(3, putCmd("x", "y"))
	id := clusterid.Random()
	s.SetClusterID(id)
	b := encode(t, s)
	info, err := VerifySnapshot(bytes.NewReader(b))
	if err != nil || info.Cluster != id || info.Index != 3 {
		t.Fatalf("VerifySnapshot = %+v, %v; want cluster %s at index 3", info, err, id)
	}
	r := New()
	if err := r.Restore(bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	if r.ClusterID() != id {
		t.Fatalf("restored cluster %s, want %s", r.ClusterID(), id)
	}
	// A snapshot that names no cluster (an older build's) keeps the id the
	// store knows.
	keep := clusterid.Random()
	old := New()
	old.SetClusterID(keep)
	if err := old.Restore(bytes.NewReader(encode(t, New()))); err != nil {
		t.Fatal(err)
	}
	if old.ClusterID() != keep {
		t.Fatalf("after restoring an unnamed snapshot the store is in %s, want %s", old.ClusterID(), keep)
	}
}
