package watch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Hub is the watch fan-out hub. All methods are safe for concurrent use,
// except that Publish and Restore must be called from one goroutine (the
// apply loop), in index order.
type Hub struct {
	cfg     Config
	clock   Clock
	logger  *slog.Logger
	metrics *metrics

	log    eventLog
	shards []*shard
	rr     atomic.Uint64 // round-robin shard assignment
	ids    atomic.Uint64 // watcher ids

	manual bool // tests: no goroutines, the test steps the shards
	// sliceRounds counts the progress timer's firings; firing n is the
	// timer round of slice n mod progressSlices (shard.tick).
	sliceRounds atomic.Uint64
	// afterCatchUp, tests only: a shard goroutine calls it between its
	// catch-up with the log and its progress tick (see shard.run).
	afterCatchUp func(shard int)
	stopc        chan struct{}
	wg           sync.WaitGroup
	closeOnce    sync.Once
}

// New validates cfg, fills its zero fields with defaults, and starts the
// shard goroutines and the progress timer. Close stops them.
func New(cfg Config) (*Hub, error) {
	return newHub(cfg, false, nil)
}

func newHub(cfg Config, manual bool, afterCatchUp func(shard int)) (*Hub, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	h := &Hub{
		cfg:    cfg,
		clock:  cfg.Clock,
		logger: cfg.Logger,
		manual: manual,
		stopc:  make(chan struct{}),

		afterCatchUp: afterCatchUp,
	}
	h.log.init(cfg.RetainEvents, cfg.RetainBytes)
	h.metrics = newMetrics()
	h.shards = make([]*shard, cfg.Shards)
	for i := range h.shards {
		h.shards[i] = newShard(h, i, strconv.Itoa(i))
	}
	if !manual {
		for _, s := range h.shards {
			h.wg.Add(1)
			go s.run(h.stopc)
		}
		if cfg.ProgressInterval > 0 {
			h.wg.Add(1)
			go h.progressLoop(cfg.ProgressInterval)
		}
	}
	return h, nil
}

// progressLoop runs a timer round of one slice of the watchers every
// interval/progressSlices on the hub's Clock.
func (h *Hub) progressLoop(every time.Duration) {
	defer h.wg.Done()
	for {
		t := h.clock.NewTimer(max(every/progressSlices, 1))
		select {
		case <-t.C():
			h.sliceRounds.Add(1)
			h.progress(roundIdle)
		case <-h.stopc:
			t.Stop()
			return
		}
	}
}

// Publish appends the events of one applied Raft index to the log and
// returns. It never waits on a watcher: the cost is the append (O(events),
// plus the evictions it causes) and at most one non-blocking wake-up (of
// shard 0; the shards wake each other). Shards copy the events to watchers
// in the background.
//
// index must be greater than every index given to Publish or Restore
// before; anything else is a bug in the apply loop and panics. events may
// be nil (the index still advances, so progress notifications and new
// watchers see it). The hub takes ownership of events and everything they
// point to: the caller must not modify them afterwards. Publish sets each
// event's Index. After Close, Publish does nothing.
func (h *Hub) Publish(index uint64, events []Event) {
	var at int64
	var bytes int64
	if len(events) > 0 {
		at = h.clock.Now().UnixNano()
		for i := range events {
			events[i].Index = index
			bytes += events[i].size()
		}
	}
	l := &h.log
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	if index <= l.last {
		last := l.last
		l.mu.Unlock()
		assert(false, "Publish(%d) after index %d: indices must strictly increase", index, last)
	}
	l.last = index
	if len(events) == 0 {
		l.mu.Unlock()
		return
	}
	l.appendLocked(logEntry{index: index, at: at, bytes: bytes}, events)
	l.mu.Unlock()

	h.metrics.published.Add(float64(len(events)))
	h.shards[0].wake() // the shards wake each other (shard.wakeChildren)
}

// Restore tells the hub that the state machine was replaced by a snapshot
// at index (at boot, or when a follower installs a snapshot). Watchers that
// started before index are cut with a *CompactedError (Oldest = index), and
// Watch refuses start indices below index from now on. index must not be
// below the last published index (that is a bug and panics); equal is a
// no-op.
func (h *Hub) Restore(index uint64) {
	l := &h.log
	l.mu.Lock()
	if l.closed || index == l.last {
		l.mu.Unlock()
		return
	}
	if index < l.last {
		last := l.last
		l.mu.Unlock()
		assert(false, "Restore(%d) below published index %d", index, last)
	}
	l.last = index
	l.floor = max(l.floor, index)
	l.appendLocked(logEntry{index: index, reset: true}, nil)
	l.mu.Unlock()
	h.logger.Info("watch hub restored from snapshot", "index", index)
	for _, s := range h.shards {
		s.wake()
	}
}

// Index returns the last index given to Publish or Restore.
func (h *Hub) Index() uint64 {
	h.log.mu.RLock()
	defer h.log.mu.RUnlock()
	return h.log.last
}

// Oldest returns the smallest StartIndex Watch accepts now.
func (h *Hub) Oldest() uint64 {
	h.log.mu.RLock()
	defer h.log.mu.RUnlock()
	return h.log.floor
}

// Watch subscribes to the events req selects and returns at once. The
// watcher first receives the retained events after req.StartIndex (no gap,
// no duplicate), then live ones. If req.StartIndex is older than the
// retained window it fails with a *CompactedError. If the catch-up alone
// overflows the watcher's buffer, the watcher is returned already cut: Next
// yields what fit, then an *OverflowError to resume from (so a long
// catch-up proceeds one buffer at a time).
//
// The watcher lives until Close, Hub.Close, or ctx is done. When ctx is
// done, a Next blocked on the watcher closes it at once; a watcher nobody
// reads is closed by the next progress round (Progress or the
// ProgressInterval timer). Consumers should still defer Close.
//
// Errors: ErrBadRequest, ErrCompacted, ErrClosed (hub closed), ctx.Err().
func (h *Hub) Watch(ctx context.Context, req Request) (*Watcher, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if ctx.Done() == nil {
		ctx = nil // never cancelled: nothing to watch for
	}
	return h.watch(ctx, req)
}

func (h *Hub) watch(ctx context.Context, req Request) (*Watcher, error) {
	if req.Key == "" && !req.Prefix {
		return nil, fmt.Errorf("%w: empty key without prefix", ErrBadRequest)
	}
	if req.FromNow && req.StartIndex != 0 {
		return nil, fmt.Errorf("%w: FromNow with StartIndex %d", ErrBadRequest, req.StartIndex)
	}
	if req.BufferSize < 0 || req.BufferSize > maxBuffer {
		return nil, fmt.Errorf("%w: buffer size %d", ErrBadRequest, req.BufferSize)
	}
	capacity := h.cfg.WatcherBuffer
	if req.BufferSize > 0 {
		capacity = req.BufferSize
	}
	w := &Watcher{key: req.Key, capacity: uint32(capacity), id: h.ids.Add(1), ready: req.Ready, tag: req.Tag}
	if ctx != nil {
		w.x = &watcherExtra{ctx: ctx}
	}
	if req.Prefix {
		w.opts |= optPrefix
	}
	if req.NoPut {
		w.opts |= optNoPut
	}
	if req.NoDelete {
		w.opts |= optNoDelete
	}
	if req.PrevKV {
		w.opts |= optPrevKV
	}
	if req.NoProgress {
		w.opts |= optNoProgress
	}
	s := h.shards[(h.rr.Add(1)-1)%uint64(len(h.shards))]
	w.s = s

	// Phase 1, without the shard's lock: replay the retained entries after
	// the start index, up to the log's end now.
	l := &h.log
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return nil, ErrClosed
	}
	start := req.StartIndex
	if req.FromNow {
		start = l.last
	}
	if start < l.floor {
		err := &CompactedError{Requested: start, Oldest: l.floor, Current: l.last}
		l.mu.RUnlock()
		return nil, err
	}
	w.after = start
	from, end, last := l.search(start), l.next, l.last
	l.mu.RUnlock()
	w.told = start
	if err := h.replay(w, start, from, end); err != nil {
		return nil, err
	}
	if w.errLocked() != nil {
		h.bornCut(w)
		return w, nil
	}
	// Events at or below last were replayed (or never existed); the shard
	// must not deliver them again, whatever its cursor.
	w.after = max(start, last)

	// Phase 2, under the shard's lock (the shard cannot move): if the shard
	// already applied entries past our replay, replay those too; then link.
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	if s.cursor > end {
		if err := h.replay(w, start, end, s.cursor); err != nil {
			s.mu.Unlock()
			return nil, err
		}
		if w.errLocked() != nil {
			s.mu.Unlock()
			h.bornCut(w)
			return w, nil
		}
		// Every entry before the cursor is at or below processed, every
		// entry from it on is above.
		w.after = max(w.after, s.processed.Load())
	}
	w.told = w.after
	s.link(w)
	s.mu.Unlock()
	return w, nil
}

// replay feeds w the log entries [from, to) in chunks, taking the log's
// read lock per chunk so Publish is never held off for a whole catch-up.
// It fails with a *CompactedError if eviction overtakes it; if w is cut
// (its terminal error set) it stops without error.
func (h *Hub) replay(w *Watcher, start, from, to uint64) error {
	l := &h.log
	for from < to {
		l.mu.RLock()
		if from < l.head {
			err := &CompactedError{Requested: start, Oldest: l.floor, Current: l.last}
			l.mu.RUnlock()
			return err
		}
		next, ok := w.replay(l, from, to)
		l.mu.RUnlock()
		if !ok {
			return nil
		}
		from = next
	}
	return nil
}

// bornCut accounts for a watcher whose catch-up failed before it was linked.
func (h *Hub) bornCut(w *Watcher) {
	reason := reasonRestore
	var idx uint64
	var oe *OverflowError
	if errors.As(w.errLocked(), &oe) {
		reason, idx = oe.Reason, oe.ResumeIndex
	}
	h.metrics.cut.WithLabelValues(reason).Inc()
	h.logger.Debug("watcher cut during catch-up", "shard", w.s.id, "watcher", w.id, "key", w.key,
		"reason", reason, "index", idx)
}

// WaitResult is the outcome of Wait.
type WaitResult struct {
	// Index: the caller may answer with a read of the store at any index ≥
	// Index. On a change it is the Index of the batch that carried it; on
	// timeout it is the index up to which nothing matching happened.
	Index uint64
	// Changed reports whether something matching happened after the start
	// index — or might have: a start index older than the retained window
	// and a cut-loose waiter also count as changed, because the caller
	// cannot prove otherwise and must re-read.
	Changed bool
}

// Wait is the one-shot form of Watch for blocking reads (Consul's ?index=
// and wait=, KV Get with wait_index): it blocks until an event that req
// selects happens after req.StartIndex, until timeout elapses on the hub's
// Clock (timeout ≤ 0: no timeout), or until ctx is done. It is a watcher
// that closes itself, so 100k concurrent blocking queries cost what 100k
// watchers cost, and never slow Publish. Timing out is not an error.
//
// Errors: ErrBadRequest, ErrClosed, ctx.Err().
func (h *Hub) Wait(ctx context.Context, req Request, timeout time.Duration) (WaitResult, error) {
	if err := ctx.Err(); err != nil {
		return WaitResult{}, err
	}
	req.NoProgress = true
	w, err := h.watch(nil, req)
	var ce *CompactedError
	if errors.As(err, &ce) {
		return WaitResult{Index: ce.Current, Changed: true}, nil
	}
	if err != nil {
		return WaitResult{}, err
	}
	defer w.Close()
	var tc <-chan time.Time
	if timeout > 0 {
		t := h.clock.NewTimer(timeout)
		defer t.Stop()
		tc = t.C()
	}
	for {
		b, err, timedOut := w.nextUntil(ctx, tc)
		var oe *OverflowError
		switch {
		case timedOut:
			return WaitResult{Index: b.Index}, nil
		case errors.As(err, &oe):
			return WaitResult{Index: oe.ResumeIndex, Changed: true}, nil
		case errors.As(err, &ce):
			return WaitResult{Index: ce.Oldest, Changed: true}, nil
		case err != nil:
			return WaitResult{}, err
		case len(b.Events) > 0:
			return WaitResult{Index: b.Index, Changed: true}, nil
		}
		// NB: a batch without events would be a progress notification,
		// which NoProgress keeps from this watcher; wait on regardless.
	}
}

// Progress asks every shard to send a progress notification (the shard's
// current index, which covers every Publish that returned before Progress
// was called) to each of its idle watchers whose last Index is behind.
// Servers call it when a client requests progress. It does not wait. (The
// progress timer's rounds skip watchers that heard anything since the
// previous timer round; see Config.ProgressInterval.)
func (h *Hub) Progress() { h.progress(roundAll) }

// ProgressOf is Progress for the watchers ws only (each gets a
// notification if it is idle and behind), at a cost of O(len(ws)) rather
// than O(all watchers): a gRPC stream's progress request concerns that
// stream's watches, and one request must not visit, nor notify, a million
// watchers of other streams. Watchers already closed are skipped. It does
// not wait. A watcher asked for again before its shard got to it is
// listed once.
func (h *Hub) ProgressOf(ws []*Watcher) {
	var asked []*shard
	for _, w := range ws {
		s := w.s
		if s.askProgress(w) && !slices.Contains(asked, s) {
			asked = append(asked, s)
		}
	}
	if h.manual {
		for _, s := range asked {
			for s.step() {
			}
			s.tick(roundListed, h.sliceRounds.Load())
		}
		return
	}
	for _, s := range asked {
		s.progressReq.Or(roundListed)
		s.wake()
	}
}

func (h *Hub) progress(mode uint32) {
	if h.manual {
		for _, s := range h.shards {
			fired := h.sliceRounds.Load()
			for s.step() {
			}
			s.tick(mode, fired)
		}
		return
	}
	for _, s := range h.shards {
		s.progressReq.Or(mode)
		s.wake()
	}
}

// ShardWatchers returns the number of watchers linked in each shard (cut
// and closed watchers are not counted).
func (h *Hub) ShardWatchers() []int {
	out := make([]int, len(h.shards))
	for i, s := range h.shards {
		out[i] = s.watchers()
	}
	return out
}

// Close stops the shards and the progress timer and waits for them. Every
// watcher then returns what it has buffered, then ErrClosed; Publish,
// Restore and Watch stop working. Close is idempotent and returns nil.
func (h *Hub) Close() error {
	h.closeOnce.Do(func() {
		h.log.mu.Lock()
		h.log.closed = true
		h.log.mu.Unlock()
		close(h.stopc)
		h.wg.Wait()
		for _, s := range h.shards {
			s.mu.Lock()
			s.closed = true
			s.each(func(w *Watcher) {
				w.mu.Lock()
				s.unlink(w)
				if w.errLocked() == nil {
					w.setErrLocked(ErrClosed)
				}
				s.queueWake(w)
				w.mu.Unlock()
			})
			s.mu.Unlock()
			s.flush()
		}
	})
	return nil
}
