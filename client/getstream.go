package client

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// getStream is a getBatcher's open GetStream on one connection: its
// batches go as a message each way instead of a GetMany call each. Why:
// a call's own cost (its stream's set-up and teardown, headers, trailers)
// at both ends was most of a coalesced Get's CPU, on the server and in
// the client; the commit that brought the stream has the figures. Only
// the goroutine holding the batcher's turn uses it, so one request is in
// flight at a time and the response read is always its own.
type getStream struct {
	cc     *grpc.ClientConn
	st     lodestonepb.KV_GetStreamClient
	cancel context.CancelFunc
}

// batchOn answers req over cc: on the batcher's stream while the servers
// have GetStream, else with a GetMany call.
func (b *getBatcher) batchOn(ctx context.Context, cc *grpc.ClientConn, req *lodestonepb.GetManyRequest) (*lodestonepb.GetManyResponse, error) {
	if !b.c.getStreamOff.Load() {
		resp, err := b.streamed(ctx, cc, req)
		if status.Code(err) != codes.Unimplemented {
			return resp, err
		}
		b.c.getStreamOff.Store(true) // a server that predates GetStream
	}
	return lodestonepb.NewKVClient(cc).GetMany(ctx, req)
}

// streamed answers req on the batcher's stream to cc, opening one if it
// has none there. A stream that failed, or whose request ran out of time
// (ctx), is closed, and the next batch opens another: a response that came
// after its request's time would be read as the next request's.
func (b *getBatcher) streamed(ctx context.Context, cc *grpc.ClientConn, req *lodestonepb.GetManyRequest) (*lodestonepb.GetManyResponse, error) {
	if s := b.stream; s != nil && s.cc != cc {
		s.cancel()
		b.stream = nil
	}
	if b.stream == nil {
		// NB: not ctx: the stream outlives this batch; closing the
		// Client's connection ends it.
		sctx, cancel := context.WithCancel(context.Background())
		st, err := lodestonepb.NewKVClient(cc).GetStream(sctx)
		if err != nil {
			cancel()
			return nil, err
		}
		b.stream = &getStream{cc: cc, st: st, cancel: cancel}
	}
	s := b.stream
	stop := context.AfterFunc(ctx, s.cancel)
	resp, err := s.roundTrip(req)
	stop()
	if err != nil || ctx.Err() != nil {
		s.cancel()
		b.stream = nil
	}
	if err != nil && ctx.Err() != nil {
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return resp, err
}

// roundTrip sends req and reads its response.
func (s *getStream) roundTrip(req *lodestonepb.GetManyRequest) (*lodestonepb.GetManyResponse, error) {
	if err := s.st.Send(req); err != nil {
		if !errors.Is(err, io.EOF) {
			return nil, err
		}
		// NB: the server ended the stream; Recv says why.
	}
	resp, err := s.st.Recv()
	if errors.Is(err, io.EOF) {
		return nil, status.Error(codes.Unavailable, "the server ended the get stream")
	}
	return resp, err
}
