package watch

import (
	"context"
	"sync"
	"time"
)

// Watcher is one subscription. Next is called by one goroutine at a time;
// Close may be called from any goroutine, any number of times.
//
// The struct is kept lean (160 B, TestWatcherSize) because a server holds a
// million of them: the buffer and the wake-up channel are allocated only
// when first needed, what few watchers have (a cancellable context, a
// terminal error) lives in a watcherExtra allocated only for them, and the
// shard's indexes link watchers intrusively (next/prev) instead of holding
// slices of them.
type Watcher struct {
	s *shard
	// next, prev link the watchers of one key (or one prefix) in a shard;
	// guarded by s.mu.
	next, prev *Watcher
	// snext, sprev link the watchers of one progress slice in a shard
	// (shard.slices), so a timer round visits only its slice; guarded by
	// s.mu.
	snext, sprev *Watcher
	key          string // immutable once linked (link shares equal keys' bytes)
	mu           sync.Mutex

	opts     uint8 // opt* bits, immutable
	closed   bool  // Close was called; guarded by mu
	progress bool  // a progress notification is pending; guarded by mu
	// queued: w is on ready's list; guarded by ready.mu. (A byte of its
	// own: the flags above are under other locks.)
	queued   bool
	capacity uint32 // buffer bound, immutable

	after uint64 // immutable once linked: events with index ≤ after are not for us
	told  uint64 // highest Index returned by Next; guarded by mu
	mark  uint64 // seq of the entry the shard is filling us from; shard goroutine only

	buf  []*Event      // undelivered events, shared and read-only; guarded by mu
	wake chan struct{} // cap 1, made by the first Next that blocks; guarded by mu
	// x is the rare state, nil until a watcher needs it: set before the
	// watcher is linked, or under both s.mu and mu, so holding either
	// lock is enough to read the pointer.
	x   *watcherExtra
	id  uint64 // immutable, for logs
	tag int64  // Request.Tag, immutable
	// ready, if set, is told whenever Next has something new (see Ready).
	ready *Ready // immutable
}

// watcherExtra is what only some watchers have. NB: kept apart from
// Watcher because a gRPC stream's watchers have neither, and the 24 B
// would push every Watcher into the 176 B size class.
type watcherExtra struct {
	// ctx is the context given to Watch, if it can be cancelled (else
	// the watcher has no watcherExtra for it). Immutable. NB: not a
	// context.AfterFunc hook, which costs ~180 B per watcher; a blocked
	// Next selects on it, and the progress tick reaps watchers whose ctx
	// is done.
	ctx context.Context
	// err is the terminal error, delivered after buf drains; guarded by
	// Watcher.mu.
	err error
}

// errLocked returns the terminal error, if any. The caller holds w.mu (or
// s.mu, or owns w before it is linked).
func (w *Watcher) errLocked() error {
	if w.x == nil {
		return nil
	}
	return w.x.err
}

// setErrLocked makes err the terminal error. The caller holds s.mu and
// w.mu, or owns w before it is linked.
func (w *Watcher) setErrLocked(err error) {
	if w.x == nil {
		w.x = &watcherExtra{err: err}
		return
	}
	w.x.err = err
}

// watchCtx returns the Watch context if it can be cancelled, else nil.
// The caller holds w.mu or s.mu.
func (w *Watcher) watchCtx() context.Context {
	if w.x == nil {
		return nil
	}
	return w.x.ctx
}

// slice is the progress slice w is linked in (shard.slices): its Ready
// list's, if it has one and takes progress notifications, so a consumer's
// watchers are told together; else by id. NB: a NoProgress watcher
// (a parked blocking read) keeps its id's slice: a Ready that serves
// thousands of them would otherwise put them all in one round's visit.
func (w *Watcher) slice() uint64 {
	if w.ready != nil && w.opts&optNoProgress == 0 {
		return uint64(w.ready.slice)
	}
	return w.id % progressSlices
}

// ID returns the watcher's hub-unique id (the "watcher" key in logs).
func (w *Watcher) ID() uint64 { return w.id }

// Tag returns Request.Tag.
func (w *Watcher) Tag() int64 { return w.tag }

// Next returns the next batch: buffered events, else a pending progress
// notification, else the terminal error; if there is none of these it blocks
// until there is or ctx is done. Data that is ready is returned even if ctx
// is already done, so Next(doneCtx) polls.
//
// Errors: a *OverflowError (errors.Is ErrOverflow) or *CompactedError
// (errors.Is ErrCompacted) once the watcher was cut loose and every event
// before the cut was returned; ErrClosed after Close or Hub.Close; ctx.Err().
// If the context given to Watch is done, Next closes the watcher and
// returns that context's error (then ErrClosed). Terminal errors repeat on
// every later call.
func (w *Watcher) Next(ctx context.Context) (Batch, error) {
	b, err, _ := w.nextUntil(ctx, nil)
	return b, err
}

// SharedBatch is what NextShared returns: Batch with the hub's events.
type SharedBatch struct {
	Index  uint64
	Events []*Event
}

// NextShared is Next without the copy, for a consumer that converts the
// events anyway: Events point at the hub's shared events, which nobody may
// modify; the caller owns the slice, not the events. PrevKV is left as
// published: if WantsPrevKV is false the caller must ignore it.
func (w *Watcher) NextShared(ctx context.Context) (SharedBatch, error) {
	idx, evs, err, _ := w.nextRaw(ctx, nil)
	return SharedBatch{Index: idx, Events: evs}, err
}

// Recycle gives back the Events of a batch NextShared returned, once the
// caller is done with them (it must not touch the slice afterwards): the
// watcher's next events go into it instead of a slice grown anew. A busy
// watcher (a prefix watcher fed by every write) otherwise grew a fresh
// slice for every batch, the largest share of what a watch member
// allocated after the responses themselves. Only a slice whose capacity
// is within [recycleMin, recycleMax] is kept, so an idle watcher of a
// quiet key still holds no buffer and a kept one stays small.
func (w *Watcher) Recycle(evs []*Event) {
	if c := cap(evs); c < recycleMin || c > recycleMax {
		return
	}
	evs = evs[:cap(evs)]
	clear(evs) // NB: the events must not stay pinned by an idle buffer
	w.mu.Lock()
	if w.buf == nil && !w.closed {
		w.buf = evs[:0]
	}
	w.mu.Unlock()
}

// recycleMin and recycleMax bound the capacity of a slice Recycle keeps.
const (
	recycleMin = 8
	recycleMax = 256
)

// Closed reports whether Close was called (not whether the hub closed
// the watcher: that is Next's ErrClosed).
func (w *Watcher) Closed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

// WantsPrevKV reports Request.PrevKV.
func (w *Watcher) WantsPrevKV() bool { return w.opts&optPrevKV != 0 }

// nextUntil is Next with an optional timer: when timeout fires it returns
// (Batch{Index: current}, nil, true).
func (w *Watcher) nextUntil(ctx context.Context, timeout <-chan time.Time) (Batch, error, bool) {
	idx, evs, err, timedOut := w.nextRaw(ctx, timeout)
	if len(evs) == 0 {
		return Batch{Index: idx}, err, timedOut
	}
	out := make([]Event, len(evs))
	for i, p := range evs {
		out[i] = *p
		if w.opts&optPrevKV == 0 {
			out[i].PrevKV = nil
		}
	}
	return Batch{Index: idx, Events: out}, err, timedOut
}

// nextRaw is nextUntil returning the buffer itself (the hub's events).
func (w *Watcher) nextRaw(ctx context.Context, timeout <-chan time.Time) (uint64, []*Event, error, bool) {
	for {
		w.mu.Lock()
		var watchDone <-chan struct{}
		watchCtx := w.watchCtx()
		if watchCtx != nil {
			watchDone = watchCtx.Done()
		}
		if w.closed {
			w.mu.Unlock()
			return 0, nil, ErrClosed, false
		}
		if watchCtx != nil && watchCtx.Err() != nil {
			w.mu.Unlock()
			w.Close()
			return 0, nil, watchCtx.Err(), false
		}
		if len(w.buf) > 0 {
			evs := w.buf
			w.buf = nil // NB: an idle watcher holds no buffer; the shard allocates on the next match
			idx := w.indexLocked(evs[len(evs)-1].Index)
			w.told = idx
			w.progress = false
			// NB: its end, behind the buffer, is news too, and a cut
			// watcher gets no event to list it again: list it now, so a
			// Ready consumer that polls once a round reads it next round.
			relist := w.ready != nil && w.errLocked() != nil
			w.mu.Unlock()
			if relist {
				w.ready.add(w)
			}
			return idx, evs, nil, false
		}
		if err := w.errLocked(); err != nil {
			w.mu.Unlock()
			return 0, nil, err, false
		}
		if w.progress {
			w.progress = false
			idx := w.indexLocked(0)
			w.told = idx
			w.mu.Unlock()
			return idx, nil, nil, false
		}
		if err := ctx.Err(); err != nil {
			// NB: a poll (Next with a done ctx, as a Ready consumer drains)
			// must not allocate the wake-up channel: a Ready watcher never
			// blocks in Next, and 100k idle watchers would each keep one
			// (~100 B) and be signalled through it on every delivery.
			w.mu.Unlock()
			return 0, nil, err, false
		}
		if w.wake == nil {
			w.wake = make(chan struct{}, 1)
		}
		wake := w.wake
		w.mu.Unlock()

		select {
		case <-wake:
		case <-watchDone:
			w.Close()
			return 0, nil, watchCtx.Err(), false
		case <-ctx.Done():
			// Prefer data that raced with the cancellation.
			select {
			case <-wake:
				continue
			default:
			}
			return 0, nil, ctx.Err(), false
		case <-timeout:
			w.mu.Lock()
			if len(w.buf) > 0 || w.errLocked() != nil || w.closed {
				w.mu.Unlock()
				timeout = nil
				continue
			}
			idx := w.indexLocked(0)
			w.mu.Unlock()
			return idx, nil, nil, true
		}
	}
}

// indexLocked is the Index a batch whose newest event is at lastEvent may
// claim. A live watcher has everything up to its shard's processed index
// (the shard fills a watcher's buffer for an entry while holding w.mu, so
// holding w.mu here means no entry at or below processed is half-copied).
// A watcher cut loose claims only its resume index.
func (w *Watcher) indexLocked(lastEvent uint64) uint64 {
	if err := w.errLocked(); err != nil {
		if oe, ok := err.(*OverflowError); ok {
			return max(oe.ResumeIndex, w.told)
		}
		return max(lastEvent, w.told)
	}
	return max(lastEvent, w.told, w.after, w.s.processed.Load())
}

// Close ends the subscription: it leaves its shard, drops its buffer and
// makes a blocked Next return ErrClosed. Safe to call more than once and
// concurrently with Next.
func (w *Watcher) Close() {
	// Unlink first, so that when Next reports ErrClosed the shard has
	// already forgotten the watcher.
	w.s.remove(w)
	signal(w.closeBuf())
}

// closeBuf marks w closed and drops its buffer; it returns the wake-up to
// signal (nil if none or already closed).
func (w *Watcher) closeBuf() chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	clear(w.buf)
	w.buf = nil
	return w.wake
}

// signal wakes a blocked Next without ever blocking.
func signal(c chan struct{}) {
	if c == nil {
		return
	}
	select {
	case c <- struct{}{}:
	default:
	}
}

// matches reports whether ev passes w's key and type filters.
func (w *Watcher) matches(ev *Event) bool { return matchOpts(w.key, w.opts, ev) }

// replayBudget bounds the events one replay call scans under the log's
// read lock, so a watcher catching up from far back never holds Publish
// off for long.
const replayBudget = 4096

// replay copies the matching events of log entries [from, to) into w.buf,
// before w is linked; the caller holds the log's read lock. It stops after
// the entry that takes the scanned events past replayBudget and returns the
// seq to continue from. It returns ok=false if w was cut: its buffer would
// have exceeded its capacity (its error is then an *OverflowError to resume
// from) or a restore marker intervened (a *CompactedError).
func (w *Watcher) replay(l *eventLog, from, to uint64) (next uint64, ok bool) {
	scanned := 0
	for seq := from; seq < to; seq++ {
		if scanned >= replayBudget {
			return seq, true
		}
		e := l.at(seq)
		if e.index <= w.after {
			continue
		}
		if e.reset {
			w.setErrLocked(&CompactedError{Requested: w.after, Oldest: e.index, Current: l.last})
			return seq, false
		}
		scanned += e.count + 1
		mark := len(w.buf)
		events := l.view(seq).events
		for i := range events {
			if ev := &events[i]; w.matches(ev) {
				w.buf = append(w.buf, ev)
			}
		}
		if len(w.buf) > int(w.capacity) && mark > 0 {
			clear(w.buf[mark:])
			w.buf = w.buf[:mark]
			w.setErrLocked(&OverflowError{ResumeIndex: e.index - 1, Reason: reasonReplay})
			return seq, false
		}
	}
	return to, true
}
