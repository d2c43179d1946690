package client

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc/stats"
)

// rpcTrace records, for one attempt, the two facts the retry policy needs
// and gRPC's error codes cannot tell: whether the request left the client
// and whether a server's status came back. Both are set by gRPC's
// goroutines and read after the RPC returned.
type rpcTrace struct {
	sent      atomic.Bool // headers handed to a transport (stats.OutHeader)
	responded atomic.Bool // a gRPC status arrived from the peer (stats.InTrailer)
}

type traceKey struct{}

func withTrace(ctx context.Context, t *rpcTrace) context.Context {
	return context.WithValue(ctx, traceKey{}, t)
}

// traceHandler is the stats.Handler installed on every connection. gRPC
// passes the RPC's ctx (which carries the attempt's *rpcTrace) to
// HandleRPC.
//
// NB: stats.InTrailer is emitted only for a well-formed gRPC trailer, i.e.
// a status sent by a gRPC server. A reset stream, a closed connection or a
// non-gRPC HTTP answer never produce it, so "responded" cannot be faked by
// the transport failing.
type traceHandler struct{}

var _ stats.Handler = traceHandler{}

func (traceHandler) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

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

func (traceHandler) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (traceHandler) HandleConn(context.Context, stats.ConnStats) {}
