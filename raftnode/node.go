package raftnode

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/member"
	"github.com/lodestone-kv/lodestone/raftlog"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// Node owns one raft.RawNode and drives it from a single goroutine (run).
// Every other goroutine talks to it through channels; the state it
// publishes for them (status, applied index) is read through atomics and
// the appliedWait.
//
// Entry payload layout for normal entries:
//
//	[8 bytes big-endian request id][marshaled lodestonepb.Command]
//
// An empty payload is Raft's own no-op on leader election.
type Node struct {
	id      uint64
	cfg     Config
	logger  *slog.Logger
	metrics *metrics
	clock   Clock

	rn         *raft.RawNode // touched only by the loop
	appendAcks *appendAcks   // touched only by the loop
	log        *raftlog.Log
	store      *store.Store
	hub        *watch.Hub
	sender     Sender

	waits   waitRegistry
	applied appliedWait
	nextID  atomic.Uint64

	proposeC  chan proposal
	recvC     chan raftpb.Message
	readC     chan struct{} // a read opened a round (read.go)
	reportC   chan report
	confC     chan confRequest
	transferC chan transferRequest
	snapDoneC chan snapResult
	liveSnapC chan chan LiveSnapshot // operator snapshots (snapshot.go)
	appendQ   *appendQueue           // loop → log writer (logwriter.go)
	// appendDoneC carries finished log writes back to the loop.
	appendDoneC chan appendDone
	stopC       chan struct{}
	doneC       chan struct{}
	stopOnce    sync.Once
	started     atomic.Bool    // Start launched the loop
	wg          sync.WaitGroup // snapshot encoders and the log writer
	// startSnapshot runs a snapshot's encoding and write off the loop
	// (a goroutine); the deterministic tests run it when they choose.
	startSnapshot func(job func() snapResult)

	// removedC is closed when this member is removed from the cluster.
	removedC    chan struct{}
	removedOnce sync.Once
	// fatal holds the error that stopped the loop, if any.
	fatal atomic.Pointer[error]

	status atomic.Pointer[Status]
	// lastSnapBytes is the size of the last snapshot this node encoded
	// or restored at start.
	lastSnapBytes atomic.Int64
	// appliedBytes counts the entry bytes applied since start, and
	// snapAppliedBytes what it was when the newest snapshot was taken
	// (snapshotBytesDue). Loop only.
	appliedBytes, snapAppliedBytes uint64

	// readNext is the round linearizable reads join; the loop sends it
	// (read.go).
	readMu   sync.Mutex
	readNext *readRound
	// yield gives up the processor once between waking a confirmed
	// round's reads and sending the next round (read.go); tests stand in
	// for the goroutines it lets run.
	yield func()

	heardMu sync.Mutex
	heard   map[uint64]time.Time // when each peer last sent us anything

	leaderMu sync.Mutex
	leaderCh chan struct{} // closed and replaced on every leader change

	// The leader's view of its learners (membership.go): published by the
	// loop, learnersCh closed and replaced at each change.
	learners       atomic.Pointer[Learners]
	learnersMu     sync.Mutex
	learnersCh     chan struct{}
	learnerScratch []LearnerProgress // loop-owned

	// Loop-owned state.
	confState      raftpb.ConfState
	appliedIndex   uint64
	appliedTerm    uint64 // the term of the entry at appliedIndex, which the log may not hold yet (earlyapply.go)
	snapIndex      uint64
	released       uint64 // the log was told its entries up to here are not needed (releaseLog)
	durableCommit  uint64 // the commit index the log holds (log writer reports)
	startCommit    uint64 // the commit index the log held at start
	snapshotting   bool
	snapWantedAt   uint64           // a snapshot at or after this index is due now (a member was added)
	leaderGuard    uint64           // conf changes wait until this index is applied
	confInFlight   uint64           // request id of our pending conf change, 0 if none
	replies        []reply          // results of the entry being applied, sent once it is published
	applies        []raftpb.Message // handleReady's MsgStorageApply messages, reused
	pending        pendingEntries   // appended, not yet applied (earlyapply.go)
	readSeq        uint64
	pendingReads   map[uint64]*readRound
	pendingReadOrd []uint64
	readRounds     int          // rounds in flight in readTerm
	confirmed      []*readRound // rounds answerReads wakes (read.go)
	readTerm       uint64
	slow           *slowLeader   // slowleader.go
	soloDone       bool          // campaignAlone has campaigned, or need not (solo.go)
	restarted      bool          // started from a log or snapshot it had (advanceElection)
	orphans        []orphanBatch // proposals in flight at a leader change (orphans.go)

	leaderIdx *leaderIndexer // a follower's default-mode reads (leaderindex.go)
}

// Status is what a Node publishes of its Raft state.
type Status struct {
	Lead   uint64
	Term   uint64
	Commit uint64
	State  raft.StateType
	// TermStart is, on a leader, the index of its election entry: once
	// Commit reaches it the leader holds every committed entry.
	TermStart uint64
}

// New restores the newest snapshot in cfg.Log into cfg.Store and prepares
// the Raft state; Start runs it. A fresh log is bootstrapped from
// cfg.InitialCluster unless cfg.Join is set.
func New(cfg Config) (*Node, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	n := &Node{
		id:           cfg.ID,
		cfg:          cfg,
		logger:       cfg.Logger,
		metrics:      newMetrics(cfg.Registerer),
		clock:        cfg.Clock,
		log:          cfg.Log,
		store:        cfg.Store,
		hub:          cfg.Hub,
		sender:       cfg.Sender,
		proposeC:     make(chan proposal, 4096),
		recvC:        make(chan raftpb.Message, 4096),
		readC:        make(chan struct{}, 1),
		reportC:      make(chan report, 1024),
		confC:        make(chan confRequest),
		transferC:    make(chan transferRequest),
		snapDoneC:    make(chan snapResult, 1),
		liveSnapC:    make(chan chan LiveSnapshot),
		appendQ:      newAppendQueue(),
		appendDoneC:  make(chan appendDone),
		stopC:        make(chan struct{}),
		doneC:        make(chan struct{}),
		removedC:     make(chan struct{}),
		leaderCh:     make(chan struct{}),
		pendingReads: map[uint64]*readRound{},
		heard:        map[uint64]time.Time{},
	}
	n.startSnapshot = n.goSnapshot
	n.yield = runtime.Gosched
	n.nextID.Store(uint64(n.clock.Now().UnixNano()))
	n.status.Store(&Status{})
	n.slow = newSlowLeader(cfg.SlowLeader, cfg.Registerer)
	n.leaderIdx = newLeaderIndexer(n.askLeaderIndex, n.clock)
	n.appendAcks = newAppendAcks(observeByPeer(n.metrics.peerAppendAck))
	if err := n.init(); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *Node) init() error {
	meta, size, err := n.restoreFromLog()
	if err != nil {
		return err
	}
	if meta.Index > 0 {
		n.snapIndex = meta.Index
		n.lastSnapBytes.Store(size)
		n.appliedIndex, n.appliedTerm = meta.Index, meta.Term
		n.confState = meta.ConfState
		n.sender.SetLearners(n.confState.Learners)
		n.hub.Restore(meta.Index)
		n.logger.Info("restored snapshot", "index", meta.Index, "bytes", size)
	}
	hs, _, err := n.log.InitialState()
	if err != nil {
		return fmt.Errorf("read initial state: %w", err)
	}
	last, err := n.log.LastIndex()
	if err != nil {
		return fmt.Errorf("read last index: %w", err)
	}
	fresh := raft.IsEmptyHardState(hs) && last == 0 && meta.Index == 0
	n.durableCommit = max(hs.Commit, n.snapIndex)
	n.startCommit = n.durableCommit

	rc := &raft.Config{
		ID:            n.id,
		ElectionTick:  n.cfg.ElectionTicks,
		HeartbeatTick: n.cfg.HeartbeatTicks,
		Storage:       n.log,
		Applied:       n.appliedIndex,
		MaxSizePerMsg: 1 << 20,
		// NB: a peer's appends stop once this many await its
		// acknowledgement, and so does its commit index, which rides on
		// them. A learner serving blocking queries on a busy machine took
		// over a second to fsync and acknowledge; at 256 appends (a
		// quarter second of single writes) the leader paused it, its
		// reads waited for an apply that had stopped, and woke in
		// thousands when the acknowledgements freed the window. The bytes
		// bound keeps a window this wide from holding gigabytes of large
		// entries in the peer's queue.
		MaxInflightMsgs:  2048,
		MaxInflightBytes: 64 << 20,
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
	n.restarted = !fresh
	n.applied.advance(n.appliedIndex)

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
				Id: member.ID(name), Name: name, PeerAddr: n.cfg.InitialCluster[name],
			}})
			if err != nil {
				return fmt.Errorf("encode bootstrap member %q: %w", name, err)
			}
			peers = append(peers, raft.Peer{ID: member.ID(name), Context: ctx})
		}
		if err := rn.Bootstrap(peers); err != nil {
			return fmt.Errorf("bootstrap cluster: %w", err)
		}
		n.logger.Info("bootstrapped new cluster", "members", member.FormatCluster(n.cfg.InitialCluster))
	}
	return nil
}

// Start tells the Sender of every member known, then launches the Raft
// loop and the log writer.
func (n *Node) Start() error {
	for name, addr := range n.cfg.InitialCluster {
		if err := n.sender.SetPeer(member.ID(name), addr); err != nil {
			return err
		}
	}
	for _, mem := range n.store.Members() {
		if err := n.sender.SetPeer(mem.Id, mem.PeerAddr); err != nil {
			return err
		}
	}
	n.started.Store(true)
	n.wg.Add(1)
	go n.runLogWriter()
	go n.run()
	return nil
}

// Stop ends the loop and waits for everything the node started. Waiting
// callers are answered with ErrStopped. The log stays open: it is the
// caller's.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		close(n.stopC)
		if !n.started.Load() {
			close(n.doneC) // NB: no loop to close it
		}
	})
	<-n.doneC
	n.leaderIdx.close()
	n.wg.Wait()
	n.waits.failAll(ErrStopped)
	n.applied.close()
}

// ID is this member's Raft id.
func (n *Node) ID() uint64 { return n.id }

// Status is the Raft state as last published by the loop.
func (n *Node) Status() Status { return *n.status.Load() }

// Applied is the index applied to the store.
func (n *Node) Applied() uint64 { return n.applied.current() }

// CommittedAtStart is the commit index the log held when the node was
// made: what this member knew committed before it stopped. The loop
// applies up to it from the log alone, without a leader.
func (n *Node) CommittedAtStart() uint64 { return n.startCommit }

// LeaderChanged returns a channel closed at the next leader change.
func (n *Node) LeaderChanged() <-chan struct{} {
	n.leaderMu.Lock()
	defer n.leaderMu.Unlock()
	return n.leaderCh
}

// Done is closed when the loop has stopped, by Stop or by a fatal error
// (Err says which).
func (n *Node) Done() <-chan struct{} { return n.doneC }

// Err is ErrStopped, wrapping the fatal error that stopped the loop if
// there was one.
func (n *Node) Err() error {
	if p := n.fatal.Load(); p != nil {
		return fmt.Errorf("%w: %v", ErrStopped, *p)
	}
	return ErrStopped
}

// Failed reports the fatal error that stopped the loop, or nil.
func (n *Node) Failed() error {
	if p := n.fatal.Load(); p != nil {
		return *p
	}
	return nil
}

// Removed is closed once this member learns it was removed.
func (n *Node) Removed() <-chan struct{} { return n.removedC }

// ElectionTimeout is how long followers wait without hearing a leader.
func (n *Node) ElectionTimeout() time.Duration {
	return time.Duration(n.cfg.ElectionTicks) * n.cfg.TickInterval
}

// LastHeard is when peer last sent this node anything.
func (n *Node) LastHeard(peer uint64) (time.Time, bool) {
	n.heardMu.Lock()
	defer n.heardMu.Unlock()
	at, ok := n.heard[peer]
	return at, ok
}

// PeerActive reports whether a peer answered within a few heartbeats.
// NB: Raft's own RecentActive stays true for up to an election timeout after
// a peer dies, which is too stale to guard a removal with.
func (n *Node) PeerActive(id uint64) bool {
	if id == n.id {
		return true
	}
	at, ok := n.LastHeard(id)
	window := max(3*time.Duration(n.cfg.HeartbeatTicks)*n.cfg.TickInterval, 100*time.Millisecond)
	return ok && n.clock.Now().Sub(at) <= window
}

// --- inputs from the transport ----------------------------------------------

// Step hands a message received from another member to the loop. It
// blocks while the loop is behind, which pushes back on the sender.
func (n *Node) Step(ctx context.Context, m raftpb.Message) error {
	select {
	case n.recvC <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-n.doneC:
		return ErrStopped
	}
}

// report is a transport's news for the RawNode, which only the loop may
// touch.
type report struct {
	to         uint64
	snapshot   bool
	snapStatus raft.SnapshotStatus
}

// ReportUnreachable tells Raft a message to id was lost. It never blocks:
// the report is advisory, and dropping one only delays a probe.
func (n *Node) ReportUnreachable(id uint64) {
	select {
	case n.reportC <- report{to: id}:
	default:
	}
}

// ReportSnapshot tells Raft how sending a snapshot to id ended; Raft
// waits for it before it sends that member anything else.
func (n *Node) ReportSnapshot(id uint64, st raft.SnapshotStatus) {
	select {
	case n.reportC <- report{to: id, snapshot: true, snapStatus: st}:
	case <-n.doneC:
	}
}

// Dropped answers the callers of proposals in a message the transport
// could not send (a follower's MsgProp to its leader): Raft does not resend
// them, and they were not applied, so the callers may retry at once.
func (n *Node) Dropped(m raftpb.Message) {
	if m.Type != raftpb.MsgProp {
		return
	}
	for _, e := range m.Entries {
		if e.Type == raftpb.EntryNormal && len(e.Data) >= 8 {
			n.waits.trigger(binary.BigEndian.Uint64(e.Data), proposalResult{err: ErrNoLeader})
		}
	}
}

// MarkRemoved records that this member was removed. A removed follower
// may never see the commit of its own removal; a peer refusing its
// messages is how it learns.
func (n *Node) MarkRemoved() {
	n.removedOnce.Do(func() { close(n.removedC) })
}
