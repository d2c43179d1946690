package watch

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The log keeps its newest entries' events as the []Event that Publish
// was given, and encodes older ones into an arena: byte chunks, which hold
// no pointers, so the garbage collector marks each chunk once and never
// scans it. Kept decoded, 100,000 retained events were ~200,000 objects
// that every GC cycle marked (9-13 ms of one processor per cycle,
// BenchmarkGCRetainedLog); encoded, they are a few hundred chunks.
//
// Encoding of one entry's events, back to back, every integer a uvarint:
//
//	event   = type flags kv [kv]          the second kv is PrevKV, if flags&hasPrev
//	kv      = createIndex modifyIndex lockIndex kvFlags key value session
//	key     = len bytes
//	value   = len+1 bytes                 0 is a nil Value (kept apart from empty)
//	session = len bytes
//
// Index is not encoded: every event of an entry has the entry's index.
// An entry's events are contiguous in one chunk; an entry bigger than
// arenaChunk gets a chunk of its own.

// arenaChunk is the size of an arena chunk. Chunks are freed whole, when
// the last entry in them is evicted, so a small chunk frees memory sooner
// and a big one means fewer objects.
const arenaChunk = 256 << 10

const hasPrev = 1

// arena is an append-only sequence of chunks numbered from first. Decoded
// events copy what they need from a chunk, so no event pins one.
type arena struct {
	chunks  [][]byte // chunks[i] is chunk first+i; len is the bytes written
	first   uint64
	held    int    // capacity of the chunks, for the metric
	scratch []byte // put encodes here first, to know the size
}

// span is where an entry's encoded events are.
type span struct {
	chunk    uint64
	off, len uint32
}

// put encodes events and returns where they went.
func (a *arena) put(events []Event) span {
	enc := a.scratch[:0]
	for i := range events {
		enc = appendEvent(enc, &events[i])
	}
	if cap(enc) <= arenaChunk {
		a.scratch = enc // NB: an entry bigger than a chunk is not kept around as scratch
	}
	if len(a.chunks) == 0 || cap(a.last())-len(a.last()) < len(enc) {
		a.chunks = append(a.chunks, make([]byte, 0, max(len(enc), arenaChunk)))
		a.held += cap(a.last())
	}
	c := &a.chunks[len(a.chunks)-1]
	off := len(*c)
	*c = append(*c, enc...)
	return span{chunk: a.first + uint64(len(a.chunks)-1), off: uint32(off), len: uint32(len(enc))}
}

func (a *arena) last() []byte { return a.chunks[len(a.chunks)-1] }

// bytes returns the encoding at sp.
func (a *arena) bytes(sp span) []byte {
	c := a.chunks[sp.chunk-a.first]
	return c[sp.off : sp.off+sp.len]
}

// dropBefore frees the chunks numbered below chunk, except the one being
// written to.
func (a *arena) dropBefore(chunk uint64) {
	if chunk <= a.first || len(a.chunks) <= 1 {
		return
	}
	k := min(chunk-a.first, uint64(len(a.chunks)-1))
	for _, c := range a.chunks[:k] {
		a.held -= cap(c)
	}
	clear(a.chunks[:k])
	a.chunks = a.chunks[k:]
	a.first += k
}

func appendEvent(b []byte, ev *Event) []byte {
	var flags byte
	if ev.PrevKV != nil {
		flags |= hasPrev
	}
	b = append(b, byte(ev.Type), flags)
	b = appendKV(b, &ev.KV)
	if ev.PrevKV != nil {
		b = appendKV(b, ev.PrevKV)
	}
	return b
}

func appendKV(b []byte, kv *KeyValue) []byte {
	b = binary.AppendUvarint(b, kv.CreateIndex)
	b = binary.AppendUvarint(b, kv.ModifyIndex)
	b = binary.AppendUvarint(b, kv.LockIndex)
	b = binary.AppendUvarint(b, kv.Flags)
	b = binary.AppendUvarint(b, uint64(len(kv.Key)))
	b = append(b, kv.Key...)
	if kv.Value == nil {
		b = binary.AppendUvarint(b, 0)
	} else {
		b = binary.AppendUvarint(b, uint64(len(kv.Value))+1)
		b = append(b, kv.Value...)
	}
	b = binary.AppendUvarint(b, uint64(len(kv.Session)))
	return append(b, kv.Session...)
}

var errCorrupt = errors.New("watch: corrupt arena encoding")

// decodeEvents decodes count events at index from b. The result shares
// nothing with b. An error means a bug in this file: the hub wrote b.
func decodeEvents(b []byte, index uint64, count int) ([]Event, error) {
	events := make([]Event, count)
	d := decoder{b: b}
	for i := range events {
		ev := &events[i]
		ev.Type = EventType(d.byte())
		flags := d.byte()
		ev.Index = index
		d.kv(&ev.KV)
		if flags&hasPrev != 0 {
			ev.PrevKV = new(KeyValue)
			d.kv(ev.PrevKV)
		}
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, fmt.Errorf("%w: index %d, %d events, %d bytes left, %v", errCorrupt, index, count, len(d.b), d.err)
	}
	return events, nil
}

// decoder reads the encoding; the first error sticks and makes every
// later read return zero.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.fail()
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) take(n uint64) []byte {
	if d.err != nil || n > uint64(len(d.b)) {
		d.fail()
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = errors.New("truncated")
	}
}

func (d *decoder) kv(kv *KeyValue) {
	kv.CreateIndex = d.uvarint()
	kv.ModifyIndex = d.uvarint()
	kv.LockIndex = d.uvarint()
	kv.Flags = d.uvarint()
	kv.Key = string(d.take(d.uvarint()))
	if n := d.uvarint(); n > 0 {
		kv.Value = append([]byte{}, d.take(n-1)...)
	}
	kv.Session = string(d.take(d.uvarint()))
}
