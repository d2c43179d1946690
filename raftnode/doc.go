// Package raftnode runs one member's Raft loop: it owns a raft.RawNode
// (go.etcd.io/raft/v3), persists through raftlog, applies committed
// entries to the store and tells the watch hub of each applied index.
// It knows nothing of gRPC, HTTP or the client services.
//
// # The face
//
//	New(Config) / Start / Stop      restore the newest snapshot; run; stop
//	Propose(ctx, cmd)               replicate a command, wait until applied here
//	ReadIndex(ctx)                  a linearizable read's index, applied here
//	LeaderRead(ctx, began)          Consul's default mode: the leader's commit index
//	WaitApplied(ctx, index)         wait until this member applied index
//	Status, Applied, LeaderChanged  the published Raft state
//	ChangeConf, TransferLeader      membership and leadership, on the leader
//	Learners, LearnersChanged       a leader's view of its learners' progress
//	LeaderIndex(term)               a leader's answer to a follower's LeaderRead
//	Snapshot(ctx)                   a copy-on-write view for an operator's backup
//	Done, Err, Failed, Removed      how and why the loop ended
//	LastHeard, PeerActive           when each peer was last heard from
//
// A transport calls Step with each message it receives, ReportUnreachable
// and ReportSnapshot with what became of what it sent, Dropped with what
// it could not send, and MarkRemoved when a peer says this member was
// removed. Messages leave through the Sender in Config.
//
// Errors say what a caller may do: every Err* but ErrLeaderChanged and a
// context error means the request was not applied and may be retried. A
// proposal in flight when the leader changes is answered once its fate
// is known (orphans.go, with Config.LeaderChangeWait): applied, or
// ErrNoLeader once an entry of a later term is applied here; only a
// batch still unsettled after LeaderChangeWait gets ErrLeaderChanged.
//
// # Time is an input
//
// The loop reads time only through Config.Clock and ticks only on
// Config.Ticks; its handlers (tick, stepOne, proposeOne, handleReadies,
// appendDone, ...) are ordinary methods that the run loop's select calls.
// The package's tests drive those handlers from one goroutine with a fake
// clock, a scripted network and disks they hold or fail
// (interaction_test.go, testdata/), so the loop's behaviour is tested
// without sockets or sleeps.
//
// # The loop
//
// Exactly one goroutine (run) touches the RawNode. Everything else reaches
// it through channels: proposals, received messages, read requests,
// membership and transfer requests, transport reports, finished log
// writes. Each iteration takes one input, drains what else is queued of
// the same kind, then handles every Ready raft has. Raft runs with
// AsyncStorageWrites, so a Ready is all messages:
//
//  1. Messages to other members leave at once through the Sender. Raft
//     itself holds back whatever needs the local write first (a
//     follower's acknowledgements, votes, the leader's count of itself) as
//     responses to that write, so the leader appends to followers while
//     its own fsync runs (Raft thesis §10.2.1).
//  2. The append (entries, hard state, snapshot) goes to the log writer
//     (logwriter.go), one goroutine that takes every append queued while
//     it was busy and persists them as one raftlog Save: one journal
//     record and one fdatasync (group commit). When it is durable it
//     sends the responses meant for other members and hands the rest back
//     to the loop, which restores the store from a snapshot it carried and
//     steps them.
//  3. Committed entries are applied to the store in the loop, in order:
//     those raft hands out (committed and durable here), then those
//     committed by a quorum while this member's own write of them is still
//     running (earlyapply.go), so a slow local fsync delays neither a
//     leader's answers nor a follower's watch events. A proposer is
//     answered once its entry's events are in the hub.
//  4. Read-index answers are matched to their waiting reads.
//
// So the loop keeps taking proposals and acknowledgements during an
// fsync, and the next write carries all of them.
//
// Entry payload of a normal entry: an 8-byte big-endian request id, then a
// marshaled lodestonepb.Command. An empty payload is Raft's own no-op on
// election. The store applies every command (store.Apply); this package
// applies only what is Raft's: the RawNode's conf state, the Sender's
// peers and the snapshot a new member needs.
//
// # Around the loop
//
//   - Snapshots (snapshot.go): every SnapshotEntries applied entries the
//     store's copy-on-write view is encoded off the loop straight into
//     the log's snapshot file (raftlog.CreateSnapshotFrom), and the log
//     compacted to CatchUpEntries behind it in paced steps. Snapshot data
//     is never whole in memory on the sending side: Start restores the
//     store from a stream of the file, and a MsgSnap raft makes for a
//     lagging follower leaves through Sender.SendSnapshot with a reader
//     of that file (the only way a snapshot is sent). A member added after the newest snapshot makes one due at
//     once, since a truncated log can only catch it up by a snapshot
//     taken after its addition.
//   - Reads (read.go, leaderindex.go): linearizable reads join the next
//     ReadIndex round, one round in flight at a time, and one broadcast
//     answers all of a round's reads; the loop yields once between waking
//     a round's reads and sending the next, so that reads runnable by then
//     join it; a follower's LeaderRead asks the leader for its commit
//     index through Config.LeaderIndex, one question shared by every read
//     that began before it went out.
//   - Membership (membership.go): one change at a time, on the leader,
//     after the leader applied its own election entry; a change of the
//     voters (add, remove, promote) whose new configuration would have no
//     quorum among the members heard from lately is refused (strict
//     reconfiguration check); a learner is promoted only once it holds
//     nine tenths of the leader's log. The leader publishes its learners'
//     progress (Learners, LearnersChanged) after each batch of Readies,
//     when it changed, for the server's automatic promotion.
//   - Slow-leader step-down (slowleader.go): a leader whose log writes
//     stay slower than a threshold for a window hands leadership to the
//     healthiest follower and does not campaign for a cooldown.
//   - Append-ack timing (appendacks.go): the leader times each append to
//     each peer's acknowledgement (lodestone_peer_append_ack_seconds).
//   - A lone voter (solo.go) campaigns as soon as raft has applied what
//     it committed at start, instead of waiting out an election timeout
//     that no other member could end: a one-member cluster leads within
//     a few log writes of Start. A restarted voter of several (solo.go,
//     advanceElection) moves its election clock ElectionTicks-2 ticks
//     ahead once that is applied, as etcd does at boot, so a cluster
//     restarted whole elects within a timeout instead of one to two;
//     PreVote and CheckQuorum keep it from disturbing a live leader.
package raftnode
