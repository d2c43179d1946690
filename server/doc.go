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
// requests, membership and transfer requests, transport reports. Each
// iteration takes one input, drains what else is queued of the same kind
// (so concurrent writers share a Ready: group commit), then handles the
// Ready in this order:
//
//  1. A leader sends its messages first; it may append to followers while
//     its own fsync runs (Raft thesis §10.2.1).
//  2. Save the entries and hard state: one bbolt transaction, one fsync.
//  3. Install an incoming snapshot, if any.
//  4. A follower sends its messages now, after they are durable.
//  5. Apply committed entries to the store, in order, and wake waiters.
//  6. Answer read-index requests, then Advance.
//
// # Requests
//
// Writes are proposed on whichever node receives them; Raft forwards a
// follower's proposal to the leader, and the proposer answers once it has
// applied the entry itself, so a caller reading from the same node sees its
// write. Linearizable reads use ReadIndex, batched per loop iteration, then
// wait for the local apply. Stale reads are served at once.
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
//
// Session TTLs are the leader's job: while this node leads, one goroutine
// (runSessionTTL) sleeps until the earliest TTL deadline the store
// reports, wakes early for session events, and proposes SessionInvalidate
// with the time it judged expiry at; the store re-checks that time against
// renewals committed first. A new leader re-arms from the moment it saw
// its own election, so every session gets a full TTL × 2 after a leader
// change (erring long). The goroutine stops on Close.
package server
