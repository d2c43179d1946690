package client

import (
	"context"
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// PutOption modifies a Put.
type PutOption func(*lodestonepb.PutRequest)

// WithFlags stores f in the entry's Flags (an opaque uint64, as in Consul).
func WithFlags(f uint64) PutOption {
	return func(r *lodestonepb.PutRequest) { r.Flags = f }
}

// WithCAS makes the Put conditional: it applies only if the key's
// ModifyIndex equals idx, and idx 0 means "only if the key does not exist".
// A failed condition returns ErrCASFailed and applies nothing.
func WithCAS(idx uint64) PutOption {
	return func(r *lodestonepb.PutRequest) { r.Cas = proto.Uint64(idx) }
}

// DeleteOption modifies a Delete.
type DeleteOption func(*lodestonepb.DeleteRequest)

// Prefix deletes every key that starts with the given key.
func Prefix() DeleteOption {
	return func(r *lodestonepb.DeleteRequest) { r.Prefix = true }
}

// DeleteCAS makes the Delete conditional on the key's ModifyIndex being
// idx; a failed condition returns ErrCASFailed. The server rejects it with
// Prefix (ErrInvalidArgument).
func DeleteCAS(idx uint64) DeleteOption {
	return func(r *lodestonepb.DeleteRequest) { r.Cas = proto.Uint64(idx) }
}

// readSettings are the options Get and Range share.
type readSettings struct {
	consistency lodestonepb.Consistency
	waitIndex   uint64
	waitMS      uint32
}

// ReadOption modifies a Get or a Range.
type ReadOption func(*readSettings)

// RangeOption modifies a Range. Every ReadOption is a RangeOption.
type RangeOption interface {
	applyRange(*lodestonepb.RangeRequest)
}

func (o ReadOption) applyRange(r *lodestonepb.RangeRequest) {
	var s readSettings
	s.consistency, s.waitIndex, s.waitMS = r.Consistency, r.WaitIndex, r.WaitMs
	o(&s)
	r.Consistency, r.WaitIndex, r.WaitMs = s.consistency, s.waitIndex, s.waitMS
}

type rangeOption func(*lodestonepb.RangeRequest)

func (o rangeOption) applyRange(r *lodestonepb.RangeRequest) { o(r) }

// Stale lets any replica, learners included, answer at the index it has
// applied, instead of confirming leadership first. The answer's
// Header.Index says how fresh it is.
func Stale() ReadOption {
	return func(s *readSettings) { s.consistency = lodestonepb.Consistency_STALE }
}

// WaitIndex makes the read block until the data changes past idx or d
// elapses (a blocking query). d is rounded down to milliseconds and capped
// at about 49 days; the call's ctx deadline must exceed d or the call ends
// first.
func WaitIndex(idx uint64, d time.Duration) ReadOption {
	ms := d.Milliseconds()
	if ms > math.MaxUint32 {
		ms = math.MaxUint32
	}
	if ms < 0 {
		ms = 0
	}
	return func(s *readSettings) { s.waitIndex, s.waitMS = idx, uint32(ms) }
}

// Limit caps the keys a Range returns (the answer's More says whether it
// cut the range short). 0 means the server's maximum.
func Limit(n uint32) RangeOption {
	return rangeOption(func(r *lodestonepb.RangeRequest) { r.Limit = n })
}

// KeysOnly omits values from a Range's answer.
func KeysOnly() RangeOption {
	return rangeOption(func(r *lodestonepb.RangeRequest) { r.KeysOnly = true })
}

// StartAfter resumes a paged Range after key (exclusive); pass the last key
// of the previous page.
func StartAfter(key string) RangeOption {
	return rangeOption(func(r *lodestonepb.RangeRequest) { r.StartAfter = []byte(key) })
}

// Put stores value under key. It is a write: retried only when provably
// not applied (see the package doc). The answer's Kv is the entry as stored,
// without its value.
func (c *Client) Put(ctx context.Context, key string, value []byte, opts ...PutOption) (*lodestonepb.PutResponse, error) {
	req := &lodestonepb.PutRequest{Key: []byte(key), Value: value}
	for _, o := range opts {
		o(req)
	}
	return invoke(ctx, c, callSpec{op: fmt.Sprintf("put %q", key), write: true},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.PutResponse, error) {
			return lodestonepb.NewKVClient(cc).Put(ctx, req)
		}, (*lodestonepb.PutResponse).GetHeader)
}

// Get reads key. A missing key is not an error: the answer's Kv is nil.
// Linearizable unless Stale is given. Concurrent Gets without WaitIndex
// may share one call ([Config.GetBatch]).
func (c *Client) Get(ctx context.Context, key string, opts ...ReadOption) (*lodestonepb.GetResponse, error) {
	var s readSettings
	for _, o := range opts {
		o(&s)
	}
	req := &lodestonepb.GetRequest{Key: []byte(key), Consistency: s.consistency, WaitIndex: s.waitIndex, WaitMs: s.waitMS}
	if req.WaitIndex != 0 || c.cfg.GetBatch == 1 || c.getManyOff.Load() || int(req.Consistency) >= len(c.gets) || hasOutgoingMetadata(ctx) {
		return c.getAlone(ctx, req)
	}
	return c.gets[req.Consistency].get(ctx, req)
}

// getAlone makes req as a Get of its own.
func (c *Client) getAlone(ctx context.Context, req *lodestonepb.GetRequest) (*lodestonepb.GetResponse, error) {
	return invoke(ctx, c, callSpec{op: fmt.Sprintf("get %q", req.Key)},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.GetResponse, error) {
			return lodestonepb.NewKVClient(cc).Get(ctx, req)
		}, (*lodestonepb.GetResponse).GetHeader)
}

// Range reads the keys starting with prefix ("" for every key) in key
// order, at most Limit of them.
func (c *Client) Range(ctx context.Context, prefix string, opts ...RangeOption) (*lodestonepb.RangeResponse, error) {
	req := &lodestonepb.RangeRequest{Prefix: []byte(prefix)}
	for _, o := range opts {
		o.applyRange(req)
	}
	return invoke(ctx, c, callSpec{op: fmt.Sprintf("range %q", prefix)},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.RangeResponse, error) {
			return lodestonepb.NewKVClient(cc).Range(ctx, req)
		}, (*lodestonepb.RangeResponse).GetHeader)
}

// Delete removes key (or, with Prefix, every key under it). Deleting a
// missing key succeeds with Deleted 0. It is a write.
func (c *Client) Delete(ctx context.Context, key string, opts ...DeleteOption) (*lodestonepb.DeleteResponse, error) {
	req := &lodestonepb.DeleteRequest{Key: []byte(key)}
	for _, o := range opts {
		o(req)
	}
	return invoke(ctx, c, callSpec{op: fmt.Sprintf("delete %q", key), write: true},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.DeleteResponse, error) {
			return lodestonepb.NewKVClient(cc).Delete(ctx, req)
		}, (*lodestonepb.DeleteResponse).GetHeader)
}

// Txn applies ops atomically. A failed check is not an error: the answer
// has Succeeded false and Errors say which op failed. It is a write, even
// when every op is a GET.
func (c *Client) Txn(ctx context.Context, ops []*lodestonepb.TxnOp) (*lodestonepb.TxnResponse, error) {
	req := &lodestonepb.TxnRequest{Ops: ops}
	return invoke(ctx, c, callSpec{op: fmt.Sprintf("txn of %d ops", len(ops)), write: true},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.TxnResponse, error) {
			return lodestonepb.NewKVClient(cc).Txn(ctx, req)
		}, (*lodestonepb.TxnResponse).GetHeader)
}
