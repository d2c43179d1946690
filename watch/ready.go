package watch

import (
	"sync"
	"sync/atomic"
)

// Ready collects the watchers of one consumer that have something for Next,
// so one goroutine can serve many watchers: it waits on C, then polls Next
// (with a done context, which returns only what is ready) on each watcher
// Take returns. A watcher is listed at most once until taken; one that
// becomes ready again after Take is listed again. A consumer may poll a
// taken watcher once rather than until it is empty: whatever it did not
// take, new events or its end, lists it again.
//
// The zero value is not usable; use NewReady.
type Ready struct {
	c  chan struct{}
	mu sync.Mutex
	ws []*Watcher
	// slice is the progress slice of every watcher on this list that
	// takes progress notifications (Watcher.slice), so the timer tells
	// all of one consumer's quiet watchers in one round: one message on
	// a gRPC stream per interval, not one per round. Immutable.
	slice uint16
}

// readies numbers the Ready lists, to deal them out over the progress
// slices in turn.
var readies atomic.Uint32

// NewReady returns an empty list.
func NewReady() *Ready {
	return &Ready{c: make(chan struct{}, 1), slice: uint16((readies.Add(1) - 1) % progressSlices)}
}

// C receives a value when the list became non-empty.
func (r *Ready) C() <-chan struct{} { return r.c }

// Take returns the listed watchers and empties the list. The caller owns
// the slice.
func (r *Ready) Take() []*Watcher {
	r.mu.Lock()
	defer r.mu.Unlock()
	ws := r.ws
	r.ws = nil
	for _, w := range ws {
		w.queued = false
	}
	return ws
}

// add lists the watchers of ws that are not listed yet, all of them r's.
func (r *Ready) add(ws ...*Watcher) {
	r.mu.Lock()
	added := false
	for _, w := range ws {
		if !w.queued {
			w.queued = true
			r.ws = append(r.ws, w)
			added = true
		}
	}
	r.mu.Unlock()
	if added {
		signal(r.c)
	}
}
