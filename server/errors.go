package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/store"
)

// Conditions the node reports; toStatus turns them into gRPC codes whose
// messages say what to do.
var (
	errNoLeader      = errors.New("no leader is elected right now; the request was not applied, retry in a moment")
	errNotLeader     = errors.New("this node is not the leader")
	errBusy          = errors.New("the cluster is busy")
	errInvalidMember = errors.New("invalid membership change")
	errUnknownMember = errors.New("unknown member")
	errQuorum        = errors.New("refused: quorum would be lost")
	errNotReady      = errors.New("member not ready")
	errCASFailed     = errors.New("compare-and-swap failed")
	errReadTimeout   = errors.New("the leader did not confirm the read within an election timeout; nothing was read, retry")
	errLeaderChanged = errors.New("the leader changed while the request was in flight; it may or may not have been applied (read before retrying)")
)

// toStatus maps an internal error to a gRPC status. Unavailable always
// means the request was not applied, so clients may retry it.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var code codes.Code
	switch {
	case errors.Is(err, store.ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, errCASFailed), errors.Is(err, errQuorum), errors.Is(err, errNotReady), errors.Is(err, errInvalidMember):
		code = codes.FailedPrecondition
	case errors.Is(err, errUnknownMember):
		code = codes.NotFound
	case errors.Is(err, errNoLeader), errors.Is(err, errNotLeader), errors.Is(err, errReadTimeout), errors.Is(err, errBusy), errors.Is(err, errStopped):
		code = codes.Unavailable
	case errors.Is(err, errLeaderChanged):
		code = codes.Aborted
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	default:
		code = codes.Internal
	}
	st := status.New(code, err.Error())
	if code == codes.Unavailable {
		// Clients back off by this much before retrying.
		if withHint, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retryHint)}); derr == nil {
			st = withHint
		}
	}
	return st.Err()
}

// retryHint is the delay suggested to clients with Unavailable: long enough
// for a typical election to finish.
const retryHint = 200 * time.Millisecond

func invalidf(format string, args ...any) error {
	return status.Error(codes.InvalidArgument, fmt.Sprintf(format, args...))
}
