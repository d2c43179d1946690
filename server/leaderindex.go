package server

import (
	"context"
	"fmt"
	"sync"

	"go.etcd.io/raft/v3"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// leaderIndexer gives a follower's default-consistency reads (leaderRead)
// the leader's commit index, one Peer.LeaderIndex call at a time: a read
// that starts while a call is out waits for the next call, because the
// one out may have been answered before the read began. On the leader a
// batch costs one small unary call, where a ReadIndex costs a heartbeat
// round to every peer; 2,000 re-issued blocking queries a second on the
// followers, each with its own ReadIndex, made wake-ups 470 ms late.
//
// The zero value is not ready; newLeaderIndexer makes one. close ends it.
type leaderIndexer struct {
	ask func(ctx context.Context) (uint64, error) // one call to the leader

	ctx    context.Context // ends with close; every call's parent
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	calling bool
	next    *indexBatch // the reads the next call answers
}

// indexBatch is the reads one call answers: done closes once index or
// err is set.
type indexBatch struct {
	done  chan struct{}
	reads int // sharing it
	index uint64
	err   error
}

func newLeaderIndexer(ask func(ctx context.Context) (uint64, error)) *leaderIndexer {
	ctx, cancel := context.WithCancel(context.Background())
	return &leaderIndexer{ask: ask, ctx: ctx, cancel: cancel}
}

// index returns a leader commit index learned by a call sent after index
// was called.
func (l *leaderIndexer) index(ctx context.Context) (uint64, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return 0, errStopped
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
		b.index, b.err = l.ask(l.ctx)
		close(b.done)
	}
}

// close fails the call out and waits for it; later reads get errStopped.
func (l *leaderIndexer) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	l.wg.Wait()
}

// askLeaderIndex is one LeaderIndex call to the leader this node knows,
// bounded by an election timeout.
func (n *node) askLeaderIndex(ctx context.Context) (uint64, error) {
	st := n.status.Load()
	if st.lead == raft.None {
		return 0, errNoLeader
	}
	client, ok := n.transport.peerClient(st.lead)
	if !ok {
		return 0, fmt.Errorf("%w: leader %x has no known peer address", errNoLeader, st.lead)
	}
	ctx, cancel := context.WithTimeout(ctx, n.electionTimeout())
	defer cancel()
	n.metrics.leaderIndexCalls.Inc()
	resp, err := client.LeaderIndex(ctx, &lodestonepb.LeaderIndexRequest{Term: st.term})
	if err != nil {
		return 0, fmt.Errorf("ask leader %x for its commit index: %w", st.lead, err)
	}
	return resp.Index, nil
}

// leaderIndex answers LeaderIndex: the commit index, on a leader that
// holds every committed entry and whose term is not older than the
// asker's.
func (n *node) leaderIndex(term uint64) (uint64, uint64, error) {
	st := n.status.Load()
	if st.state != raft.StateLeader || st.commit < st.termStart || st.term < term {
		return 0, 0, errNotLeader
	}
	return st.commit, st.term, nil
}
