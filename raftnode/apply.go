package raftnode

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store"
)

// restoreSnapshot brings the state machine to a snapshot from the leader,
// once the log writer has persisted it.
func (n *Node) restoreSnapshot(snap raftpb.Snapshot) error {
	if err := n.store.Restore(bytes.NewReader(snap.Data)); err != nil {
		return fmt.Errorf("restore snapshot at index %d: %w", snap.Metadata.Index, err)
	}
	n.confState = snap.Metadata.ConfState
	n.sender.SetLearners(n.confState.Learners)
	n.snapIndex = snap.Metadata.Index
	n.snapAppliedBytes = n.appliedBytes
	n.lastSnapBytes.Store(int64(len(snap.Data)))
	n.appliedIndex, n.appliedTerm = snap.Metadata.Index, snap.Metadata.Term
	n.hub.Restore(snap.Metadata.Index)
	for _, mem := range n.store.Members() {
		if err := n.sender.SetPeer(mem.Id, mem.PeerAddr); err != nil {
			return err
		}
	}
	n.applied.advance(n.appliedIndex)
	n.metrics.appliedIndex.Set(float64(n.appliedIndex))
	n.logger.Info("installed snapshot from leader", "index", snap.Metadata.Index, "bytes", len(snap.Data))
	return nil
}

func (n *Node) apply(ents []raftpb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	start := n.clock.Now()
	for _, e := range ents {
		if e.Index <= n.appliedIndex {
			continue
		}
		var err error
		var events []store.Event
		replaced := false
		switch e.Type {
		case raftpb.EntryNormal:
			events, replaced = n.applyNormal(e)
		case raftpb.EntryConfChange:
			var cc raftpb.ConfChange
			if err = cc.Unmarshal(e.Data); err == nil {
				err = n.applyConfChange(e.Index, cc.AsV2())
			}
		case raftpb.EntryConfChangeV2:
			var cc raftpb.ConfChangeV2
			if err = cc.Unmarshal(e.Data); err == nil {
				err = n.applyConfChange(e.Index, cc)
			}
		}
		if err != nil {
			return fmt.Errorf("apply entry %d: %w", e.Index, err)
		}
		// Every index is published, changes or not, so watchers' progress
		// follows the applied index. Publish never waits on a watcher. A
		// restore replaced the state: watchers resume from a reload, as
		// after a snapshot install.
		if replaced {
			n.hub.Restore(e.Index)
		} else {
			n.hub.Publish(e.Index, toWatchEvents(events))
		}
		n.sendReplies()
		n.appliedIndex, n.appliedTerm = e.Index, e.Term
		n.appliedBytes += uint64(len(e.Data))
	}
	n.metrics.snapshotLogBytes.Set(float64(n.appliedBytes - n.snapAppliedBytes))
	n.applied.advance(n.appliedIndex)
	n.settleOrphans()
	n.metrics.appliedIndex.Set(float64(n.appliedIndex))
	n.metrics.applyLatency.Observe(n.clock.Now().Sub(start).Seconds())
	return nil
}

// applyNormal applies a normal entry; replaced reports a restore that
// replaced the state.
func (n *Node) applyNormal(e raftpb.Entry) (events []store.Event, replaced bool) {
	if len(e.Data) == 0 {
		n.store.Advance(e.Index)
		return nil, false
	}
	if len(e.Data) < 8 {
		n.logger.Error("skipping malformed entry", "index", e.Index, "bytes", len(e.Data))
		n.store.Advance(e.Index)
		return nil, false
	}
	id := binary.BigEndian.Uint64(e.Data)
	var cmd lodestonepb.Command
	if err := proto.Unmarshal(e.Data[8:], &cmd); err != nil {
		// Validation happens before proposing, so this means a newer
		// version wrote the entry; skipping keeps replicas identical.
		n.logger.Error("skipping undecodable entry", "index", e.Index, "err", err)
		n.store.Advance(e.Index)
		n.replyAfterPublish(id, proposalResult{index: e.Index, err: fmt.Errorf("decode command at index %d: %w", e.Index, err)})
		return nil, false
	}
	res, events := n.store.Apply(e.Index, &cmd)
	if out := res.GetRestore(); out != nil && res.Rejected == nil {
		replaced = true
		n.logger.Info("state restored from an operator's snapshot", "index", e.Index, "snapshot_index", out.SnapshotIndex)
	}
	if pol := cmd.GetAdmission(); pol != nil {
		n.logger.Info("admission policy changed", "index", e.Index, "enabled", pol.GetEnabled(),
			"reads", pol.GetReads(), "writes", pol.GetWrites(), "watches", pol.GetWatches(), "ramp_percent_per_min", pol.GetRampPercentPerMin())
	}
	n.replyAfterPublish(id, proposalResult{index: e.Index, result: res})
	return events, replaced
}

// reply is a proposal's result waiting for its entry to be published.
type reply struct {
	id  uint64
	res proposalResult
}

// replyAfterPublish queues a proposal's result until its entry's events are
// in the watch hub. NB: answering first let a client that saw its write
// acknowledged, and then watched "from now", be sent that same write: the
// hub's "now" was still the index before it.
func (n *Node) replyAfterPublish(id uint64, res proposalResult) {
	n.replies = append(n.replies, reply{id, res})
}

// sendReplies answers the proposals of the entry just published.
func (n *Node) sendReplies() {
	for _, r := range n.replies {
		n.waits.trigger(r.id, r.res)
	}
	clear(n.replies)
	n.replies = n.replies[:0]
}

func (n *Node) applyConfChange(index uint64, cc raftpb.ConfChangeV2) error {
	var cctx lodestonepb.ConfChangeContext
	if len(cc.Context) > 0 {
		if err := proto.Unmarshal(cc.Context, &cctx); err != nil {
			return fmt.Errorf("decode conf change context: %w", err)
		}
	}
	n.confState = *n.rn.ApplyConfChange(cc)
	n.sender.SetLearners(n.confState.Learners)
	added, removed := n.store.ApplyConfChange(index, cc.Changes, cctx.Member)
	for _, id := range removed {
		n.sender.RemovePeer(id)
		n.appendAcks.forget(id)
		n.logger.Info("member removed", "member", fmt.Sprintf("%x", id), "index", index)
		if id == n.id {
			n.MarkRemoved()
		}
	}
	for _, m := range added {
		if err := n.sender.SetPeer(m.Id, m.PeerAddr); err != nil {
			n.logger.Warn("connect to new member", "member", m.Name, "err", err)
		}
		n.logger.Info("member added", "member", m.Name, "learner", m.Learner, "index", index)
		if n.snapIndex > 0 {
			// NB: once the log is truncated a new member can only be
			// caught up by snapshot, and its Raft refuses one whose
			// conf state predates it. Without a snapshot taken after
			// this entry it would wait for the next periodic one.
			n.snapWantedAt = max(n.snapWantedAt, index)
		}
	}
	if cctx.RequestId != 0 {
		if cctx.RequestId == n.confInFlight {
			n.confInFlight = 0
		}
		n.replyAfterPublish(cctx.RequestId, proposalResult{index: index})
	}
	return nil
}
