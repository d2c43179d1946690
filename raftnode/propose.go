package raftnode

import (
	"context"
	"encoding/binary"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Result is a proposal's outcome once applied on this node.
type Result struct {
	Index  uint64                     // the entry's Raft index
	Result *lodestonepb.CommandResult // nil for a membership change
}

// Propose replicates cmd and returns its result once it is applied on
// this node, so a read here afterwards sees it. Validation is the
// caller's: the store applies whatever commits. An error wrapping
// ErrLeaderChanged or a context error leaves the outcome unknown; every
// other error means cmd was not applied.
func (n *Node) Propose(ctx context.Context, cmd *lodestonepb.Command) (Result, error) {
	body, err := proto.Marshal(cmd)
	if err != nil {
		return Result{}, fmt.Errorf("encode command: %w", err)
	}
	id := n.nextID.Add(1)
	data := make([]byte, 8+len(body))
	binary.BigEndian.PutUint64(data, id)
	copy(data[8:], body)
	r, err := n.proposeAndWait(ctx, id, func() error {
		select {
		case n.proposeC <- proposal{id: id, data: data}:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-n.doneC:
			return n.Err()
		}
	})
	return Result{Index: r.index, Result: r.result}, err
}

// proposeAndWait registers a waiter for id, runs submit, and waits for the
// apply loop to resolve the id.
func (n *Node) proposeAndWait(ctx context.Context, id uint64, submit func() error) (proposalResult, error) {
	start := n.clock.Now()
	ch := n.waits.register(id)
	if err := submit(); err != nil {
		n.waits.cancel(id)
		return proposalResult{}, err
	}
	select {
	case r := <-ch:
		if r.err != nil {
			n.metrics.proposals.WithLabelValues("failed").Inc()
			return r, r.err
		}
		n.metrics.proposals.WithLabelValues("ok").Inc()
		n.metrics.commitLatency.Observe(n.clock.Now().Sub(start).Seconds())
		return r, nil
	case <-ctx.Done():
		n.waits.cancel(id)
		return proposalResult{}, ctx.Err()
	}
}
