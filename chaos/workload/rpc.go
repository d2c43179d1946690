package workload

import (
	"context"
	"errors"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/chaos/history"
)

// rpcTrace records what gRPC's codes cannot tell: whether the request left
// the client, and whether a server's status came back (as client/trace.go
// does; kept separate so the harness judges outcomes independently of the
// client library it may one day test).
type rpcTrace struct {
	sent      atomic.Bool // stats.OutHeader: a server may be executing it
	responded atomic.Bool // stats.InTrailer: the status is the server's
}

type traceKey struct{}

func withTrace(ctx context.Context) (context.Context, *rpcTrace) {
	t := &rpcTrace{}
	return context.WithValue(ctx, traceKey{}, t), t
}

type traceHandler struct{}

var _ stats.Handler = traceHandler{}

func (traceHandler) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (traceHandler) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (traceHandler) HandleConn(context.Context, stats.ConnStats) {}
func (traceHandler) HandleRPC(ctx context.Context, s stats.RPCStats) {
	t, _ := ctx.Value(traceKey{}).(*rpcTrace)
	if t == nil {
		return
	}
	switch s.(type) {
	case *stats.OutHeader:
		t.sent.Store(true)
	case *stats.InTrailer:
		t.responded.Store(true)
	}
}

// DialOptions must be on every connection the workloads use.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithStatsHandler(traceHandler{})}
}

// classifyWrite turns a write's error into a Jepsen outcome, relying only
// on the server's documented promise (server/doc.go, client/doc.go):
// Unavailable from a server means "not applied".
//
//   - no error: OK;
//   - the server answered FailedPrecondition: Fail, and the CAS condition
//     did not hold (mismatch);
//   - the server answered a code that rejects before proposing
//     (Unavailable, InvalidArgument, NotFound, ResourceExhausted): Fail;
//   - the request never left the client: Fail;
//   - anything else (timeout, reset, Aborted, Internal, ...): Info.
func classifyWrite(err error, t *rpcTrace) (typ string, mismatch bool) {
	if err == nil {
		return history.OK, false
	}
	code := status.Code(err)
	switch {
	case t.responded.Load() && code == codes.FailedPrecondition:
		return history.Fail, true
	case t.responded.Load():
		switch code {
		case codes.Unavailable, codes.InvalidArgument, codes.NotFound, codes.ResourceExhausted:
			return history.Fail, false
		}
		return history.Info, false
	case !t.sent.Load():
		return history.Fail, false
	}
	return history.Info, false
}

// errText is the recorded error: the gRPC code and message.
func errText(err error) string {
	if err == nil {
		return ""
	}
	if st, ok := status.FromError(err); ok {
		return st.Code().String() + ": " + st.Message()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "DeadlineExceeded"
	}
	return err.Error()
}
