package watch

import "strings"

// EventType says what happened to a key.
type EventType uint8

const (
	// Put: the key was created or updated; KV is the entry as stored.
	Put EventType = 1
	// Delete: the key was removed; KV.Key is set, KV.ModifyIndex is the
	// index of the delete.
	Delete EventType = 2
)

func (t EventType) String() string {
	switch t {
	case Put:
		return "put"
	case Delete:
		return "delete"
	default:
		return "unknown"
	}
}

// KeyValue is one stored entry with Consul's bookkeeping fields. It mirrors
// lodestonepb.KeyValue without depending on it; the server converts.
type KeyValue struct {
	Key         string
	Value       []byte
	CreateIndex uint64
	ModifyIndex uint64
	LockIndex   uint64
	Flags       uint64
	Session     string
}

// Event is one change to one key at one index.
//
// Events handed to Publish become the hub's: they are shared, read-only,
// between the log and every watcher they are delivered to. Nobody may
// modify an Event, its Value bytes or its PrevKV after Publish.
type Event struct {
	Type EventType
	// Index is the Raft index of the change. Publish sets it.
	Index uint64
	// KV is the entry after the change (for Delete: the key and the index).
	KV KeyValue
	// PrevKV is the entry before the change, if the publisher supplied it
	// (nil when the key did not exist). It is delivered only to watchers
	// that asked for it (Request.PrevKV).
	PrevKV *KeyValue
}

// eventOverhead approximates the fixed heap cost of a retained Event
// (struct, slice slot, pointer from a watcher buffer), for RetainBytes.
const eventOverhead = 128

// size estimates the bytes an Event keeps alive.
func (e *Event) size() int64 {
	n := int64(eventOverhead + len(e.KV.Key) + len(e.KV.Value) + len(e.KV.Session))
	if p := e.PrevKV; p != nil {
		n += int64(96 + len(p.Key) + len(p.Value) + len(p.Session))
	}
	return n
}

// Request selects what a watcher sees.
type Request struct {
	// Key is the key to watch, or with Prefix the prefix every watched key
	// starts with. An empty Key with Prefix watches everything; an empty
	// Key without Prefix is a bad request.
	Key    string
	Prefix bool
	// StartIndex is the last index the client has seen (the index of the
	// read it is following up, or the last Batch.Index): it receives the
	// matching events with index > StartIndex. A StartIndex older than the
	// retained window fails with an error wrapping ErrCompacted. Zero is
	// not special: it means "everything", which only a hub that has never
	// evicted can serve. A StartIndex ahead of the hub (the client read from
	// a more advanced replica) is honoured: nothing at or below it is
	// delivered.
	StartIndex uint64
	// FromNow ignores history: the watcher starts at the hub's index when
	// Watch is called. Only for clients that do not need to line up with a
	// read; StartIndex must then be zero.
	FromNow bool
	// NoPut and NoDelete drop puts or deletes.
	NoPut    bool
	NoDelete bool
	// PrevKV passes Event.PrevKV through; otherwise it is nil in delivered
	// events.
	PrevKV bool
	// NoProgress: the watcher gets no progress notifications, from the
	// timer or from Hub.Progress. For a consumer that only waits for a
	// change (Hub.Wait sets it): a notification would wake it for
	// nothing, and 10,000 blocking reads would be woken 1,000 times a
	// second.
	NoProgress bool
	// BufferSize caps the events buffered for this watcher before it is cut
	// loose (0: Config.WatcherBuffer). The events of one index are never
	// split, so a buffer that was empty accepts one index of any size.
	BufferSize int
	// Ready, if set, is told each time this watcher has something for Next
	// (events, a progress notification, a terminal error). It lets one
	// goroutine serve many watchers (a gRPC stream) instead of blocking in
	// Next on each.
	Ready *Ready
	// Tag is the caller's, returned by Watcher.Tag (a gRPC stream keeps the
	// client's watch id there instead of in a map of its own).
	Tag int64
}

// Batch is what Next returns: events in index order, or a progress
// notification (no events).
type Batch struct {
	// Index: the watcher has now seen every matching event with index ≤
	// Index. Resume with Request.StartIndex = Index. Index never decreases
	// from one Batch to the next.
	Index uint64
	// Events are the matching events, in index order (and within an index,
	// in the publisher's order). The caller owns the slice; the Events'
	// Value bytes and PrevKV are shared and read-only.
	Events []Event
}

// IsProgress reports whether b is a progress notification: no events, only
// a newer Index.
func (b Batch) IsProgress() bool { return len(b.Events) == 0 }

// options bits of a Watcher, immutable after Watch.
const (
	optPrefix uint8 = 1 << iota
	optNoPut
	optNoDelete
	optPrevKV
	optNoProgress
)

// matchOpts reports whether an event passes the watcher's key and type
// filters. Index filtering is separate.
func matchOpts(key string, opts uint8, ev *Event) bool {
	if opts&optPrefix != 0 {
		if !strings.HasPrefix(ev.KV.Key, key) {
			return false
		}
	} else if ev.KV.Key != key {
		return false
	}
	return typeOK(opts, ev)
}

func typeOK(opts uint8, ev *Event) bool {
	switch ev.Type {
	case Put:
		return opts&optNoPut == 0
	case Delete:
		return opts&optNoDelete == 0
	}
	return true
}
