package store

import (
	"testing"

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
		got, err := decodeKV(b)
		switch {
		case (err == nil) != (werr == nil):
			t.Fatalf("decodeKV error %v, proto.Unmarshal %v", err, werr)
		case err != nil:
			return
		case !proto.Equal(got, want):
			t.Fatalf("decodeKV = %v, proto.Unmarshal = %v", got, want)
		}
		_ = append(got.Key, 'X', 'X')
		if !proto.Equal(got, want) {
			t.Fatalf("appending to the key changed the entry: %v", got)
		}
	})
}
