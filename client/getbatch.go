package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// getBatcher coalesces a Client's concurrent Gets of one consistency into
// GetMany batches, by natural batching: a Get that finds no call of its
// kind in flight takes the turn and goes alone at once; Gets that arrive
// while the turn is taken queue, and when it is given back the queue goes
// as one GetMany request of at most Config.GetBatch keys, on the
// batcher's GetStream (getstream.go). One call in flight per kind keeps
// the batches full while the process is busy and adds no wait while it is
// not. Why: a Get's server CPU is mostly gRPC's cost of a call (frames,
// headers, a response write), not the read, and a leader answering many
// small Gets is bound by it.
//
// Each Get keeps Get's answer and error: a key the GetMany did not serve,
// and every key of a GetMany the servers refused as a whole with
// InvalidArgument or Unimplemented, or that ran out of time before the
// Get's own ctx did, is asked for alone.
type getBatcher struct {
	c           *Client
	consistency lodestonepb.Consistency

	// stream is the batches' GetStream (getstream.go), nil until the
	// first batch and after one failed; used only with the turn.
	stream *getStream

	mu    sync.Mutex
	taken bool         // a call of this kind is in flight
	queue []*queuedGet // Gets waiting for the turn, oldest first
}

// queuedGet is one Get waiting in a getBatcher's queue.
type queuedGet struct {
	ctx  context.Context
	key  []byte
	done chan struct{} // closed when the fields below are set
	resp *lodestonepb.GetResponse
	err  error
	// turn says the Get was handed the turn to go alone (resp and err
	// nil) and must give it back.
	turn bool

	// Under the getBatcher's mu: taken says next took it from the queue
	// (done will be closed), left that its caller stopped waiting first.
	taken, left bool
}

// get answers req, coalesced with others or alone (Client.getAlone).
func (b *getBatcher) get(ctx context.Context, req *lodestonepb.GetRequest) (*lodestonepb.GetResponse, error) {
	b.mu.Lock()
	if !b.taken {
		b.taken = true
		b.mu.Unlock()
		defer b.next()
		return b.c.getAlone(ctx, req)
	}
	q := &queuedGet{ctx: ctx, key: req.Key, done: make(chan struct{})}
	b.queue = append(b.queue, q)
	b.mu.Unlock()
	select {
	case <-q.done:
	case <-ctx.Done():
		b.mu.Lock()
		q.left = !q.taken
		b.mu.Unlock()
		if q.left {
			return b.c.getAlone(ctx, req) // NB: fails at once with Get's ctx error
		}
		<-q.done // soon: its GetMany ends by this ctx's deadline
	}
	if q.turn {
		defer b.next()
	}
	if q.resp == nil && q.err == nil {
		return b.c.getAlone(ctx, req)
	}
	return q.resp, q.err
}

// next gives the turn to the queue: a lone Get goes alone, more go as
// one GetMany; with nobody waiting the turn is free again.
func (b *getBatcher) next() {
	b.mu.Lock()
	batch := b.take()
	if len(batch) == 0 {
		b.taken = false
	}
	b.mu.Unlock()
	switch len(batch) {
	case 0:
	case 1:
		batch[0].turn = true
		close(batch[0].done)
	default:
		go b.getMany(batch)
	}
}

// take removes the oldest queued Gets whose callers still wait, at most
// Config.GetBatch of them. The caller holds mu.
func (b *getBatcher) take() []*queuedGet {
	var batch []*queuedGet
	n := 0
	for _, q := range b.queue {
		n++
		if q.left {
			continue
		}
		q.taken = true
		batch = append(batch, q)
		if len(batch) == b.c.cfg.GetBatch {
			break
		}
	}
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil // NB: lets a burst's backing array go
	}
	return batch
}

// getMany answers batch with one GetMany request, then gives the turn on.
func (b *getBatcher) getMany(batch []*queuedGet) {
	defer b.next()
	req := &lodestonepb.GetManyRequest{Keys: make([][]byte, len(batch)), Consistency: b.consistency}
	for i, q := range batch {
		req.Keys[i] = q.key
	}
	// The call ends when the first of its Gets would have: it answers
	// nobody after that, and the others, asked alone, use the rest of
	// their own time.
	ctx, cancel := context.WithDeadline(context.Background(), earliestDeadline(batch, b.c.cfg.RequestTimeout))
	defer cancel()
	resp, err := invoke(ctx, b.c, callSpec{op: fmt.Sprintf("get of %d keys", len(batch))},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.GetManyResponse, error) {
			return b.batchOn(ctx, cc, req)
		}, (*lodestonepb.GetManyResponse).GetHeader)
	switch {
	case err == nil && len(resp.Results) == len(batch):
		for i, q := range batch {
			if r := resp.Results[i]; r.Served {
				q.resp = &lodestonepb.GetResponse{Header: cloneHeader(resp.Header), Kv: r.Kv}
			}
		}
	case err == nil, ctx.Err() != nil:
		// Asked alone, each with its own time.
	default:
		var e *Error
		if !errors.As(err, &e) || e.Code == codes.InvalidArgument {
			break // asked alone
		}
		if e.Code == codes.Unimplemented {
			b.c.getManyOff.Store(true) // a server that predates GetMany
			break
		}
		for _, q := range batch {
			one := *e
			one.Op = fmt.Sprintf("get %q", q.key)
			q.err = &one
		}
	}
	for _, q := range batch {
		close(q.done)
	}
}

// hasOutgoingMetadata says whether ctx carries gRPC metadata for the call
// (a token of the caller's own, say). NB: such a Get goes alone: a
// GetMany carries no caller's metadata, so it would be answered under the
// Client's token instead.
func hasOutgoingMetadata(ctx context.Context) bool {
	md, ok := metadata.FromOutgoingContext(ctx)
	return ok && md.Len() > 0
}

// earliestDeadline is the first deadline among batch's ctxs, a ctx without
// one counting as now plus timeout (what invoke would give it).
func earliestDeadline(batch []*queuedGet, timeout time.Duration) time.Time {
	first := time.Now().Add(timeout)
	for _, q := range batch {
		if dl, ok := q.ctx.Deadline(); ok && dl.Before(first) {
			first = dl
		}
	}
	return first
}

// cloneHeader gives each coalesced Get a header of its own.
func cloneHeader(h *lodestonepb.ResponseHeader) *lodestonepb.ResponseHeader {
	if h == nil {
		return nil
	}
	return &lodestonepb.ResponseHeader{Index: h.Index, Term: h.Term, LeaderId: h.LeaderId, NodeId: h.NodeId, KnownLeader: h.KnownLeader}
}
