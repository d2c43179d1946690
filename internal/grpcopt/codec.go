package grpcopt

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

// Codec is gRPC's protobuf codec except that messages from smallMessage
// bytes up are marshalled into a buffer from gRPC's pool, which gRPC
// returns once the message is on the wire. gRPC's own codec pools only
// messages above 1 KiB and allocates the rest, and many messages Lodestone
// sends are a few hundred bytes: a Raft append of a few entries, a watch
// stream's events for one delivery round. On a leader fanning 100k
// events/s out to watch streams those allocations were a quarter of all
// bytes allocated, so a quarter of its garbage collection work, and a
// write that lands in a collection waits for it.
type Codec struct{}

// poolMin is the least capacity asked of the pool: gRPC frees a buffer
// back to its pool only if its capacity is above 1 KiB (its pooling
// threshold), and drops smaller ones to the collector.
const poolMin = 1<<10 + 1

// smallMessage is the size under which a message is allocated at its
// size instead: a put's answer, a Raft acknowledgement, a watch's
// "created". Each pooled message holds a poolMin (in fact 4 KiB) buffer
// until gRPC has written it, so a burst of small ones (a fleet creating
// 100k watches over a second) drains the pool; every message then got a
// fresh 4 KiB, zeroed and faulted in, and garbage collection ran back to
// back. A 100k-watch attach took 1.3-1.9 s with them pooled, 0.7-1.2 s
// without.
const smallMessage = 512

// Encoded is a message already in protobuf wire form, passed to SendMsg
// in place of the message by a sender that builds it from parts encoded
// once and shared (a watch event sent on a hundred streams). Marshal
// copies it into a pooled buffer, so the sender may reuse it as soon as
// SendMsg returns.
type Encoded []byte

// Owned is a message already in protobuf wire form, *Buf, whose buffer
// goes to gRPC with it: Marshal hands it on without a copy, and gRPC gives
// Buf to Pool.Put once the message is written (or dropped with its
// stream). A sender that builds each message in a fresh buffer (a watch
// stream's delivery round) saves the copy Encoded makes, and learns from
// Put when gRPC no longer holds the message. A buffer of at most 1 KiB
// (gRPC's pooling threshold, below which gRPC would never call Put) is
// copied and given back to Pool before Marshal returns.
type Owned struct {
	Buf  *[]byte
	Pool mem.BufferPool
}

func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	if o, ok := v.(Owned); ok {
		if mem.IsBelowBufferPoolingThreshold(cap(*o.Buf)) {
			out := append([]byte(nil), *o.Buf...)
			o.Pool.Put(o.Buf)
			return mem.BufferSlice{mem.SliceBuffer(out)}, nil
		}
		return mem.BufferSlice{mem.NewBuffer(o.Buf, o.Pool)}, nil
	}
	if e, ok := v.(Encoded); ok {
		pool := mem.DefaultBufferPool()
		buf := pool.Get(max(len(e), poolMin))
		*buf = (*buf)[:copy(*buf, e)]
		return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
	}
	m := messageOf(v)
	if m == nil {
		return nil, fmt.Errorf("grpcopt: cannot marshal %T: not a protobuf message", v)
	}
	// UseCachedSize is safe right after Size: the message is not changing
	// under us (gRPC's own codec relies on the same).
	size := proto.Size(m)
	if size < smallMessage {
		out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(make([]byte, 0, size), m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(out)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(max(size, poolMin))
	out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], m)
	if err != nil {
		pool.Put(buf)
		return nil, err
	}
	*buf = out
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	m := messageOf(v)
	if m == nil {
		return fmt.Errorf("grpcopt: cannot unmarshal into %T: not a protobuf message", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

func messageOf(v any) proto.Message {
	switch v := v.(type) {
	case protoadapt.MessageV2:
		return v
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(v)
	}
	return nil
}

// Name is "proto": the codec speaks the same wire format as gRPC's own,
// so a peer using the default codec reads it unchanged.
func (Codec) Name() string { return "proto" }

var _ encoding.CodecV2 = Codec{}

func serverCodec() grpc.ServerOption { return grpc.ForceServerCodecV2(Codec{}) }

func dialCodec() grpc.DialOption {
	return grpc.WithDefaultCallOptions(grpc.ForceCodecV2(Codec{}))
}
