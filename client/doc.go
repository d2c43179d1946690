// Package client is the Go client for Lodestone's native gRPC API: the KV
// service (Get, Range, Put, Delete, Txn; GetMany carries coalesced Gets,
// see "Coalesced Gets"), the Cluster service (Members, AddMember,
// RemoveMember, PromoteMember, TransferLeader, Status) and the Watch
// service (Client.Watch, see "Watches").
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
//     A connection that could not be made is dialed again only after
//     [Config.ReconnectBase] (growing to [Config.ReconnectMax] while it
//     keeps failing); until then calls find that endpoint failed and go on
//     to the next one, so a fleet whose server went down does not redial
//     it every round. Nor is it redialed in the background: only when a
//     call or watch picks that endpoint again, so a fleet back from an
//     outage connects where it sends, not to every server it tried.
//     An admission refusal (ResourceExhausted with a RetryInfo) ends the
//     round: the server booked the call a slot, so the call waits the hint
//     (and at least the backoff) and goes back to that server alone. A
//     watch stream refused so resumes the same way.
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
// # Coalesced Gets
//
// A Get (without [WaitIndex]) that finds another Get of its consistency in
// flight on the same Client waits for it, and the Gets that waited go
// together as one GetMany batch of at most [Config.GetBatch] keys: one
// leadership check for all of them, which lets a busy process read
// several times as fast from the same servers. Batches travel as messages
// on a GetStream the Client keeps open per connection and consistency
// (a server without one gets GetMany calls instead). A lone Get waits
// for nothing. Each Get keeps its own answer and error: a key the batch
// did not serve is asked for alone, an error the batch got is returned to
// each Get under its own name, and a Get whose ctx ends while it waits
// returns at once. A Get whose ctx carries outgoing gRPC metadata (a
// token of its own, say) always goes alone. A server without GetMany
// turns coalescing off for the Client.
//
// # Watches
//
// [Client.Watch] follows a key or a prefix (or, with
// [WatchCatalogServices], the catalog's service instances with their
// health; decode with [DecodeServiceInstanceEvent]). Every Watch of a Client shares
// one gRPC Watch stream to one server, so a process with 10k watches holds
// one stream, not 10k. Any member serves watches; by default the stream
// goes to a follower ([Config.WatchFrom]), keeping the fan-out off the
// leader that every write goes through, and leaves a follower that
// becomes the leader. The contract:
//
//  1. A watch delivers every matching event with index > its start index
//     ([FromIndex]; without it, the index at which the server created the
//     watch), exactly once, in index order, each index whole in one
//     [WatchBatch]. A batch's Index says every matching event up to it
//     has been returned; [Watch.Index] is the last one.
//  2. When the stream breaks (the server dies, restarts, is partitioned,
//     loses leadership, or closes it), the client opens a stream to the
//     next endpoint and recreates every watch with start_index = the
//     highest index it had queued (an event's, or one the server reported
//     in a created, progress or resync answer). Any member can serve it,
//     because indices are Raft indices, the same on every member; a member
//     that is behind holds the watch until it catches up. Events at or
//     below that index that a server sends again are dropped, so a resume
//     never duplicates. Endpoints are tried as for calls, with the same
//     backoff after a full round of failures; a watch retries until its
//     ctx ends, unless [WatchGiveUpAfter] bounds it.
//  3. When a stream has been silent for [Config.WatchProgressInterval],
//     the client probes its server with a Status call on the same
//     connection. No answer within another interval (a dead server that
//     sent no TCP reset), or an answer naming no leader (a member cut off
//     from the cluster, whose watches would silently stall), abandons the
//     stream as in 2. So does a running watch that the server cancels
//     without a resume index (a server shutting down).
//  4. When the server cuts a watch loose (resync_index: it fell behind),
//     the client recreates it from resync_index on the same stream: no
//     gap, nothing for the caller to do.
//  5. When the resume index is older than the server's retained history
//     (compacted_index), the watch ends with [ErrCompacted] after the
//     batches queued before it. The caller must reload: Range (or Get),
//     then Watch with FromIndex(the read's Header.Index).
//  6. A consumer that does not keep up never slows the other watches of
//     the stream: once [WatchBuffer] events are queued, the client cancels
//     the watch on the stream and recreates it from its last queued index
//     when Next has drained half of them (5 applies if that index was
//     compacted meanwhile).
//  7. A watch without [FromIndex] has no position until the server's
//     created answer (or first event or progress) arrives; a break before
//     that resumes "from now" again, so events in between may be missed.
//     Callers that must not miss anything read first and pass FromIndex.
//
// A watch ends with: the error of its ctx; an error matching [ErrClosed]
// after [Watch.Close] or [Client.Close]; [ErrCompacted];
// [ErrWatchCanceled] when the server canceled it for another reason;
// [ErrInvalidArgument] for a request every server refuses (an empty key
// without [WatchPrefix]), or an [*Error] with the stream's code when the
// server refuses the Watch service itself (e.g. Unimplemented);
// [ErrUnavailable] when [WatchGiveUpAfter] expired.
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
