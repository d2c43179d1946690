package server

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/raftnode"
)

// runAutoPromote makes voters of the learners added to be promoted
// (Member.AutoPromote, AddMember's default) once they have caught up:
// while this node leads, a learner whose match index is within
// cfg.AutoPromoteLag of the leader's last index, and which the leader
// heard from within the last few heartbeats, is promoted through the
// ordinary conf change path, strict reconfiguration check included. It
// wakes when the leader's view of its learners changes
// (raftnode.LearnersChanged: a match index, activity, learners coming or
// going, leadership), and after a refused promotion once more an election
// timeout later; it never polls. A learner that never catches up (nobody
// answers at its address) wakes it never and stays a learner. It returns
// when the server closes.
func (s *core) runAutoPromote() {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	lastErr := map[uint64]string{} // per learner, so a refusal is logged once
	for {
		changed := s.raft.LearnersChanged()
		leader := s.raft.LeaderChanged()
		if s.raft.Status().State == raftnode.StateLeader {
			if s.promoteCaughtUp(lastErr) {
				retry.Reset(s.electionTimeout())
			}
		}
		select {
		case <-changed:
		case <-leader:
		case <-retry.C:
		case <-s.ctx.Done():
			return
		}
	}
}

func (s *core) electionTimeout() time.Duration {
	return time.Duration(s.cfg.ElectionTicks) * s.cfg.TickInterval
}

// promoteCaughtUp promotes every caught-up learner awaiting promotion; it
// reports whether one was refused and is worth another try.
func (s *core) promoteCaughtUp(lastErr map[uint64]string) (retry bool) {
	view := s.raft.Learners()
	if len(view.Progress) == 0 {
		return false
	}
	members := map[uint64]*lodestonepb.Member{}
	for _, m := range s.store.Members() {
		members[m.Id] = m
	}
	for _, p := range view.Progress {
		m := members[p.ID]
		if m == nil || !m.Learner || !m.AutoPromote {
			continue
		}
		// NB: a learner that never answered holds nothing (Match 0);
		// the leader's own match may trail a learner's during its fsync.
		if p.Match == 0 || p.Match+s.cfg.AutoPromoteLag < view.LastIndex || !p.RecentActive || !s.raft.PeerActive(p.ID) {
			continue
		}
		ctx, cancel := context.WithTimeout(s.ctx, 10*s.electionTimeout())
		cc := raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddNode, NodeID: m.Id}}}
		index, err := s.raft.ChangeConf(ctx, cc, m)
		cancel()
		if err != nil {
			if s.ctx.Err() != nil {
				return false
			}
			if lastErr[m.Id] != err.Error() {
				lastErr[m.Id] = err.Error()
				s.logger.Info("learner not promoted yet", "member", m.Name, "id", fmt.Sprintf("%x", m.Id),
					"match", p.Match, "leader_last_index", view.LastIndex, "err", err)
			}
			retry = true
			continue
		}
		delete(lastErr, m.Id)
		s.metrics.promoted.Inc()
		s.logger.Info("learner promoted to voter", "member", m.Name, "id", fmt.Sprintf("%x", m.Id),
			"match", p.Match, "leader_last_index", view.LastIndex, "max_lag", s.cfg.AutoPromoteLag, "index", index)
	}
	return retry
}
