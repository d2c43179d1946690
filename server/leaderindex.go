package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/raft/v3"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// leaderIndexer gives a follower's default-consistency reads (leaderRead)
// the leader's commit index, one question at a time: a read that began
// before the last answered call was sent takes that call's answer, and
// any other read waits for the next call (one out now may have been
// answered before the read began). A blocking query's read begins when
// it parks, so its wake-up almost never asks: each write woke one query
// on a follower, and a call per wake-up was 1,000 calls a second to a
// leader taking 1,000 writes a second. On the leader a batch costs
// one message on the follower's LeaderIndexStream (indexStream), where a
// ReadIndex costs a heartbeat round to every peer; 2,000 re-issued
// blocking queries a second on the followers, each with its own
// ReadIndex, made wake-ups 470 ms late. (A unary call per batch, the
// first way, made ~580 calls/s there and raised the leader's CPU by 3.7
// points of a core, about 60 µs a call.)
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

func newLeaderIndexer(ask func(ctx context.Context) (uint64, error)) *leaderIndexer {
	ctx, cancel := context.WithCancel(context.Background())
	return &leaderIndexer{ask: ask, ctx: ctx, cancel: cancel}
}

// index returns a leader commit index learned by a call sent after
// began, when the read asking for it began: the last call's, if it was
// sent after began, or the next one's.
func (l *leaderIndexer) index(ctx context.Context, began time.Time) (uint64, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return 0, errStopped
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
		sent := time.Now() // NB: before the question goes out, so a read taking the answer began before it did
		b.index, b.err = l.ask(l.ctx)
		if b.err == nil {
			l.mu.Lock()
			l.lastSent, l.lastIndex = sent, b.index
			l.mu.Unlock()
		}
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

// askLeaderIndex asks the leader this node knows for its commit index
// on the LeaderIndexStream, bounded by an election timeout. ctx is the
// leaderIndexer's: it lives until close, and so does the stream.
func (n *node) askLeaderIndex(ctx context.Context) (uint64, error) {
	st := n.status.Load()
	if st.lead == raft.None {
		return 0, errNoLeader
	}
	n.metrics.leaderIndexCalls.Inc()
	index, err := n.indexStream.ask(ctx, st.lead, st.term, n.electionTimeout(), n.transport.peerClient)
	if err != nil {
		return 0, fmt.Errorf("ask leader %x for its commit index: %w", st.lead, err)
	}
	return index, nil
}

// indexStream is a follower's LeaderIndexStream to its leader. The
// leaderIndexer asks one question at a time; the mutex only makes that
// safe to rely on.
//
// The zero value has no stream; ask opens one.
type indexStream struct {
	mu     sync.Mutex
	lead   uint64 // whom stream talks to
	stream lodestonepb.Peer_LeaderIndexStreamClient
	cancel context.CancelFunc
}

// ask sends one request to lead on the stream, opening it first if the
// stream goes elsewhere or there is none, and waits up to timeout for the
// answer. Any failure closes the stream, so the next ask starts afresh
// and no late answer can be taken for another question's; a refusal
// keeps it.
func (s *indexStream) ask(ctx context.Context, lead, term uint64, timeout time.Duration,
	client func(id uint64) (lodestonepb.PeerClient, bool)) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.openLocked(ctx, lead, client); err != nil {
		return 0, err
	}
	resp, err := s.exchangeLocked(term, timeout)
	if err != nil || s.stream.Context().Err() != nil { // NB: the timer may end the stream just after an answer
		s.closeLocked()
	}
	if err != nil {
		return 0, err
	}
	if resp.Refused {
		return 0, errNotLeader
	}
	return resp.Index, nil
}

func (s *indexStream) openLocked(ctx context.Context, lead uint64, client func(id uint64) (lodestonepb.PeerClient, bool)) error {
	if s.stream != nil && s.lead == lead {
		return nil
	}
	s.closeLocked()
	c, ok := client(lead)
	if !ok {
		return fmt.Errorf("%w: leader %x has no known peer address", errNoLeader, lead)
	}
	sctx, cancel := context.WithCancel(ctx)
	stream, err := c.LeaderIndexStream(sctx)
	if err != nil {
		cancel()
		return fmt.Errorf("open index stream: %w", err)
	}
	s.lead, s.stream, s.cancel = lead, stream, cancel
	return nil
}

func (s *indexStream) exchangeLocked(term uint64, timeout time.Duration) (*lodestonepb.LeaderIndexResponse, error) {
	// NB: Recv has no deadline of its own; ending the stream ends it.
	expire := time.AfterFunc(timeout, s.cancel)
	defer expire.Stop()
	if err := s.stream.Send(&lodestonepb.LeaderIndexRequest{Term: term}); err != nil {
		return nil, fmt.Errorf("send: %w", err)
	}
	resp, err := s.stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("receive: %w", err)
	}
	return resp, nil
}

// close ends the stream, if any.
func (s *indexStream) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeLocked()
}

func (s *indexStream) closeLocked() {
	if s.cancel != nil {
		s.cancel()
	}
	s.lead, s.stream, s.cancel = 0, nil, nil
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
