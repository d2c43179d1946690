package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/rpcstatus"
	"github.com/lodestone-kv/lodestone/raftnode"
	"github.com/lodestone-kv/lodestone/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The write path. Every service that changes state (KV, Catalog, Session,
// the Consul HTTP API, gossip reconcile, session TTLs) calls write:
//
//	service → write (stamp, session id, validate) → propose (limits)
//	        → hold (no leader: wait for one) → raftnode.Node.Propose
//	        → applied here → result checked
//
// Membership changes (cluster.go) and the admission policy (admission.go)
// go to the Raft node directly: they are not commands a client shapes.

// write does the proposer's duties of store/doc.go for any command:
// stamps it with this server's clock, gives a new session a fresh UUID,
// validates, replicates, and turns a malformed result into InvalidArgument
// and a rejection into a *store.RejectedError (callers map it: gRPC
// FailedPrecondition, Consul HTTP 500). cas_failed and lock_failed stay
// answers in the result.
func (s *core) write(ctx context.Context, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, uint64, error) {
	if cmd.TimeUnixNano == 0 {
		cmd.TimeUnixNano = time.Now().UnixNano()
	}
	if c := cmd.GetSessionCreate(); c != nil && c.Session != nil && c.Session.Id == "" {
		id, err := newUUID()
		if err != nil {
			return nil, 0, status.Error(codes.Internal, err.Error())
		}
		c.Session.Id = id
	}
	res, index, err := s.propose(ctx, cmd)
	if err != nil {
		return nil, 0, err
	}
	if res.Result == nil && !res.CasFailed && !res.LockFailed {
		if err := store.CheckCommand(cmd); err != nil {
			return nil, 0, rpcstatus.Of(err)
		}
	}
	if err := store.ResultError(res); err != nil {
		return nil, index, err
	}
	return res, index, nil
}

// newUUID returns a random (version 4) UUID.
func newUUID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("read random session id: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], nil
}

// rejectedStatus maps a store rejection to FailedPrecondition for gRPC
// callers; other errors pass through.
func rejectedStatus(err error) error {
	var re *store.RejectedError
	if errors.As(err, &re) {
		return status.Error(codes.FailedPrecondition, re.Detail)
	}
	return err
}

// propose validates cmd against the configured limits and replicates it; a
// failed CAS is reported in the result, not as an error.
func (s *core) propose(ctx context.Context, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, uint64, error) {
	if err := s.live().Limits.ValidateCommand(cmd); err != nil {
		return nil, 0, rpcstatus.Of(err)
	}
	var r raftnode.Result
	err := s.hold(ctx, holdWrite, retryWrite, func() (err error) {
		r, err = s.raft.Propose(ctx, cmd)
		return err
	})
	if err != nil {
		return nil, 0, rpcstatus.Of(err)
	}
	if r.Result == nil {
		return nil, 0, rpcstatus.Of(fmt.Errorf("command at index %d produced no result", r.Index))
	}
	return r.Result, r.Index, nil
}
