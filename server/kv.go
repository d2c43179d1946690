package server

import (
	"context"
	"errors"
	"io"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/rpcstatus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// kvService serves the KV gRPC API. Writes go through Raft from any node
// (followers forward proposals to the leader); reads are linearizable via
// ReadIndex unless the caller asks for stale.
type kvService struct {
	lodestonepb.UnimplementedKVServer
	s *core
}

func (k *kvService) Get(ctx context.Context, req *lodestonepb.GetRequest) (*lodestonepb.GetResponse, error) {
	if err := k.s.live().Limits.ValidateKey(req.Key); err != nil {
		return nil, rpcstatus.Of(err)
	}
	if err := k.s.waitForChange(ctx, req.Key, false, req.WaitIndex, req.WaitMs); err != nil {
		return nil, rpcstatus.Of(err)
	}
	if err := k.s.read(ctx, req.Consistency); err != nil {
		return nil, rpcstatus.Of(err)
	}
	kv, index := k.s.store.Get(req.Key)
	return &lodestonepb.GetResponse{Header: k.s.header(index), Kv: kv}, nil
}

// GetMany answers several Gets with one leadership check and one
// response. A key a Get would refuse (not valid, or not readable with the
// caller's token: the ACL filter) or whose entry would take the answer
// past --max-range-response-bytes (as a Range's, the first always fits)
// is answered unserved instead of failing the others: the client asks for
// it alone, and Get says why.
func (k *kvService) GetMany(ctx context.Context, req *lodestonepb.GetManyRequest) (*lodestonepb.GetManyResponse, error) {
	lim := k.s.live().Limits
	if max := lim.TxnOpsLimit(); len(req.Keys) > max {
		k.s.metrics.refused.WithLabelValues("grpc", "max-txn-ops").Inc()
		return nil, rpcstatus.Invalidf("GetMany of %d keys; at most %d allowed (limit max-txn-ops)", len(req.Keys), max)
	}
	keys := make([][]byte, len(req.Keys))
	for i, key := range req.Keys {
		if lim.ValidateKey(key) == nil {
			keys[i] = key
		}
	}
	if err := k.s.read(ctx, req.Consistency); err != nil {
		return nil, rpcstatus.Of(err)
	}
	kvs, index := k.s.store.GetMany(keys)
	fit := k.s.fitted(kvs)
	results := make([]*lodestonepb.GetManyResult, len(keys))
	for i, kv := range kvs {
		served := keys[i] != nil && i < fit
		if !served {
			kv = nil
		}
		results[i] = &lodestonepb.GetManyResult{Served: served, Kv: kv}
	}
	return &lodestonepb.GetManyResponse{Header: k.s.header(index), Results: results}, nil
}

// GetStream answers each GetManyRequest of the stream as GetMany does, in
// order, until the client closes its side or an answer fails. The
// interceptors authorize and admit each request as they would a GetMany
// (authz's getStreamAuthz, admission's admittedStream), so a long-lived
// stream holds no right its token lost since it opened, and a batch costs
// the read tokens of its keys. Each request is counted as a unary call
// is, those the interceptors refuse among them.
//
// A stream waiting for its next request ends Unavailable when the server
// closes. NB: a client keeps its GetStream open between batches, and a
// graceful stop waits for every stream: an idle one held each server's
// shutdown for its whole grace period. So requests are received on a
// goroutine of the stream's, one at a time: the next is received only
// after the last one's response went out, as getStreamAuthz requires.
func (k *kvService) GetStream(stream lodestonepb.KV_GetStreamServer) error {
	count := func(err error) {
		k.s.metrics.requests.WithLabelValues(lodestonepb.KV_GetStream_FullMethodName, status.Code(err).String()).Inc()
	}
	in, next := receiveInTurn(stream)
	for {
		var r getStreamRecv
		select {
		case r = <-in:
		case <-k.s.ctx.Done():
			return status.Error(codes.Unavailable, "the server is shutting down; ask another member")
		}
		if errors.Is(r.err, io.EOF) {
			return nil
		}
		if r.err != nil {
			if errors.As(r.err, new(streamRefusal)) {
				count(r.err)
			}
			return r.err
		}
		resp, err := k.GetMany(stream.Context(), r.req)
		count(err)
		if err != nil {
			return err
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		next <- struct{}{}
	}
}

// getStreamRecv is what one Recv of a GetStream returned.
type getStreamRecv struct {
	req *lodestonepb.GetManyRequest
	err error
}

// receiveInTurn receives stream's requests on a goroutine, each after the
// caller sent on next; it stops after an error or when the stream ends.
func receiveInTurn(stream lodestonepb.KV_GetStreamServer) (<-chan getStreamRecv, chan<- struct{}) {
	in, next := make(chan getStreamRecv), make(chan struct{})
	done := stream.Context().Done()
	go func() {
		for {
			req, err := stream.Recv()
			select {
			case in <- getStreamRecv{req, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
			select {
			case <-next:
			case <-done:
				return
			}
		}
	}()
	return in, next
}

func (k *kvService) Range(ctx context.Context, req *lodestonepb.RangeRequest) (*lodestonepb.RangeResponse, error) {
	lim := k.s.live().Limits
	if max := lim.MaxRangeLimit; int(req.Limit) > max {
		return nil, rpcstatus.Invalidf("range limit %d is above the maximum %d (limit max-range-keys); page with start_after", req.Limit, max)
	}
	limit := lim.RangeLimit(req.Limit)
	if err := lim.ValidatePrefix(req.Prefix); err != nil {
		return nil, rpcstatus.Of(err)
	}
	if err := lim.ValidatePrefix(req.StartAfter); err != nil {
		return nil, rpcstatus.Of(err)
	}
	if err := k.s.waitForChange(ctx, req.Prefix, true, req.WaitIndex, req.WaitMs); err != nil {
		return nil, rpcstatus.Of(err)
	}
	if err := k.s.read(ctx, req.Consistency); err != nil {
		return nil, rpcstatus.Of(err)
	}
	kvs, more, index := k.s.store.Range(req.Prefix, req.StartAfter, limit, req.KeysOnly)
	kvs, more = k.s.fitRange(kvs, more)
	return &lodestonepb.RangeResponse{Header: k.s.header(index), Kvs: kvs, More: more}, nil
}

// write replicates one command; a failed CAS, and a lock verb naming an
// unknown session, become FailedPrecondition. A put with acquire that did
// not take the lock is an answer, not an error: its kv is the current
// entry, whose session says who holds it.
func (k *kvService) write(ctx context.Context, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, uint64, error) {
	res, index, err := k.s.write(ctx, cmd)
	if err != nil {
		return nil, 0, rejectedStatus(err)
	}
	if res.CasFailed {
		return res, index, status.Error(codes.FailedPrecondition, "compare-and-swap failed: the key's ModifyIndex did not match; nothing was written (read it again and retry with its current index)")
	}
	return res, index, nil
}

func (k *kvService) Put(ctx context.Context, req *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error) {
	res, index, err := k.write(ctx, &lodestonepb.Command{Op: &lodestonepb.Command_Put{Put: req}})
	if err != nil {
		return nil, err
	}
	out := res.GetPut()
	if out == nil {
		out = &lodestonepb.PutResponse{}
	}
	out.Header = k.s.header(index)
	return out, nil
}

func (k *kvService) Delete(ctx context.Context, req *lodestonepb.DeleteRequest) (*lodestonepb.DeleteResponse, error) {
	res, index, err := k.write(ctx, &lodestonepb.Command{Op: &lodestonepb.Command_Delete{Delete: req}})
	if err != nil {
		return nil, err
	}
	out := res.GetDelete()
	if out == nil {
		out = &lodestonepb.DeleteResponse{}
	}
	out.Header = k.s.header(index)
	return out, nil
}

func (k *kvService) Txn(ctx context.Context, req *lodestonepb.TxnRequest) (*lodestonepb.TxnResponse, error) {
	res, index, err := k.write(ctx, &lodestonepb.Command{Op: &lodestonepb.Command_Txn{Txn: req}})
	if err != nil {
		return nil, err
	}
	out := res.GetTxn()
	if out == nil {
		out = &lodestonepb.TxnResponse{}
	}
	out.Header = k.s.header(index)
	return out, nil
}

// fitRange cuts a Range answer before the entry that would take its
// encoded entries past --max-range-response-bytes and says there is
// more; the first entry is always kept, so paging with start_after always
// moves on.
func (s *core) fitRange(kvs []*lodestonepb.KeyValue, more bool) ([]*lodestonepb.KeyValue, bool) {
	if n := s.fitted(kvs); n < len(kvs) {
		return kvs[:n], true
	}
	return kvs, more
}

// fitted is how many of kvs, from the first, fit in
// --max-range-response-bytes encoded (at least one); a cut is counted.
func (s *core) fitted(kvs []*lodestonepb.KeyValue) int {
	max, size := s.rangeBytes(), 0
	for i, kv := range kvs {
		n := proto.Size(kv)
		size += n + 1 + protowire.SizeVarint(uint64(n)) // NB: the repeated field's tag and length
		if size > max && i > 0 {
			s.metrics.refused.WithLabelValues("grpc", "max-range-response-bytes").Inc()
			return i
		}
	}
	return len(kvs)
}

// rangeBytes is --max-range-response-bytes or its default.
func (s *core) rangeBytes() int {
	if n := s.live().MaxRangeResponseBytes; n > 0 {
		return n
	}
	return DefaultConfig().MaxRangeResponseBytes
}

// streamRefusal is the error an interceptor ends a stream with when it
// refuses one of the stream's requests (authz's getStreamAuthz, admission's
// admittedStream): the refusal's status, marked so the handler can tell it
// from a broken stream and count the refused request.
type streamRefusal struct{ err error }

func (r streamRefusal) Error() string              { return r.err.Error() }
func (r streamRefusal) GRPCStatus() *status.Status { return status.Convert(r.err) }
