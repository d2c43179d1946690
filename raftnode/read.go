package raftnode

import (
	"context"
	"encoding/binary"
	"time"

	"go.etcd.io/raft/v3"
)

type readBatch struct {
	waiters []chan readResult
	started time.Time
	term    uint64 // the term it went out in: it counts in readRounds while that term lasts
}

// maxReadBatch bounds the reads startRead takes off readC at once, so a
// flood of reads does not hold the loop from its other inputs.
const maxReadBatch = 4096

// startRead queues first and every read waiting behind it, and sends a
// round for them unless one is in flight (flushReads).
func (n *Node) startRead(first chan readResult) {
	n.readQueue = append(n.readQueue, first)
	for range maxReadBatch - 1 {
		select {
		case r := <-n.readC:
			n.readQueue = append(n.readQueue, r)
			continue
		default:
		}
		break
	}
	n.flushReads()
}

// flushReads sends one ReadIndex round for every queued read, unless
// maxReadRounds are in flight in this term: the reads then join the round
// sent when one comes back. Each round is a heartbeat to every follower
// and their answers, so one round for all the reads that arrived during
// the previous one is what keeps a read's cost low under load (etcd's
// read loop does the same). A read that waits for the next round still
// gets an index chosen after it arrived, so it stays linearizable.
func (n *Node) flushReads() {
	if len(n.readQueue) == 0 {
		return
	}
	// NB: raft forgets the rounds of a past term (it resets its read
	// state at every change of role), so they no longer count: waiting for
	// them would stall reads until they expire.
	if term := n.status.Load().Term; term != n.readTerm {
		n.readTerm, n.readRounds = term, 0
	}
	if n.readRounds >= maxReadRounds {
		return
	}
	b := &readBatch{waiters: n.readQueue, started: n.clock.Now(), term: n.readTerm}
	n.readQueue = nil
	n.readRounds++
	n.metrics.readIndexBatch.Observe(float64(len(b.waiters)))
	n.readSeq++
	// NB: the leader drops a read whose context equals one it is already
	// confirming, so the context names this node as well as the batch.
	var key [16]byte
	binary.BigEndian.PutUint64(key[:8], n.id)
	binary.BigEndian.PutUint64(key[8:], n.readSeq)
	n.pendingReads[n.readSeq] = b
	n.pendingReadOrd = append(n.pendingReadOrd, n.readSeq)
	n.rn.ReadIndex(key[:])
}

// roundDone marks b's round as no longer in flight.
func (n *Node) roundDone(b *readBatch) {
	if b.term == n.readTerm && n.readRounds > 0 {
		n.readRounds--
	}
}

func (n *Node) finishRead(rs raft.ReadState) {
	if len(rs.RequestCtx) != 16 || binary.BigEndian.Uint64(rs.RequestCtx) != n.id {
		return
	}
	seq := binary.BigEndian.Uint64(rs.RequestCtx[8:])
	b, ok := n.pendingReads[seq]
	if !ok {
		return
	}
	delete(n.pendingReads, seq)
	n.roundDone(b)
	for _, w := range b.waiters {
		w <- readResult{index: rs.Index}
	}
	n.flushReads()
}

// expireReads fails read batches that got no answer within an election
// timeout: the leader is gone or unreachable, and a read is safe to retry.
func (n *Node) expireReads() {
	limit := n.ElectionTimeout()
	keep := n.pendingReadOrd[:0]
	for _, seq := range n.pendingReadOrd {
		b, ok := n.pendingReads[seq]
		if !ok {
			continue
		}
		if n.clock.Now().Sub(b.started) > limit {
			delete(n.pendingReads, seq)
			n.roundDone(b)
			for _, w := range b.waiters {
				w <- readResult{err: ErrReadTimeout}
			}
			continue
		}
		keep = append(keep, seq)
	}
	n.pendingReadOrd = keep
	n.flushReads()
}

func (n *Node) failReads(err error) {
	for seq, b := range n.pendingReads {
		for _, w := range b.waiters {
			w <- readResult{err: err}
		}
		delete(n.pendingReads, seq)
	}
	for _, w := range n.readQueue {
		w <- readResult{err: err}
	}
	n.readQueue, n.readRounds = nil, 0
	n.pendingReadOrd = nil
}

// ReadIndex returns an index that a linearizable read must wait for:
// confirmed by a quorum, then applied locally.
func (n *Node) ReadIndex(ctx context.Context) (uint64, error) {
	if n.status.Load().Lead == raft.None {
		return 0, ErrNoLeader
	}
	start := n.clock.Now()
	ch := make(chan readResult, 1)
	select {
	case n.readC <- ch:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-n.doneC:
		return 0, n.Err()
	}
	var res readResult
	select {
	case res = <-ch:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-n.doneC:
		return 0, n.Err()
	}
	if res.err != nil {
		return 0, res.err
	}
	if err := n.WaitApplied(ctx, res.index); err != nil {
		return 0, err
	}
	n.metrics.readIndexLatency.Observe(n.clock.Now().Sub(start).Seconds())
	return res.index, nil
}

// LeaderRead is Consul's default consistency mode: on a leader that has
// committed an entry of its own term it waits only for its own commit
// index to be applied, with no quorum round; a follower waits for the
// leader's commit index as of some time after began, when the read
// began, which it asks for unless it asked since (leaderindex.go);
// elsewhere, or when the leader cannot answer, it is readIndex.
// NB: such a read is stale only on a leader cut off from the quorum that
// has not yet noticed, which with CheckQuorum is at most an election
// timeout: Consul's default mode makes the same trade for the same cost
// (no round per read), and ?consistent still pays for the round.
func (n *Node) LeaderRead(ctx context.Context, began time.Time) error {
	st := n.status.Load()
	switch {
	case st.State == raft.StateLeader && st.Commit >= st.TermStart:
		n.metrics.leaderReads.Inc()
		return n.WaitApplied(ctx, st.Commit)
	case st.State != raft.StateLeader && st.Lead != raft.None:
		index, err := n.leaderIdx.index(ctx, began)
		if err == nil {
			n.metrics.followerLeaderReads.Inc()
			return n.WaitApplied(ctx, index)
		}
		if ctx.Err() != nil {
			return err
		}
		// The leader could not answer (it changed, or is not reachable
		// from here): a quorum round settles the read instead.
		n.logger.Debug("leader index call failed; reading through ReadIndex", "err", err)
	}
	_, err := n.ReadIndex(ctx)
	return err
}

func (n *Node) WaitApplied(ctx context.Context, index uint64) error {
	// NB: most reads find index applied: answer before ctx.Done, which
	// makes a request context's channel on first use.
	if n.applied.current() >= index {
		return nil
	}
	select {
	case <-n.applied.wait(index):
		if n.applied.current() < index {
			return n.Err()
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// maxReadRounds is how many ReadIndex rounds may be in flight at once.
// One, as etcd: with a round per arrival, concurrent reads almost never
// shared one (BenchmarkGet64's reads/round).
const maxReadRounds = 1
