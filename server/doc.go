// Package server runs one Lodestone registry node: a Raft member that
// stores the replicated state machine and serves it over gRPC and HTTP.
//
// # What it owns
//
// The node lifecycle: the Raft loop, the peer transport, applying committed
// entries to the store, snapshots and log truncation, membership changes,
// leader transfer, and the client-facing gRPC services (KV, Cluster) and
// HTTP endpoints (/metrics, /healthz, /readyz), and the operator's tools
// for a bad day: the Admin service (consistent snapshots, admission
// control replicated through Raft: admission.go) and the slow-leader
// step-down (slowleader.go). It knows how to persist
// through raftlog and how to apply through store; it knows nothing of their
// internals.
//
// # The Raft loop
//
// Exactly one goroutine (node.run) touches the raft.RawNode. Everything
// else reaches it through channels: proposals, received messages, read
// requests, membership and transfer requests, transport reports, finished
// log writes. Each iteration takes one input, drains what else is queued of
// the same kind, then handles every Ready raft has. Raft runs with
// AsyncStorageWrites, so a Ready is all messages:
//
//  1. Messages to other members leave at once, each peer's on a framed
//     TCP stream of its own (raftstream.go; snapshots go over gRPC, and
//     the peer port serves both: peermux.go). Raft itself holds back
//     whatever needs the local write first (a follower's acknowledgements,
//     votes, the leader's count of itself) as responses to that write, so
//     the leader appends to followers while its own fsync runs (Raft thesis
//     §10.2.1). One kind may wait: the entry-less append that tells a
//     follower of a new commit waits up to Config.CommitNoticeHold for the
//     next append to that follower, which carries the same news, and is
//     then dropped (transport.go). Under single writes that halves the Raft
//     messages per write; followers learn of a commit that much later.
//  2. The append (entries, hard state, snapshot) goes to the log writer
//     (logwriter.go), one goroutine that takes every append queued while it
//     was busy and persists them in one bbolt transaction (group commit).
//     When it is durable it sends the responses meant for other members and
//     hands the rest back to the loop, which restores the store from a
//     snapshot it carried and steps them.
//  3. Committed entries are applied to the store in the loop, in order,
//     waking waiters: those raft hands out (committed and durable here),
//     then those committed by a quorum while this node's own write of them
//     is still running (earlyapply.go), so a slow local fsync delays
//     neither a leader's answers nor a follower's watch events.
//  4. Read-index answers are matched to their waiting reads.
//
// So the loop keeps taking proposals and acknowledgements during an fsync,
// and the next write carries all of them.
//
// # Requests
//
// Writes are proposed on whichever node receives them; Raft forwards a
// follower's proposal to the leader, and the proposer answers once it has
// applied the entry itself, so a caller reading from the same node sees its
// write. Linearizable reads use ReadIndex, batched per loop iteration, then
// wait for the local apply. Stale reads are served at once. Consul's
// default-mode reads on a follower wait for the leader's commit index,
// asked for with one question per batch of them on a stream each
// follower keeps to the leader (Peer.LeaderIndexStream, leaderindex.go).
//
// Unavailable always means the request was not applied and may be retried;
// DeadlineExceeded after a write leaves its outcome unknown.
//
// # Catalog and sessions
//
// The Catalog and Session gRPC services and the Consul-compatible HTTP API
// (server/consulapi) write through applyChecked, which does the store's
// proposer duties (store/doc.go): stamp the command with this node's
// clock, give a new session a fresh UUID, validate, propose, and turn a
// rejection into FailedPrecondition (HTTP: Consul's codes). Blocking reads
// wait on the watch hub for the events of exactly what they read and
// re-check the store's index for it on every wake-up (consulapi.Block).
// On HTTP/1.1 the wait holds no goroutine: the request is parked
// (server/httppark) as a hub watcher and a timer on its hijacked
// connection, and run again to answer once it changed or timed out; the
// lot then reads the connection's next blocking query itself and hands
// anything else back to the http.Server. --no-parking turns that off.
//
// # Watch streams
//
// One goroutine per Watch stream sends everything: the hub puts the
// stream's watchers that have something on the stream's Ready list, and
// the goroutine drains them at the next point of a process-wide grid
// (Config.WatchDeliveryInterval, --watch-delivery-interval, 5 ms by
// default), so a stream sends at most one message per interval and the
// streams of a connection hand gRPC's writer their messages together. A
// stream that sent less than --watch-busy-delivery-interval (20 ms) ago
// waits for that coarser grid instead: one fed by every write sends a
// message per 20 ms, while one that sends now and then keeps 5 ms. A
// stream whose client set WatchCreate.grouped gets one response per round
// with a group per woken watch; others get one response per watch and
// batch.
//
// Session TTLs are the leader's job: while this node leads, one goroutine
// (runSessionTTL) sleeps until the earliest TTL deadline the store
// reports, wakes early for session events, and proposes SessionInvalidate
// with the time it judged expiry at; the store re-checks that time against
// renewals committed first. A new leader re-arms from the moment it saw
// its own election, so every session gets a full TTL × 2 after a leader
// change (erring long). The goroutine stops on Close.
package server
