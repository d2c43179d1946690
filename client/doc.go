// Package client is the Go client for Lodestone's native gRPC API: the KV
// service (Get, Range, Put, Delete, Txn) and the Cluster service (Members,
// AddMember, RemoveMember, PromoteMember, TransferLeader, Status).
//
// # What it owns
//
// One [Client] holds one lazily dialed gRPC connection per endpoint address,
// an address book of the cluster (member id → gRPC address, learned from
// Members, Status and membership-change answers) and the id of the leader
// as the latest response header reported it. Every call picks an endpoint,
// runs one attempt, and decides from the outcome whether another attempt is
// safe.
//
// # What it refuses to know
//
// Nothing about Raft, the store or the wire between servers. It relies on
// one promise of the server: a server answers a write with Unavailable only
// before it proposed the write, so that answer proves the write was not
// applied. It keeps no cache of values and never reorders writes.
//
// # How a call runs
//
//  1. The caller's ctx bounds the call. If ctx has no deadline the client
//     adds [Config.RequestTimeout]. No call outlives its ctx.
//  2. Endpoints are tried in this order: the leader's gRPC address when the
//     client knows it, then the configured endpoints starting at the one
//     that answered last, then addresses learned from the membership. Any
//     server accepts every request (followers forward writes), so the
//     leader is a preference, never a requirement.
//  3. On a transport failure or an Unavailable answer the call moves to the
//     next endpoint at once. After every endpoint failed once, it backs off
//     (exponential, jittered, [Config.BackoffBase] to [Config.BackoffMax])
//     before the next round, and never sleeps past the ctx deadline: when
//     the backoff would, the call returns the last error instead.
//  4. Reads (Get, Range, Members, Status) retry on any Unavailable answer,
//     any transport failure and a server-side DeadlineExceeded.
//     Writes (Put, Delete, Txn and the membership changes) retry only when
//     the outcome proves the write was not applied: the server answered
//     Unavailable, or the request never left the client (no connection
//     could be established to that endpoint). A write that failed after it
//     was sent — a timeout, a reset stream, a dropped connection — is
//     returned at once with [ErrUnknownOutcome]: it may or may not have been
//     applied, and only the caller can decide how to find out.
//
// # Errors
//
// Every failed call returns an [*Error] that names the operation, the last
// endpoint tried and the server's message, and matches with [errors.Is]
// the sentinel for its gRPC code: [ErrCASFailed], [ErrUnavailable],
// [ErrInvalidArgument], [ErrNotFound], [context.DeadlineExceeded],
// [context.Canceled]; plus [ErrUnknownOutcome] for writes as above.
//
// # Caller's duties
//
//  1. Create one Client per process and share it; it is safe for concurrent
//     use.
//  2. Pass a ctx with the deadline the caller can afford.
//  3. On [ErrUnknownOutcome], read before re-issuing a non-idempotent write
//     (or make the write idempotent with a CAS index).
//  4. Call [Client.Close] when done; it closes every connection. Calls
//     after Close fail with [ErrClosed].
package client
