package server

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/buildinfo"
	"github.com/lodestone-kv/lodestone/raftnode"
	"github.com/lodestone-kv/lodestone/server/consulapi"
)

// The Consul API's operator face (consulapi.Operator): the Raft
// configuration, member removal and member health, from the membership
// the store replicates and the contact the Raft node tracks.

var _ consulapi.Operator = consulBackend{}

// raftID is a member's id as the Consul API and `lodestone members` show it.
func raftID(id uint64) string { return strconv.FormatUint(id, 16) }

func (b consulBackend) RaftMembers() ([]consulapi.RaftMember, uint64) {
	lead := b.s.raft.Status().Lead
	var out []consulapi.RaftMember
	for _, m := range b.s.store.Members() {
		out = append(out, consulapi.RaftMember{ID: raftID(m.Id), Name: m.Name, PeerAddr: m.PeerAddr,
			Voter: !m.Learner, AutoPromote: m.AutoPromote, Leader: m.Id == lead})
	}
	return out, b.s.store.MembersIndex()
}

// RemoveMember goes through the Cluster service's RemoveMember, so the
// refusals of `lodestone members remove` (the last voter but one, the
// strict reconfiguration check) hold; it never forces.
func (b consulBackend) RemoveMember(ctx context.Context, id, address string) error {
	var ref *lodestonepb.MemberRef
	for _, m := range b.s.store.Members() {
		if (id != "" && raftID(m.Id) == id) || (address != "" && m.PeerAddr == address) {
			ref = &lodestonepb.MemberRef{Id: m.Id}
		}
	}
	if ref == nil {
		return consulapi.ErrUnknownMember
	}
	_, err := (&clusterService{s: b.s}).RemoveMember(ctx, &lodestonepb.RemoveMemberRequest{Member: ref})
	if st, ok := status.FromError(err); ok && (st.Code() == codes.FailedPrecondition || st.Code() == codes.InvalidArgument) {
		// NB: Consul answers a refused removal 500 with the reason.
		return errors.New(st.Message())
	}
	return err
}

func (b consulBackend) MemberHealth() []consulapi.MemberHealth {
	st := b.s.raft.Status()
	self := b.s.raft.ID()
	leading := st.State == raftnode.StateLeader
	match := map[uint64]uint64{}
	for _, p := range b.s.raft.Learners().Progress {
		match[p.ID] = p.Match
	}
	now := time.Now()
	var out []consulapi.MemberHealth
	for _, m := range b.s.store.Members() {
		h := consulapi.MemberHealth{RaftMember: consulapi.RaftMember{ID: raftID(m.Id), Name: m.Name, PeerAddr: m.PeerAddr,
			Voter: !m.Learner, AutoPromote: m.AutoPromote, Leader: m.Id == st.Lead}}
		switch {
		case m.Id == self:
			// NB: a follower is healthy while it hears its leader.
			h.Known, h.Version, h.LastTerm, h.LastIndex = true, buildinfo.Get().Version, st.Term, b.s.raft.Applied()
			h.Healthy = leading || (st.Lead != 0 && b.s.raft.PeerActive(st.Lead))
			if !leading {
				h.LastContact = sinceHeard(b.s.raft, st.Lead, now)
			}
		case leading || m.Id == st.Lead:
			at, heard := b.s.raft.LastHeard(m.Id)
			h.Known, h.Healthy, h.LastTerm, h.LastIndex = heard, b.s.raft.PeerActive(m.Id), st.Term, match[m.Id]
			if heard {
				h.LastContact = now.Sub(at)
			}
		}
		h.StableSince = b.s.stable.since(m.Id, h.Healthy, now)
		out = append(out, h)
	}
	return out
}

// sinceHeard is how long ago this node heard from peer (0 if never).
func sinceHeard(n *raftnode.Node, peer uint64, now time.Time) time.Duration {
	if at, ok := n.LastHeard(peer); ok {
		return now.Sub(at)
	}
	return 0
}

// stableSince remembers, per member, when its health as this server sees
// it last changed (Consul's StableSince).
type stableSince struct {
	mu sync.Mutex
	by map[uint64]stableMark
}

type stableMark struct {
	healthy bool
	since   time.Time
}

func (s *stableSince) since(id uint64, healthy bool, now time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.by == nil {
		s.by = map[uint64]stableMark{}
	}
	m, ok := s.by[id]
	if !ok || m.healthy != healthy {
		m = stableMark{healthy: healthy, since: now}
		s.by[id] = m
	}
	return m.since
}

var _ consulapi.Snapshotter = consulBackend{}

func (b consulBackend) SaveSnapshot(ctx context.Context) (*lodestonepb.SavedSnapshotHeader, []byte, error) {
	return b.s.liveSnapshot(ctx)
}
