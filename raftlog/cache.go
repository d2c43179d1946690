package raftlog

import (
	"sort"

	"go.etcd.io/raft/v3/raftpb"
)

// termRun says that the entries from index up to the next run's index (or the
// last index) all have term.
type termRun struct{ index, term uint64 }

// termIndex answers Term(i) for every i in [compacted index, last index] from
// memory. Terms only change at leader changes, so the run-length encoding is
// tiny (one run per term seen in the retained log) and Term never reads disk.
//
// Invariant: runs is non-empty, runs[0].index is the compacted index, indexes
// strictly increase and adjacent runs have different terms.
type termIndex struct {
	runs []termRun
	last uint64 // last index covered
}

// reset makes the index cover just the compacted entry at (index, term).
func (t *termIndex) reset(index, term uint64) {
	t.runs = append(t.runs[:0], termRun{index, term})
	t.last = index
}

// term returns the term of entry i; i must be in [runs[0].index, last].
func (t *termIndex) term(i uint64) uint64 {
	assert(len(t.runs) > 0 && i >= t.runs[0].index && i <= t.last,
		"term(%d) outside [%d, %d]", i, t.runs[0].index, t.last)
	// First run that starts after i, minus one.
	k := sort.Search(len(t.runs), func(k int) bool { return t.runs[k].index > i })
	return t.runs[k-1].term
}

// append records that entry index has term; index must be last+1.
func (t *termIndex) append(index, term uint64) {
	assert(index == t.last+1, "term index append %d after %d", index, t.last)
	if t.runs[len(t.runs)-1].term != term {
		t.runs = append(t.runs, termRun{index, term})
	}
	t.last = index
}

// truncateFrom forgets entries >= i; i must be > runs[0].index.
func (t *termIndex) truncateFrom(i uint64) {
	assert(i > t.runs[0].index, "truncate term index at %d <= %d", i, t.runs[0].index)
	if i > t.last {
		return
	}
	k := sort.Search(len(t.runs), func(k int) bool { return t.runs[k].index >= i })
	t.runs = t.runs[:k]
	t.last = i - 1
}

// compactTo forgets entries < i, keeping i as the compacted entry.
func (t *termIndex) compactTo(i uint64) {
	assert(i >= t.runs[0].index && i <= t.last, "compact term index to %d outside [%d, %d]",
		i, t.runs[0].index, t.last)
	k := sort.Search(len(t.runs), func(k int) bool { return t.runs[k].index > i }) - 1
	// NB: copy into a new slice so the dropped prefix can be collected.
	runs := make([]termRun, len(t.runs)-k)
	copy(runs, t.runs[k:])
	runs[0].index = i
	t.runs = runs
}

// entryCache holds a suffix of the log in memory: ents[k].Index ==
// ents[0].Index+k and, when non-empty, the last cached entry is the last entry
// of the log. It never holds more than maxEntries entries nor, unless it holds
// a single entry, more than maxBytes bytes of Entry.Data.
//
// Cached entries are treated as immutable: Entries hands out copies of the
// Entry structs whose Data slices alias the cache, and nothing ever writes
// into a cached Data slice.
type entryCache struct {
	maxEntries int   // <= 0 disables the cache
	maxBytes   int64 // cap on the sum of len(Data)
	ents       []raftpb.Entry
	bytes      int64
}

// covers reports whether entry i is cached.
func (c *entryCache) covers(i uint64) bool {
	return len(c.ents) > 0 && i >= c.ents[0].Index && i <= c.ents[len(c.ents)-1].Index
}

// first returns the index of the first cached entry; the cache must be
// non-empty.
func (c *entryCache) first() uint64 { return c.ents[0].Index }

// get returns cached entry i; covers(i) must hold.
func (c *entryCache) get(i uint64) *raftpb.Entry { return &c.ents[i-c.ents[0].Index] }

// reset empties the cache.
func (c *entryCache) reset() {
	clear(c.ents)
	c.ents = c.ents[:0]
	c.bytes = 0
}

// truncateFrom drops cached entries with index >= i.
func (c *entryCache) truncateFrom(i uint64) {
	if len(c.ents) == 0 || i > c.ents[len(c.ents)-1].Index {
		return
	}
	if i <= c.ents[0].Index {
		c.reset()
		return
	}
	k := int(i - c.ents[0].Index)
	for j := k; j < len(c.ents); j++ {
		c.bytes -= int64(len(c.ents[j].Data))
	}
	clear(c.ents[k:])
	c.ents = c.ents[:k]
}

// dropBefore drops cached entries with index < i (compaction).
func (c *entryCache) dropBefore(i uint64) {
	if len(c.ents) == 0 || i <= c.ents[0].Index {
		return
	}
	if i > c.ents[len(c.ents)-1].Index {
		c.reset()
		return
	}
	c.dropFront(int(i - c.ents[0].Index))
}

// append adds ents, which must directly follow the cached suffix (or the
// cache must be empty), then trims the front to the limits.
func (c *entryCache) append(ents []raftpb.Entry) {
	if c.maxEntries <= 0 || len(ents) == 0 {
		return
	}
	if len(c.ents) > 0 {
		assert(ents[0].Index == c.ents[len(c.ents)-1].Index+1,
			"cache append %d after %d", ents[0].Index, c.ents[len(c.ents)-1].Index)
	}
	// Only the newest maxEntries of ents can survive the trim below.
	if len(ents) > c.maxEntries {
		ents = ents[len(ents)-c.maxEntries:]
		c.reset()
	}
	for i := range ents {
		c.bytes += int64(len(ents[i].Data))
	}
	c.ents = append(c.ents, ents...)
	n, bytes := 0, c.bytes
	for !c.fits(len(c.ents)-n, bytes) {
		bytes -= int64(len(c.ents[n].Data))
		n++
	}
	if n > 0 {
		c.dropFront(n)
	}
}

// fits says whether the cache may hold n entries of these bytes: within
// both limits, or a single entry of any size.
func (c *entryCache) fits(n int, bytes int64) bool {
	return n <= c.maxEntries && (bytes <= c.maxBytes || n <= 1)
}

// window says how many of the newest entries an empty cache keeps when
// entries of these data sizes, oldest first, are appended to it.
func (c *entryCache) window(sizes []int) int {
	if c.maxEntries <= 0 {
		return 0
	}
	n, bytes := 0, int64(0)
	for i := len(sizes) - 1; i >= 0 && c.fits(n+1, bytes+int64(sizes[i])); i-- {
		bytes += int64(sizes[i])
		n++
	}
	return n
}

// dropFront removes the first n cached entries.
func (c *entryCache) dropFront(n int) {
	for j := range n {
		c.bytes -= int64(len(c.ents[j].Data))
	}
	// NB: zero the dropped slots so their Data can be collected even though
	// the backing array lives on until append outgrows it. Reslicing the
	// front shrinks cap, so append reallocates (to about twice the live
	// length) well before the dead prefix can grow without bound.
	clear(c.ents[:n])
	c.ents = c.ents[n:]
}

// Release tells the log that no one will read the entries up to index
// soon: every member has them and this one has applied them. The cache
// drops them, and Entries reads any it is asked for again from raft.db.
// Those raft.db does not hold yet (the journal's, which the next
// checkpoint takes from the cache) stay until the checkpoint that writes
// them, which drops them then. NB: without it the cache stays full to its
// bounds however well the followers keep up, and with batched writes its
// bytes bound was a member's largest heap share after the keys.
//
// It never waits: if a write holds the log it records nothing and reports
// false, and the caller tries again later.
func (l *Log) Release(index uint64) bool {
	if !l.wmu.TryLock() {
		return false
	}
	defer l.wmu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.released = max(l.released, index)
	l.trimReleasedLocked()
	return true
}

// trimReleasedLocked drops the released entries raft.db holds from the
// cache: up to released, but not the journal's pending entries nor those
// of a fold not yet reaped. The caller holds wmu and mu; Release and every
// checkpoint that moves entries into raft.db call it.
func (l *Log) trimReleasedLocked() {
	l.cache.dropBefore(min(l.released, l.onDiskThroughLocked()) + 1)
}

// onDiskThroughLocked is the last index a raft.db read finds: the journal's
// pending entries and those of a fold not yet reaped are not there yet.
// The caller holds mu.
func (l *Log) onDiskThroughLocked() uint64 {
	upTo := l.last
	if l.pendFrom != 0 {
		upTo = min(upTo, l.pendFrom-1)
	}
	if f := l.folding; f != nil && len(f.ents) > 0 {
		upTo = min(upTo, f.ents[0].Index-1)
	}
	return upTo
}
