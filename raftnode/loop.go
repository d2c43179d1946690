package raftnode

import (
	"errors"
	"fmt"
	"math"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

type proposal struct {
	id   uint64
	data []byte
}

type confRequest struct {
	cc   raftpb.ConfChangeV2
	id   uint64
	done chan error // answered once the change is proposed or refused
}

type transferRequest struct {
	to   uint64
	done chan transferResult
}

type transferResult struct {
	to  uint64
	err error
}

type snapResult struct {
	index        uint64
	appliedBytes uint64 // Node.appliedBytes when the snapshot's view was taken
	stale        bool
	err          error
}

func (n *Node) run() {
	defer close(n.doneC)
	ticks := n.cfg.Ticks
	if ticks == nil {
		ticker := time.NewTicker(n.cfg.TickInterval)
		defer ticker.Stop()
		ticks = ticker.C
	}
	// NB: what raft has at start (a fresh log's bootstrap entries, a
	// restart's committed entries) is handled now, not at the first tick:
	// a lone voter campaigns once it is applied (campaignAlone).
	if err := n.handleReadies(); err != nil {
		n.logger.Error("raft loop stopped", "err", err)
		n.fatal.Store(&err)
		return
	}
	n.advanceElection()
	for {
		var err error
		select {
		case <-ticks:
			n.tick()
		case p := <-n.proposeC:
			n.propose(p)
		case m := <-n.recvC:
			n.step(m)
		case <-n.readC:
			n.flushReads()
		case r := <-n.reportC:
			n.handleReport(r)
		case c := <-n.confC:
			c.done <- n.proposeConfChange(c)
		case t := <-n.transferC:
			n.transfer(t)
		case s := <-n.snapDoneC:
			n.saveSnapshot(s)
		case r := <-n.liveSnapC:
			r <- n.liveSnapshot()
		case d := <-n.appendDoneC:
			err = n.appendDone(d)
		case <-n.stopC:
			n.failReads(ErrStopped)
			return
		}
		if err == nil {
			err = n.handleReadies()
		}
		if err != nil {
			// NB: a failed fsync leaves the on-disk state unknown;
			// carrying on could acknowledge writes that are not
			// durable, so the node stops and the operator restarts it.
			n.logger.Error("raft loop stopped", "err", err)
			n.fatal.Store(&err)
			n.failReads(err)
			return
		}
	}
}

// appendDone takes a finished log write: the state machine catches up with
// a persisted snapshot, then raft learns what is durable.
func (n *Node) appendDone(d appendDone) error {
	if d.err != nil {
		return d.err
	}
	n.observeWrite(d)
	n.durableCommit = max(n.durableCommit, d.commit)
	if d.snap != nil {
		// NB: before the responses: stepping them tells raft the snapshot
		// is applied, and it then hands out the entries after it.
		if err := n.restoreSnapshot(*d.snap); err != nil {
			return err
		}
	}
	n.stepLocal(d.local)
	// NB: a snapshot due since this write's commit index became durable
	// starts now, not at the next Ready; a member added after the newest
	// snapshot was otherwise sent the old one first.
	n.maybeSnapshot()
	return nil
}

// stepLocal steps messages raft addressed to this node's own storage
// responses.
func (n *Node) stepLocal(msgs []raftpb.Message) {
	for _, m := range msgs {
		if err := n.rn.Step(m); err != nil {
			n.logger.Debug("step local", "type", m.Type.String(), "err", err)
		}
	}
}

// propose hands one proposal and every other queued one to Raft, so that
// concurrent writers share one Ready and one fsync.
func (n *Node) propose(first proposal) {
	batch := 1
	n.proposeOne(first)
	for batch < n.cfg.MaxBatchProposals {
		select {
		case p := <-n.proposeC:
			n.proposeOne(p)
			batch++
			continue
		default:
		}
		break
	}
	n.metrics.proposalBatch.Observe(float64(batch))
}

func (n *Node) proposeOne(p proposal) {
	if err := n.rn.Propose(p.data); err != nil {
		n.metrics.proposals.WithLabelValues("dropped").Inc()
		n.waits.trigger(p.id, proposalResult{err: ErrNoLeader})
		return
	}
	// NB: only now may a leader change orphan it: raft appended or
	// forwarded it in the current term, and no later (orphans.go).
	n.waits.submitted(p.id)
}

func (n *Node) step(first raftpb.Message) {
	n.stepOne(first)
	for i := 0; i < 1024; i++ {
		select {
		case m := <-n.recvC:
			n.stepOne(m)
			continue
		default:
		}
		break
	}
}

func (n *Node) stepOne(m raftpb.Message) {
	now := n.clock.Now()
	n.heardMu.Lock()
	n.heard[m.From] = now
	n.heardMu.Unlock()
	n.appendAcks.received(m, now)
	if m.Type == raftpb.MsgProp && !n.acceptForwarded(m) {
		return
	}
	if m.Type == raftpb.MsgTimeoutNow && n.coolingDown() {
		n.logger.Info("not taking over leadership: cooling down after a slow-disk step-down")
		return
	}
	if err := n.rn.Step(m); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) {
		n.logger.Debug("step", "type", m.Type.String(), "from", fmt.Sprintf("%x", m.From), "err", err)
	}
}

func (n *Node) handleReport(r report) {
	if r.snapshot {
		n.rn.ReportSnapshot(r.to, r.snapStatus)
		return
	}
	n.rn.ReportUnreachable(r.to)
}

// tick advances Raft's clock by one tick and runs the checks that go with
// it.
func (n *Node) tick() {
	n.rn.Tick()
	n.expireReads()
	n.settleOrphans()
	n.checkSlowLeader()
}

// handleReadies handles every Ready raft has. NB: stepping the responses
// of local writes can make another Ready at once; waiting for the next
// input would stall it until the next tick.
func (n *Node) handleReadies() error {
	for {
		for n.rn.HasReady() {
			if err := n.handleReady(); err != nil {
				return err
			}
		}
		if n.campaignAlone() {
			continue
		}
		if n.answerAndFlushReads() {
			continue // the next read round's heartbeats
		}
		n.publishLearners()
		n.releaseLog()
		return nil
	}
}

func (n *Node) handleReady() error {
	start := n.clock.Now()
	rd := n.rn.Ready()
	rd.Messages = n.holdCampaign(rd.Messages)
	if rd.SoftState != nil {
		n.softStateChanged(rd.SoftState, rd.Entries)
	}
	n.publishHardState(rd)
	// With AsyncStorageWrites, Entries, HardState, Snapshot and
	// CommittedEntries arrive as messages to the local storage threads;
	// raft already holds back every message that needs them durable (a
	// follower's acknowledgements, votes, the leader's own MsgAppResp) as
	// responses to the append, so the rest may leave now. The leader's
	// appends thus go out before its own fsync (Raft thesis §10.2.1).
	applies := n.applies[:0]
	for _, m := range rd.Messages {
		switch m.To {
		case raft.LocalAppendThread:
			n.pending.record(m)
			n.appendQ.push(m)
		case raft.LocalApplyThread:
			applies = append(applies, m)
		}
	}
	// NB: a pass of its own, so every append is queued before any
	// message leaves. Sending in raft's order (messages first) cut group
	// commit from 13 puts a commit to 3.4 in BenchmarkPut64, and a pinned
	// leader's throughput at 64 clients by 40% (make bench-kv).
	sent := n.clock.Now()
	for _, m := range rd.Messages {
		if m.To != raft.LocalAppendThread && m.To != raft.LocalApplyThread {
			if m.Type == raftpb.MsgProp {
				m.LogTerm = n.status.Load().Term // orphans.go: only that term's leader may append it
			}
			n.appendAcks.sent(m, sent)
			if m.Type == raftpb.MsgSnap {
				n.sendSnapshot(m)
				continue
			}
			n.sender.Send(m)
		}
	}
	// Apply in the loop, since conf changes need the RawNode: first what
	// raft hands out (committed and durable here), then what is committed
	// but still in the log writer's hands (earlyapply.go).
	for _, m := range applies {
		if err := n.apply(m.Entries); err != nil {
			return err
		}
		n.stepLocal(m.Responses)
	}
	if err := n.applyEarly(); err != nil {
		return err
	}
	// NB: kept for the next Ready, so a write's several Readies do not
	// each allocate it; cleared so it pins no entries.
	clear(applies)
	n.applies = applies[:0]
	for _, rs := range rd.ReadStates {
		n.finishRead(rs)
	}
	n.maybeSnapshot()
	n.metrics.readyLatency.Observe(n.clock.Now().Sub(start).Seconds())
	return nil
}

// releaseLog lets the log's cache drop the entries no one reads again
// soon: this member applied them and, on a leader, every other member has
// them. A member that lags keeps what it still needs cached, up to the
// cache's bounds. It runs after every input, since a follower's
// acknowledgement need not make a Ready, and calls the log only when that
// point moved. A log busy with a write skips it; the next input tries
// again.
func (n *Node) releaseLog() {
	if n.appliedIndex <= n.released {
		return
	}
	upTo := n.appliedIndex
	if n.status.Load().State == raft.StateLeader {
		n.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
			if id != n.id {
				upTo = min(upTo, pr.Match)
			}
		})
	}
	if upTo > n.released && n.log.Release(upTo) {
		n.released = upTo
	}
}

// applyEarly applies the committed entries raft has not handed out yet
// because this node's log write of them is still running. While a snapshot
// is due it stops at the commit index the log holds, since a snapshot may
// not be ahead of the log (maybeSnapshot).
func (n *Node) applyEarly() error {
	limit := uint64(math.MaxUint64)
	if n.snapshotDue() {
		limit = n.durableCommit
	}
	ents := n.pending.committed(n.appliedIndex, limit)
	if len(ents) > 0 {
		if err := n.apply(ents); err != nil {
			return err
		}
		n.metrics.appliedEarly.Add(float64(len(ents)))
	}
	n.pending.release(n.appliedIndex)
	return nil
}

// publishHardState makes the term and commit index visible to readers.
func (n *Node) publishHardState(rd raft.Ready) {
	if raft.IsEmptyHardState(rd.HardState) {
		return
	}
	next := *n.status.Load()
	next.Term = rd.HardState.Term
	next.Commit = rd.HardState.Commit
	n.status.Store(&next)
	n.metrics.term.Set(float64(next.Term))
	n.metrics.commitIndex.Set(float64(next.Commit))
}

func (n *Node) softStateChanged(ss *raft.SoftState, ents []raftpb.Entry) {
	prev := n.status.Load()
	next := *prev
	next.Lead = ss.Lead
	next.State = ss.RaftState
	if ss.RaftState == raft.StateLeader && prev.State != raft.StateLeader {
		// Raft refuses conf changes until it has applied everything up to
		// its election; so do we, to answer callers instead of dropping.
		n.leaderGuard = n.rn.Status().Commit
		if len(ents) > 0 {
			n.leaderGuard = max(n.leaderGuard, ents[len(ents)-1].Index)
		}
		next.TermStart = n.leaderGuard
		n.metrics.isLeader.Set(1)
	} else if ss.RaftState != raft.StateLeader {
		n.metrics.isLeader.Set(0)
		n.appendAcks.reset()
	}
	n.status.Store(&next)
	if ss.RaftState != raft.StateLeader {
		n.confInFlight = 0
	}
	if prev.Lead != ss.Lead {
		if prev.Lead != raft.None {
			// NB: a proposal in flight to a leader that is gone may be
			// lost or may still commit; its waiter is answered once
			// that is settled (orphans.go).
			n.orphanProposals(prev.Term)
		}
		n.metrics.leaderChanges.Inc()
		n.logger.Info("leader changed", "leader", fmt.Sprintf("%x", ss.Lead), "state", ss.RaftState.String())
		n.leaderMu.Lock()
		close(n.leaderCh)
		n.leaderCh = make(chan struct{})
		n.leaderMu.Unlock()
	}
}
