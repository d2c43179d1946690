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

// A small message must come back in a buffer gRPC returns to its pool (a
// SliceBuffer is dropped to the collector, which is what the codec is
// for), and both sizes must read back as they were.
func TestCodecPoolsSmallMessagesAndRoundTrips(t *testing.T) {
	var c grpcopt.Codec
	for _, n := range []int{0, 10, 900, 5000, 300_000} {
		in := &lodestonepb.KeyValue{Key: []byte("k"), Value: bytes.Repeat([]byte{'v'}, n), ModifyIndex: uint64(n) + 1}
		data, err := c.Marshal(in)
		if err != nil {
			t.Fatalf("value of %d bytes: %v", n, err)
		}
		if got, want := data.Len(), proto.Size(in); got != want {
			t.Errorf("value of %d bytes: %d bytes marshalled, want %d", n, got, want)
		}
		checkPooledRoundTrip(t, fmt.Sprintf("value of %d bytes", n), data, in)
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
