package client

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// RPCTrace records, for one RPC, the two facts a retry policy needs and
// gRPC's error codes cannot tell: whether the request left the client
// (Sent) and whether a server's gRPC status came back (Responded). gRPC's
// goroutines set them while the RPC runs; read them after it returned.
//
// The client traces every attempt it makes this way. Code that makes its
// own gRPC calls and must judge their outcomes by the same facts (the
// chaos workloads) dials with RPCTraceDialOption and calls each RPC with
// a ctx from WithRPCTrace.
type RPCTrace struct {
	sent      atomic.Bool // headers handed to a transport (stats.OutHeader)
	responded atomic.Bool // a gRPC status arrived from the peer (stats.InTrailer)
}

// Sent reports whether the request's headers were handed to a transport:
// from then on a server may be executing it. False after an error means
// the request never left the client, so no server applied it.
func (t *RPCTrace) Sent() bool { return t.sent.Load() }

// Responded reports whether a gRPC status arrived from the server, so the
// RPC's error is the server's answer and not a transport failure.
func (t *RPCTrace) Responded() bool { return t.responded.Load() }

type traceKey struct{}

// WithRPCTrace returns a ctx for one RPC and the RPCTrace that the RPC
// fills in. Only a connection dialed with RPCTraceDialOption fills it
// (every connection of a Client is); elsewhere both facts stay false.
// Use the ctx (or ctxs derived from it) for one RPC only: a second RPC
// would set the same trace.
func WithRPCTrace(ctx context.Context) (context.Context, *RPCTrace) {
	t := &RPCTrace{}
	return context.WithValue(ctx, traceKey{}, t), t
}

// RPCTraceDialOption installs, on a gRPC connection, the stats handler
// that fills the RPCTrace of each RPC made with a ctx from WithRPCTrace.
// RPCs without one are not observed.
func RPCTraceDialOption() grpc.DialOption { return grpc.WithStatsHandler(traceHandler{}) }

// traceHandler is the stats.Handler installed on every connection. gRPC
// passes the RPC's ctx (which carries the attempt's *RPCTrace) to
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
	t, _ := ctx.Value(traceKey{}).(*RPCTrace)
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
