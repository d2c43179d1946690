package raftnode

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// ChangeConf proposes a membership change on this node, which must be the
// leader (ErrNotLeader), and waits until it is applied here. member
// describes an added member. A change of the voters (adding, removing or
// promoting one) is refused (ErrQuorum) unless the voters of the new
// configuration that answered within a few heartbeats form a quorum of
// it; a voter added outright does not count (it has caught up with
// nothing), except as the second voter of a leader alone, so its caller
// must have checked that it answers. Promoting a learner is refused (ErrNotReady)
// until it holds nine tenths of the leader's log.
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
	n.waits.submitted(c.id)
	n.confInFlight = c.id
	return nil
}

func (n *Node) checkConfChange(cc raftpb.ConfChangeV2) error {
	st := n.rn.Status()
	voters := st.Config.Voters[0]
	learners := st.Config.Learners
	next := maps.Clone(map[uint64]struct{}(voters)) // the voters after the change
	var what []string
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
				what = append(what, fmt.Sprintf("promoting %x", ch.NodeID))
			} else {
				what = append(what, fmt.Sprintf("adding voter %x", ch.NodeID))
			}
			next[ch.NodeID] = struct{}{}
		case raftpb.ConfChangeRemoveNode:
			if !isVoter && !isLearner {
				return fmt.Errorf("%w: member %x is not in the cluster", ErrUnknownMember, ch.NodeID)
			}
			if isVoter {
				what = append(what, fmt.Sprintf("removing voter %x", ch.NodeID))
				delete(next, ch.NodeID)
			}
		}
	}
	if len(what) == 0 {
		return nil // only learners come or go: no quorum changes
	}
	if len(next) == 0 {
		return fmt.Errorf("%w: cannot remove the last voter", ErrQuorum)
	}
	// Strict reconfiguration check (etcd's --strict-reconfig-check): the
	// new configuration must have a quorum among the members this leader
	// hears from now, or the change could be the last thing it commits.
	reachable := 0
	for id := range next {
		_, known := st.Progress[id]
		switch {
		case id == n.id:
			reachable++
		case !known:
			// NB: a voter added outright holds nothing yet and acknowledges
			// nothing until it has caught up, so it does not count; but a
			// leader alone could never add a second voter then. As etcd
			// does, that one case is let through: the caller (the server's
			// AddMember) probed the new voter before proposing.
			if len(voters) == 1 {
				reachable++
			}
		case st.Progress[id].RecentActive && n.PeerActive(id):
			reachable++
		}
	}
	if need := len(next)/2 + 1; reachable < need {
		return fmt.Errorf("%w: %s would leave %d of the %d voters of the new configuration reachable; it needs %d",
			ErrQuorum, strings.Join(what, ", "), reachable, len(next), need)
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

// LearnerProgress is how far a learner has come, as its leader sees it.
type LearnerProgress struct {
	ID uint64
	// Match is the last index the learner is known to hold.
	Match uint64
	// RecentActive is Raft's: the learner answered within the last
	// election timeout.
	RecentActive bool
}

// Learners is a leader's view of its learners; empty on a follower and on
// a leader without learners.
type Learners struct {
	// LastIndex is the leader's own durable last index when the view was
	// taken.
	LastIndex uint64
	Progress  []LearnerProgress // sorted by id
}

// Learners returns the leader's latest view of its learners. It changes
// (and LearnersChanged fires) when a learner's match index or activity
// changes, when learners come or go and when leadership moves; not when
// only the leader's log grows.
func (n *Node) Learners() Learners {
	if l := n.learners.Load(); l != nil {
		return *l
	}
	return Learners{}
}

// LearnersChanged returns a channel closed at the next change of Learners.
func (n *Node) LearnersChanged() <-chan struct{} {
	n.learnersMu.Lock()
	defer n.learnersMu.Unlock()
	if n.learnersCh == nil {
		n.learnersCh = make(chan struct{})
	}
	return n.learnersCh
}

// publishLearners runs in the loop after each batch of Readies: it
// publishes the leader's view of its learners when it changed. It
// allocates only then.
func (n *Node) publishLearners() {
	cur := n.learners.Load()
	if n.status.Load().State != raft.StateLeader || len(n.confState.Learners) == 0 {
		if cur != nil && len(cur.Progress) > 0 {
			n.setLearners(&Learners{})
		}
		return
	}
	scratch := n.learnerScratch[:0]
	var last uint64
	n.rn.WithProgress(func(id uint64, typ raft.ProgressType, pr tracker.Progress) {
		switch {
		case id == n.id:
			last = pr.Match
		case typ == raft.ProgressTypeLearner:
			scratch = append(scratch, LearnerProgress{ID: id, Match: pr.Match, RecentActive: pr.RecentActive})
		}
	})
	slices.SortFunc(scratch, func(a, b LearnerProgress) int { return cmp.Compare(a.ID, b.ID) })
	n.learnerScratch = scratch
	if cur != nil && slices.Equal(cur.Progress, scratch) {
		return
	}
	n.setLearners(&Learners{LastIndex: last, Progress: slices.Clone(scratch)})
}

func (n *Node) setLearners(l *Learners) {
	n.learners.Store(l)
	n.learnersMu.Lock()
	if n.learnersCh != nil {
		close(n.learnersCh)
	}
	n.learnersCh = make(chan struct{})
	n.learnersMu.Unlock()
}
