package client

import (
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// attempt is what one RPC attempt left behind: its error and what the
// client saw on the wire (see trace.go).
type attempt struct {
	err error
	// sent is true once the request's headers were handed to a transport:
	// from then on a server may be executing it.
	sent bool
	// responded is true when a server's gRPC status arrived, so err is the
	// server's answer and not a transport failure.
	responded bool
	// ctxDone is true when the call's ctx had ended when the attempt
	// returned.
	ctxDone bool
}

// verdict is what the call does after a failed attempt.
type verdict struct {
	// retry: another attempt (on the next endpoint) is safe and useful.
	retry bool
	// unknown: a write that may have been applied (only when !retry).
	unknown bool
}

// judge decides what follows a failed attempt. It is the whole retry
// policy, kept free of I/O so it can be tested case by case:
//
//   - The call's ctx ended: stop. A write that was sent has an unknown
//     outcome.
//   - A server answered: Unavailable is retried (the server promises it
//     answers Unavailable only before proposing, so the write was not
//     applied). A server-side DeadlineExceeded is retried for reads and
//     leaves writes unknown. Codes that prove the request was rejected
//     (InvalidArgument, FailedPrecondition, NotFound, ...) stop; codes that
//     do not (Internal, Unknown, Aborted, DataLoss) leave writes unknown.
//   - No server answered and the request never left the client (no
//     connection, or the connection failed before the headers were
//     queued): retry on a transport-failure code, for writes too.
//   - No server answered but the request was sent (a reset stream, a
//     dropped connection): reads retry; writes stop, outcome unknown.
func judge(write bool, a attempt) verdict {
	code := status.Code(a.err)
	switch {
	case a.ctxDone:
		return verdict{unknown: write && a.sent}
	case a.responded:
		switch code {
		case codes.Unavailable:
			return verdict{retry: true}
		case codes.ResourceExhausted:
			// Admission control refuses before doing anything and says
			// when to come back (RetryInfo); other exhaustion is final.
			return verdict{retry: retryHint(a.err) > 0}
		case codes.DeadlineExceeded:
			if write {
				return verdict{unknown: true}
			}
			return verdict{retry: true}
		case codes.Internal, codes.Unknown, codes.Aborted, codes.DataLoss, codes.Canceled:
			return verdict{unknown: write}
		}
		return verdict{}
	case !a.sent:
		return verdict{retry: transportCode(code)}
	case write:
		return verdict{unknown: true}
	default:
		return verdict{retry: transportCode(code)}
	}
}

// transportCode reports whether gRPC uses code for transport failures
// (connection refused or lost, stream reset, connection closing).
func transportCode(c codes.Code) bool {
	switch c {
	case codes.Unavailable, codes.Internal, codes.Unknown, codes.Canceled:
		return true
	}
	return false
}

// backoff returns the delay before round (1 for the second round, 2 for
// the third, ...): base doubled per round, capped at max, then jittered to
// [d/2, d] with rnd, which returns a value in [0, n).
func backoff(round int, base, max time.Duration, rnd func(n int64) int64) time.Duration {
	d := base
	for i := 1; i < round && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	half := d / 2
	if half <= 0 {
		return d
	}
	return half + time.Duration(rnd(int64(d-half)+1))
}

// hintDelay stretches a server's retry hint by a random [0, hint/2], so
// clients refused together do not all come back together.
func hintDelay(hint time.Duration, rnd func(n int64) int64) time.Duration {
	if hint <= 0 {
		return 0
	}
	return hint + time.Duration(rnd(int64(hint/2)+1))
}

// refusedWithSlot reports whether err is an admission refusal: the
// server refused before doing anything, booked the caller the next free
// slot and said when it is (RetryInfo). The caller waits for it and comes
// back to that server alone. Asking the others meanwhile cost each of
// them a refusal and a booked slot no one came for, and a connection
// when the caller had none there: in a whole fleet's return to service
// (make drill) each server refused every returning watcher several times
// over within a second, while it should have been committing.
func refusedWithSlot(err error) bool {
	return status.Code(err) == codes.ResourceExhausted && retryHint(err) > 0
}

// retryHint returns the delay a server asked for in a RetryInfo detail of
// its status, or 0.
func retryHint(err error) time.Duration {
	st, ok := status.FromError(err)
	if !ok {
		return 0
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}
