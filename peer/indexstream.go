package peer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/raftnode"
)

// AskLeaderIndex asks lead for its commit index on the follower's
// LeaderIndexStream, waiting up to timeout; it is raftnode.Config's
// LeaderIndex. One question is in flight at a time.
func (t *Transport) AskLeaderIndex(ctx context.Context, lead, term uint64, timeout time.Duration) (uint64, error) {
	return t.index.ask(ctx, lead, term, timeout, t.Client)
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
		return 0, raftnode.ErrNotLeader
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
		return fmt.Errorf("%w: leader %x has no known peer address", raftnode.ErrNoLeader, lead)
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
