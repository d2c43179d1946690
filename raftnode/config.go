package raftnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// Config is what a Node is made of. Log, Store, Hub and Sender are the
// caller's: the Node uses them and closes none of them.
type Config struct {
	ID uint64 // this member's Raft id (member.ID of its name)

	Log    *raftlog.Log // the durable Raft log, opened by the caller
	Store  *store.Store // the state machine every committed entry is applied to
	Hub    *watch.Hub   // told of every applied index and its events
	Sender Sender       // carries messages to the other members

	// InitialCluster is name → peer address of every founding member; a
	// fresh log is bootstrapped from it unless Join is set.
	InitialCluster map[string]string
	Join           bool

	TickInterval   time.Duration
	ElectionTicks  int
	HeartbeatTicks int
	// Ticks drives the Raft clock; nil means a ticker at TickInterval.
	Ticks <-chan time.Time
	// Clock is the time every decision in the loop reads; nil means the
	// wall clock.
	Clock Clock

	SnapshotEntries uint64 // applied entries between two snapshots
	// SnapshotBytes also makes a snapshot due once the entries applied
	// since the last one hold this many bytes and at least as many as
	// that snapshot had (0: entries alone decide; snapshotBytesDue).
	SnapshotBytes     uint64
	CatchUpEntries    uint64 // entries kept behind a snapshot for slow followers
	MaxBatchProposals int    // proposals taken into one Ready at most

	SlowLeader SlowLeaderConfig
	Faults     *Faults // test hooks; nil in production

	// LeaderChangeWait is how long a proposal in flight when the leader
	// changes may wait to learn its outcome (orphans.go): it is answered
	// as soon as this member applies an entry of a later term, applied or
	// ErrLeaderChanged, and ErrLeaderChanged once this passes. Zero
	// answers ErrLeaderChanged at the change.
	LeaderChangeWait time.Duration

	// LeaderIndex asks the leader for its commit index on a follower's
	// default-mode read (LeaderRead); nil makes those reads quorum rounds.
	LeaderIndex func(ctx context.Context, leader, term uint64, timeout time.Duration) (uint64, error)

	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Sender carries Raft messages to other members. Send must not block: a
// message it cannot queue is dropped, and the transport reports the peer
// unreachable (ReportUnreachable), as Raft expects of a lossy network.
type Sender interface {
	Send(m raftpb.Message)
	// SendSnapshot streams m, a MsgSnap whose Snapshot carries metadata
	// only, with the snapshot's size bytes of data read from data, which
	// it closes. It must not block; it reports how the send ended through
	// Node.ReportSnapshot. Every MsgSnap leaves this way, never by Send.
	SendSnapshot(m raftpb.Message, data io.ReadCloser, size int64)
	// SetPeer adds a member or changes its address; RemovePeer forgets it.
	SetPeer(id uint64, addr string) error
	RemovePeer(id uint64)
	// SetLearners says which members are learners: in no quorum, so what
	// goes to them may wait to go out together. Called at start and after
	// every change of the configuration.
	SetLearners(ids []uint64)
}

// Clock is the loop's view of time.
type Clock interface {
	Now() time.Time
	// After fires once d has passed.
	After(d time.Duration) <-chan time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time                         { return time.Now() }
func (wallClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

func (c *Config) validate() error {
	switch {
	case c.ID == 0:
		return errors.New("raftnode: ID must not be 0")
	case c.Log == nil || c.Store == nil || c.Hub == nil || c.Sender == nil:
		return errors.New("raftnode: Log, Store, Hub and Sender are required")
	case c.ElectionTicks <= c.HeartbeatTicks || c.HeartbeatTicks <= 0:
		return fmt.Errorf("raftnode: election ticks %d must exceed heartbeat ticks %d > 0", c.ElectionTicks, c.HeartbeatTicks)
	case c.Ticks == nil && c.TickInterval <= 0:
		return fmt.Errorf("raftnode: tick interval %v must be positive", c.TickInterval)
	}
	if c.Clock == nil {
		c.Clock = wallClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	c.MaxBatchProposals = max(c.MaxBatchProposals, 1)
	c.SnapshotEntries = max(c.SnapshotEntries, 1)
	return nil
}

// Conditions a Node reports. Every one but ErrLeaderChanged means the
// request was not applied and may be retried.
var (
	ErrNoLeader      = errors.New("no leader is elected right now; the request was not applied, retry in a moment")
	ErrNotLeader     = errors.New("this node is not the leader")
	ErrBusy          = errors.New("the cluster is busy")
	ErrInvalidMember = errors.New("invalid membership change")
	ErrUnknownMember = errors.New("unknown member")
	ErrQuorum        = errors.New("refused: quorum would be lost")
	ErrNotReady      = errors.New("member not ready")
	ErrReadTimeout   = errors.New("the leader did not confirm the read within an election timeout; nothing was read, retry")
	ErrLeaderChanged = errors.New("the leader changed while the request was in flight; it may or may not have been applied (read before retrying)")
	ErrStopped       = errors.New("raft node stopped")
)

// StateLeader is the Status.State of a leader, so that callers need not
// import raft to ask.
const StateLeader = raft.StateLeader
