// Package rpcstatus turns the errors of the Raft node and the store into
// gRPC statuses whose codes say what a client may do: Unavailable always
// means the request was not applied and may be retried (with a RetryInfo
// hint), Aborted that its outcome is unknown. The client and peer services
// answer through it, so a condition reads the same on every port.
package rpcstatus

import (
	"context"
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/raftnode"
	"github.com/lodestone-kv/lodestone/store"
)

// RetryHint is the delay suggested to clients with Unavailable: long
// enough for a typical election to finish.
const RetryHint = 200 * time.Millisecond

// Of maps err to a gRPC status error; a status error passes through and
// nil stays nil.
func Of(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codeOf(err)
	st := status.New(code, err.Error())
	if code == codes.Unavailable {
		if withHint, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(RetryHint)}); derr == nil {
			st = withHint
		}
	}
	return st.Err()
}

func codeOf(err error) codes.Code {
	is := func(targets ...error) bool {
		for _, t := range targets {
			if errors.Is(err, t) {
				return true
			}
		}
		return false
	}
	switch {
	case is(store.ErrInvalid):
		return codes.InvalidArgument
	case is(raftnode.ErrQuorum, raftnode.ErrNotReady, raftnode.ErrInvalidMember):
		return codes.FailedPrecondition
	case is(raftnode.ErrUnknownMember):
		return codes.NotFound
	case is(raftnode.ErrNoLeader, raftnode.ErrNotLeader, raftnode.ErrReadTimeout, raftnode.ErrBusy, raftnode.ErrStopped):
		return codes.Unavailable
	case is(raftnode.ErrLeaderChanged):
		return codes.Aborted
	case is(context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case is(context.Canceled):
		return codes.Canceled
	}
	return codes.Internal
}

// Invalidf is an InvalidArgument status: what was wrong and what is
// allowed.
func Invalidf(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}
