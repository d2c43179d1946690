package raftnode

import (
	"context"
	"fmt"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// ChangeConf proposes a membership change on this node, which must be the
// leader (ErrNotLeader), and waits until it is applied here. member
// describes an added member. Removing a voter is refused (ErrQuorum)
// unless the voters left that answered within a few heartbeats form a
// quorum; promoting a learner is refused (ErrNotReady) until it holds
// nine tenths of the leader's log.
func (n *Node) ChangeConf(ctx context.Context, cc raftpb.ConfChangeV2, member *lodestonepb.Member) (uint64, error) {
	id := n.nextID.Add(1)
	cctx, err := proto.Marshal(&lodestonepb.ConfChangeContext{Member: member, RequestId: id})
	if err != nil {
		return 0, fmt.Errorf("encode conf change context: %w", err)
	}
	cc.Context = cctx
	res, err := n.proposeAndWait(ctx, id, func() error {
		done := make(chan error, 1)
		select {
		case n.confC <- confRequest{cc: cc, id: id, done: done}:
		case <-ctx.Done():
			return ctx.Err()
		case <-n.doneC:
			return n.Err()
		}
		return <-done
	})
	return res.index, err
}

// proposeConfChange runs in the loop: it checks the change against the
// leader's view of the cluster and proposes it.
func (n *Node) proposeConfChange(c confRequest) error {
	if n.status.Load().State != raft.StateLeader {
		return ErrNotLeader
	}
	if n.appliedIndex < n.leaderGuard {
		return fmt.Errorf("%w: the new leader is still applying its log (at %d of %d)", ErrBusy, n.appliedIndex, n.leaderGuard)
	}
	if n.confInFlight != 0 {
		return fmt.Errorf("%w: another membership change is in progress", ErrBusy)
	}
	if err := n.checkConfChange(c.cc); err != nil {
		return err
	}
	if err := n.rn.ProposeConfChange(c.cc); err != nil {
		return ErrNoLeader
	}
	n.confInFlight = c.id
	return nil
}

func (n *Node) checkConfChange(cc raftpb.ConfChangeV2) error {
	st := n.rn.Status()
	voters := st.Config.Voters[0]
	learners := st.Config.Learners
	for _, ch := range cc.Changes {
		_, isVoter := voters[ch.NodeID]
		_, isLearner := learners[ch.NodeID]
		switch ch.Type {
		case raftpb.ConfChangeAddLearnerNode:
			if isVoter || isLearner {
				return fmt.Errorf("%w: member %x is already in the cluster", ErrInvalidMember, ch.NodeID)
			}
		case raftpb.ConfChangeAddNode:
			if isVoter {
				return fmt.Errorf("%w: member %x is already a voter", ErrInvalidMember, ch.NodeID)
			}
			if isLearner {
				// Promotion: the learner must have caught up, or the
				// cluster would wait on it for commits.
				leaderMatch := st.Progress[n.id].Match
				if pr, ok := st.Progress[ch.NodeID]; !ok || pr.Match*10 < leaderMatch*9 {
					have := uint64(0)
					if ok {
						have = pr.Match
					}
					return fmt.Errorf("%w: learner %x has %d of %d entries; promote it once it has caught up", ErrNotReady, ch.NodeID, have, leaderMatch)
				}
			}
		case raftpb.ConfChangeRemoveNode:
			if !isVoter && !isLearner {
				return fmt.Errorf("%w: member %x is not in the cluster", ErrUnknownMember, ch.NodeID)
			}
			if isVoter {
				remaining, active := 0, 0
				for id := range voters {
					if id == ch.NodeID {
						continue
					}
					remaining++
					if pr, ok := st.Progress[id]; id == n.id || (ok && pr.RecentActive && n.PeerActive(id)) {
						active++
					}
				}
				if remaining == 0 {
					return fmt.Errorf("%w: cannot remove the last voter", ErrQuorum)
				}
				if need := remaining/2 + 1; active < need {
					return fmt.Errorf("%w: removing %x would leave %d of %d remaining voters reachable; a quorum needs %d", ErrQuorum, ch.NodeID, active, remaining, need)
				}
			}
		}
	}
	return nil
}

// transfer asks Raft to move leadership. With to == 0 the leader picks the
// voter with the most of the log.
func (n *Node) transfer(t transferRequest) {
	if n.status.Load().State != raft.StateLeader {
		t.done <- transferResult{err: ErrNotLeader}
		return
	}
	st := n.rn.Status()
	to := t.to
	if to == 0 {
		var best uint64
		for _, id := range st.Config.Voters[0].Slice() { // NB: sorted, so ties go the same way every time
			if id == n.id {
				continue
			}
			if pr := st.Progress[id]; to == 0 || pr.Match > best {
				to, best = id, pr.Match
			}
		}
		if to == 0 {
			t.done <- transferResult{err: fmt.Errorf("%w: no other voter to transfer leadership to", ErrInvalidMember)}
			return
		}
	}
	if _, ok := st.Config.Voters[0][to]; !ok {
		t.done <- transferResult{err: fmt.Errorf("%w: member %x is not a voter", ErrUnknownMember, to)}
		return
	}
	if to == n.id {
		t.done <- transferResult{to: to}
		return
	}
	n.rn.TransferLeader(to)
	t.done <- transferResult{to: to}
}

// TransferLeader moves leadership (this node must lead) and waits until
// the target leads. With to == 0 the voter with the most of the log is
// chosen.
func (n *Node) TransferLeader(ctx context.Context, to uint64) (uint64, error) {
	done := make(chan transferResult, 1)
	select {
	case n.transferC <- transferRequest{to: to, done: done}:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-n.doneC:
		return 0, n.Err()
	}
	res := <-done
	if res.err != nil {
		return 0, res.err
	}
	for {
		changed := n.LeaderChanged()
		if n.status.Load().Lead == res.to {
			return res.to, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, fmt.Errorf("leadership did not move to %x: %w", res.to, ctx.Err())
		}
	}
}
