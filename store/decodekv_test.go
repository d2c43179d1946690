package store

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// FuzzDecodeKV checks decodeKV against proto.Unmarshal: the same entry for
// every payload proto accepts, an error for every one it refuses.
func FuzzDecodeKV(f *testing.F) {
	full, _ := proto.MarshalOptions{Deterministic: true}.Marshal(&lodestonepb.KeyValue{
		Key: []byte("k"), Value: []byte("value"), CreateIndex: 3, ModifyIndex: 9,
		LockIndex: 2, Flags: 1 << 40, Session: "sess-1"})
	f.Add(full)
	f.Add(full[:len(full)-3])                                   // cut inside the session
	f.Add(protowire.AppendTag(append([]byte{}, full...), 9, 0)) // an unknown field, cut
	f.Add(protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 7))
	f.Add(protowire.AppendBytes(protowire.AppendTag(nil, 7, protowire.BytesType), []byte{0xff}))
	f.Add(append(append([]byte{}, full...), full...)) // every field twice
	f.Add([]byte(":\x0600\xfa000:\x06000000"))        // a bad session, then a good one
	f.Fuzz(func(t *testing.T, b []byte) {
		want := &lodestonepb.KeyValue{}
		werr := proto.Unmarshal(b, want)
		want.ProtoReflect().SetUnknown(nil) // NB: the store keeps the fields it knows
		f, err := decodeKV(b)
		got := f.message()
		switch {
		case (err == nil) != (werr == nil):
			t.Fatalf("decodeKV error %v, proto.Unmarshal %v", err, werr)
		case err != nil:
			return
		case !proto.Equal(got, want):
			t.Fatalf("decodeKV = %v, proto.Unmarshal = %v", got, want)
		}
		if f.valueAt >= 0 && !bytes.Equal(b[f.valueAt:f.valueAt+len(f.value)], f.value) {
			t.Fatalf("valueAt %d does not point at the value %q in % x", f.valueAt, f.value, b)
		}
	})
}

// FuzzKVRecord holds kvRecord to what the encoder wrote before it: a
// record whose payload is proto's deterministic encoding of the entry,
// with a checksum that matches, read back by decodeKV as the same entry.
func FuzzKVRecord(f *testing.F) {
	f.Add([]byte("k"), []byte("value"), uint64(3), uint64(9), uint64(2), uint64(1<<40), "sess-1")
	f.Add([]byte("k"), []byte(nil), uint64(0), uint64(0), uint64(0), uint64(0), "")
	f.Fuzz(func(t *testing.T, key, value []byte, create, modify, lock, flags uint64, session string) {
		if !utf8.ValidString(session) {
			return // NB: a stored session id always is; proto refuses to marshal one that is not
		}
		kv := &lodestonepb.KeyValue{Key: key, Value: value, CreateIndex: create, ModifyIndex: modify,
			LockIndex: lock, Flags: flags, Session: session}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(kv)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		enc := &encoder{w: bufio.NewWriter(&out)}
		enc.kvRecord(kv.Key, &row{CreateIndex: create, ModifyIndex: modify, Flags: flags, lock: &lockState{index: lock, session: session}}, value)
		if enc.err != nil || enc.w.Flush() != nil {
			t.Fatal(enc.err)
		}
		rec := out.Bytes()
		if len(rec) < recHeaderLen || rec[0] != recKV || int(binary.BigEndian.Uint32(rec[1:])) != len(rec)-recHeaderLen {
			t.Fatalf("record header % x for a %d-byte record", rec[:min(len(rec), recHeaderLen)], len(rec))
		}
		payload := rec[recHeaderLen:]
		if !bytes.Equal(payload, want) {
			t.Fatalf("payload % x, proto gives % x", payload, want)
		}
		if c := crc32.Update(crc32.Update(0, castagnoli, rec[:5]), castagnoli, payload); c != binary.BigEndian.Uint32(rec[5:]) {
			t.Fatalf("record checksum %#x, payload's %#x", binary.BigEndian.Uint32(rec[5:]), c)
		}
		if enc.crc != crc32.Update(0, castagnoli, rec) {
			t.Fatal("the body checksum does not cover the record as written")
		}
		if got, err := decodeKV(payload); err != nil || !proto.Equal(got.message(), kv) {
			t.Fatalf("decodeKV = %v, %v; want %v", got, err, kv)
		}
	})
}

// message is f as the KeyValue proto.Unmarshal gives.
func (f kvFields) message() *lodestonepb.KeyValue {
	kv := &lodestonepb.KeyValue{Key: f.key, Value: f.value, Session: f.session, CreateIndex: f.createIndex,
		ModifyIndex: f.modifyIndex, LockIndex: f.lockIndex, Flags: f.flags}
	if len(kv.Key) == 0 {
		kv.Key = nil
	}
	if len(kv.Value) == 0 {
		kv.Value = nil
	}
	return kv
}
