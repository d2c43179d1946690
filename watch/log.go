package watch

import (
	"sync"
	"sync/atomic"
	"time"
)

// logEntry is one published Raft index (or one Restore marker).
type logEntry struct {
	seq    uint64 // position in the log, from 1, contiguous
	index  uint64 // Raft index, strictly increasing with seq
	at     time.Time
	events []Event // shared, read-only; nil for a reset marker
	bytes  int64
	reset  bool // Restore(index): the state machine was replaced at index
}

// eventLog is the bounded, indexed log of published events: a ring of
// entries with sequence numbers [head, next).
//
// Publish (the only writer) holds mu for an append and the evictions it
// causes. Shards and Watch hold mu.RLock only to copy entries out; nobody
// holds it while touching a watcher.
type eventLog struct {
	mu   sync.RWMutex
	ring []logEntry // len is a power of two
	head uint64     // seq of the oldest retained entry
	next uint64     // seq the next entry gets
	// nextA mirrors next for the shards' lock-free "is there more?" check.
	nextA atomic.Uint64

	last   uint64 // last published index (Publish with no events included)
	floor  uint64 // smallest StartIndex that can be served: events with index > floor are all retained
	events int    // retained events
	bytes  int64  // retained bytes (estimate)
	closed bool

	maxEvents int
	maxBytes  int64
}

func (l *eventLog) init(maxEvents int, maxBytes int64) {
	l.ring = make([]logEntry, 64)
	l.head, l.next = 1, 1
	l.nextA.Store(1)
	l.maxEvents, l.maxBytes = maxEvents, maxBytes
}

// at returns the slot of seq; the caller holds mu and head ≤ seq < next.
func (l *eventLog) at(seq uint64) *logEntry {
	return &l.ring[seq&uint64(len(l.ring)-1)]
}

// appendLocked adds an entry and evicts down to the retention bounds,
// always keeping the newest entry. O(events) amortised.
func (l *eventLog) appendLocked(e logEntry) {
	if l.next-l.head == uint64(len(l.ring)) {
		l.grow()
	}
	e.seq = l.next
	*l.at(l.next) = e
	l.next++
	l.events += len(e.events)
	l.bytes += e.bytes
	for (l.events > l.maxEvents || l.bytes > l.maxBytes) && l.next-l.head > 1 {
		old := l.at(l.head)
		l.floor = max(l.floor, old.index)
		l.events -= len(old.events)
		l.bytes -= old.bytes
		*old = logEntry{} // NB: drop the events so a slow watcher's buffer is the only thing pinning them
		l.head++
	}
	l.nextA.Store(l.next)
}

func (l *eventLog) grow() {
	ring := make([]logEntry, 2*len(l.ring))
	for seq := l.head; seq < l.next; seq++ {
		ring[seq&uint64(len(ring)-1)] = *l.at(seq)
	}
	l.ring = ring
}

// search returns the seq of the first retained entry with index > idx
// (next if none). The caller holds mu.
func (l *eventLog) search(idx uint64) uint64 {
	lo, hi := l.head, l.next
	for lo < hi {
		mid := lo + (hi-lo)/2
		if l.at(mid).index > idx {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}
