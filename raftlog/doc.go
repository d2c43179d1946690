// Package raftlog is Lodestone's durable Raft log: a raft.Storage
// (go.etcd.io/raft/v3) on bbolt that also persists the hard state and the
// current snapshot (metadata in raft.db, data in its own file).
//
// # What it owns and what it refuses to know
//
// raftlog owns the files in the directory given to Open — raft.db, raft.wal and snap/
// (layout, checksums and crash recovery in FORMAT.md) — and the numbers that
// describe them (Stats, NewCollector, Inspect). It knows nothing of the state
// machine (snapshot data is opaque bytes), of the transport, or of the Raft
// algorithm beyond the raft.Storage contract. It starts two goroutines,
// which Close stops: the one that rotates raft.db (below) and the one that
// folds the journal into raft.db (Costs).
//
// # Freelist accounting and rotation
//
// Truncating the log (Compact, ApplySnapshot) frees bbolt pages. Free pages
// cost appends nothing here — the hashmap freelist allocates in O(1) and is
// never written (NoFreelistSync), so a commit writes the same few pages
// however many are free (Stats.LastCommitWriteBytes) — but they hold disk.
// Stats and the collector report them (FileBytes, LiveBytes, FreePages,
// PendingPages, FreeBytes, FreelistBytes). When free pages pass
// Options.RotateFreeRatio of a file of at least Options.RotateMinBytes, the
// Log rotates raft.db online: its goroutine copies the live entries and
// records to a new file while the Log keeps serving, then swaps the files
// under the write lock; writes pause only for the last catch-up (Rotate,
// FORMAT.md "Rotation"). Offline, `lodestone compact` does the same through
// Rotate with verification and a backup. The server has nothing to do
// beyond passing Options.
//
// # The caller's duties, per Ready, in order
//
// The server drives one raft.RawNode from one goroutine. For each Ready rd:
//
//  1. If !raft.IsEmptySnap(rd.Snapshot): ApplySnapshot(rd.Snapshot). It
//     replaces the whole log and raises the stored commit index to the
//     snapshot's, so it must come before step 2, whose entries follow it.
//  2. Save(rd.HardState, rd.Entries): one journal record (raft.wal), or now
//     and then a bbolt transaction, durable when Save returns. Entries with
//     an index already stored replace that entry and everything after it.
//  3. Send rd.Messages. No message may leave before the Save of the same
//     Ready has returned, except that a leader may send its appends
//     (MsgApp) to followers while its own Save is in progress (Raft thesis
//     §10.2.1); votes and acknowledgements must wait.
//  4. Apply: restore the state machine from rd.Snapshot.Data if it was not
//     empty, then apply rd.CommittedEntries. For each conf change call
//     RawNode.ApplyConfChange and remember the ConfState it returns.
//  5. RawNode.Advance(rd).
//  6. From time to time, after applying index i: CreateSnapshot(i, &confState,
//     data), then Compact(j) for some j <= i (keep a margin of entries for
//     followers that lag slightly, so they get entries instead of a whole
//     snapshot). Recording a snapshot also deletes superseded data files
//     (Options.SnapshotsRetained).
//
// With raft's AsyncStorageWrites (the server's choice) the same order holds
// per MsgStorageAppend: ApplySnapshot for its snapshot, Save its hard state
// (Term, Vote, Commit) and entries, and only then deliver its Responses.
// Consecutive appends may be merged into one Save (later entries replace
// earlier ones from their first index, the last hard state wins), never
// across one that carries a snapshot. CreateSnapshot(i) needs a Save whose
// commit index is at least i first, which async apply can outrun.
//
// Any error from Save, ApplySnapshot, CreateSnapshot or Compact means the
// state on disk is not what the caller asked for: stop the node. A failed
// write (a journal record or a raft.db transaction, also a background
// checkpoint's, reported by the next write call) also makes the Log refuse further writes (ErrWriteFailed)
// until it is closed and reopened, because after a failed fsync the kernel's
// view of the file cannot be trusted.
//
// # Restart and the ConfState
//
// After Open, the server restores its in-memory state machine from
// Snapshot() and builds raft with raft.Config{Storage: log, Applied:
// snapshot index}. raft then hands back, as CommittedEntries, every committed
// entry after the snapshot, and the server re-applies them, conf changes
// included.
//
// InitialState therefore returns the ConfState of the current snapshot, not
// the latest one applied: raft requires the ConfState to match
// Config.Applied, because the conf changes after it are applied again.
// Returning a later ConfState would make raft re-apply a conf change on top of
// itself; for a joint-consensus change that is an error ("config is already
// joint") on which RawNode.ApplyConfChange panics, at every restart. So there
// is no SaveConfState: the ConfState is persisted with each snapshot
// (CreateSnapshot's cs argument, rd.Snapshot.Metadata.ConfState), and that is
// all a node with an in-memory state machine needs.
//
// # Concurrency
//
// All methods are safe for concurrent use. The raft.Storage methods and Stats
// run concurrently with each other and with one write in progress, and see
// the state before or after that write, never a mixture. A background
// checkpoint changes nothing they see: it writes to raft.db only entries the
// cache serves and a stale suffix beyond the last index. Writes (Save,
// ApplySnapshot, CreateSnapshot, Compact) are serialized; Compact deletes
// 4,096 entries per write, so a Save waits for one such chunk, not for the
// whole compaction. A rotation runs
// concurrently with all of them; it holds the write lock only for its final
// catch-up and the swap, so a Save may wait that long (Stats.
// LastRotationPause). Term, FirstIndex,
// LastIndex and InitialState never touch disk; Entries reads bbolt only for
// entries older than the cache (a lagging follower, or entries the caller
// let go with Release), and waits for an in-progress Save to finish when
// it does. Release never waits for one. CreateSnapshot writes its data
// file without blocking Save, so it may run on a goroutine other than the
// Ready loop's; Compact may make a concurrent Entries return
// raft.ErrCompacted, which raft expects.
//
// # Snapshot data
//
// The data of a snapshot lives in its file and only there, as etcd keeps
// its state outside raft's MemoryStorage: Snapshot (the raft.Storage
// method) returns the metadata with nil Data, which is all raft needs to
// decide that a follower needs a snapshot. OpenSnapshot streams the data
// from the file, with its length and CRC checked when the reader reaches
// the end; the caller restores its state machine from it at a restart and
// streams it to a follower that needs it (raftnode hands raft's MsgSnap to
// its transport with that reader). CreateSnapshotFrom writes the data into
// the file as the caller encodes it; CreateSnapshot and ApplySnapshot take
// it as one slice and keep no reference to it. A reader keeps its file
// open, so a newer snapshot that removes it does not cut a send short.
//
// # Ownership
//
// Entries returns a newly allocated slice the caller may append to; the
// entries' Data is shared with the cache and must not be modified (raft never
// does). Save keeps the Entry values it is given (and their Data) in the
// cache. Callers must treat them as immutable once handed over.
//
// # Errors
//
// The raft.Storage methods return raft.ErrCompacted, raft.ErrUnavailable,
// raft.ErrSnapOutOfDate unwrapped where raft expects them, because raft
// compares them with ==. Everything else is wrapped with the step that failed
// and, where the condition has a name, one of this package's sentinels:
// ErrCorrupt (with a *CorruptError naming the file and index), ErrClosed,
// ErrWriteFailed, ErrOutOfOrder, ErrNotCommitted, ErrCompactBeyondSnapshot,
// ErrUnsupportedVersion, ErrLocked, ErrVerify. The write methods refuse what
// raft would refuse at the next start (a commit index outside the log, a
// snapshot of an uncommitted index, compaction past the snapshot) instead of
// persisting a log that cannot be reopened. Nothing read from disk causes a panic;
// only a broken internal invariant (a bug) does.
//
// # Costs
//
// Save is one write and one fdatasync of raft.wal, the journal: a bbolt
// commit costs two fdatasyncs (dirty pages, then meta page) and about twice
// the CPU. On Linux, in a process with one P, the fdatasync is an AIO
// request (diskwait_aio.go): the Save's goroutine waits for it parked in
// Go's poller, not in a system call that holds its thread and the only P.
// With more Ps it is a plain system call, which returns sooner. Every 256 entries (Options.CheckpointEntries) a checkpoint folds
// the journal's current epoch into raft.db in one bbolt commit, in the
// background: the Save that finds the epoch full hands it to the fold
// goroutine and writes to the journal's other slot, under the next epoch.
// At most one fold runs; a Save due for the next one while it still runs
// goes on in the same epoch instead (Stats.CheckpointDeferrals), as long as
// the epoch stays within its slot and a quarter of the cache, and waits for
// the fold only past that (Stats.CheckpointWaits, checkpoint_waits_total),
// so the journal never holds more than two epochs and the cache (which
// serves every entry not yet in raft.db) stays bounded.
// Every other write (CreateSnapshot, ApplySnapshot, Compact, Close, a
// rotation's catch-up) first waits for the fold, then folds the current
// epoch with its own commit (FORMAT.md "Journal"). WaitCheckpoint waits for
// the background fold, for callers that measure. Because raft.db's freelist is never written
// (NoFreelistSync) and allocation uses the hashmap freelist, a commit's cost
// does not grow with the file's history. Memory: the entry cache (Options.CacheEntries,
// Options.CacheBytes; less once the caller Releases what it no longer needs), never snapshot data (a SnapshotReader reads through
// the caller's buffer). Snapshot never touches disk. Open reads and checksums the
// whole retained log and, since the freelist is not persisted, scans
// raft.db's pages. A rotation reads and writes the live log once (plus what
// is appended meanwhile) and needs disk for a second copy of it.
package raftlog
