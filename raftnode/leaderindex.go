package raftnode

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/raft/v3"
)

// leaderIndexer gives a follower's default-consistency reads (leaderRead)
// the leader's commit index, one question at a time: a read that began
// before the last answered call was sent takes that call's answer, and
// any other read waits for the next call (one out now may have been
// answered before the read began). A blocking query's read begins when
// it parks, so its wake-up almost never asks: each write woke one query
// on a follower, and a call per wake-up was 1,000 calls a second to a
// leader taking 1,000 writes a second. On the leader a batch costs
// one message on the follower's LeaderIndexStream (the peer package), where a
// ReadIndex costs a heartbeat round to every peer; 2,000 re-issued
// blocking queries a second on the followers, each with its own
// ReadIndex, made wake-ups 470 ms late. (A unary call per batch, the
// first way, made ~580 calls/s there and raised the leader's CPU by 3.7
// points of a core, about 60 µs a call.)
//
// The zero value is not ready; newLeaderIndexer makes one. close ends it.
type leaderIndexer struct {
	ask   func(ctx context.Context) (uint64, error) // one call to the leader
	clock Clock

	ctx    context.Context // ends with close; every call's parent
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	calling bool
	next    *indexBatch // the reads the next call answers
	// The newest answered call: when it was sent and what the leader said.
	lastSent  time.Time
	lastIndex uint64
}

// indexBatch is the reads one call answers: done closes once index or
// err is set.
type indexBatch struct {
	done  chan struct{}
	reads int // sharing it
	index uint64
	err   error
}

func newLeaderIndexer(ask func(ctx context.Context) (uint64, error), clock Clock) *leaderIndexer {
	ctx, cancel := context.WithCancel(context.Background())
	return &leaderIndexer{ask: ask, clock: clock, ctx: ctx, cancel: cancel}
}

// index returns a leader commit index learned by a call sent after
// began, when the read asking for it began: the last call's, if it was
// sent after began, or the next one's.
func (l *leaderIndexer) index(ctx context.Context, began time.Time) (uint64, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return 0, ErrStopped
	}
	if l.lastSent.After(began) {
		i := l.lastIndex
		l.mu.Unlock()
		return i, nil
	}
	b := l.next
	if b == nil {
		b = &indexBatch{done: make(chan struct{})}
		l.next = b
	}
	b.reads++
	if !l.calling {
		l.calling = true
		l.wg.Add(1)
		go l.run()
	}
	l.mu.Unlock()
	select {
	case <-b.done:
		return b.index, b.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// run makes one call per waiting batch until no read waits.
func (l *leaderIndexer) run() {
	defer l.wg.Done()
	for {
		l.mu.Lock()
		b := l.next
		l.next = nil
		if b == nil {
			l.calling = false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		sent := l.clock.Now() // NB: before the question goes out, so a read taking the answer began before it did
		b.index, b.err = l.ask(l.ctx)
		if b.err == nil {
			l.mu.Lock()
			l.lastSent, l.lastIndex = sent, b.index
			l.mu.Unlock()
		}
		close(b.done)
	}
}

// close fails the call out and waits for it; later reads get ErrStopped.
func (l *leaderIndexer) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	l.wg.Wait()
}

// askLeaderIndex asks the leader this node knows for its commit index,
// bounded by an election timeout. ctx is the leaderIndexer's: it lives
// until close.
func (n *Node) askLeaderIndex(ctx context.Context) (uint64, error) {
	st := n.status.Load()
	if st.Lead == raft.None {
		return 0, ErrNoLeader
	}
	if n.cfg.LeaderIndex == nil {
		return 0, fmt.Errorf("%w: no way to ask the leader for its commit index", ErrNoLeader)
	}
	n.metrics.leaderIndexCalls.Inc()
	index, err := n.cfg.LeaderIndex(ctx, st.Lead, st.Term, n.ElectionTimeout())
	if err != nil {
		return 0, fmt.Errorf("ask leader %x for its commit index: %w", st.Lead, err)
	}
	return index, nil
}

// LeaderIndex answers a follower's question for the leader's commit
// index: the commit index and term, on a leader that holds every committed
// entry and whose term is not older than the asker's; ErrNotLeader
// elsewhere.
func (n *Node) LeaderIndex(term uint64) (uint64, uint64, error) {
	st := n.status.Load()
	if st.State != raft.StateLeader || st.Commit < st.TermStart || st.Term < term {
		return 0, 0, ErrNotLeader
	}
	return st.Commit, st.Term, nil
}
