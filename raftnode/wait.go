package raftnode

import (
	"container/heap"
	"sync"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// proposalResult is what the apply loop hands back to a waiting proposer.
type proposalResult struct {
	index  uint64
	result *lodestonepb.CommandResult
	err    error
}

// waitRegistry pairs proposals with their results by request id. Register
// before proposing; the apply loop calls trigger exactly once per id it
// applies (or fails). Unknown ids are ignored: another node proposed them.
type waitRegistry struct {
	mu sync.Mutex
	m  map[uint64]*waiter
}

// waiter is one registered proposal.
type waiter struct {
	ch chan proposalResult
	// submitted: the loop handed the proposal to raft (proposeOne,
	// proposeConfChange). Until then no log can hold it, and a leader
	// change does not concern it: raft takes it in whatever term the
	// loop reaches it (orphans.go).
	submitted bool
}

func (w *waitRegistry) register(id uint64) <-chan proposalResult {
	ch := make(chan proposalResult, 1)
	w.mu.Lock()
	if w.m == nil {
		w.m = make(map[uint64]*waiter)
	}
	w.m[id] = &waiter{ch: ch}
	w.mu.Unlock()
	return ch
}

// submitted records that the loop handed id's proposal to raft.
func (w *waitRegistry) submitted(id uint64) {
	w.mu.Lock()
	if wt, ok := w.m[id]; ok {
		wt.submitted = true
	}
	w.mu.Unlock()
}

func (w *waitRegistry) cancel(id uint64) {
	w.mu.Lock()
	delete(w.m, id)
	w.mu.Unlock()
}

func (w *waitRegistry) trigger(id uint64, r proposalResult) {
	w.mu.Lock()
	wt, ok := w.m[id]
	delete(w.m, id)
	w.mu.Unlock()
	if ok {
		wt.ch <- r // buffered: never blocks the apply loop
	}
}

// pending lists the ids waiting now whose proposals were handed to raft.
// NB: not those registered but still on their way to the loop: raft takes
// them after the caller's leader change, in a later term.
func (w *waitRegistry) pending() []uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	ids := make([]uint64, 0, len(w.m))
	for id, wt := range w.m {
		if wt.submitted {
			ids = append(ids, id)
		}
	}
	return ids
}

// failAll resolves every waiter with err (on shutdown).
func (w *waitRegistry) failAll(err error) {
	w.mu.Lock()
	m := w.m
	w.m = nil
	w.mu.Unlock()
	for _, wt := range m {
		wt.ch <- proposalResult{err: err}
	}
}

// appliedWait lets readers wait until the applied index reaches a value.
// The apply loop calls advance after every batch; it costs O(log n) per
// woken waiter and nothing when nobody waits.
type appliedWait struct {
	mu      sync.Mutex
	applied uint64
	closed  bool
	h       waitHeap
}

type indexWaiter struct {
	index uint64
	ch    chan struct{}
}

type waitHeap []indexWaiter

func (h waitHeap) Len() int           { return len(h) }
func (h waitHeap) Less(i, j int) bool { return h[i].index < h[j].index }
func (h waitHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *waitHeap) Push(x any)        { *h = append(*h, x.(indexWaiter)) }
func (h *waitHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// wait returns a channel closed once applied >= index (or on shutdown).
func (a *appliedWait) wait(index uint64) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.applied >= index || a.closed {
		return closedCh
	}
	ch := make(chan struct{})
	heap.Push(&a.h, indexWaiter{index: index, ch: ch})
	return ch
}

func (a *appliedWait) advance(applied uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if applied > a.applied {
		a.applied = applied
	}
	for len(a.h) > 0 && a.h[0].index <= a.applied {
		close(heap.Pop(&a.h).(indexWaiter).ch)
	}
}

func (a *appliedWait) current() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.applied
}

func (a *appliedWait) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	for len(a.h) > 0 {
		close(heap.Pop(&a.h).(indexWaiter).ch)
	}
}
