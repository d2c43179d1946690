package server

import (
	"sync"
	"unsafe"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/watch"
)

// A watch stream's event responses are written in protobuf wire form
// directly, from events encoded once per process: a write seen by 100
// prefix watchers on 100 streams is encoded once and copied 100 times,
// where marshalling each stream's response re-encoded every event in it
// (a fifth of a fanning-out leader's CPU). The layout is WatchResponse's
// and WatchGroup's in api/lodestone/v1/watch.proto; clients decode it as
// those messages. TestWireResponsesMatchMessages holds the two together.
const (
	respHeaderField = 1  // WatchResponse.header
	respIDField     = 2  // WatchResponse.watch_id
	respIndexField  = 8  // WatchResponse.index
	respEventsField = 9  // WatchResponse.events
	respGroupsField = 10 // WatchResponse.groups

	groupIDField     = 1 // WatchGroup.watch_id
	groupIndexField  = 2 // WatchGroup.index
	groupEventsField = 3 // WatchGroup.events
)

// wireCache holds the wire form (without prev_kv) of recent events for
// every stream that sends them. It is keyed by the hub's shared
// *watch.Event (NextShared) and remembers the last wireCacheSize events,
// so its memory is fixed (~1 MiB for small values) whatever the hub
// retains; an older event is encoded again if it is sent again.
type wireCache struct {
	mu   sync.Mutex
	m    map[*watch.Event][]byte
	ring [wireCacheSize]*watch.Event // insertion order, for eviction
	next int
}

const wireCacheSize = 8192

// event returns ev's wire form (an Event message, without prev_kv).
// Callers only read it.
func (c *wireCache) event(ev *watch.Event) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.m[ev]; ok {
		return b
	}
	if c.m == nil {
		c.m = make(map[*watch.Event][]byte, wireCacheSize)
	}
	if old := c.ring[c.next]; old != nil {
		delete(c.m, old)
	}
	b := appendEvent(nil, ev, false)
	c.ring[c.next] = ev
	c.next = (c.next + 1) % wireCacheSize
	c.m[ev] = b
	return b
}

// appendEvents appends evs as repeated Event field num, through the
// cache unless prev_kv is wanted and present.
func (c *wireCache) appendEvents(dst []byte, num protowire.Number, evs []*watch.Event, prev bool) []byte {
	for _, ev := range evs {
		dst = protowire.AppendTag(dst, num, protowire.BytesType)
		if prev && ev.PrevKV != nil {
			m := newPBEvent(ev, true)
			dst = protowire.AppendVarint(dst, uint64(proto.Size(m)))
			dst = appendMessage(dst, m)
			continue
		}
		dst = protowire.AppendBytes(dst, c.event(ev))
	}
	return dst
}

// appendGroup appends one WatchResponse.groups entry, a watch's batch. It
// encodes the group's fields in scratch first (for their length) and
// returns scratch for reuse.
func (c *wireCache) appendGroup(dst, scratch []byte, id int64, index uint64, evs []*watch.Event, prev bool) (out, scratchOut []byte) {
	g := appendIDIndex(scratch[:0], groupIDField, id, groupIndexField, index)
	g = c.appendEvents(g, groupEventsField, evs, prev)
	dst = protowire.AppendTag(dst, respGroupsField, protowire.BytesType)
	return protowire.AppendBytes(dst, g), g
}

// appendResponse appends a whole ungrouped WatchResponse carrying one
// watch's batch.
func (c *wireCache) appendResponse(dst []byte, hdr *lodestonepb.ResponseHeader, id int64, index uint64, evs []*watch.Event, prev bool) []byte {
	dst = protowire.AppendTag(dst, respHeaderField, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(proto.Size(hdr)))
	dst = appendMessage(dst, hdr)
	dst = appendIDIndex(dst, respIDField, id, respIndexField, index)
	return c.appendEvents(dst, respEventsField, evs, prev)
}

// appendIDIndex appends a watch id and an index as the varint fields
// idNum and indexNum, each omitted when zero as proto3 does.
func appendIDIndex(dst []byte, idNum protowire.Number, id int64, indexNum protowire.Number, index uint64) []byte {
	if id != 0 {
		dst = protowire.AppendTag(dst, idNum, protowire.VarintType)
		dst = protowire.AppendVarint(dst, uint64(id))
	}
	if index != 0 {
		dst = protowire.AppendTag(dst, indexNum, protowire.VarintType)
		dst = protowire.AppendVarint(dst, index)
	}
	return dst
}

// appendEvent appends ev's Event message, with prev_kv if prev.
func appendEvent(dst []byte, ev *watch.Event, prev bool) []byte {
	m := newPBEvent(ev, prev)
	proto.Size(m) // fills the size cache appendMessage uses
	return appendMessage(dst, m)
}

// appendMessage appends m, whose size was just computed, in wire form.
// NB: it cannot fail: these messages hold only scalars, bytes and
// strings that came from valid messages.
func appendMessage(dst []byte, m proto.Message) []byte {
	dst, _ = proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(dst, m)
	return dst
}

// newPBEvent converts one event, with prev_kv if prev.
// NB: the key is not copied: the KeyValue's Key aliases the hub's
// immutable string, and the message is only marshalled (read).
func newPBEvent(ev *watch.Event, prev bool) *lodestonepb.Event {
	pe := &lodestonepb.Event{Kv: &lodestonepb.KeyValue{}}
	setPBKV(pe.Kv, &ev.KV)
	if prev && ev.PrevKV != nil {
		pe.PrevKv = &lodestonepb.KeyValue{}
		setPBKV(pe.PrevKv, ev.PrevKV)
	}
	if ev.Type == watch.Delete {
		pe.Type = lodestonepb.Event_DELETE
	}
	return pe
}

func setPBKV(dst *lodestonepb.KeyValue, kv *watch.KeyValue) {
	dst.Key = unsafe.Slice(unsafe.StringData(kv.Key), len(kv.Key))
	dst.Value, dst.CreateIndex, dst.ModifyIndex = kv.Value, kv.CreateIndex, kv.ModifyIndex
	dst.LockIndex, dst.Flags, dst.Session = kv.LockIndex, kv.Flags, kv.Session
}
