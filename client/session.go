package client

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Sessions and locks: the Session gRPC service and the KV lock verbs.
// A session lives until destroyed, invalidated (its node or a bound check
// failing) or, with a TTL, not renewed within TTL × 2 (the leader's
// grace, as Consul's). Destroying or losing it releases (or, with
// SESSION_DELETE, deletes) the keys it holds.

// CreateSession creates se (Node is required and must be registered; Id is
// chosen by the server) and returns it as stored. It is a write.
func (c *Client) CreateSession(ctx context.Context, se *lodestonepb.SessionEntry) (*lodestonepb.SessionEntry, error) {
	req := &lodestonepb.CreateSessionRequest{Session: se}
	resp, err := invoke(ctx, c, callSpec{op: fmt.Sprintf("create session on %q", se.GetNode()), write: true},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.CreateSessionResponse, error) {
			return lodestonepb.NewSessionClient(cc).Create(ctx, req)
		}, (*lodestonepb.CreateSessionResponse).GetHeader)
	return resp.GetSession(), err
}

// RenewSession records a renewal of session id's TTL. An unknown (expired,
// destroyed) session fails with ErrCASFailed: create a new one.
func (c *Client) RenewSession(ctx context.Context, id string) (*lodestonepb.SessionEntry, error) {
	req := &lodestonepb.RenewSessionRequest{Id: id}
	resp, err := invoke(ctx, c, callSpec{op: fmt.Sprintf("renew session %s", id), write: true},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.RenewSessionResponse, error) {
			return lodestonepb.NewSessionClient(cc).Renew(ctx, req)
		}, (*lodestonepb.RenewSessionResponse).GetHeader)
	return resp.GetSession(), err
}

// DestroySession destroys session id, applying its behavior to the keys
// it holds. It reports whether the session existed.
func (c *Client) DestroySession(ctx context.Context, id string) (bool, error) {
	req := &lodestonepb.DestroySessionRequest{Id: id}
	resp, err := invoke(ctx, c, callSpec{op: fmt.Sprintf("destroy session %s", id), write: true},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.DestroySessionResponse, error) {
			return lodestonepb.NewSessionClient(cc).Destroy(ctx, req)
		}, (*lodestonepb.DestroySessionResponse).GetHeader)
	return resp.GetDestroyed(), err
}

// SessionInfo reads session id; the answer's Session is nil when it does
// not exist.
func (c *Client) SessionInfo(ctx context.Context, id string, opts ...ReadOption) (*lodestonepb.SessionInfoResponse, error) {
	s := readSettingsOf(opts)
	req := &lodestonepb.SessionInfoRequest{Id: id, Consistency: s.consistency, WaitIndex: s.waitIndex, WaitMs: s.waitMS}
	return invoke(ctx, c, callSpec{op: fmt.Sprintf("read session %s", id)},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.SessionInfoResponse, error) {
			return lodestonepb.NewSessionClient(cc).Info(ctx, req)
		}, (*lodestonepb.SessionInfoResponse).GetHeader)
}

// Sessions lists every session, or with node set the sessions of that
// node.
func (c *Client) Sessions(ctx context.Context, node string, opts ...ReadOption) (*lodestonepb.ListSessionsResponse, error) {
	s := readSettingsOf(opts)
	return invoke(ctx, c, callSpec{op: "list sessions"},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.ListSessionsResponse, error) {
			if node != "" {
				return lodestonepb.NewSessionClient(cc).ListNode(ctx, &lodestonepb.ListNodeSessionsRequest{
					Node: node, Consistency: s.consistency, WaitIndex: s.waitIndex, WaitMs: s.waitMS})
			}
			return lodestonepb.NewSessionClient(cc).List(ctx, &lodestonepb.ListSessionsRequest{
				Consistency: s.consistency, WaitIndex: s.waitIndex, WaitMs: s.waitMS})
		}, (*lodestonepb.ListSessionsResponse).GetHeader)
}

// Acquire tries to take key's lock for session, writing value (Consul's
// ?acquire=). It reports whether the session holds the key afterwards;
// false means another session holds it or a lock delay is in force. An
// unknown session fails with ErrCASFailed.
func (c *Client) Acquire(ctx context.Context, key string, value []byte, session string, opts ...PutOption) (bool, *lodestonepb.PutResponse, error) {
	resp, err := c.Put(ctx, key, value, append(opts, lockVerb(session, true))...)
	if err != nil {
		return false, nil, err
	}
	// NB: a put that did not take the lock answers with the current entry,
	// so its session says who holds the key.
	return resp.GetKv().GetSession() == session, resp, nil
}

// Release gives up key's lock held by session, writing value (Consul's
// ?release=). It reports whether the key is free of session afterwards.
func (c *Client) Release(ctx context.Context, key string, value []byte, session string, opts ...PutOption) (bool, error) {
	resp, err := c.Put(ctx, key, value, append(opts, lockVerb(session, false))...)
	if err != nil {
		return false, err
	}
	return resp.GetKv().GetSession() != session, nil
}

func lockVerb(session string, acquire bool) PutOption {
	return func(r *lodestonepb.PutRequest) {
		r.Session = session
		r.Acquire, r.Release = acquire, !acquire
	}
}
