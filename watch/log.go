package watch

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

// logEntry is one published Raft index (or one Restore marker). It holds
// no pointers, so the ring of 100,000 of them is one object the garbage
// collector marks without scanning (a slice in each entry, even nil, made
// it read every entry's cache line: ~4 ms per cycle).
type logEntry struct {
	seq   uint64 // position in the log, from 1, contiguous
	index uint64 // Raft index, strictly increasing with seq
	at    int64  // publish time, Unix nanoseconds (a time.Time holds a pointer)
	enc   span   // where a cold entry's events are encoded
	count int    // events
	bytes int64
	hot   bool // its events are in eventLog.hotEvents, not encoded yet
	reset bool // Restore(index): the state machine was replaced at index
}

// cold reports whether e's events are in the arena only.
func (e *logEntry) cold() bool { return !e.hot && e.count > 0 }

// entryView is a log entry with its events, as readers copy it out of the
// log: Publish's slice for a hot entry, a decoded copy for a cold one.
type entryView struct {
	logEntry
	events []Event // shared and read-only
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

	// The newest hot entries keep the []Event Publish was given, in
	// hotEvents[seq&(len-1)]; older ones are encoded into arena
	// (arena.go). Shards read the newest entries as soon as they are
	// published, so they almost never decode. At most hot entries are
	// hot, holding at most hotMax events (the newest entry stays hot
	// whatever its size); the entries from hotHead on may be hot, and
	// those that are hold hotCount events.
	hot       int
	hotMax    int
	hotEvents [][]Event // len is a power of two ≥ hot
	hotHead   uint64
	hotCount  int
	arena     arena
	decoded   atomic.Uint64 // events decoded by view, for the metric
}

// hotEntries is how many of the newest entries stay decoded: seconds of
// writes at thousands per second, far more than a shard lags by in
// normal operation. Their events are bounded too, at twice as many. NB:
// a decoded event costs about a third more memory than its encoding and
// is several objects for the collector to mark; with transactions of 64
// puts, 4096 hot entries were the whole retained history, decoded.
const hotEntries = 4096

func (l *eventLog) init(maxEvents int, maxBytes int64) {
	l.ring = make([]logEntry, 64)
	l.head, l.next, l.hotHead = 1, 1, 1
	l.nextA.Store(1)
	l.maxEvents, l.maxBytes = maxEvents, maxBytes
	l.setHot(hotEntries)
}

// setHot sets how many of the newest entries stay decoded; the log must be
// empty.
func (l *eventLog) setHot(n int) {
	l.hot, l.hotMax = n, 2*n
	l.hotEvents = make([][]Event, 1<<bits.Len(uint(max(n, 1)-1)))
}

// at returns the slot of seq; the caller holds mu and head ≤ seq < next.
func (l *eventLog) at(seq uint64) *logEntry {
	return &l.ring[seq&uint64(len(l.ring)-1)]
}

func (l *eventLog) hotSlot(seq uint64) *[]Event {
	return &l.hotEvents[seq&uint64(len(l.hotEvents)-1)]
}

// appendLocked adds an entry with its events, encodes the entry that stops
// being hot, and evicts down to the retention bounds, always keeping the
// newest entry. O(events) amortised.
func (l *eventLog) appendLocked(e logEntry, events []Event) {
	if l.next-l.head == uint64(len(l.ring)) {
		l.grow()
	}
	e.seq = l.next
	e.count = len(events)
	// NB: freeze the entries that stop being hot first: with hot equal to
	// len(hotEvents), the oldest one's slot is the new entry's.
	l.cool(e.seq, e.count)
	switch {
	case len(events) == 0:
	case l.hot == 0:
		e.enc = l.arena.put(events)
	default:
		e.hot = true
		*l.hotSlot(e.seq) = events
		l.hotCount += e.count
	}
	*l.at(l.next) = e
	l.next++
	l.events += e.count
	l.bytes += e.bytes
	evicted := false
	for (l.events > l.maxEvents || l.bytes > l.maxBytes) && l.next-l.head > 1 {
		old := l.at(l.head)
		l.floor = max(l.floor, old.index)
		l.events -= old.count
		l.bytes -= old.bytes
		evicted = evicted || old.cold()
		if old.hot {
			*l.hotSlot(old.seq) = nil // NB: so a slow watcher's buffer is the only thing pinning them
			l.hotCount -= old.count
		}
		*old = logEntry{}
		l.head++
	}
	if evicted {
		l.dropChunks()
	}
	l.nextA.Store(l.next)
}

// cool freezes the oldest hot entries until the entry at seq, of count
// events, can join them within hot entries and hotMax events.
func (l *eventLog) cool(seq uint64, count int) {
	for l.hotHead < seq && (seq-l.hotHead >= uint64(l.hot) || l.hotCount+count > l.hotMax) {
		if l.hotHead >= l.head { // NB: an evicted entry's slot is another's now
			l.freeze(l.at(l.hotHead))
		}
		l.hotHead++
	}
}

// freeze moves a hot entry's events into the arena.
func (l *eventLog) freeze(e *logEntry) {
	if !e.hot {
		return
	}
	slot := l.hotSlot(e.seq)
	e.enc = l.arena.put(*slot)
	e.hot = false
	l.hotCount -= e.count
	*slot = nil
}

// dropChunks frees the arena chunks that no retained entry is in. The
// entries from head on are cold up to the first hot one, and their
// chunks ascend, so head's chunk is the oldest still needed.
func (l *eventLog) dropChunks() {
	for seq := l.head; seq < l.next; seq++ {
		switch e := l.at(seq); {
		case e.cold():
			l.arena.dropBefore(e.enc.chunk)
			return
		case !e.reset:
			l.arena.dropBefore(^uint64(0)) // nothing cold left
			return
		}
	}
}

// view returns the entry at seq with its events, decoding them if it is
// cold; the caller holds mu (at least for reading) and head ≤ seq < next.
// Decoded events are the caller's: a later view decodes again.
func (l *eventLog) view(seq uint64) entryView {
	e := l.at(seq)
	v := entryView{logEntry: *e}
	switch {
	case e.hot:
		v.events = *l.hotSlot(seq)
	case e.count > 0:
		evs, err := decodeEvents(l.arena.bytes(e.enc), e.index, e.count)
		assert(err == nil, "%v", err)
		l.decoded.Add(uint64(len(evs)))
		v.events = evs
	}
	return v
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
