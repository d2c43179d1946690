package raftnode

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// The log writer: Raft runs with AsyncStorageWrites, so the loop hands each
// Ready's MsgStorageAppend to this goroutine instead of saving it inline,
// and goes on stepping messages, taking proposals and applying while the
// fsync runs. The writer takes every append queued meanwhile and persists
// them in one raftlog.Save (group commit: one journal record and one
// fdatasync however many Readies it covers). Only then does it deliver the
// messages' responses: acknowledgements to other members go straight to
// the transport; the ones addressed to this node (its own MsgAppResp as
// leader, the MsgStorageAppendResp that marks entries stable) go back to the loop,
// which steps them. So nothing is acknowledged, to a peer or to raft
// itself, before it is durable here. (Applying need not wait for it: an
// entry a quorum committed is safe whatever this node's disk does; see
// earlyapply.go.)

// appendQueue is the loop → writer queue. NB: unbounded so the loop never
// blocks on the writer while the writer blocks on the loop (appendDoneC);
// raft's MaxUncommittedEntriesSize and MaxInflightMsgs bound what it holds.
type appendQueue struct {
	mu    sync.Mutex
	msgs  []raftpb.Message
	wakeC chan struct{} // capacity 1: "the queue is not empty"
}

func newAppendQueue() *appendQueue {
	return &appendQueue{wakeC: make(chan struct{}, 1)}
}

func (q *appendQueue) push(m raftpb.Message) {
	q.mu.Lock()
	q.msgs = append(q.msgs, m)
	q.mu.Unlock()
	select {
	case q.wakeC <- struct{}{}:
	default:
	}
}

// takeAll returns what is queued and queues into spare from now on: the
// writer hands back the slice it took last time, so the two alternate and
// a push seldom allocates.
func (q *appendQueue) takeAll(spare []raftpb.Message) []raftpb.Message {
	clear(spare) // NB: pins no entries while it waits
	q.mu.Lock()
	defer q.mu.Unlock()
	msgs := q.msgs
	q.msgs = spare[:0]
	return msgs
}

// appendDone reports one write to the loop.
type appendDone struct {
	snap   *raftpb.Snapshot // persisted by this write: the loop restores the store from it
	local  []raftpb.Message // responses addressed to this node, to step in order
	commit uint64           // the commit index the log now holds (0: unchanged)
	wrote  bool             // entries were written: took is a log-write latency
	at     time.Time        // when the write finished
	took   time.Duration
	err    error
}

// appendBatch is what one raftlog write persists: consecutive
// MsgStorageAppend messages merged.
type appendBatch struct {
	hs        raftpb.HardState
	ents      []raftpb.Entry
	snap      *raftpb.Snapshot
	responses []raftpb.Message
}

// nextAppendBatch merges the longest prefix of msgs that one Save can
// persist and returns the rest. A message carrying a snapshot is a batch on
// its own (ApplySnapshot, then its entries and hard state), since the
// snapshot replaces the log the earlier messages wrote to.
//
// Merging follows raft's own rules: a later message's hard state supersedes
// an earlier one (it is the whole state, not a delta), and a later
// message's entries replace every merged entry from their first index on
// (a follower overwriting a conflicting suffix). Responses keep their
// order. The entries of a single message are passed through; merged ones
// are copied once, never appended to raft's slices.
func nextAppendBatch(msgs []raftpb.Message) (appendBatch, []raftpb.Message) {
	var b appendBatch
	owned := false // b.ents is a copy of our own, safe to append to
	n := 0
	for _, m := range msgs {
		if m.Snapshot != nil && n > 0 {
			break
		}
		n++
		if m.Snapshot != nil {
			b.snap = m.Snapshot
		}
		if hs := (raftpb.HardState{Term: m.Term, Vote: m.Vote, Commit: m.Commit}); !raft.IsEmptyHardState(hs) {
			b.hs = hs
		}
		b.ents, owned = mergeEntries(b.ents, m.Entries, owned)
		if b.responses == nil {
			// NB: clipped, so a later message's responses are appended
			// to a copy and never to raft's slice.
			b.responses = slices.Clip(m.Responses)
		} else {
			b.responses = append(b.responses, m.Responses...)
		}
		if m.Snapshot != nil {
			break
		}
	}
	return b, msgs[n:]
}

// mergeEntries returns cur with next written over it from next's first
// index, and whether the result is a copy of our own. Either argument may
// be returned as is. The first merge copies; later ones append to that
// copy, which grows as appends do, so merging k messages costs O(k)
// copies, not O(k²).
func mergeEntries(cur, next []raftpb.Entry, owned bool) ([]raftpb.Entry, bool) {
	if len(next) == 0 {
		return cur, owned
	}
	if len(cur) == 0 {
		return next, false
	}
	keep := kept(cur, next[0].Index)
	if !owned {
		// NB: capped, so append copies: cur may be raft's unstable slice
		// (the first message's), and appending to it could overwrite
		// entries raft still holds.
		cur = cur[:keep:keep]
	}
	return append(cur[:keep], next...), true
}

// kept returns how many of cur, consecutive entries, an append starting at
// index first leaves in place: raft's rule is that an append replaces
// everything from its first index on.
func kept(cur []raftpb.Entry, first uint64) int {
	switch {
	case len(cur) == 0 || first <= cur[0].Index:
		return 0
	case first <= cur[len(cur)-1].Index:
		return int(first - cur[0].Index)
	}
	return len(cur)
}

// runLogWriter is the writer goroutine. It stops on stopC, after a failed
// write (reported to the loop, which stops the node) or when the loop has
// exited.
func (n *Node) runLogWriter() {
	defer n.wg.Done()
	var spare []raftpb.Message
	for {
		select {
		case <-n.appendQ.wakeC:
		case <-n.stopC:
			return
		case <-n.doneC:
			return
		}
		msgs := n.appendQ.takeAll(spare)
		spare = msgs // NB: the whole slice; the loop below reslices msgs
		for len(msgs) > 0 {
			var b appendBatch
			b, msgs = nextAppendBatch(msgs)
			d := n.writeAppend(b)
			select {
			case n.appendDoneC <- d:
			case <-n.stopC:
				return
			case <-n.doneC:
				return
			}
			if d.err != nil {
				return
			}
		}
	}
}

// writeAppend persists one batch and sends its responses to other members.
func (n *Node) writeAppend(b appendBatch) appendDone {
	var d appendDone
	if b.snap != nil {
		if err := n.log.ApplySnapshot(*b.snap); err != nil {
			d.err = fmt.Errorf("persist snapshot at index %d: %w", b.snap.Metadata.Index, err)
			return d
		}
		d.snap = b.snap
		d.commit = b.snap.Metadata.Index
	}
	took, err := n.saveTimed(b.hs, b.ents)
	if err != nil {
		d.err = fmt.Errorf("persist log: %w", err)
		return d
	}
	d.at, d.took, d.wrote = n.clock.Now(), took, len(b.ents) > 0
	d.commit = max(d.commit, b.hs.Commit)
	// Durable now: acknowledgements may leave.
	for _, m := range b.responses {
		if m.To == n.id {
			if d.local == nil {
				d.local = make([]raftpb.Message, 0, len(b.responses))
			}
			d.local = append(d.local, m)
		} else {
			n.sender.Send(m)
		}
	}
	return d
}
