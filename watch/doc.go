// Package watch is Lodestone's sharded watch fan-out hub: the one place where
// applied changes meet the clients waiting for them. gRPC Watch streams, HTTP
// blocking queries (Consul's ?index=) and the gateway's registry subscription
// are all views on one Hub.
//
// # What it owns
//
//   - A bounded, indexed event log: every Raft index that changed something
//     is appended with its events and kept until the retention bound (events
//     and bytes, see Config) pushes it out. The newest 4,096 entries keep
//     their events as published; older ones are encoded into byte chunks,
//     which the garbage collector does not scan (arena.go), and decoded
//     again only for a watcher resuming from that far back.
//   - N shards, each with its own lock and goroutine. Watchers are spread
//     over the shards round-robin. A shard reads the log from its own cursor,
//     finds the watchers an event concerns through an exact-key map and a
//     prefix map probed once per distinct prefix length (never by scanning
//     its watchers), and copies the event into each watcher's bounded buffer.
//   - The watchers: a Watcher's buffer, its terminal error and its wake-up.
//
// # What it refuses to know
//
// Nothing here knows Raft, gRPC, HTTP or the store. A Key is an opaque
// string; the store decides how catalog tables map onto keys. Time comes in
// through a Clock, so tests step it by hand.
//
// # The write path never waits
//
// Publish takes the log's lock for an append (O(events), never O(watchers)),
// then wakes the shards that are asleep with a non-blocking send. It never
// sends on a watcher's channel and never takes a lock a consumer holds. This
// is the failure of the Consul streaming outage in Roblox's public
// post-mortem of October 2021: fan-out through one contended channel made
// writers block behind readers. Here a watcher that cannot keep up is cut
// loose with an *OverflowError carrying the index to resume after, and a
// shard that falls behind the log's retention cuts loose the watchers it
// could no longer serve; nobody else slows down.
//
// # The caller's duties, in order
//
//  1. New the Hub once per server, before the first apply. Register it with
//     a prometheus.Registerer (it is a Collector).
//  2. Restore(index) whenever the state machine is replaced by a snapshot:
//     at boot with the snapshot's index, and on every snapshot install.
//     Watchers that cannot be continued across it get an error wrapping
//     ErrCompacted.
//  3. After applying each committed entry, in index order and from the one
//     apply goroutine, call Publish(index, events) with the entry's changes
//     (nil events is fine and advances Index). The store must already show
//     the change: a woken reader re-reads the store.
//  4. Serve watchers: Watch for streams, Wait for one-shot blocking reads.
//     Each Watcher is read by one goroutine (Next, or NextShared for a
//     consumer that converts the events anyway and must not modify them)
//     and closed exactly when its consumer is done (Close, or cancel the
//     ctx given to Watch). One goroutine may serve many watchers through a
//     Ready list.
//  5. Close the Hub after the apply loop has stopped. Close waits for every
//     goroutine the Hub started.
//
// # Indices
//
// Every index is a Raft log index and strictly increases across Publish
// calls. A watcher asked to start at S receives every matching event with
// index > S (so S is "the last index I have seen"), first from the retained
// log, then live, with no gap and no duplicate. Each Batch carries Index: the
// watcher has now seen every matching event at or below it, so Index is
// what to resume from after a reconnect and what a blocking query reports.
// The events of one index are never split across batches.
package watch
