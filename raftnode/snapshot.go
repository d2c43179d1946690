package raftnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
	"github.com/lodestone-kv/lodestone/store"
)

// maybeSnapshot starts a snapshot once enough entries were applied since
// the last one. The store view is taken here, in apply order; encoding,
// writing the file and truncating the log happen on another goroutine so
// writes go on meanwhile.
func (n *Node) maybeSnapshot() {
	// NB: the log refuses a snapshot above the commit index it holds
	// (raftlog.ErrNotCommitted), and the hard state that committed an
	// applied entry may still be queued for the log writer.
	if !n.snapshotDue() || n.durableCommit < n.appliedIndex {
		return
	}
	n.snapshotting = true
	n.metrics.snapshotTriggers.WithLabelValues(n.snapshotTrigger()).Inc()
	at := n.appliedBytes
	sn := n.store.Snapshot()
	cs := n.confState
	n.startSnapshot(func() snapResult {
		res := n.writeSnapshot(sn, cs)
		res.appliedBytes = at
		return res
	})
}

// goSnapshot runs job on a goroutine of its own and hands its result to
// the loop.
func (n *Node) goSnapshot(job func() snapResult) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		res := job()
		select {
		case n.snapDoneC <- res:
		case <-n.stopC:
		}
	}()
}

// snapshotDue reports whether a snapshot should start once the log holds
// the commit index of everything applied.
func (n *Node) snapshotDue() bool {
	return !n.snapshotting && n.snapshotTrigger() != ""
}

// snapshotTrigger names what makes a snapshot due now, "" if nothing.
func (n *Node) snapshotTrigger() string {
	switch {
	case n.snapWantedAt > n.snapIndex:
		return "member"
	case n.appliedIndex-n.snapIndex >= n.cfg.SnapshotEntries:
		return "entries"
	case snapshotBytesDue(n.appliedBytes-n.snapAppliedBytes, n.cfg.SnapshotBytes, uint64(n.lastSnapBytes.Load())):
		return "bytes"
	}
	return ""
}

// snapshotBytesDue reports whether since bytes of entries applied after
// the last snapshot, whose encoding had last bytes, make the next one due,
// with the floor SnapshotBytes (0: never by bytes). A restart restores the
// newest snapshot and replays the log after it, and replaying costs
// several times what restoring the same state does; with few large
// entries (batched writes) SnapshotEntries alone let that log grow to the
// size of the whole state, or many times it. Waiting for as many bytes as
// the last snapshot had bounds the encoding work per byte written as the
// state grows, and the replay to about one snapshot's worth.
func snapshotBytesDue(since, floor, last uint64) bool {
	return floor > 0 && since >= max(floor, last)
}

func (n *Node) writeSnapshot(sn *store.Snapshot, cs raftpb.ConfState) snapResult {
	start := n.clock.Now()
	var size countingWriter
	// NB: encoded straight into the log's data file: a snapshot of the
	// whole state held in memory, even briefly, set the server's peak
	// heap and with it its resident memory for good.
	_, err := n.log.CreateSnapshotFrom(sn.Index(), &cs, func(w io.Writer) error {
		size.w = w
		if _, err := sn.WriteTo(yieldingWriter{&size}); err != nil {
			return fmt.Errorf("encode snapshot: %w", err)
		}
		return nil
	})
	sn.Close() // NB: before compaction: the store may reuse value slots now
	if err != nil {
		if errors.Is(err, raft.ErrSnapOutOfDate) {
			// A snapshot from the leader overtook this one.
			return snapResult{index: sn.Index(), err: nil, stale: true}
		}
		return snapResult{index: sn.Index(), err: fmt.Errorf("save snapshot: %w", err)}
	}
	if sn.Index() > n.cfg.CatchUpEntries {
		to := sn.Index() - n.cfg.CatchUpEntries
		if err := compactInSteps(n.log, to, func() bool { return n.pause(compactPause) }); err != nil {
			return snapResult{index: sn.Index(), err: fmt.Errorf("compact log to %d: %w", to, err)}
		}
	}
	n.lastSnapBytes.Store(size.n)
	n.logger.Info("snapshot saved", "index", sn.Index(), "bytes", size.n, "took", n.clock.Now().Sub(start))
	return snapResult{index: sn.Index()}
}

// countingWriter counts the bytes written through it to w.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	k, err := c.w.Write(p)
	c.n += int64(k)
	return k, err
}

// sendSnapshot hands a MsgSnap raft made to the Sender with the data of
// the log's current snapshot, streamed from its file. raft took m's
// metadata from the log a moment ago; if a newer snapshot replaced it
// since, the send is reported failed and raft sends the newer one.
func (n *Node) sendSnapshot(m raftpb.Message) {
	r, err := n.log.OpenSnapshot()
	if err == nil && r.Metadata().Index != m.Snapshot.Metadata.Index {
		err = fmt.Errorf("snapshot %d replaced by %d", m.Snapshot.Metadata.Index, r.Metadata().Index)
		_ = r.Close()
	}
	if err != nil {
		n.logger.Warn("snapshot not sent", "peer", fmt.Sprintf("%x", m.To), "index", m.Snapshot.Metadata.Index, "err", err)
		n.rn.ReportSnapshot(m.To, raft.SnapshotFailure)
		return
	}
	n.sender.SendSnapshot(m, r, r.Size())
}

// restoreFromLog restores the store from the log's current snapshot,
// streamed from its file, and returns its metadata and size (zero if
// there is none). The data's checksum is checked at its end, so the rest
// of the file is read even if the store's decoder stopped short of it.
func (n *Node) restoreFromLog() (raftpb.SnapshotMetadata, int64, error) {
	r, err := n.log.OpenSnapshot()
	if errors.Is(err, raftlog.ErrNoSnapshot) {
		return raftpb.SnapshotMetadata{}, 0, nil
	}
	if err != nil {
		return raftpb.SnapshotMetadata{}, 0, fmt.Errorf("open snapshot: %w", err)
	}
	defer r.Close()
	meta := r.Metadata()
	restore := n.store.Restore
	// NB: the values stay in the snapshot file where it can be opened
	// again: copying them into the store's value file was most of a
	// restart's CPU.
	if base, err := r.OpenShared(); err == nil {
		restore = func(rd io.Reader) error { return n.store.RestoreShared(rd, base) }
	} else {
		n.logger.Warn("restoring by copying every value", "err", err)
	}
	if err := restore(r); err != nil {
		return meta, 0, fmt.Errorf("restore snapshot at index %d: %w", meta.Index, err)
	}
	if _, err := io.Copy(io.Discard, r); err != nil {
		return meta, 0, fmt.Errorf("restore snapshot at index %d: %w", meta.Index, err)
	}
	return meta, r.Size(), nil
}

// A snapshot's log compaction deletes compactStep entries at a time,
// compactPause apart. Every member snapshots at about the same index;
// compacting 95,000 entries at once took about 40 ms of CPU on each, and
// on a shared core the three bursts stalled every write for 200-300 ms.
// Paced, a step (about 0.5 ms of CPU, one bbolt transaction) comes every
// 20 ms and the compaction takes about 2 s, which nothing waits for.
const (
	compactStep  = 1024
	compactPause = 20 * time.Millisecond
)

// compactInSteps compacts l up to index compactStep entries at a time,
// calling pause between two steps; it stops early, with no error, when
// pause reports false (the node is stopping).
func compactInSteps(l *raftlog.Log, index uint64, pause func() bool) error {
	for {
		first, err := l.FirstIndex()
		if err != nil {
			return err
		}
		if first > index {
			return nil // NB: compacted meanwhile (a snapshot from the leader)
		}
		step := min(index, first-1+compactStep)
		if err := l.Compact(step); err != nil && !errors.Is(err, raft.ErrCompacted) {
			return err
		}
		if step == index || !pause() {
			return nil
		}
	}
}

// pause waits d, or until the node stops (false).
func (n *Node) pause(d time.Duration) bool {
	select {
	case <-n.clock.After(d):
		return true
	case <-n.stopC:
		return false
	}
}

// yieldingWriter lets other goroutines run after each write to w. A
// snapshot encodes into memory with no system call to give up the
// processor at: on a server with one processor, encoding 10,000 keys held
// it for 7 ms, every write in flight waiting. The encoder writes 64 KiB at
// a time, so this bounds that to a fraction of a millisecond.
type yieldingWriter struct{ w io.Writer }

func (y yieldingWriter) Write(p []byte) (int, error) {
	n, err := y.w.Write(p)
	runtime.Gosched()
	return n, err
}

func (n *Node) saveSnapshot(s snapResult) {
	n.snapshotting = false
	if s.err != nil {
		n.logger.Error("snapshot failed", "index", s.index, "err", s.err)
		return
	}
	if s.stale {
		return
	}
	n.snapIndex = max(n.snapIndex, s.index)
	n.snapAppliedBytes = max(n.snapAppliedBytes, s.appliedBytes)
	n.metrics.snapshots.Inc()
	n.metrics.snapshotIndex.Set(float64(n.snapIndex))
}

// LiveSnapshot is a copy-on-write view of the store taken in apply order,
// with the Raft term and configuration at its index. Close Snap once
// written (store.Snapshot).
type LiveSnapshot struct {
	Snap *store.Snapshot
	Term uint64
	Conf raftpb.ConfState
	err  error
}

// liveSnapshot runs in the Raft loop: nothing is applied while it runs, so
// the store view, its term and the configuration agree.
func (n *Node) liveSnapshot() LiveSnapshot {
	sn := n.store.Snapshot()
	// NB: the term from apply, not the log: an entry applied before this
	// node's own append of it was durable is not in the log yet.
	if sn.Index() != n.appliedIndex {
		return LiveSnapshot{err: fmt.Errorf("store at index %d, applied index %d", sn.Index(), n.appliedIndex)}
	}
	cs := raftpb.ConfState{
		Voters:   append([]uint64(nil), n.confState.Voters...),
		Learners: append([]uint64(nil), n.confState.Learners...),
	}
	return LiveSnapshot{Snap: sn, Term: n.appliedTerm, Conf: cs}
}

// Snapshot takes a LiveSnapshot at the applied index, for an operator's
// backup. Call ReadIndex first for one that holds every acknowledged write.
func (n *Node) Snapshot(ctx context.Context) (LiveSnapshot, error) {
	ch := make(chan LiveSnapshot, 1)
	select {
	case n.liveSnapC <- ch:
	case <-ctx.Done():
		return LiveSnapshot{}, ctx.Err()
	case <-n.doneC:
		return LiveSnapshot{}, n.Err()
	}
	select {
	case ls := <-ch:
		return ls, ls.err
	case <-ctx.Done():
		return LiveSnapshot{}, ctx.Err()
	}
}
