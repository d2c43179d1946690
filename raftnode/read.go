package raftnode

import (
	"context"
	"encoding/binary"
	"time"

	"go.etcd.io/raft/v3"
)

// readRound is the reads one ReadIndex round confirms: every read that
// joined it before the loop sent it. The loop sets index or err and then
// closes done, which wakes all of them at once: a read costs the loop
// nothing of its own, neither a channel send to join nor one to answer.
type readRound struct {
	done  chan struct{}
	index uint64 // set before done is closed
	err   error  // set before done is closed
	reads int    // joined; under Node.readMu until the loop sends the round

	started time.Time
	term    uint64 // the term it went out in: it counts in readRounds while that term lasts
}

// joinRead adds a read to the round that goes out next and returns that
// round. The read that opens a round tells the loop (readC); a round
// opened while another is in flight goes when that one comes back.
func (n *Node) joinRead() *readRound {
	n.readMu.Lock()
	r := n.readNext
	opened := r == nil
	if opened {
		r = &readRound{done: make(chan struct{})}
		n.readNext = r
	}
	r.reads++
	n.readMu.Unlock()
	if opened {
		// NB: a full readC already promises the loop a look at readNext.
		select {
		case n.readC <- struct{}{}:
		default:
		}
	}
	return r
}

// takeReads hands the loop the round reads have joined, if any; reads
// that arrive after it open the next.
func (n *Node) takeReads() *readRound {
	n.readMu.Lock()
	r := n.readNext
	n.readNext = nil
	n.readMu.Unlock()
	return r
}

// flushReads sends the round reads have joined, unless maxReadRounds are
// in flight in this term: it then goes when one comes back. Each round is
// a heartbeat to every follower and their answers, so one round for all
// the reads that arrived during the previous one is what keeps a read's
// cost low under load (etcd's read loop does the same). A read that waits
// for the next round still gets an index chosen after it arrived, so it
// stays linearizable. It reports whether it sent a round.
func (n *Node) flushReads() bool {
	// NB: raft forgets the rounds of a past term (it resets its read
	// state at every change of role), so they no longer count: waiting for
	// them would stall reads until they expire.
	if term := n.status.Load().Term; term != n.readTerm {
		n.readTerm, n.readRounds = term, 0
	}
	if n.readRounds >= maxReadRounds {
		return false
	}
	r := n.takeReads()
	if r == nil {
		return false
	}
	r.started, r.term = n.clock.Now(), n.readTerm
	n.readRounds++
	n.metrics.readIndexBatch.Observe(float64(r.reads))
	n.readSeq++
	// NB: the leader drops a read whose context equals one it is already
	// confirming, so the context names this node as well as the round.
	var key [16]byte
	binary.BigEndian.PutUint64(key[:8], n.id)
	binary.BigEndian.PutUint64(key[8:], n.readSeq)
	n.pendingReads[n.readSeq] = r
	n.pendingReadOrd = append(n.pendingReadOrd, n.readSeq)
	n.rn.ReadIndex(key[:])
	return true
}

// roundDone marks r as no longer in flight.
func (n *Node) roundDone(r *readRound) {
	if r.term == n.readTerm && n.readRounds > 0 {
		n.readRounds--
	}
}

// answer wakes every read of r with index, or err.
func (r *readRound) answer(index uint64, err error) {
	r.index, r.err = index, err
	close(r.done)
}

func (n *Node) finishRead(rs raft.ReadState) {
	if len(rs.RequestCtx) != 16 || binary.BigEndian.Uint64(rs.RequestCtx) != n.id {
		return
	}
	seq := binary.BigEndian.Uint64(rs.RequestCtx[8:])
	r, ok := n.pendingReads[seq]
	if !ok {
		return
	}
	delete(n.pendingReads, seq)
	n.roundDone(r)
	r.index = rs.Index
	n.confirmed = append(n.confirmed, r)
}

// answerReads wakes the reads of every round confirmed since it last ran
// and reports whether there were any.
func (n *Node) answerReads() bool {
	if len(n.confirmed) == 0 {
		return false
	}
	for i, r := range n.confirmed {
		close(r.done)
		n.confirmed[i] = nil
	}
	n.confirmed = n.confirmed[:0]
	return true
}

// answerAndFlushReads wakes the confirmed rounds' reads, then sends the
// next round if reads joined one, yielding the processor once between the
// two. It reports whether it sent one: the loop then has its heartbeats
// to hand on.
//
// A round goes out only when the previous one came back, so without the
// yield it held only the reads that arrived in one heartbeat's round trip:
// on a busy leader with one core, a few reads a round and thousands of
// rounds a second, whose heartbeats and answers took a large share of the
// three servers' CPU. After the yield, the goroutines runnable by
// then (the woken reads answering, requests already read from the
// network) have run, and the reads they joined go out in the same round.
// Where nothing else is runnable (one client, or a processor to spare) the
// yield returns at once. The figures are in the commit that brought it.
func (n *Node) answerAndFlushReads() bool {
	if !n.answerReads() || !n.readsWaiting() {
		return false
	}
	n.yield()
	return n.flushReads()
}

// readsWaiting reports whether reads have joined the round that goes out
// next.
func (n *Node) readsWaiting() bool {
	n.readMu.Lock()
	defer n.readMu.Unlock()
	return n.readNext != nil
}

// expireReads fails rounds that got no answer within an election
// timeout: the leader is gone or unreachable, and a read is safe to retry.
func (n *Node) expireReads() {
	limit := n.ElectionTimeout()
	keep := n.pendingReadOrd[:0]
	for _, seq := range n.pendingReadOrd {
		r, ok := n.pendingReads[seq]
		if !ok {
			continue
		}
		if n.clock.Now().Sub(r.started) > limit {
			delete(n.pendingReads, seq)
			n.roundDone(r)
			r.answer(0, ErrReadTimeout)
			continue
		}
		keep = append(keep, seq)
	}
	n.pendingReadOrd = keep
	n.flushReads()
}

// failReads fails every read in flight or waiting for a round. A read
// that joins after it sees the loop stopped (doneC).
func (n *Node) failReads(err error) {
	for _, r := range n.confirmed {
		r.index, r.err = 0, err
	}
	n.answerReads()
	for seq, r := range n.pendingReads {
		r.answer(0, err)
		delete(n.pendingReads, seq)
	}
	if r := n.takeReads(); r != nil {
		r.answer(0, err)
	}
	n.readRounds = 0
	n.pendingReadOrd = nil
}

// ReadIndex returns an index that a linearizable read must wait for:
// confirmed by a quorum, then applied locally.
func (n *Node) ReadIndex(ctx context.Context) (uint64, error) {
	if n.status.Load().Lead == raft.None {
		return 0, ErrNoLeader
	}
	start := n.clock.Now()
	r := n.joinRead()
	select {
	case <-r.done:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-n.doneC:
		return 0, n.Err()
	}
	if r.err != nil {
		return 0, r.err
	}
	if err := n.WaitApplied(ctx, r.index); err != nil {
		return 0, err
	}
	n.metrics.readIndexLatency.Observe(n.clock.Now().Sub(start).Seconds())
	return r.index, nil
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
