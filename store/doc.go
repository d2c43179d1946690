// Package store is Lodestone's replicated state machine: the KV table, the
// catalog (nodes, services, checks), sessions and KV locks, the cluster
// membership and the admission policy. It applies every replicated
// command; the server keeps no apply logic of its own.
//
// # What it owns
//
// The in-memory state every replica derives from the committed Raft log: an
// ordered B-tree of KV entries carrying Consul's CreateIndex, ModifyIndex,
// LockIndex, Flags and Session; the catalog and session tables (B-trees
// too); tombstones of deleted keys and lock delays; the max index of every
// table and of every node and service name, for blocking queries; the
// member table with addresses; the admission policy every server enforces
// (its own state, not a key: no KV command can change it); the ACL tables
// (tokens, policies, roles, bootstrap state: acl.go); the applied index;
// and the snapshot encoding of all of it (SNAPSHOT.md).
//
// # What it refuses to know
//
// Raft's machinery, gRPC, the disk, clocks and the watch hub. Of Raft it
// knows only the decoded conf-change data the server hands to
// ApplyConfChange (raftpb.ConfChangeSingle). It starts no goroutines,
// never calls time.Now, does no I/O except on the io.Reader/io.Writer handed
// to Restore and Snapshot.WriteTo and on the value file it is given
// (NewWithValues; New keeps values in memory), and never panics on command
// content. It does panic when the value file fails a read or a write: that
// is a failed disk, and the member stops as it does when its log cannot be
// written (valuefile's doc).
//
// Time enters only as the command's time_unix_nano (the proposing server's
// clock), so Apply stays deterministic; TTL expiry is decided by the leader
// (ExpiredSessions), never by the store.
//
// # Values
//
// The KV values are not on the Go heap: each key's row holds a
// valuefile.Ref, and reads copy the value out of the file. A write frees
// the slots of the values it replaced or deleted once the command is done
// (a transaction undone frees the ones it took instead), and a Snapshot
// pins the file so the slots its frozen tree names are not reused while it
// is encoded: close it once written. RestoreShared leaves a restored
// snapshot's values where they lie in its file instead of copying them.
//
// # Concurrency
//
// One goroutine, the server's apply loop, calls the mutating methods:
// Apply, ApplyConfChange, Advance, SetMember, RemoveMember, Snapshot, Restore and
// RestoreShared. Any number of goroutines call the reads concurrently with it:
// Get, Range, Members, Admission, Index, KVIndex, MembersIndex, Len,
// KVIndexFor, the catalog and session reads and the index getters.
// Admission and the ACL reads (ACLIndex, TokenBySecret, Policy, Role and
// the other ACL accessors) take no lock (one atomic load: they are read on
// every client request); the store implements acl.Source. A sync.RWMutex guards the rest of the state: Apply holds it
// exclusively for one whole command (a transaction, a registration or an
// invalidation is never seen half applied), reads hold it shared. A Range
// holds the read lock while it walks at most its limit of keys, so
// Limits.MaxRangeLimit bounds how long a read can delay Apply; KVIndexFor
// and the catalog reads walk what they answer. Snapshots do not hold the
// lock while encoding: they are copy-on-write clones of the B-trees (see
// Snapshot).
//
// Entries and messages returned by reads, results and events are shared,
// immutable values: callers must not modify them. (KV entries from Get and
// Range are fresh copies, but their key bytes are the store's.)
//
// # Caller's duties, in order
//
//  1. Before proposing, stamp cmd.time_unix_nano with the server's clock
//     (catalog and session commands, a put with acquire and a txn with LOCK
//     need it), fill a new session's id with a fresh UUID (and an ACL
//     create's ids and secret, and a new token's create time), then validate:
//     Limits.ValidateCommand(cmd). Apply does not enforce limits (replicas
//     may be configured differently) and applies anything CheckCommand
//     accepts.
//  2. For each committed entry, in log order, on the apply goroutine:
//     a normal entry with data → Apply(entry.Index, cmd), whatever the
//     command (member and admission commands included); an empty or
//     undecodable entry → Advance(entry.Index); a conf change (after the
//     Raft node's own ApplyConfChange) → ApplyConfChange(entry.Index,
//     changes, context member), then connect to the members it returns as
//     added and drop those it returns as removed.
//  3. Hand Apply's events to the watch hub, then answer the proposer with
//     the result (filling the response header). A result with no Result set
//     means the command was malformed: answer with CheckCommand(cmd) (nil,
//     i.e. success, for member and admission commands, which never set
//     Result). A result with rejected set: answer with ResultError(res).
//     cas_failed and lock_failed are answers ("false"), not errors.
//  4. To snapshot: call Snapshot on the apply goroutine, then WriteTo on any
//     goroutine; record Snapshot.Index() as the Raft snapshot's index.
//  5. On start or when Raft installs a snapshot: Restore (on start,
//     RestoreShared with the snapshot's file), then replay the log entries
//     after its index (replays at or below Index() are no-ops).
//  6. Serve reads at Index(): a linearizable read waits until Index() has
//     reached the ReadIndex, then calls Get/Range or a catalog read; a
//     stale read just calls them. Both report the index they were read at.
//     Admission control reads Admission() per request (or caches against
//     the index it returns).
//  7. On the leader only: propose SessionInvalidate for ExpiredSessions
//     (with ttl_expired_at_unix_nano) and for failed nodes; see below.
//
// # Catalog (Consul semantics)
//
// A registration upserts the node (unless skip_node_update, which needs the
// node to exist), then the service (id defaults to the name, weights to
// {1,1}), then the checks (id defaults to the name, status to critical,
// node must be the registration's; service_name/tags are copied from the
// service). Preconditions are checked before anything changes: a service
// or check on a missing node, a check of a service not on the node, or a
// node id owned by another node rejects the whole command. Re-registering
// identical data changes nothing, so it wakes no blocking query.
// Deregistering a node removes its services, checks and sessions;
// deregistering a service removes its checks. Removing a check, or a check
// becoming critical (by registration or check_update), invalidates the
// sessions bound to it.
//
// # Sessions and locks
//
// A session needs its node registered and binds the check ids in checks,
// node_checks and service_checks, which must exist on its node and not be
// critical. There is no implicit "serfHealth" check: a session with no
// checks is bound to nothing but its node (and its TTL). Consul's HTTP
// layer defaults to ["serfHealth"]; ours must either register a serfHealth
// check per node (as Consul's leader does) or drop it from requests. The
// leader invalidates a failed node's sessions with SessionInvalidate{node}
// (and may set its checks critical with check_update).
//
// Destroying or invalidating a session applies its behavior to the keys it
// holds, in key order: release clears Session (LockIndex, value and flags
// stay, ModifyIndex moves); delete deletes the key. Each such key gets a
// lock delay: no session may acquire it while the acquiring command's time
// is before invalidation time + lock_delay (unset lock_delay: 15s).
// Delays are replicated state, pruned when an invalidation sees them over.
//
// Acquire (put with acquire, txn LOCK) succeeds if the session exists, no
// other session holds the key and no lock delay is in force; it writes
// value and flags, and increments LockIndex unless the session already
// held the key. Release (put with release, txn UNLOCK) succeeds if the
// session holds the key; it writes value and flags and clears Session. A
// plain put keeps the key's Session and LockIndex; a delete ignores locks.
// A put with acquire and cas checks cas first (Consul ignores cas there).
//
// Renewal: session_renew is a replicated command that only records the
// proposer's time in renewed_unix_nano: it moves no index, emits no event,
// so renewals wake nobody. The leader computes expiry with ExpiredSessions
// (TTL × SessionTTLMultiplier after max(last recorded renewal, the time it
// became leader)) and proposes SessionInvalidate with
// ttl_expired_at_unix_nano, which Apply re-checks against the recorded
// renewal so a renewal committed first wins. A leader may also keep
// renewals in memory and replicate only some of them: the notBefore grace
// makes a new leader give every session a full TTL, as Consul does.
//
// # Indices for blocking queries
//
// Every answer has a max index (Consul's X-Consul-Index, never 0) that
// moves only when the answer's data changes: KVIndexFor(key, prefix) for
// KV (tombstones count deletes for TombstoneRetention indices), NodesIndex,
// ServicesIndex, ChecksIndex, SessionsIndex for the tables, NodeIndex(name)
// for one node with its services and checks, ServiceIndex(name) for one
// service's instances and everything their health depends on. The catalog
// reads return it with the data in a QueryMeta.
//
// # Event namespace
//
// Apply's events for catalog and session changes use keys that start with
// a NUL byte, which no user key may contain (CheckCommand refuses it), so
// they never collide with KV keys and a user watch cannot name them by
// accident. The server publishes them to the same hub; a user watch on the
// empty prefix must skip keys where IsReservedKey is true. Values are
// deterministic protobuf encodings; PrevKV is always nil; a delete carries
// only Key and ModifyIndex. Names never contain NUL, so NUL separates
// them.
//
//	key                                          put value          moves with
//	\x00catalog/node/<node>                      Node               NodeIndex(node)
//	\x00catalog/service/<name>\x00<node>\x00<id> ServiceHealth      ServiceIndex(name)
//	\x00catalog/check/<node>\x00<check id>       Check              ChecksIndex
//	\x00session/<id>                             SessionEntry       SessionsIndex
//
// A node key gets a put whenever anything of the node changes (record,
// services, checks), a delete when it is deregistered. An instance key gets
// a put when the instance, its checks, its node's node-level checks or its
// node record change, a delete when it goes. Watch the prefix
// ServiceEventKeyPrefix(name) for one service (the trailing NUL keeps "web"
// from matching "web2"), ServiceEventPrefix for all. Session keys get a put
// on create and a delete on destroy/invalidation; renewals emit nothing.
package store
