package httppark

import (
	"container/heap"
	"time"
)

// deadlineHeap orders parked requests by Wait.Deadline (a container/heap);
// each request knows its position (parked.due, -1 when it is not in the
// heap), so an answered request leaves in O(log n). The Lot's mu guards
// it.
type deadlineHeap []*parked

func (h *deadlineHeap) push(p *parked) { heap.Push(h, p) }

// remove takes p out, if it is in.
func (h *deadlineHeap) remove(p *parked) {
	if i := p.due; i >= 0 && i < len(*h) && (*h)[i] == p {
		heap.Remove(h, i)
	}
}

// first returns the earliest deadline.
func (h deadlineHeap) first() (time.Time, bool) {
	if len(h) == 0 {
		return time.Time{}, false
	}
	return h[0].wait.Deadline, true
}

// popDue takes out and returns the request with the earliest deadline if
// that is not after now.
func (h *deadlineHeap) popDue(now time.Time) (*parked, bool) {
	if len(*h) == 0 || (*h)[0].wait.Deadline.After(now) {
		return nil, false
	}
	return heap.Pop(h).(*parked), true
}

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].wait.Deadline.Before(h[j].wait.Deadline) }

func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].due, h[j].due = i, j
}

// Push and Pop are for container/heap only.
func (h *deadlineHeap) Push(x any) {
	p := x.(*parked)
	p.due = len(*h)
	*h = append(*h, p)
}

func (h *deadlineHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	p.due = -1
	return p
}
