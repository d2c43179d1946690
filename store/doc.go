// Package store is Lodestone's replicated state machine: the KV table and
// the cluster membership (the catalog and sessions join it later, as more
// B-trees behind the same contract).
//
// # What it owns
//
// The in-memory state every replica derives from the committed Raft log: an
// ordered B-tree of KV entries carrying Consul's CreateIndex, ModifyIndex,
// LockIndex, Flags and Session; the member table with addresses; the
// applied index; and the snapshot encoding of all of it (SNAPSHOT.md).
//
// # What it refuses to know
//
// Raft, gRPC, the disk, clocks and the watch hub. It starts no goroutines,
// never calls time.Now, does no I/O except on the io.Reader/io.Writer handed
// to Restore and Snapshot.WriteTo, and never panics on command content.
//
// # Concurrency
//
// One goroutine, the server's apply loop, calls the mutating methods:
// Apply, Advance, SetMember, RemoveMember, Snapshot and Restore. Any number
// of goroutines call the reads concurrently with it: Get, Range, Members,
// Index, KVIndex, MembersIndex, Len. A sync.RWMutex guards the state: Apply
// holds it exclusively for one whole command (a transaction is never seen
// half applied), reads hold it shared. A Range holds the read lock while it
// walks at most its limit of keys, so Limits.MaxRangeLimit bounds how long a
// read can delay Apply. Snapshots do not hold the lock while encoding: they
// are copy-on-write clones of the B-tree (see Snapshot).
//
// Entries returned by reads, results and events are shared, immutable
// values: callers must not modify them.
//
// # Caller's duties, in order
//
//  1. Before proposing, validate: Limits.ValidateCommand(cmd). Apply does
//     not enforce limits (replicas may be configured differently) and
//     applies anything CheckCommand accepts.
//  2. For each committed entry, in log order, on the apply goroutine:
//     a normal entry with data → Apply(entry.Index, cmd); an empty entry →
//     Advance(entry.Index); a conf change → SetMember/RemoveMember for each
//     member it adds, updates or removes (several calls with the same index
//     are fine), or Advance if it carries no member data.
//  3. Hand Apply's events to the watch hub, then answer the proposer with
//     the result (filling the response header). A result with no Result set
//     means the command was malformed: answer with CheckCommand(cmd).
//  4. To snapshot: call Snapshot on the apply goroutine, then WriteTo on any
//     goroutine; record Snapshot.Index() as the Raft snapshot's index.
//  5. On start or when Raft installs a snapshot: Restore, then replay the
//     log entries after its index (replays at or below Index() are
//     no-ops).
//  6. Serve reads at Index(): a linearizable read waits until Index() has
//     reached the ReadIndex, then calls Get/Range; a stale read just calls
//     them. Both report the index they were read at.
package store
