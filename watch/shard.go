package watch

import (
	"slices"
	"sync"
	"sync/atomic"
)

// Reasons a watcher is cut loose (the "reason" label of
// lodestone_watch_watchers_cut_total).
const (
	reasonOverflow = "overflow" // its buffer filled
	reasonReplay   = "replay"   // its catch-up did not fit its buffer
	reasonLag      = "lag"      // its shard fell behind the log's retention
	reasonRestore  = "restore"  // the state machine was replaced by a snapshot
)

// chunk bounds the entries a shard copies out of the log and applies under
// one hold of its lock, so Watch and Close never wait long for a shard.
const chunk = 256

// shard is one lock, one goroutine and one cursor on the log, and the
// indexes of its watchers.
//
// The logic (step, apply, tick, link, remove) is synchronous: plain methods
// with no channels or sleeps. run is the thin goroutine shell around it,
// and the output that needs the outside world (wake-ups, logs, metrics) is
// collected into scratch lists and flushed by the shell after s.mu is
// released.
type shard struct {
	h     *Hub
	id    int
	label string

	// Wake-up protocol with Publish (see run and wake).
	_           [64]byte // NB: keep the flags Publish reads off the cache lines the shard writes
	idle        atomic.Bool
	progressReq atomic.Uint32 // requested progress rounds: roundIdle|roundAll
	_           [64]byte
	notify      chan struct{} // cap 1

	mu     sync.Mutex
	cursor uint64 // next log seq to apply; written under mu by the stepping goroutine only
	// processed: every log entry with index ≤ processed has been applied
	// to this shard's watchers. Written under mu, read lock-free by Next.
	processed atomic.Uint64
	exact     map[string]*Watcher // key → first watcher of the key
	prefix    map[string]*Watcher // prefix → first watcher of the prefix
	plens     []int               // distinct prefix lengths present, ascending
	plenN     map[int]int         // prefix length → watchers
	n         int                 // linked watchers
	// slices heads each progress slice's list of linked watchers (see
	// progressSlices and Watcher.slice), linked through snext and sprev.
	slices [progressSlices]*Watcher
	closed bool
	// Timer rounds (roundIdle), for the stepping goroutine only: how many
	// of the hub's slice rounds this shard has run, and processed as of
	// each slice's last round.
	slicesDone uint64
	lastRound  [progressSlices]uint64

	// asked holds the watchers Hub.ProgressOf listed for the next
	// roundListed tick, each once (so it never outgrows the watchers).
	askedMu sync.Mutex
	asked   map[*Watcher]struct{}

	// Scratch of the stepping goroutine.
	entries   []entryView
	touched   []*Watcher
	wakes     []chan struct{}
	readies   []*Watcher // watchers to put on their Ready lists at flush
	cuts      []cutRecord
	delivered int
	lagSum    []float64 // delivery lag samples (seconds) of this step, one per entry that delivered
}

// cutRecord is a watcher cut loose during a step, logged after s.mu.
type cutRecord struct {
	id     uint64
	key    string
	reason string
	index  uint64
}

func newShard(h *Hub, id int, label string) *shard {
	s := &shard{
		h:      h,
		id:     id,
		label:  label,
		notify: make(chan struct{}, 1),
		exact:  make(map[string]*Watcher),
		prefix: make(map[string]*Watcher),
		plenN:  make(map[int]int),
		cursor: 1,
	}
	return s
}

// run is the shard goroutine: catch up with the log, wake its children in
// the wake-up tree, run a requested progress tick, sleep until woken.
func (s *shard) run(stop <-chan struct{}) {
	defer s.h.wg.Done()
	for {
		// NB: take the progress request before the catch-up, not after
		// it. Progress is called after the Publish it must cover, so a
		// request seen here is answered with that Publish applied. Taken
		// after the catch-up, the request could have arrived after the
		// catch-up read the log: the tick then reported an older index,
		// and a watcher that nothing newer matched waited forever for the
		// index it was promised (TestShardsAgreeLive hung;
		// TestProgressCoversEarlierPublish).
		progress := s.progressReq.Swap(0)
		fired := s.h.sliceRounds.Load() // NB: before the catch-up too, for the same reason
		var listed map[*Watcher]struct{}
		if progress&roundListed != 0 {
			listed = s.takeAsked() // NB: before the catch-up too, for the same reason
		}
		for s.step() {
			s.wakeChildren()
			select {
			case <-stop:
				return
			default:
			}
		}
		s.wakeChildren()
		if f := s.h.afterCatchUp; f != nil {
			f(s.id)
		}
		if progress&^roundListed != 0 {
			s.tick(progress&^roundListed, fired)
		}
		if len(listed) > 0 {
			s.tickListed(listed)
		}
		// NB: announce idleness, then re-check. A waker makes the new entry
		// visible (Publish stores nextA; a parent shard has read it), then
		// loads idle; we store idle, then load nextA. With sequentially
		// consistent atomics one of us sees the other, so no wake-up is lost
		// and nobody sends to a busy shard.
		s.idle.Store(true)
		if s.h.log.nextA.Load() > s.cursor || s.progressReq.Load() != 0 {
			s.idle.Store(false)
			continue
		}
		select {
		case <-s.notify:
		case <-stop:
			return
		}
		s.idle.Store(false)
	}
}

// wakeChildren wakes shards 2i+1 and 2i+2. Publish wakes only shard 0 and
// each shard wakes its two children once it has caught up, so Publish pays
// for one wake-up whatever the number of shards, and the last shard hears
// of an entry after log2(shards) hops.
func (s *shard) wakeChildren() {
	sh := s.h.shards
	for c := 2*s.id + 1; c <= 2*s.id+2 && c < len(sh); c++ {
		sh[c].wake()
	}
}

// wake wakes the shard if it sleeps. Never blocks.
func (s *shard) wake() {
	if s.idle.Load() && s.idle.CompareAndSwap(true, false) {
		signal(s.notify)
	}
}

// step applies up to chunk new log entries to the shard's watchers and
// reports whether more are waiting. Called only by the shard's stepping
// goroutine (run, or a test driving the hub by hand).
func (s *shard) step() bool {
	l := &s.h.log
	l.mu.RLock()
	head, next, last, floor := l.head, l.next, l.last, l.floor
	from := max(s.cursor, head)
	lagged := s.cursor < head
	n := min(next-from, chunk)
	for seq := from; seq < from+n; seq++ {
		s.entries = append(s.entries, l.view(seq))
	}
	l.mu.RUnlock()
	more := from+n < next

	s.mu.Lock()
	if lagged {
		s.cutLagging(floor)
	}
	for i := range s.entries {
		s.apply(&s.entries[i])
	}
	s.cursor = from + n
	switch {
	case !more:
		s.processed.Store(max(s.processed.Load(), last))
	case n > 0:
		s.processed.Store(s.entries[n-1].index)
	}
	s.mu.Unlock()

	clear(s.entries)
	s.entries = s.entries[:0]
	s.flush()
	return more
}

// queueWake schedules the wake-up of a watcher that has something new for
// its reader: its own channel, or its Ready list. The caller holds w.mu.
func (s *shard) queueWake(w *Watcher) {
	if w.wake != nil {
		s.wakes = append(s.wakes, w.wake)
	}
	if w.ready != nil {
		s.readies = append(s.readies, w)
	}
}

// flush hands the step's output to the outside world: wake consumers, log
// cuts, count metrics. Runs without s.mu.
func (s *shard) flush() {
	for _, c := range s.wakes {
		signal(c)
	}
	clear(s.wakes)
	s.wakes = s.wakes[:0]
	// NB: a run of watchers on one Ready (a stream's watchers of the key
	// just written) is listed under one lock with one signal.
	for i := 0; i < len(s.readies); {
		r := s.readies[i].ready
		j := i + 1
		for j < len(s.readies) && s.readies[j].ready == r {
			j++
		}
		r.add(s.readies[i:j]...)
		i = j
	}
	clear(s.readies)
	s.readies = s.readies[:0]
	m := s.h.metrics
	if s.delivered > 0 {
		m.delivered.Add(float64(s.delivered))
		s.delivered = 0
	}
	for _, v := range s.lagSum {
		m.lag.Observe(v)
	}
	s.lagSum = s.lagSum[:0]
	if len(s.cuts) == 0 {
		return
	}
	// NB: one Info line per reason per step, not per watcher: a mass cut
	// (a lagging shard, a restore, a burst that overflows 100k slow
	// consumers) must not turn into a log flood.
	lg := s.h.logger
	for _, c := range s.cuts {
		lg.Debug("watcher cut loose", "shard", s.id, "watcher", c.id, "key", c.key,
			"reason", c.reason, "index", c.index)
	}
	for _, reason := range []string{reasonOverflow, reasonLag, reasonRestore} {
		n := 0
		var first cutRecord
		for _, c := range s.cuts {
			if c.reason == reason {
				if n == 0 {
					first = c
				}
				n++
			}
		}
		if n == 0 {
			continue
		}
		m.cut.WithLabelValues(reason).Add(float64(n))
		lg.Info("watchers cut loose", "shard", s.id, "reason", reason, "count", n,
			"watcher", first.id, "key", first.key, "index", first.index)
	}
	clear(s.cuts)
	s.cuts = s.cuts[:0]
}

// apply matches one log entry against the shard's watchers and fills their
// buffers. Cost: per event, one exact-map probe plus one prefix-map probe
// per distinct prefix length ≤ len(key) — independent of the number of
// watchers, except for the watchers that do match.
func (s *shard) apply(e *entryView) {
	if e.reset {
		s.cutRestore(e.index)
		return
	}
	delivered := s.delivered
	for i := range e.events {
		ev := &e.events[i]
		key := ev.KV.Key
		for w := s.exact[key]; w != nil; {
			nx := w.next // offer may unlink w
			s.offer(w, e, ev)
			w = nx
		}
		for _, n := range s.plens {
			if n > len(key) {
				break
			}
			for w := s.prefix[key[:n]]; w != nil; {
				nx := w.next
				s.offer(w, e, ev)
				w = nx
			}
		}
	}
	if len(s.touched) == 0 {
		return
	}
	// NB: every watcher touched by this entry stays locked until the whole
	// entry is in its buffer, so Next never returns half an index.
	for _, w := range s.touched {
		s.queueWake(w)
		w.mu.Unlock()
	}
	clear(s.touched)
	s.touched = s.touched[:0]
	if s.delivered > delivered {
		s.lagSum = append(s.lagSum, float64(s.h.clock.Now().UnixNano()-e.at)/1e9)
	}
}

// offer delivers ev (of entry e) to w if w wants it.
func (s *shard) offer(w *Watcher, e *entryView, ev *Event) {
	if e.index <= w.after || !typeOK(w.opts, ev) {
		return
	}
	if w.mark != e.seq {
		w.mark = e.seq
		w.mu.Lock()
		s.touched = append(s.touched, w)
	}
	if w.closed || w.errLocked() != nil {
		return
	}
	// The events of one index are never split: a buffer holding an older
	// index that cannot take this event means the consumer is behind by a
	// full buffer. Cut it loose at the previous index instead of waiting.
	if len(w.buf) >= int(w.capacity) && w.buf[0].Index != e.index {
		k := len(w.buf)
		for k > 0 && w.buf[k-1].Index == e.index {
			k--
		}
		clear(w.buf[k:])
		w.buf = w.buf[:k]
		s.cutLocked(w, &OverflowError{ResumeIndex: e.index - 1, Reason: reasonOverflow}, reasonOverflow, e.index-1)
		return
	}
	w.buf = append(w.buf, ev)
	s.delivered++
}

// cutLocked makes err w's terminal error and unlinks it. The caller holds
// s.mu and w.mu.
func (s *shard) cutLocked(w *Watcher, err error, reason string, index uint64) {
	w.setErrLocked(err)
	s.unlink(w)
	s.cuts = append(s.cuts, cutRecord{id: w.id, key: w.key, reason: reason, index: index})
}

// cut is cutLocked for a watcher the caller has not locked; it queues the
// wake-up.
func (s *shard) cut(w *Watcher, err error, reason string, index uint64) {
	w.mu.Lock()
	s.cutLocked(w, err, reason, index)
	s.queueWake(w)
	w.mu.Unlock()
}

// cutLagging cuts the watchers that needed log entries evicted before this
// shard applied them: those that start below floor.
func (s *shard) cutLagging(floor uint64) {
	resume := s.processed.Load()
	s.each(func(w *Watcher) {
		if w.after < floor {
			s.cut(w, &OverflowError{ResumeIndex: max(resume, w.after), Reason: reasonLag}, reasonLag, resume)
		}
	})
}

// cutRestore cuts the watchers a snapshot restore at index interrupts.
func (s *shard) cutRestore(index uint64) {
	s.each(func(w *Watcher) {
		if w.after < index {
			s.cut(w, &CompactedError{Requested: w.after, Oldest: index, Current: index}, reasonRestore, index)
		}
	})
}

// Progress rounds, as tick's mode.
const (
	// roundIdle is the timer's round: it tells only watchers that heard
	// nothing (no event, no progress) since the previous timer round. A
	// watcher that got an event within the interval already holds a
	// resume point that recent; telling it again would be a notification
	// per watcher per interval for nothing, and at 100k watchers that
	// burst of notifications is what a round cost the write path.
	roundIdle uint32 = 1 << iota
	// roundAll is Hub.Progress: every watcher whose last Index is behind.
	roundAll
	// roundListed is Hub.ProgressOf: the watchers it listed in
	// shard.asked, if behind.
	roundListed
)

// askProgress lists w for the next roundListed tick and reports whether
// it was not listed already.
func (s *shard) askProgress(w *Watcher) bool {
	s.askedMu.Lock()
	defer s.askedMu.Unlock()
	if _, ok := s.asked[w]; ok {
		return false
	}
	if s.asked == nil {
		s.asked = make(map[*Watcher]struct{})
	}
	s.asked[w] = struct{}{}
	return true
}

// takeAsked returns the listed watchers and empties the list.
func (s *shard) takeAsked() map[*Watcher]struct{} {
	s.askedMu.Lock()
	defer s.askedMu.Unlock()
	m := s.asked
	s.asked = nil
	return m
}

// tickListed is a progress round over listed only: each of them that is
// idle and behind the shard's processed index is told it.
func (s *shard) tickListed(listed map[*Watcher]struct{}) {
	s.mu.Lock()
	processed := s.processed.Load()
	for w := range listed {
		w.mu.Lock()
		if !w.closed && w.opts&optNoProgress == 0 && len(w.buf) == 0 && w.errLocked() == nil && !w.progress && max(w.told, w.after) < processed {
			w.progress = true
			s.queueWake(w)
		}
		w.mu.Unlock()
	}
	s.mu.Unlock()
	s.flush()
}

// progressSlices is how many slices a timer round is cut into: the hub's
// timer fires every ProgressInterval/progressSlices and each firing
// visits the watchers of one slice, so the notifications of quiet
// watchers go out as many small bursts per interval instead of one large
// one. Events woken behind a burst wait for it, so a burst must stay
// small at a million watchers: a sixteenth of them per firing set the
// delivery-lag tail there. A watcher's slice is its Ready list's
// (Watcher.slice): sliced by watcher id, every firing told a few
// watchers of every gRPC stream, so every stream sent a message per
// firing; sliced by stream, a stream sends one per interval.
const progressSlices = 256

// sliceSet is a set of progress slices.
type sliceSet [progressSlices / 64]uint64

func (m *sliceSet) add(i uint64)      { m[i/64] |= 1 << (i % 64) }
func (m *sliceSet) has(i uint64) bool { return m[i/64]&(1<<(i%64)) != 0 }

// allSlices holds every slice.
var allSlices = func() (m sliceSet) {
	for i := range m {
		m[i] = ^uint64(0)
	}
	return m
}()

// tick is a progress round (see roundIdle and roundAll): an idle watcher
// (empty buffer) whose last reported Index is behind the shard's
// processed index gets a progress notification. It also samples buffer
// occupancy and closes watchers whose Watch context is done. A timer
// round covers the slices whose turn came since the shard's last one, up
// to fired (Hub.sliceRounds, read before the catch-up that preceded this
// call). O(watchers visited): a timer round visits only its slices'
// watchers.
func (s *shard) tick(mode uint32, fired uint64) {
	if mode&roundListed != 0 {
		if listed := s.takeAsked(); len(listed) > 0 {
			s.tickListed(listed)
		}
		if mode &^= roundListed; mode == 0 {
			return
		}
	}
	s.mu.Lock()
	processed := s.processed.Load()
	var slices sliceSet // the slices whose timer round is due
	if mode&roundIdle != 0 {
		for r := max(s.slicesDone, fired-min(fired, progressSlices)); r < fired; r++ {
			slices.add(r % progressSlices)
		}
		s.slicesDone = fired
	}
	all := mode&roundAll != 0
	if all {
		slices = allSlices
	}
	occ := s.h.metrics.occupancy
	s.eachIn(&slices, func(w *Watcher) {
		slice := w.slice()
		if c := w.watchCtx(); c != nil && c.Err() != nil {
			s.unlink(w)
			if c := w.closeBuf(); c != nil {
				s.wakes = append(s.wakes, c)
			}
			return
		}
		// heard ≤ cutoff: nothing newer than the slice's last timer round
		// reached the watcher (roundIdle); roundAll tells every watcher
		// behind.
		cutoff := processed
		if !all {
			cutoff = s.lastRound[slice]
		}
		w.mu.Lock()
		occ.Observe(float64(len(w.buf)) / float64(w.capacity))
		if heard := max(w.told, w.after); w.opts&optNoProgress == 0 && len(w.buf) == 0 && w.errLocked() == nil && !w.progress && heard < processed && heard <= cutoff {
			w.progress = true
			s.queueWake(w)
		}
		w.mu.Unlock()
	})
	for i := range uint64(progressSlices) {
		if slices.has(i) {
			s.lastRound[i] = processed
		}
	}
	s.mu.Unlock()
	s.flush()
}

// each calls f for every linked watcher; f may unlink the watcher it is
// given. The caller holds s.mu.
func (s *shard) each(f func(*Watcher)) {
	s.eachIn(&allSlices, f)
}

// eachIn calls f for every linked watcher of the progress slices in set;
// f may unlink the watcher it is given. The caller holds s.mu.
func (s *shard) eachIn(set *sliceSet, f func(*Watcher)) {
	for i := range uint64(progressSlices) {
		if !set.has(i) {
			continue
		}
		for w := s.slices[i]; w != nil; {
			nx := w.snext
			f(w)
			w = nx
		}
	}
}

// link adds w to the shard's indexes. The caller holds s.mu.
func (s *shard) link(w *Watcher) {
	m := s.exact
	if w.opts&optPrefix != 0 {
		m = s.prefix
		n := len(w.key)
		if s.plenN[n] == 0 {
			i, _ := slices.BinarySearch(s.plens, n)
			// Copy on change: apply may be ranging over the old slice.
			s.plens = slices.Insert(slices.Clip(s.plens), i, n)
		}
		s.plenN[n]++
	}
	if head := m[w.key]; head != nil {
		// NB: share the key's bytes with the watchers already on it: 100k
		// watchers on 10k keys would otherwise each hold a copy.
		w.key = head.key
		w.next = head
		head.prev = w
	}
	m[w.key] = w
	i := w.slice()
	if head := s.slices[i]; head != nil {
		w.snext = head
		head.sprev = w
	}
	s.slices[i] = w
	s.n++
}

// unlink removes w from the shard's indexes. The caller holds s.mu.
func (s *shard) unlink(w *Watcher) {
	m := s.exact
	if w.opts&optPrefix != 0 {
		m = s.prefix
	}
	// NB: no "linked" flag (it would push the struct into the next size
	// class): a linked watcher has a predecessor or heads its key's list.
	if w.prev == nil && m[w.key] != w {
		return
	}
	if w.prev != nil {
		w.prev.next = w.next
	} else if w.next != nil {
		m[w.key] = w.next
	} else {
		delete(m, w.key)
	}
	if w.next != nil {
		w.next.prev = w.prev
	}
	w.next, w.prev = nil, nil
	if w.sprev != nil {
		w.sprev.snext = w.snext
	} else {
		s.slices[w.slice()] = w.snext
	}
	if w.snext != nil {
		w.snext.sprev = w.sprev
	}
	w.snext, w.sprev = nil, nil
	if w.opts&optPrefix != 0 {
		n := len(w.key)
		if s.plenN[n]--; s.plenN[n] == 0 {
			delete(s.plenN, n)
			i, _ := slices.BinarySearch(s.plens, n)
			s.plens = slices.Delete(slices.Clone(s.plens), i, i+1)
		}
	}
	s.n--
}

// remove is unlink under s.mu, for Watcher.Close.
func (s *shard) remove(w *Watcher) {
	s.mu.Lock()
	s.unlink(w)
	s.mu.Unlock()
}

// watchers returns the number of linked watchers.
func (s *shard) watchers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}
