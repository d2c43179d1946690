package server

import (
	"context"
	"time"

	"go.etcd.io/raft/v3"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/ctxtime"
	"github.com/lodestone-kv/lodestone/internal/rpcstatus"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// sessionService serves the Session gRPC API. Reads report the sessions
// table's index (Consul's X-Consul-Index for every session read).
type sessionService struct {
	lodestonepb.UnimplementedSessionServer
	s *core
}

func (ss *sessionService) Create(ctx context.Context, req *lodestonepb.CreateSessionRequest) (*lodestonepb.CreateSessionResponse, error) {
	if req.Session == nil {
		return nil, rpcstatus.Invalidf("session is missing; set at least session.node")
	}
	res, index, err := ss.s.write(ctx, &lodestonepb.Command{Op: &lodestonepb.Command_SessionCreate{SessionCreate: req}})
	if err != nil {
		return nil, rejectedStatus(err)
	}
	out := res.GetSessionCreate()
	out.Header = ss.s.header(index)
	return out, nil
}

func (ss *sessionService) Destroy(ctx context.Context, req *lodestonepb.DestroySessionRequest) (*lodestonepb.DestroySessionResponse, error) {
	res, index, err := ss.s.write(ctx, &lodestonepb.Command{Op: &lodestonepb.Command_SessionDestroy{SessionDestroy: req}})
	if err != nil {
		return nil, rejectedStatus(err)
	}
	out := res.GetSessionDestroy()
	out.Header = ss.s.header(index)
	return out, nil
}

func (ss *sessionService) Renew(ctx context.Context, req *lodestonepb.RenewSessionRequest) (*lodestonepb.RenewSessionResponse, error) {
	res, index, err := ss.s.write(ctx, &lodestonepb.Command{Op: &lodestonepb.Command_SessionRenew{SessionRenew: req}})
	if err != nil {
		return nil, rejectedStatus(err)
	}
	out := res.GetSessionRenew()
	out.Header = ss.s.header(index)
	return out, nil
}

func (ss *sessionService) Info(ctx context.Context, req *lodestonepb.SessionInfoRequest) (*lodestonepb.SessionInfoResponse, error) {
	if req.Id == "" {
		return nil, rpcstatus.Invalidf("session id is empty")
	}
	if err := ss.s.blockingRead(ctx, consulapi.SessionsDep(), req.Consistency, req.WaitIndex, req.WaitMs); err != nil {
		return nil, err
	}
	se, m := ss.s.store.Session(req.Id)
	return &lodestonepb.SessionInfoResponse{Header: ss.s.header(m.Index), Session: se}, nil
}

func (ss *sessionService) List(ctx context.Context, req *lodestonepb.ListSessionsRequest) (*lodestonepb.ListSessionsResponse, error) {
	if err := ss.s.blockingRead(ctx, consulapi.SessionsDep(), req.Consistency, req.WaitIndex, req.WaitMs); err != nil {
		return nil, err
	}
	list, m := ss.s.store.Sessions()
	return &lodestonepb.ListSessionsResponse{Header: ss.s.header(m.Index), Sessions: list}, nil
}

func (ss *sessionService) ListNode(ctx context.Context, req *lodestonepb.ListNodeSessionsRequest) (*lodestonepb.ListSessionsResponse, error) {
	if req.Node == "" {
		return nil, rpcstatus.Invalidf("node name is empty")
	}
	if err := ss.s.blockingRead(ctx, consulapi.SessionsDep(), req.Consistency, req.WaitIndex, req.WaitMs); err != nil {
		return nil, err
	}
	list, m := ss.s.store.NodeSessions(req.Node)
	return &lodestonepb.ListSessionsResponse{Header: ss.s.header(m.Index), Sessions: list}, nil
}

// runSessionTTL enforces session TTLs while this node leads (store/doc.go
// duty 7). It sleeps until the earliest TTL deadline, waking early for any
// session event (a new session may expire sooner), and proposes one
// SessionInvalidate per batch of expired sessions. On becoming leader it
// re-arms every timer from the moment it noticed (store's notBefore),
// erring long: renewals the old leader received but did not replicate,
// and clock skew between proposers, never expire a live session early.
// It returns when the server closes.
func (s *core) runSessionTTL() {
	for {
		changed := s.raft.LeaderChanged()
		if st := s.raft.Status(); st.State == raft.StateLeader {
			ctx, cancel := context.WithCancel(s.ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				s.enforceTTLs(ctx, time.Now())
			}()
			select {
			case <-changed:
			case <-s.ctx.Done():
			}
			cancel()
			<-done
		} else {
			select {
			case <-changed:
			case <-s.ctx.Done():
			}
		}
		if s.ctx.Err() != nil {
			return
		}
	}
}

// enforceTTLs is one term of leadership: it runs until ctx ends.
func (s *core) enforceTTLs(ctx context.Context, notBefore time.Time) {
	s.logger.Info("session TTL timers armed", "not_before", notBefore.Format(time.RFC3339Nano))
	after := s.hub.Index()
	retry := s.cfg.Catalog.SessionTTLRetry
	for ctx.Err() == nil {
		now := time.Now()
		if expired := s.store.ExpiredSessions(now, notBefore); len(expired) > 0 {
			if !s.invalidateExpired(ctx, expired, now) {
				_ = ctxtime.Sleep(ctx, retry) // NB: the loop checks ctx
			}
			continue
		}
		wait := s.cfg.Catalog.SessionTTLRecheck
		if next, ok := s.store.NextSessionExpiry(notBefore); ok {
			// NB: a few ms past the deadline, so the store (which compares
			// with <=) agrees it has expired when we look again.
			wait = min(wait, time.Until(next)+time.Millisecond)
		}
		res, err := s.hub.Wait(ctx, watch.Request{Key: store.SessionEventPrefix, Prefix: true, StartIndex: after}, max(wait, time.Millisecond))
		if err != nil {
			if ctx.Err() == nil {
				s.logger.Warn("session TTL wait failed", "err", err)
				_ = ctxtime.Sleep(ctx, retry) // NB: the loop checks ctx
			}
			continue
		}
		after = max(after, res.Index)
	}
}

// invalidateExpired proposes SessionInvalidate for ids in batches; it
// reports whether every batch was applied.
func (s *core) invalidateExpired(ctx context.Context, ids []string, now time.Time) bool {
	for len(ids) > 0 {
		n := min(len(ids), s.cfg.Catalog.SessionInvalidateBatch)
		batch := ids[:n]
		ids = ids[n:]
		cctx, cancel := context.WithTimeout(ctx, s.cfg.Catalog.SessionTTLRetry*10)
		// The command's time is the time expiry was judged at, so its lock
		// delays start there.
		res, _, err := s.write(cctx, &lodestonepb.Command{TimeUnixNano: now.UnixNano(), Op: &lodestonepb.Command_SessionInvalidate{SessionInvalidate: &lodestonepb.SessionInvalidate{
			Ids: batch, TtlExpiredAtUnixNano: now.UnixNano(),
		}}})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				s.logger.Warn("invalidate expired sessions", "sessions", len(batch), "err", err)
			}
			return false
		}
		got := res.GetSessionInvalidate().GetInvalidated()
		s.sessionMetrics.invalidated.WithLabelValues("ttl").Add(float64(len(got)))
		s.logger.Info("sessions expired", "invalidated", len(got), "ids", got)
	}
	return true
}
