package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/raftlog"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// node owns one raft.RawNode and drives it from a single goroutine (run).
// Every other goroutine talks to it through channels; the state it
// publishes for them (status, applied index) is read through atomics and
// the appliedWait.
//
// Entry payload layout for normal entries:
//
//	[8 bytes big-endian request id][marshaled lodestonepb.Command]
//
// An empty payload is Raft's own no-op on leader election.
type node struct {
	id      uint64
	cfg     Config
	logger  *slog.Logger
	metrics *metrics

	rn         *raft.RawNode // touched only by run
	appendAcks *appendAcks   // touched only by run
	log        *raftlog.Log
	store      *store.Store
	hub        *watch.Hub
	transport  *transport

	waits   waitRegistry
	applied appliedWait
	nextID  atomic.Uint64

	proposeC  chan proposal
	recvC     chan raftpb.Message
	readC     chan chan readResult
	confC     chan confRequest
	transferC chan transferRequest
	snapDoneC chan snapResult
	liveSnapC chan chan liveSnapshot // operator snapshots (admin.go)
	appendQ   *appendQueue           // loop → log writer (logwriter.go)
	// appendDoneC carries finished log writes back to the loop.
	appendDoneC chan appendDone
	stopC       chan struct{}
	doneC       chan struct{}
	stopOnce    sync.Once
	wg          sync.WaitGroup // snapshot encoders, the publisher and the log writer

	// removedC is closed when this member is removed from the cluster.
	removedC    chan struct{}
	removedOnce sync.Once
	// fatal holds the error that stopped the loop, if any.
	fatal atomic.Pointer[error]

	status atomic.Pointer[nodeStatus]
	// lastSnapBytes is the size of the last snapshot this node encoded.
	lastSnapBytes atomic.Int64

	heardMu sync.Mutex
	heard   map[uint64]time.Time // when each peer last sent us anything

	leaderMu sync.Mutex
	leaderCh chan struct{} // closed and replaced on every leader change

	// Loop-owned state.
	confState      raftpb.ConfState
	appliedIndex   uint64
	appliedTerm    uint64 // the term of the entry at appliedIndex, which the log may not hold yet (earlyapply.go)
	snapIndex      uint64
	durableCommit  uint64 // the commit index the log holds (log writer reports)
	snapshotting   bool
	snapWantedAt   uint64           // a snapshot at or after this index is due now (a member was added)
	leaderGuard    uint64           // conf changes wait until this index is applied
	confInFlight   uint64           // request id of our pending conf change, 0 if none
	replies        []reply          // results of the entry being applied, sent once it is published
	applies        []raftpb.Message // handleReady's MsgStorageApply messages, reused
	pending        pendingEntries   // appended, not yet applied (earlyapply.go)
	readSeq        uint64
	pendingReads   map[uint64]*readBatch
	pendingReadOrd []uint64
	slow           *slowLeader // slowleader.go
	adm            *admission  // admission.go

	leaderIdx   *leaderIndexer // a follower's default-mode reads (leaderindex.go)
	indexStream indexStream    // the leaderIndexer's stream to the leader
}

type nodeStatus struct {
	lead   uint64
	term   uint64
	commit uint64
	state  raft.StateType
	// termStart is, on a leader, the index of its election entry: once
	// commit reaches it the leader holds every committed entry.
	termStart uint64
}

type proposal struct {
	id   uint64
	data []byte
}

type readResult struct {
	index uint64
	err   error
}

type readBatch struct {
	waiters []chan readResult
	started time.Time
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
	index uint64
	stale bool
	err   error
}

// newNode opens the log, restores the newest snapshot and prepares the
// RawNode; run starts it.
func newNode(cfg Config, logger *slog.Logger, m *metrics, st *store.Store, hub *watch.Hub) (*node, error) {
	id := MemberID(cfg.Name)
	lg, err := raftlog.Open(filepath.Join(cfg.DataDir, "raft"), raftlog.Options{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("open raft log: %w", err)
	}
	n := &node{
		id:           id,
		cfg:          cfg,
		logger:       logger,
		metrics:      m,
		log:          lg,
		store:        st,
		hub:          hub,
		proposeC:     make(chan proposal, 4096),
		recvC:        make(chan raftpb.Message, 4096),
		readC:        make(chan chan readResult, 4096),
		confC:        make(chan confRequest),
		transferC:    make(chan transferRequest),
		snapDoneC:    make(chan snapResult, 1),
		liveSnapC:    make(chan chan liveSnapshot),
		appendQ:      newAppendQueue(),
		appendDoneC:  make(chan appendDone),
		stopC:        make(chan struct{}),
		doneC:        make(chan struct{}),
		removedC:     make(chan struct{}),
		leaderCh:     make(chan struct{}),
		pendingReads: map[uint64]*readBatch{},
		heard:        map[uint64]time.Time{},
	}
	n.nextID.Store(uint64(time.Now().UnixNano()))
	n.status.Store(&nodeStatus{})
	n.slow = newSlowLeader(cfg.SlowLeader, m.reg)
	n.adm = newAdmission(st, m.reg)
	n.leaderIdx = newLeaderIndexer(n.askLeaderIndex)
	n.appendAcks = newAppendAcks(observeByPeer(m.peerAppendAck))
	if err := n.init(); err != nil {
		return nil, errors.Join(err, lg.Close())
	}
	return n, nil
}

func (n *node) init() error {
	snap, err := n.log.Snapshot()
	if err != nil {
		return fmt.Errorf("read snapshot: %w", err)
	}
	if !raft.IsEmptySnap(snap) {
		if err := n.store.Restore(bytes.NewReader(snap.Data)); err != nil {
			return fmt.Errorf("restore snapshot at index %d: %w", snap.Metadata.Index, err)
		}
		n.snapIndex = snap.Metadata.Index
		n.appliedIndex, n.appliedTerm = snap.Metadata.Index, snap.Metadata.Term
		n.confState = snap.Metadata.ConfState
		n.hub.Restore(snap.Metadata.Index)
		n.logger.Info("restored snapshot", "index", snap.Metadata.Index, "bytes", len(snap.Data))
	}
	hs, _, err := n.log.InitialState()
	if err != nil {
		return fmt.Errorf("read initial state: %w", err)
	}
	last, err := n.log.LastIndex()
	if err != nil {
		return fmt.Errorf("read last index: %w", err)
	}
	fresh := raft.IsEmptyHardState(hs) && last == 0 && raft.IsEmptySnap(snap)
	n.durableCommit = max(hs.Commit, n.snapIndex)

	rc := &raft.Config{
		ID:              n.id,
		ElectionTick:    n.cfg.ElectionTicks,
		HeartbeatTick:   n.cfg.HeartbeatTicks,
		Storage:         n.log,
		Applied:         n.appliedIndex,
		MaxSizePerMsg:   1 << 20,
		MaxInflightMsgs: 256,
		// NB: bounds memory when followers lag and clients keep writing;
		// past it proposals are dropped and clients see Unavailable.
		MaxUncommittedEntriesSize: 256 << 20,
		MaxCommittedSizePerReady:  64 << 20,
		// Log writes run on their own goroutine and batch across Readies
		// (logwriter.go); raft holds back acknowledgements and applies
		// until they are durable.
		AsyncStorageWrites: true,
		CheckQuorum:        true,
		PreVote:            true,
		ReadOnlyOption:     raft.ReadOnlySafe,
		Logger:             raftLogger{n.logger.With("component", "raft")},
	}
	rn, err := raft.NewRawNode(rc)
	if err != nil {
		return fmt.Errorf("start raft: %w", err)
	}
	n.rn = rn
	n.applied.advance(n.appliedIndex)

	n.transport = newTransport(n.id, n.logger, n.metrics, n.deliver, n.proposalsDropped)
	n.transport.removedSelf = n.markRemoved
	n.transport.commitHold = n.cfg.CommitNoticeHold
	for name, addr := range n.cfg.InitialCluster {
		if err := n.transport.setPeer(MemberID(name), addr); err != nil {
			return err
		}
	}
	for _, mem := range n.store.Members() {
		if err := n.transport.setPeer(mem.Id, mem.PeerAddr); err != nil {
			return err
		}
	}

	if fresh && !n.cfg.Join {
		// Every member bootstraps the same entries in the same order, so
		// their logs agree from index 1.
		names := make([]string, 0, len(n.cfg.InitialCluster))
		for name := range n.cfg.InitialCluster {
			names = append(names, name)
		}
		sort.Strings(names)
		peers := make([]raft.Peer, 0, len(names))
		for _, name := range names {
			ctx, err := proto.Marshal(&lodestonepb.ConfChangeContext{Member: &lodestonepb.Member{
				Id: MemberID(name), Name: name, PeerAddr: n.cfg.InitialCluster[name],
			}})
			if err != nil {
				return fmt.Errorf("encode bootstrap member %q: %w", name, err)
			}
			peers = append(peers, raft.Peer{ID: MemberID(name), Context: ctx})
		}
		if err := rn.Bootstrap(peers); err != nil {
			return fmt.Errorf("bootstrap cluster: %w", err)
		}
		n.logger.Info("bootstrapped new cluster", "members", FormatInitialCluster(n.cfg.InitialCluster))
	}
	return nil
}

// start launches the Raft loop and the log writer.
func (n *node) start() {
	n.wg.Add(1)
	go n.runLogWriter()
	go n.run()
}

// stop ends the loop and waits for everything the node started, then
// closes the log. It returns the first error.
func (n *node) stop() error {
	n.stopOnce.Do(func() { close(n.stopC) })
	<-n.doneC
	n.leaderIdx.close()
	n.indexStream.close()
	n.wg.Wait()
	errs := []error{n.transport.close()}
	n.waits.failAll(errStopped)
	n.applied.close()
	errs = append(errs, n.log.Close())
	return errors.Join(errs...)
}

func (n *node) deliver(ctx context.Context, m raftpb.Message) error {
	select {
	case n.recvC <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-n.doneC:
		return errStopped
	}
}

func (n *node) run() {
	defer close(n.doneC)
	ticker := time.NewTicker(n.cfg.TickInterval)
	defer ticker.Stop()
	for {
		var err error
		select {
		case <-ticker.C:
			n.rn.Tick()
			n.expireReads()
			n.checkSlowLeader()
		case p := <-n.proposeC:
			n.propose(p)
		case m := <-n.recvC:
			n.step(m)
		case r := <-n.readC:
			n.startRead(r)
		case ev := <-n.transport.events:
			n.handleTransportEvent(ev)
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
			n.failReads(errStopped)
			return
		}
		// NB: stepping the responses of local writes can make another
		// Ready at once; waiting for the next input would stall it until
		// the next tick.
		for err == nil && n.rn.HasReady() {
			err = n.handleReady()
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
func (n *node) appendDone(d appendDone) error {
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
	return nil
}

// stepLocal steps messages raft addressed to this node's own storage
// responses.
func (n *node) stepLocal(msgs []raftpb.Message) {
	for _, m := range msgs {
		if err := n.rn.Step(m); err != nil {
			n.logger.Debug("step local", "type", m.Type.String(), "err", err)
		}
	}
}

// propose hands one proposal and every other queued one to Raft, so that
// concurrent writers share one Ready and one fsync.
func (n *node) propose(first proposal) {
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

func (n *node) proposeOne(p proposal) {
	if err := n.rn.Propose(p.data); err != nil {
		n.metrics.proposals.WithLabelValues("dropped").Inc()
		n.waits.trigger(p.id, proposalResult{err: errNoLeader})
	}
}

func (n *node) step(first raftpb.Message) {
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

func (n *node) markRemoved() {
	n.removedOnce.Do(func() { close(n.removedC) })
}

// proposalsDropped answers the callers of proposals that never left this
// node: they were not applied, so the callers may retry.
func (n *node) proposalsDropped(m raftpb.Message) {
	for _, e := range m.Entries {
		if e.Type == raftpb.EntryNormal && len(e.Data) >= 8 {
			n.waits.trigger(binary.BigEndian.Uint64(e.Data), proposalResult{err: errNoLeader})
		}
	}
}

func (n *node) stepOne(m raftpb.Message) {
	now := time.Now()
	n.heardMu.Lock()
	n.heard[m.From] = now
	n.heardMu.Unlock()
	n.appendAcks.received(m, now)
	if m.Type == raftpb.MsgTimeoutNow && n.coolingDown() {
		n.logger.Info("not taking over leadership: cooling down after a slow-disk step-down")
		return
	}
	if err := n.rn.Step(m); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) {
		n.logger.Debug("step", "type", m.Type.String(), "from", fmt.Sprintf("%x", m.From), "err", err)
	}
}

func (n *node) handleTransportEvent(ev transportEvent) {
	switch {
	case ev.snapshot:
		n.rn.ReportSnapshot(ev.to, ev.snapStatus)
	case ev.unreachable:
		n.rn.ReportUnreachable(ev.to)
	}
}

func (n *node) handleReady() error {
	start := time.Now()
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
	sent := time.Now()
	for _, m := range rd.Messages {
		if m.To != raft.LocalAppendThread && m.To != raft.LocalApplyThread {
			n.appendAcks.sent(m, sent)
			n.transport.send(m)
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
	n.metrics.readyLatency.Observe(time.Since(start).Seconds())
	return nil
}

// applyEarly applies the committed entries raft has not handed out yet
// because this node's log write of them is still running. While a snapshot
// is due it stops at the commit index the log holds, since a snapshot may
// not be ahead of the log (maybeSnapshot).
func (n *node) applyEarly() error {
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
func (n *node) publishHardState(rd raft.Ready) {
	if raft.IsEmptyHardState(rd.HardState) {
		return
	}
	next := *n.status.Load()
	next.term = rd.HardState.Term
	next.commit = rd.HardState.Commit
	n.status.Store(&next)
	n.metrics.term.Set(float64(next.term))
	n.metrics.commitIndex.Set(float64(next.commit))
}

func (n *node) softStateChanged(ss *raft.SoftState, ents []raftpb.Entry) {
	prev := n.status.Load()
	next := *prev
	next.lead = ss.Lead
	next.state = ss.RaftState
	if ss.RaftState == raft.StateLeader && prev.state != raft.StateLeader {
		// Raft refuses conf changes until it has applied everything up to
		// its election; so do we, to answer callers instead of dropping.
		n.leaderGuard = n.rn.Status().Commit
		if len(ents) > 0 {
			n.leaderGuard = max(n.leaderGuard, ents[len(ents)-1].Index)
		}
		next.termStart = n.leaderGuard
		n.metrics.isLeader.Set(1)
	} else if ss.RaftState != raft.StateLeader {
		n.metrics.isLeader.Set(0)
		n.appendAcks.reset()
	}
	n.status.Store(&next)
	if ss.RaftState != raft.StateLeader {
		n.confInFlight = 0
	}
	if prev.lead != ss.Lead {
		if prev.lead != raft.None {
			// NB: a proposal in flight to a leader that is gone may be
			// lost or may still commit; nobody can tell until long
			// after. Answering now (Aborted: outcome unknown) beats
			// holding callers until their deadline.
			n.waits.failAll(errLeaderChanged)
		}
		n.metrics.leaderChanges.Inc()
		n.logger.Info("leader changed", "leader", fmt.Sprintf("%x", ss.Lead), "state", ss.RaftState.String())
		n.leaderMu.Lock()
		close(n.leaderCh)
		n.leaderCh = make(chan struct{})
		n.leaderMu.Unlock()
	}
}

// leaderChanged returns a channel closed at the next leader change.
func (n *node) leaderChanged() <-chan struct{} {
	n.leaderMu.Lock()
	defer n.leaderMu.Unlock()
	return n.leaderCh
}

// restoreSnapshot brings the state machine to a snapshot from the leader,
// once the log writer has persisted it.
func (n *node) restoreSnapshot(snap raftpb.Snapshot) error {
	if err := n.store.Restore(bytes.NewReader(snap.Data)); err != nil {
		return fmt.Errorf("restore snapshot at index %d: %w", snap.Metadata.Index, err)
	}
	n.confState = snap.Metadata.ConfState
	n.snapIndex = snap.Metadata.Index
	n.appliedIndex, n.appliedTerm = snap.Metadata.Index, snap.Metadata.Term
	n.hub.Restore(snap.Metadata.Index)
	for _, mem := range n.store.Members() {
		if err := n.transport.setPeer(mem.Id, mem.PeerAddr); err != nil {
			return err
		}
	}
	n.applied.advance(n.appliedIndex)
	n.metrics.appliedIndex.Set(float64(n.appliedIndex))
	n.logger.Info("installed snapshot from leader", "index", snap.Metadata.Index, "bytes", len(snap.Data))
	return nil
}

func (n *node) apply(ents []raftpb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	start := time.Now()
	for _, e := range ents {
		if e.Index <= n.appliedIndex {
			continue
		}
		var err error
		var events []store.Event
		switch e.Type {
		case raftpb.EntryNormal:
			events = n.applyNormal(e)
		case raftpb.EntryConfChange:
			var cc raftpb.ConfChange
			if err = cc.Unmarshal(e.Data); err == nil {
				err = n.applyConfChange(e.Index, cc.AsV2())
			}
		case raftpb.EntryConfChangeV2:
			var cc raftpb.ConfChangeV2
			if err = cc.Unmarshal(e.Data); err == nil {
				err = n.applyConfChange(e.Index, cc)
			}
		}
		if err != nil {
			return fmt.Errorf("apply entry %d: %w", e.Index, err)
		}
		// Every index is published, changes or not, so watchers' progress
		// follows the applied index. Publish never waits on a watcher.
		n.hub.Publish(e.Index, toWatchEvents(events))
		n.sendReplies()
		n.appliedIndex, n.appliedTerm = e.Index, e.Term
	}
	n.applied.advance(n.appliedIndex)
	n.metrics.appliedIndex.Set(float64(n.appliedIndex))
	n.metrics.applyLatency.Observe(time.Since(start).Seconds())
	return nil
}

func (n *node) applyNormal(e raftpb.Entry) []store.Event {
	if len(e.Data) == 0 {
		n.store.Advance(e.Index)
		return nil
	}
	if len(e.Data) < 8 {
		n.logger.Error("skipping malformed entry", "index", e.Index, "bytes", len(e.Data))
		n.store.Advance(e.Index)
		return nil
	}
	id := binary.BigEndian.Uint64(e.Data)
	var cmd lodestonepb.Command
	if err := proto.Unmarshal(e.Data[8:], &cmd); err != nil {
		// Validation happens before proposing, so this means a newer
		// version wrote the entry; skipping keeps replicas identical.
		n.logger.Error("skipping undecodable entry", "index", e.Index, "err", err)
		n.store.Advance(e.Index)
		n.replyAfterPublish(id, proposalResult{index: e.Index, err: fmt.Errorf("decode command at index %d: %w", e.Index, err)})
		return nil
	}
	if mem := cmd.GetMember(); mem != nil {
		n.applyMemberAttrs(e.Index, mem)
		n.replyAfterPublish(id, proposalResult{index: e.Index})
		return nil
	}
	if pol := cmd.GetAdmission(); pol != nil {
		return n.applyAdmission(e.Index, id, pol, cmd.GetTimeUnixNano())
	}
	res, events := n.store.Apply(e.Index, &cmd)
	n.replyAfterPublish(id, proposalResult{index: e.Index, result: res})
	return events
}

// reply is a proposal's result waiting for its entry to be published.
type reply struct {
	id  uint64
	res proposalResult
}

// replyAfterPublish queues a proposal's result until its entry's events are
// in the watch hub. NB: answering first let a client that saw its write
// acknowledged, and then watched "from now", be sent that same write: the
// hub's "now" was still the index before it.
func (n *node) replyAfterPublish(id uint64, res proposalResult) {
	n.replies = append(n.replies, reply{id, res})
}

// sendReplies answers the proposals of the entry just published.
func (n *node) sendReplies() {
	for _, r := range n.replies {
		n.waits.trigger(r.id, r.res)
	}
	clear(n.replies)
	n.replies = n.replies[:0]
}

// applyMemberAttrs records a member's client addresses; voting rights are
// only ever changed by conf changes.
func (n *node) applyMemberAttrs(index uint64, mem *lodestonepb.Member) {
	for _, cur := range n.store.Members() {
		if cur.Id == mem.Id {
			upd := proto.Clone(cur).(*lodestonepb.Member)
			upd.GrpcAddr, upd.HttpAddr = mem.GrpcAddr, mem.HttpAddr
			n.store.SetMember(index, upd)
			return
		}
	}
	n.store.Advance(index)
}

func (n *node) applyConfChange(index uint64, cc raftpb.ConfChangeV2) error {
	var cctx lodestonepb.ConfChangeContext
	if len(cc.Context) > 0 {
		if err := proto.Unmarshal(cc.Context, &cctx); err != nil {
			return fmt.Errorf("decode conf change context: %w", err)
		}
	}
	n.confState = *n.rn.ApplyConfChange(cc)
	members := map[uint64]*lodestonepb.Member{}
	for _, m := range n.store.Members() {
		members[m.Id] = m
	}
	for _, ch := range cc.Changes {
		switch ch.Type {
		case raftpb.ConfChangeAddNode, raftpb.ConfChangeAddLearnerNode:
			m := members[ch.NodeID]
			if cctx.Member != nil && cctx.Member.Id == ch.NodeID {
				m = proto.Clone(cctx.Member).(*lodestonepb.Member)
			} else if m != nil {
				m = proto.Clone(m).(*lodestonepb.Member)
			} else {
				m = &lodestonepb.Member{Id: ch.NodeID, Name: fmt.Sprintf("%x", ch.NodeID)}
			}
			m.Learner = ch.Type == raftpb.ConfChangeAddLearnerNode
			n.store.SetMember(index, m)
			if err := n.transport.setPeer(m.Id, m.PeerAddr); err != nil {
				n.logger.Warn("connect to new member", "member", m.Name, "err", err)
			}
			n.logger.Info("member added", "member", m.Name, "learner", m.Learner, "index", index)
			if n.snapIndex > 0 {
				// NB: once the log is truncated a new member can only be
				// caught up by snapshot, and its Raft refuses one whose
				// conf state predates it. Without a snapshot taken after
				// this entry it would wait for the next periodic one.
				n.snapWantedAt = max(n.snapWantedAt, index)
			}
		case raftpb.ConfChangeRemoveNode:
			n.store.RemoveMember(index, ch.NodeID)
			n.transport.removePeer(ch.NodeID)
			n.appendAcks.forget(ch.NodeID)
			n.logger.Info("member removed", "member", fmt.Sprintf("%x", ch.NodeID), "index", index)
			if ch.NodeID == n.id {
				n.markRemoved()
			}
		}
	}
	n.store.Advance(index)
	if cctx.RequestId != 0 {
		if cctx.RequestId == n.confInFlight {
			n.confInFlight = 0
		}
		n.replyAfterPublish(cctx.RequestId, proposalResult{index: index})
	}
	return nil
}

// maybeSnapshot starts a snapshot once enough entries were applied since
// the last one. The store view is taken here, in apply order; encoding,
// writing the file and truncating the log happen on another goroutine so
// writes go on meanwhile.
func (n *node) maybeSnapshot() {
	// NB: the log refuses a snapshot above the commit index it holds
	// (raftlog.ErrNotCommitted), and the hard state that committed an
	// applied entry may still be queued for the log writer.
	if !n.snapshotDue() || n.durableCommit < n.appliedIndex {
		return
	}
	n.snapshotting = true
	sn := n.store.Snapshot()
	cs := n.confState
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		res := n.writeSnapshot(sn, cs)
		select {
		case n.snapDoneC <- res:
		case <-n.stopC:
		}
	}()
}

// snapshotDue reports whether a snapshot should start once the log holds
// the commit index of everything applied.
func (n *node) snapshotDue() bool {
	return !n.snapshotting && (n.appliedIndex-n.snapIndex >= n.cfg.SnapshotEntries || n.snapWantedAt > n.snapIndex)
}

func (n *node) writeSnapshot(sn *store.Snapshot, cs raftpb.ConfState) snapResult {
	start := time.Now()
	var buf bytes.Buffer
	// NB: sized from the last snapshot (+1/8 for growth): growing a buffer
	// of many megabytes by doubling copied and zeroed it over and over,
	// about half of a snapshot's CPU.
	if last := n.lastSnapBytes.Load(); last > 0 {
		buf.Grow(int(last + last/8))
	}
	if _, err := sn.WriteTo(yieldingWriter{&buf}); err != nil {
		return snapResult{index: sn.Index(), err: fmt.Errorf("encode snapshot: %w", err)}
	}
	if _, err := n.log.CreateSnapshot(sn.Index(), &cs, buf.Bytes()); err != nil {
		if errors.Is(err, raft.ErrSnapOutOfDate) {
			// A snapshot from the leader overtook this one.
			return snapResult{index: sn.Index(), err: nil, stale: true}
		}
		return snapResult{index: sn.Index(), err: fmt.Errorf("save snapshot: %w", err)}
	}
	if sn.Index() > n.cfg.CatchUpEntries {
		to := sn.Index() - n.cfg.CatchUpEntries
		if err := compactInSteps(n.log, to, func() bool { return n.pause(compactPause) }); err != nil {
			return snapResult{index: sn.Index(), err: fmt.Errorf("compact log to %d: %w", to, err)}
		}
	}
	n.lastSnapBytes.Store(int64(buf.Len()))
	n.logger.Info("snapshot saved", "index", sn.Index(), "bytes", buf.Len(), "took", time.Since(start))
	return snapResult{index: sn.Index()}
}

// A snapshot's log compaction deletes compactStep entries at a time,
// compactPause apart. Every member snapshots at about the same index;
// compacting 95,000 entries at once took about 40 ms of CPU on each, and
// on a shared core the three bursts stalled every write for 200-300 ms.
// Paced, a step (about 0.5 ms of CPU, one bbolt transaction) comes every
// 20 ms and the compaction takes about 2 s, which nothing waits for.
const (
	compactStep  = 1024
	compactPause = 20 * time.Millisecond
)

// compactInSteps compacts l up to index compactStep entries at a time,
// calling pause between two steps; it stops early, with no error, when
// pause reports false (the node is stopping).
func compactInSteps(l *raftlog.Log, index uint64, pause func() bool) error {
	for {
		first, err := l.FirstIndex()
		if err != nil {
			return err
		}
		if first > index {
			return nil // NB: compacted meanwhile (a snapshot from the leader)
		}
		step := min(index, first-1+compactStep)
		if err := l.Compact(step); err != nil && !errors.Is(err, raft.ErrCompacted) {
			return err
		}
		if step == index || !pause() {
			return nil
		}
	}
}

// pause waits d, or until the node stops (false).
func (n *node) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-n.stopC:
		return false
	}
}

// yieldingWriter lets other goroutines run after each write to w. A
// snapshot encodes into memory with no system call to give up the
// processor at: on a server with one processor, encoding 10,000 keys held
// it for 7 ms, every write in flight waiting. The encoder writes 64 KiB at
// a time, so this bounds that to a fraction of a millisecond.
type yieldingWriter struct{ w io.Writer }

func (y yieldingWriter) Write(p []byte) (int, error) {
	n, err := y.w.Write(p)
	runtime.Gosched()
	return n, err
}

func (n *node) saveSnapshot(s snapResult) {
	n.snapshotting = false
	if s.err != nil {
		n.logger.Error("snapshot failed", "index", s.index, "err", s.err)
		return
	}
	if s.stale {
		return
	}
	n.snapIndex = max(n.snapIndex, s.index)
	n.metrics.snapshots.Inc()
	n.metrics.snapshotIndex.Set(float64(n.snapIndex))
}

// --- linearizable reads -------------------------------------------------

func (n *node) startRead(first chan readResult) {
	b := &readBatch{waiters: []chan readResult{first}, started: time.Now()}
	for len(b.waiters) < 4096 {
		select {
		case r := <-n.readC:
			b.waiters = append(b.waiters, r)
			continue
		default:
		}
		break
	}
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

func (n *node) finishRead(rs raft.ReadState) {
	if len(rs.RequestCtx) != 16 || binary.BigEndian.Uint64(rs.RequestCtx) != n.id {
		return
	}
	seq := binary.BigEndian.Uint64(rs.RequestCtx[8:])
	b, ok := n.pendingReads[seq]
	if !ok {
		return
	}
	delete(n.pendingReads, seq)
	for _, w := range b.waiters {
		w <- readResult{index: rs.Index}
	}
}

// expireReads fails read batches that got no answer within an election
// timeout: the leader is gone or unreachable, and a read is safe to retry.
func (n *node) expireReads() {
	limit := n.electionTimeout()
	keep := n.pendingReadOrd[:0]
	for _, seq := range n.pendingReadOrd {
		b, ok := n.pendingReads[seq]
		if !ok {
			continue
		}
		if time.Since(b.started) > limit {
			delete(n.pendingReads, seq)
			for _, w := range b.waiters {
				w <- readResult{err: errReadTimeout}
			}
			continue
		}
		keep = append(keep, seq)
	}
	n.pendingReadOrd = keep
}

func (n *node) failReads(err error) {
	for seq, b := range n.pendingReads {
		for _, w := range b.waiters {
			w <- readResult{err: err}
		}
		delete(n.pendingReads, seq)
	}
	n.pendingReadOrd = nil
}

// readIndex returns an index that a linearizable read must wait for:
// confirmed by a quorum, then applied locally.
func (n *node) readIndex(ctx context.Context) (uint64, error) {
	if n.status.Load().lead == raft.None {
		return 0, errNoLeader
	}
	start := time.Now()
	ch := make(chan readResult, 1)
	select {
	case n.readC <- ch:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-n.doneC:
		return 0, n.stoppedErr()
	}
	var res readResult
	select {
	case res = <-ch:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-n.doneC:
		return 0, n.stoppedErr()
	}
	if res.err != nil {
		return 0, res.err
	}
	if err := n.waitApplied(ctx, res.index); err != nil {
		return 0, err
	}
	n.metrics.readIndexLatency.Observe(time.Since(start).Seconds())
	return res.index, nil
}

// leaderRead is Consul's default consistency mode: on a leader that has
// committed an entry of its own term it waits only for its own commit
// index to be applied, with no quorum round; a follower waits for the
// leader's commit index as of some time after began, when the read
// began, which it asks for unless it asked since (leaderindex.go);
// elsewhere, or when the leader cannot answer, it is readIndex.
// NB: such a read is stale only on a leader cut off from the quorum that
// has not yet noticed, which with CheckQuorum is at most an election
// timeout: Consul's default mode makes the same trade for the same cost
// (no round per read), and ?consistent still pays for the round.
func (n *node) leaderRead(ctx context.Context, began time.Time) error {
	st := n.status.Load()
	switch {
	case st.state == raft.StateLeader && st.commit >= st.termStart:
		n.metrics.leaderReads.Inc()
		return n.waitApplied(ctx, st.commit)
	case st.state != raft.StateLeader && st.lead != raft.None:
		index, err := n.leaderIdx.index(ctx, began)
		if err == nil {
			n.metrics.followerLeaderReads.Inc()
			return n.waitApplied(ctx, index)
		}
		if ctx.Err() != nil {
			return err
		}
		// The leader could not answer (it changed, or is not reachable
		// from here): a quorum round settles the read instead.
		n.logger.Debug("leader index call failed; reading through ReadIndex", "err", err)
	}
	_, err := n.readIndex(ctx)
	return err
}

// electionTimeout is how long followers wait without hearing a leader.
func (n *node) electionTimeout() time.Duration {
	return time.Duration(n.cfg.ElectionTicks) * n.cfg.TickInterval
}

func (n *node) waitApplied(ctx context.Context, index uint64) error {
	select {
	case <-n.applied.wait(index):
		if n.applied.current() < index {
			return n.stoppedErr()
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (n *node) stoppedErr() error {
	if p := n.fatal.Load(); p != nil {
		return fmt.Errorf("%w: %v", errStopped, *p)
	}
	return errStopped
}

// --- proposals --------------------------------------------------------------

// proposeCommand replicates cmd and returns its result once applied here.
func (n *node) proposeCommand(ctx context.Context, cmd *lodestonepb.Command) (proposalResult, error) {
	body, err := proto.Marshal(cmd)
	if err != nil {
		return proposalResult{}, fmt.Errorf("encode command: %w", err)
	}
	id := n.nextID.Add(1)
	data := make([]byte, 8+len(body))
	binary.BigEndian.PutUint64(data, id)
	copy(data[8:], body)
	return n.proposeAndWait(ctx, id, func() error {
		select {
		case n.proposeC <- proposal{id: id, data: data}:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-n.doneC:
			return n.stoppedErr()
		}
	})
}

// proposeAndWait registers a waiter for id, runs submit, and waits for the
// apply loop to resolve the id.
func (n *node) proposeAndWait(ctx context.Context, id uint64, submit func() error) (proposalResult, error) {
	start := time.Now()
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
		n.metrics.commitLatency.Observe(time.Since(start).Seconds())
		return r, nil
	case <-ctx.Done():
		n.waits.cancel(id)
		return proposalResult{}, ctx.Err()
	}
}

// --- membership -------------------------------------------------------------

// changeConf proposes a membership change on this node, which must be the
// leader, and waits until it is applied here.
func (n *node) changeConf(ctx context.Context, cc raftpb.ConfChangeV2, member *lodestonepb.Member) (uint64, error) {
	id := n.nextID.Add(1)
	cctx, err := proto.Marshal(&lodestonepb.ConfChangeContext{Member: member, RequestId: id})
	if err != nil {
		return 0, fmt.Errorf("encode conf change context: %w", err)
	}
	cc.Context = cctx
	res, err := n.proposeAndWait(ctx, id, func() error {
		done := make(chan error, 1)
		select {
		case n.confC <- confRequest{cc: cc, id: id, done: done}:
		case <-ctx.Done():
			return ctx.Err()
		case <-n.doneC:
			return n.stoppedErr()
		}
		return <-done
	})
	return res.index, err
}

// proposeConfChange runs in the loop: it checks the change against the
// leader's view of the cluster and proposes it.
func (n *node) proposeConfChange(c confRequest) error {
	if n.status.Load().state != raft.StateLeader {
		return errNotLeader
	}
	if n.appliedIndex < n.leaderGuard {
		return fmt.Errorf("%w: the new leader is still applying its log (at %d of %d)", errBusy, n.appliedIndex, n.leaderGuard)
	}
	if n.confInFlight != 0 {
		return fmt.Errorf("%w: another membership change is in progress", errBusy)
	}
	if err := n.checkConfChange(c.cc); err != nil {
		return err
	}
	if err := n.rn.ProposeConfChange(c.cc); err != nil {
		return errNoLeader
	}
	n.confInFlight = c.id
	return nil
}

func (n *node) checkConfChange(cc raftpb.ConfChangeV2) error {
	st := n.rn.Status()
	voters := st.Config.Voters[0]
	learners := st.Config.Learners
	for _, ch := range cc.Changes {
		_, isVoter := voters[ch.NodeID]
		_, isLearner := learners[ch.NodeID]
		switch ch.Type {
		case raftpb.ConfChangeAddLearnerNode:
			if isVoter || isLearner {
				return fmt.Errorf("%w: member %x is already in the cluster", errInvalidMember, ch.NodeID)
			}
		case raftpb.ConfChangeAddNode:
			if isVoter {
				return fmt.Errorf("%w: member %x is already a voter", errInvalidMember, ch.NodeID)
			}
			if isLearner {
				// Promotion: the learner must have caught up, or the
				// cluster would wait on it for commits.
				leaderMatch := st.Progress[n.id].Match
				if pr, ok := st.Progress[ch.NodeID]; !ok || pr.Match*10 < leaderMatch*9 {
					have := uint64(0)
					if ok {
						have = pr.Match
					}
					return fmt.Errorf("%w: learner %x has %d of %d entries; promote it once it has caught up", errNotReady, ch.NodeID, have, leaderMatch)
				}
			}
		case raftpb.ConfChangeRemoveNode:
			if !isVoter && !isLearner {
				return fmt.Errorf("%w: member %x is not in the cluster", errUnknownMember, ch.NodeID)
			}
			if isVoter {
				remaining, active := 0, 0
				for id := range voters {
					if id == ch.NodeID {
						continue
					}
					remaining++
					if pr, ok := st.Progress[id]; id == n.id || (ok && pr.RecentActive && n.peerActive(id)) {
						active++
					}
				}
				if remaining == 0 {
					return fmt.Errorf("%w: cannot remove the last voter", errQuorum)
				}
				if need := remaining/2 + 1; active < need {
					return fmt.Errorf("%w: removing %x would leave %d of %d remaining voters reachable; a quorum needs %d", errQuorum, ch.NodeID, active, remaining, need)
				}
			}
		}
	}
	return nil
}

// peerActive reports whether a peer answered within a few heartbeats.
// NB: Raft's own RecentActive stays true for up to an election timeout after
// a peer dies, which is too stale to guard a removal with.
func (n *node) peerActive(id uint64) bool {
	if id == n.id {
		return true
	}
	n.heardMu.Lock()
	at, ok := n.heard[id]
	n.heardMu.Unlock()
	window := max(3*time.Duration(n.cfg.HeartbeatTicks)*n.cfg.TickInterval, 100*time.Millisecond)
	return ok && time.Since(at) <= window
}

// transfer asks Raft to move leadership. With to == 0 the leader picks the
// voter with the most of the log.
func (n *node) transfer(t transferRequest) {
	if n.status.Load().state != raft.StateLeader {
		t.done <- transferResult{err: errNotLeader}
		return
	}
	st := n.rn.Status()
	to := t.to
	if to == 0 {
		var best uint64
		for id := range st.Config.Voters[0] {
			if id == n.id {
				continue
			}
			if pr := st.Progress[id]; to == 0 || pr.Match > best {
				to, best = id, pr.Match
			}
		}
		if to == 0 {
			t.done <- transferResult{err: fmt.Errorf("%w: no other voter to transfer leadership to", errInvalidMember)}
			return
		}
	}
	if _, ok := st.Config.Voters[0][to]; !ok {
		t.done <- transferResult{err: fmt.Errorf("%w: member %x is not a voter", errUnknownMember, to)}
		return
	}
	if to == n.id {
		t.done <- transferResult{to: to}
		return
	}
	n.rn.TransferLeader(to)
	t.done <- transferResult{to: to}
}

// transferLeader moves leadership (this node must lead) and waits until the
// target leads.
func (n *node) transferLeader(ctx context.Context, to uint64) (uint64, error) {
	done := make(chan transferResult, 1)
	select {
	case n.transferC <- transferRequest{to: to, done: done}:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-n.doneC:
		return 0, n.stoppedErr()
	}
	res := <-done
	if res.err != nil {
		return 0, res.err
	}
	for {
		changed := n.leaderChanged()
		if n.status.Load().lead == res.to {
			return res.to, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, fmt.Errorf("leadership did not move to %x: %w", res.to, ctx.Err())
		}
	}
}

// raftStatus is a consistent copy of Raft's status, taken in the loop's
// absence of mutation by asking the RawNode through the loop would cost a
// round trip; the published nodeStatus is enough for most callers.
func (n *node) publishedStatus() nodeStatus { return *n.status.Load() }
