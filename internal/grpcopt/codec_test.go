package grpcopt_test

import (
	"bytes"
	"fmt"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/grpcopt"
)

// A message of a few hundred bytes and up must come back in a buffer
// gRPC returns to its pool (a SliceBuffer is dropped to the collector),
// a smaller one in a buffer of its own size (a pooled one would hold
// 4 KiB), and every size must read back as it was.
func TestCodecPoolsAllButTinyMessagesAndRoundTrips(t *testing.T) {
	var c grpcopt.Codec
	for _, n := range []int{0, 10, 400, 900, 5000, 300_000} {
		in := &lodestonepb.KeyValue{Key: []byte("k"), Value: bytes.Repeat([]byte{'v'}, n), ModifyIndex: uint64(n) + 1}
		what := fmt.Sprintf("value of %d bytes", n)
		data, err := c.Marshal(in)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got, want := data.Len(), proto.Size(in); got != want {
			t.Errorf("%s: %d bytes marshalled, want %d", what, got, want)
		}
		if n >= 900 {
			checkPooledRoundTrip(t, what, data, in)
			continue
		}
		if b, own := data[0].(mem.SliceBuffer); len(data) != 1 || !own || cap(b) != proto.Size(in) {
			t.Errorf("%s: want one unpooled buffer of exactly %d bytes, got %d buffers, the first a %T", what, proto.Size(in), len(data), data[0])
		}
		checkRoundTrip(t, what, data, in)
	}
	if _, err := c.Marshal("not a message"); err == nil {
		t.Error("marshalling a string: want an error")
	}
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0xff})}, &lodestonepb.KeyValue{}); err == nil {
		t.Error("unmarshalling garbage: want an error")
	}
}

// An Encoded message goes out as its bytes, copied into a pooled buffer:
// the sender's slice can be overwritten as soon as Marshal returns.
func TestCodecSendsEncodedBytesAsACopy(t *testing.T) {
	var c grpcopt.Codec
	for _, n := range []int{0, 10, 5000} {
		in := &lodestonepb.KeyValue{Key: []byte("k"), Value: bytes.Repeat([]byte{'v'}, n)}
		wire, err := proto.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		data, err := c.Marshal(grpcopt.Encoded(wire))
		if err != nil {
			t.Fatalf("%d-byte value: %v", n, err)
		}
		for i := range wire {
			wire[i] = 0xff
		}
		checkPooledRoundTrip(t, fmt.Sprintf("%d-byte value sent encoded", n), data, in)
	}
}

// checkPooledRoundTrip checks that data sits in buffers gRPC returns to
// its pool and reads back as want, then frees it.
func checkPooledRoundTrip(t *testing.T, what string, data mem.BufferSlice, want *lodestonepb.KeyValue) {
	t.Helper()
	for _, b := range data {
		if _, unpooled := b.(mem.SliceBuffer); unpooled {
			t.Errorf("%s: in an unpooled buffer", what)
		}
	}
	checkRoundTrip(t, what, data, want)
}

// checkRoundTrip checks that data reads back as want, then frees it.
func checkRoundTrip(t *testing.T, what string, data mem.BufferSlice, want *lodestonepb.KeyValue) {
	t.Helper()
	var c grpcopt.Codec
	out := &lodestonepb.KeyValue{}
	if err := c.Unmarshal(data, out); err != nil {
		t.Fatalf("%s: unmarshal: %v", what, err)
	}
	data.Free()
	if !proto.Equal(want, out) {
		t.Errorf("%s: reads back as %v, want %v", what, out, want)
	}
}

// countingPool records the buffers given back to it.
type countingPool struct{ put []*[]byte }

func (p *countingPool) Get(n int) *[]byte { b := make([]byte, n); return &b }
func (p *countingPool) Put(b *[]byte)     { p.put = append(p.put, b) }

// An Owned message goes out in its own buffer, uncopied, and the buffer
// comes back to its pool exactly once, when gRPC frees the message; one
// of at most 1 KiB (which gRPC would never give back) is copied and given
// back at once.
func TestCodecHandsOwnedBufferOnAndBack(t *testing.T) {
	var c grpcopt.Codec
	for _, n := range []int{10, 5000} {
		in := &lodestonepb.KeyValue{Key: []byte("k"), Value: bytes.Repeat([]byte{'v'}, n)}
		wire, err := proto.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		pool := &countingPool{}
		buf := &wire
		data, err := c.Marshal(grpcopt.Owned{Buf: buf, Pool: pool})
		if err != nil {
			t.Fatalf("%d-byte value: %v", n, err)
		}
		what := fmt.Sprintf("%d-byte value sent owned", n)
		small := n < 1000
		if got := len(pool.put); small != (got == 1) {
			t.Fatalf("%s: given back %d times before it was freed", what, got)
		}
		if !small && &data[0].ReadOnlyData()[0] != &wire[0] {
			t.Errorf("%s: copied, want the sender's buffer itself", what)
		}
		checkRoundTrip(t, what, data, in)
		if len(pool.put) != 1 || pool.put[0] != buf {
			t.Errorf("%s: given back %d times after it was freed, want once, the sender's", what, len(pool.put))
		}
	}
}
