package raftnode

import (
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Applying before the local fsync.
//
// With AsyncStorageWrites, raft hands out committed entries only once they
// are durable on this node too. Committed already means durable on a
// quorum, so that wait protects nothing: the state machine is in memory and
// is rebuilt from a snapshot and the local log on restart, and an entry
// missing there is fetched from the leader again. What the wait cost was a
// slow fsync here holding back what others had made safe: on a follower,
// every watch event it delivers; on a leader, every write's answer, since
// the leader answers once it has applied. etcd applies in parallel with its
// WAL write for the same reason (Raft thesis §10.2.1).
//
// So the loop keeps the entries it hands to the log writer (every
// MsgStorageAppend, in order, which is how raft's log reaches storage) and
// the commit index those appends carry in their hard state, and applies
// the entries both cover ahead of raft. Raft later hands the same entries
// out again; apply skips what it has applied. Two kinds wait for raft's
// own hand-out: conf changes, which need the RawNode to agree that they
// are applied, and anything past a gap (entries persisted before a
// restart, which this node did not see pass).
//
// Why the kept entries are raft's: an index at or below raft's commit
// index holds the committed entry in raft's log, and raft's log reaches
// the writer only through these appends. An append whose first index is
// already held replaces everything from there on (a new leader's log
// winning over an uncommitted tail), and a snapshot replaces all of it.

// pendingEntries are the entries sent to the log writer and not yet
// applied, with raft's commit index as the appends last told it. The zero
// value is empty and ready.
type pendingEntries struct {
	ents   []raftpb.Entry // consecutive indexes
	commit uint64
}

// record takes one MsgStorageAppend.
func (p *pendingEntries) record(m raftpb.Message) {
	if m.Snapshot != nil && !raft.IsEmptySnap(*m.Snapshot) {
		p.truncate(0)
	}
	if len(m.Entries) > 0 {
		first := m.Entries[0].Index
		if len(p.ents) > 0 && first > p.last()+1 {
			p.truncate(0) // NB: not raft's order; start over rather than guess
		}
		p.truncate(kept(p.ents, first))
		p.ents = append(p.ents, m.Entries...)
	}
	// NB: an append without a hard state carries Commit 0; raft's commit
	// index never goes down.
	p.commit = max(p.commit, m.Commit)
}

func (p *pendingEntries) last() uint64 { return p.ents[len(p.ents)-1].Index }

// truncate keeps the first n entries, clearing the rest so the backing
// array pins no entry data.
func (p *pendingEntries) truncate(n int) {
	clear(p.ents[n:])
	p.ents = p.ents[:n]
}

// committed returns the kept entries that follow applied without a gap,
// are at or below both the commit index and limit, and come before the
// first conf change.
func (p *pendingEntries) committed(applied, limit uint64) []raftpb.Entry {
	upTo := min(p.commit, limit)
	if len(p.ents) == 0 || upTo <= applied || p.ents[0].Index > applied+1 || p.last() <= applied {
		return nil
	}
	from := int(applied + 1 - p.ents[0].Index)
	n := from
	for n < len(p.ents) && p.ents[n].Index <= upTo && p.ents[n].Type == raftpb.EntryNormal {
		n++
	}
	return p.ents[from:n]
}

// release drops the entries at or below applied.
func (p *pendingEntries) release(applied uint64) {
	if len(p.ents) == 0 || p.ents[0].Index > applied {
		return
	}
	if p.last() <= applied {
		p.truncate(0) // NB: keeps the backing array for the next append
		return
	}
	n := int(applied + 1 - p.ents[0].Index)
	clear(p.ents[:n])
	p.ents = p.ents[n:]
}
