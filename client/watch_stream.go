package client

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// session is one Watch stream; it lives inside one call of
// watchMux.session.
type session struct {
	ep      string
	stream  lodestonepb.Watch_WatchClient
	nextID  int64
	byID    map[int64]*Watch
	ids     map[*Watch]int64
	created map[int64]bool // the server acknowledged the create
	served  bool           // a response arrived

	// inbox: the receiving goroutine appends, run takes. Unbounded on
	// purpose: the receiver must never wait for run, which may itself be
	// blocked sending to a server that is blocked sending to us.
	inMu  sync.Mutex
	in    []*lodestonepb.WatchResponse
	inErr error
	inSig chan struct{}
}

// session runs one stream to ep until it fails, goes idle, or shutdown.
// served reports whether any response arrived on it.
func (m *watchMux) session(ep string) (served bool, err error) {
	cc, err := m.c.acquire(ep)
	if err != nil {
		return false, err
	}
	defer m.c.release(ep, cc)
	ctx, cancel := context.WithCancel(m.ctx)
	stream, err := lodestonepb.NewWatchClient(cc).Watch(ctx)
	if err != nil {
		cancel()
		return false, err
	}
	s := &session{ep: ep, stream: stream, byID: map[int64]*Watch{}, ids: map[*Watch]int64{}, created: map[int64]bool{}, inSig: make(chan struct{}, 1)}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			resp, err := stream.Recv()
			s.inMu.Lock()
			if err != nil {
				s.inErr = err
			} else {
				s.in = append(s.in, resp)
			}
			s.inMu.Unlock()
			signal(s.inSig)
			if err != nil {
				return
			}
		}
	})
	defer func() {
		cancel()
		wg.Wait()
	}()

	// Every live watch is (re)created on the new stream.
	m.mu.Lock()
	m.pending = m.pending[:0]
	for w := range m.watches {
		m.pending = append(m.pending, w)
	}
	m.mu.Unlock()

	// Liveness: a stream silent for an interval gets a probe, a Status
	// call on the same connection. No answer within an interval means the
	// server or the path to it is gone (no TCP reset came); an answer
	// naming no leader means the member is cut off from the cluster and
	// would hold the watches back. Either way the watches move on.
	interval := m.c.cfg.WatchProgressInterval
	tick := time.NewTicker(interval)
	defer tick.Stop()
	lastRecv := time.Now()
	probing := false
	probed := make(chan error, 1)
	ticks := 0
	seen := func(h *lodestonepb.ResponseHeader) { m.c.observe(ep, h) }
	for {
		if err := m.sync(s); err != nil {
			return s.served, s.ended(m.ctx, err)
		}
		select {
		case <-m.ctx.Done():
			return s.served, m.ctx.Err()
		case <-m.kick:
		case <-s.inSig:
			s.inMu.Lock()
			in, inErr := s.in, s.inErr
			s.in = nil
			s.inMu.Unlock()
			if len(in) > 0 {
				s.served = true
				lastRecv = time.Now()
			}
			for _, resp := range in {
				if err := m.handle(s, resp); err != nil {
					return s.served, err
				}
			}
			if inErr != nil {
				return s.served, streamEnd(inErr)
			}
		case <-tick.C:
			ticks++
			if len(s.byID) == 0 || probing {
				break
			}
			if m.onLeader(ep) {
				return s.served, errOnLeader
			}
			// A busy stream is probed too, now and then, so that a
			// client that only watches learns when its member became
			// the leader (grouped responses carry no header).
			if time.Since(lastRecv) < interval && (m.c.cfg.WatchFrom == WatchFromLeader || ticks%placementProbeEvery != 0) {
				break
			}
			probing = true
			wg.Go(func() { probed <- probe(ctx, cc, interval, seen) })
		case err := <-probed:
			probing = false
			if err != nil {
				return s.served, err
			}
			lastRecv = time.Now()
		}
	}
}

// onLeader reports whether a stream on ep should leave it: watches go to
// followers, ep reaches the leader as far as the client knows, and the
// client knows a follower to go to.
func (m *watchMux) onLeader(ep string) bool {
	if m.c.cfg.WatchFrom == WatchFromLeader {
		return false
	}
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	if !m.c.book.isLeader(ep) {
		return false
	}
	plan := m.c.book.followerPlan(m.spread)
	return len(plan) > 0 && !m.c.book.isLeader(plan[0])
}

// streamEnd is the error a stream's Recv ended with, io.EOF (a stream the
// server closed without a status) made Unavailable.
func streamEnd(err error) error {
	if errors.Is(err, io.EOF) {
		return status.Error(codes.Unavailable, "watch stream closed by the server")
	}
	return err
}

// ended is why the stream failed, given the error a Send failed with.
// NB: a Send on a stream the server has ended fails with io.EOF, and gRPC
// gives the server's status to Recv alone: a refusal with a booked slot
// that came back before the creates went out would otherwise read as a
// broken stream, and the watches would leave the server that booked them.
func (s *session) ended(ctx context.Context, sendErr error) error {
	if !errors.Is(sendErr, io.EOF) {
		return sendErr
	}
	for {
		s.inMu.Lock()
		err := s.inErr
		s.inMu.Unlock()
		if err != nil {
			return streamEnd(err)
		}
		select {
		case <-s.inSig:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// placementProbeEvery is how many ticks of WatchProgressInterval a
// stream on a follower goes between probes while it is busy: the probe's
// answer tells the client whether that member has become the leader.
const placementProbeEvery = 6

// probe asks the server behind cc for its status and reports why a watch
// stream to it should be abandoned, or nil; seen gets the answer's header.
func probe(ctx context.Context, cc grpc.ClientConnInterface, timeout time.Duration, seen func(*lodestonepb.ResponseHeader)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := lodestonepb.NewClusterClient(cc).Status(ctx, &lodestonepb.StatusRequest{})
	if err == nil && st.GetHeader() != nil {
		seen(st.GetHeader())
	}
	switch code := status.Code(err); {
	case err == nil && st.GetLeaderId() == 0:
		return status.Error(codes.Unavailable, "watch stream's server knows no leader; moving to another member")
	case code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Canceled:
		return status.Errorf(codes.Unavailable, "%v: %v", errStalled, err)
	}
	return nil // answered (even an error status proves the server is there)
}

// sync sends the creates and cancels that pending asks for.
func (m *watchMux) sync(s *session) error {
	m.mu.Lock()
	todo := m.pending
	m.pending = nil
	m.mu.Unlock()
	for _, w := range todo {
		start, ok, stale := w.streamStart()
		id, onStream := s.ids[w]
		if onStream && (!ok || stale) {
			// Ended, paused, or paused and resumed already: in every case
			// the stream's copy stops here; a live watch is created
			// again below from its resume point.
			delete(s.ids, w)
			delete(s.byID, id)
			delete(s.created, id)
			if err := s.stream.Send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Cancel{Cancel: &lodestonepb.WatchCancel{WatchId: id}}}); err != nil {
				return err
			}
			onStream = false
		}
		if ok && !onStream {
			s.nextID++
			id = s.nextID
			s.ids[w], s.byID[id] = id, w
			if err := s.stream.Send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Create{Create: &lodestonepb.WatchCreate{
				WatchId: id, Key: []byte(w.key), Prefix: w.set.prefix, StartIndex: start,
				PrevKv: w.set.prevKV, NoPut: w.set.noPut, NoDelete: w.set.noDelete, Target: w.set.target(),
				Grouped: true,
			}}}); err != nil {
				return err
			}
		}
		if !w.live() {
			m.mu.Lock()
			delete(m.watches, w)
			m.mu.Unlock()
		}
	}
	m.mu.Lock()
	idle := len(m.watches) == 0 && len(m.pending) == 0
	m.mu.Unlock()
	if idle && len(s.ids) == 0 {
		return errSessionIdle
	}
	return nil
}

// handle applies one response. A non-nil error ends the stream.
func (m *watchMux) handle(s *session, resp *lodestonepb.WatchResponse) error {
	if gs := resp.GetGroups(); len(gs) > 0 {
		// Each group reads as a response of its own with only watch_id,
		// index and events (WatchResponse.groups).
		for _, g := range gs {
			if err := m.handle(s, &lodestonepb.WatchResponse{WatchId: g.GetWatchId(), Index: g.GetIndex(), Events: g.GetEvents()}); err != nil {
				return err
			}
		}
		return nil
	}
	id := resp.GetWatchId()
	w := s.byID[id]
	if w == nil {
		return nil // canceled by us; late responses are dropped
	}
	if resp.GetCreated() {
		s.created[id] = true
		if resp.GetHeader() != nil {
			m.c.observe(s.ep, resp.GetHeader())
		}
		if len(resp.GetEvents()) == 0 {
			// NB: a created response's index is taken only by a watch with
			// no position yet ("from now"): for a watch created with a
			// start index the replay of (start, now] follows, and moving
			// the resume point past it would drop that replay as
			// duplicates.
			if start, _ := w.startIndex(); start != 0 {
				return nil
			}
		}
	}
	if resp.GetCanceled() {
		created := s.created[id]
		delete(s.byID, id)
		delete(s.ids, w)
		delete(s.created, id)
		switch {
		case resp.GetCompactedIndex() > 0:
			start, _ := w.startIndex()
			w.fail(&CompactedError{Key: w.key, Requested: start, CompactedIndex: resp.GetCompactedIndex()})
		case resp.GetResyncIndex() > 0:
			// Every event up to the resync index was delivered (they
			// preceded this response): go on from there.
			w.advance(resp.GetResyncIndex())
			m.c.log.Debug("client: watch resyncs", "key", w.key, "index", resp.GetResyncIndex(), "reason", resp.GetCancelReason())
			m.requeue(w)
		case !created:
			// The server refused the create: every server would.
			w.fail(&WatchCanceledError{Key: w.key, Reason: resp.GetCancelReason()})
		default:
			// A running watch ended without a resume index (e.g. the
			// server is shutting down): resume it, and every other watch,
			// on another member.
			m.requeue(w)
			return status.Errorf(codes.Unavailable, "server ended watch %q: %s", w.key, resp.GetCancelReason())
		}
		return nil
	}
	if w.deliver(resp) {
		m.requeue(w) // full: cancel it on the stream until Next drains it
	}
	return nil
}
