package watch

import "unsafe"

// NewManual returns a Hub that starts no goroutines: its shards move only
// when the test calls Sync (or Progress, which syncs first). Tests use it to
// make interleavings deterministic.
func NewManual(cfg Config) (*Hub, error) { return newHub(cfg, true, nil) }

// NewWithCatchUpHook returns a running Hub whose shard goroutines call f
// after each catch-up with the log, before they run a requested progress
// tick: a test can publish and request progress exactly there.
func NewWithCatchUpHook(cfg Config, f func(shard int)) (*Hub, error) { return newHub(cfg, false, f) }

// Sync steps every shard of a manual Hub until it has applied the whole log.
func (h *Hub) Sync() {
	for _, s := range h.shards {
		for s.step() {
		}
	}
}

// Retained returns the retained log entries' count and the log's bounds.
func (h *Hub) Retained() (entries int, events int, floor, last uint64) {
	h.log.mu.RLock()
	defer h.log.mu.RUnlock()
	return int(h.log.next - h.log.head), h.log.events, h.log.floor, h.log.last
}

// ShardOf returns the shard a watcher was assigned to.
func (w *Watcher) ShardOf() int { return w.s.id }

// TimerRounds runs n of the progress timer's slice rounds on a manual Hub,
// as n firings of its timer would; ProgressSlices of them make one
// ProgressInterval.
func (h *Hub) TimerRounds(n int) {
	for range n {
		h.sliceRounds.Add(1)
		h.progress(roundIdle)
	}
}

// ProgressSlices is how many timer rounds make one interval.
const ProgressSlices = progressSlices

// SetHotEntries sets how many of the newest log entries stay decoded
// (hotEntries by default; at most twice as many events); 0 encodes every entry as it is published, so
// every shard step and replay decodes. Call it before the first Publish.
func (h *Hub) SetHotEntries(n int) {
	h.log.mu.Lock()
	defer h.log.mu.Unlock()
	h.log.setHot(n)
}

// ArenaChunks returns the arena's chunk count.
func (h *Hub) ArenaChunks() int {
	h.log.mu.RLock()
	defer h.log.mu.RUnlock()
	return len(h.log.arena.chunks)
}

// WatcherSize is the size of the struct every watcher pays for.
const WatcherSize = unsafe.Sizeof(Watcher{})

// Hot returns the hot entries and their events, counted afresh from the
// ring, and the log's own count of hot events, which must agree.
func (h *Hub) Hot() (entries, events, counted int) {
	l := &h.log
	l.mu.RLock()
	defer l.mu.RUnlock()
	for seq := l.head; seq < l.next; seq++ {
		if e := l.at(seq); e.hot {
			entries++
			events += e.count
		}
	}
	return entries, events, l.hotCount
}
