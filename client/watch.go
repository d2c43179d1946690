package client

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// WatchBatch is what Watch.Next returns: the events of one or more whole
// indices, in index order, or a progress notification (no events).
type WatchBatch struct {
	// Index: every matching event with index ≤ Index has now been
	// returned. It never decreases from one batch to the next. Resume a
	// later watch with FromIndex(Index).
	Index uint64
	// Events are the matching events in index order (within an index, in
	// the order the server applied them). The caller owns them. An event's
	// index is Kv.ModifyIndex (for a delete: the index of the delete).
	Events []*lodestonepb.Event
}

// IsProgress reports whether b is a progress notification.
func (b WatchBatch) IsProgress() bool { return len(b.Events) == 0 }

// Watch is one watch on a key or prefix; see the package doc ("Watches")
// for its delivery contract. Next may be called from one goroutine at a
// time; Close and Index from any.
type Watch struct {
	mux  *watchMux
	key  string
	set  watchSettings
	born time.Time

	mu     sync.Mutex
	queue  []WatchBatch
	queued int    // events in queue
	last   uint64 // resume point: every matching event ≤ last is queued or was returned
	index  uint64 // Index of the last batch Next returned (or the start index)
	paused bool   // the queue filled up: the stream stopped feeding this watch
	// stale: the watch paused on the current stream, so deliver drops
	// what that stream sends from then on, even after Next resumed the
	// watch; the stream's copy must be canceled and the watch created
	// again from last. Read and cleared by sync (streamStart), which does
	// that.
	stale bool
	err   error // terminal error, returned once the queue is drained
	done  error // set by Close, the ctx or Client.Close: Next returns it at once
	wake  chan struct{}
	stop  func() bool // unregisters the ctx hook

	registered bool // added to mux; set before any other goroutine sees w
}

// Watch starts watching key (with WatchPrefix: every key under it) and
// returns at once; read what happens with Next. The watch lives until ctx
// ends, Close is called, the client is closed, or it ends with a terminal
// error (ErrCompacted, ErrWatchCanceled, ErrInvalidArgument, or
// ErrUnavailable under WatchGiveUpAfter). Every watch of a Client shares
// one gRPC stream to one server, which the client moves to another server
// when it breaks; each watch then resumes from the last index it queued,
// with no gap and no duplicate.
func (c *Client) Watch(ctx context.Context, key string, opts ...WatchOption) *Watch {
	w := &Watch{mux: c.watchMux(), key: key, born: time.Now(), wake: make(chan struct{}, 1)}
	for _, o := range opts {
		o(&w.set)
	}
	if w.set.buffer < 1 {
		w.set.buffer = DefaultWatchBuffer
	}
	w.last, w.index = w.set.start, w.set.start
	if w.set.catalog {
		w.set.prefix = true
	}
	if key == "" && !w.set.prefix {
		w.err = &Error{Op: w.op(), Code: codes.InvalidArgument, Message: "an empty key needs WatchPrefix"}
		return w
	}
	if err := ctx.Err(); err != nil {
		w.done = err
		return w
	}
	w.registered = true
	w.mu.Lock()
	w.stop = context.AfterFunc(ctx, func() { w.finish(ctx.Err()) })
	w.mu.Unlock()
	if !w.mux.add(w) {
		w.Close()
	}
	return w
}

func (w *Watch) op() string {
	if w.set.catalog {
		return fmt.Sprintf("watch catalog service %q", w.key)
	}
	if w.set.prefix {
		return fmt.Sprintf("watch prefix %q", w.key)
	}
	return fmt.Sprintf("watch %q", w.key)
}

// Next returns the next batch, waiting until there is one, the watch ends,
// or ctx ends (then it returns ctx.Err() and the watch goes on). After the
// watch ended it returns its terminal error, first draining the batches
// queued before a server-side end (ErrCompacted, ErrWatchCanceled): those
// were delivered before it. After Close or the watch's ctx ended it returns
// at once an error matching ErrClosed or the ctx's error.
func (w *Watch) Next(ctx context.Context) (WatchBatch, error) {
	for {
		w.mu.Lock()
		if w.done != nil {
			err := w.done
			w.mu.Unlock()
			return WatchBatch{}, err
		}
		if len(w.queue) > 0 {
			b := w.queue[0]
			w.queue[0] = WatchBatch{}
			w.queue = w.queue[1:]
			w.queued -= len(b.Events)
			w.index = b.Index
			resume := w.paused && w.err == nil && w.queued <= w.set.buffer/2
			if resume {
				w.paused = false
			}
			w.mu.Unlock()
			if resume {
				w.mux.requeue(w)
			}
			return b, nil
		}
		if w.err != nil {
			err := w.err
			w.mu.Unlock()
			return WatchBatch{}, err
		}
		wake := w.wake
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return WatchBatch{}, ctx.Err()
		case <-wake:
		}
	}
}

// Index returns the Index of the last batch Next returned (before the
// first: the FromIndex given, or 0). A caller that stops watching and wants
// to continue later passes it to FromIndex.
func (w *Watch) Index() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.index
}

// Close ends the watch: the server is told to cancel it, and Next returns
// an error matching ErrClosed. Close is idempotent and never blocks on the
// network.
func (w *Watch) Close() {
	w.finish(fmt.Errorf("client: watch %q: %w", w.key, ErrClosed))
}

// finish ends the watch from the caller's side with err.
func (w *Watch) finish(err error) {
	w.mu.Lock()
	if w.done != nil {
		w.mu.Unlock()
		return
	}
	w.done = err
	w.queue, w.queued = nil, 0
	stop := w.stop
	w.mu.Unlock()
	if stop != nil {
		stop()
	}
	signal(w.wake)
	if w.registered {
		w.mux.requeue(w)
	}
}

// fail ends the watch from the server's side; queued batches still go out.
func (w *Watch) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	signal(w.wake)
}

// live reports whether the watch still wants a stream.
func (w *Watch) live() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.done == nil && w.err == nil
}

// startIndex returns where a (re)created watch starts and whether it may
// be created now (false while paused or ended).
func (w *Watch) startIndex() (uint64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last, w.done == nil && w.err == nil && !w.paused
}

// streamStart is startIndex for sync: it also reports, and clears,
// whether the watch's copy on the current stream went stale (it paused and
// dropped responses since) and must be created again from start.
func (w *Watch) streamStart() (start uint64, ok, stale bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	stale, w.stale = w.stale, false
	return w.last, w.done == nil && w.err == nil && !w.paused, stale
}

// deliver queues what resp carries for the watch, dropping events at or
// below the resume point (a server replaying from an older index must not
// produce duplicates). It reports whether the queue is now full, in which
// case the caller must stop the watch on its stream. A paused watch, and a
// stale one, drops resp (its events are above last, so the watch's next
// create replays them) and stays stale.
func (w *Watch) deliver(resp *lodestonepb.WatchResponse) (full bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done != nil || w.err != nil {
		return false
	}
	if w.paused || w.stale {
		// Paused, or resumed by Next but still on the stream that paused
		// it: what that stream sends now follows a gap.
		w.stale = true
		return false
	}
	var evs []*lodestonepb.Event
	top := w.last
	for i, ev := range resp.GetEvents() {
		idx := ev.GetKv().GetModifyIndex()
		if idx <= w.last {
			continue
		}
		if evs == nil {
			evs = resp.Events[i:i:len(resp.Events)]
		}
		evs = append(evs, ev) // in place: keeps order, drops the duplicates
		top = max(top, idx)
	}
	top = max(top, resp.GetIndex())
	if top <= w.last {
		return false
	}
	switch n := len(w.queue); {
	case len(evs) > 0:
		w.queue = append(w.queue, WatchBatch{Index: top, Events: evs})
		w.queued += len(evs)
	case n > 0:
		// No event between the last queued batch and top: once the
		// consumer has that batch it has everything up to top.
		w.queue[n-1].Index = top
	case w.set.progress:
		w.queue = append(w.queue, WatchBatch{Index: top})
	default:
		w.index = top // nothing pending: the caller is up to date at top
	}
	w.last = top
	signal(w.wake)
	if w.queued >= w.set.buffer {
		// NB: stale as well as paused. Next may resume the watch before
		// sync sees the pause; what the stream sent in between was
		// dropped, so the stream's copy must go even then, and what it
		// sends until it is gone must be dropped too. Without stale the
		// watch stayed on the stream and took the next response after
		// the gap (TestWatchSlowConsumerDoesNotBlockOthers hung waiting
		// for the missing events).
		w.paused, w.stale = true, true
		return true
	}
	return false
}

// advance moves the resume point to idx without events (a resync).
func (w *Watch) advance(idx uint64) {
	w.deliver(&lodestonepb.WatchResponse{Index: idx})
}

// signal does a non-blocking send on a cap-1 channel.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
