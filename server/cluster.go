package server

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/buildinfo"
	"github.com/lodestone-kv/lodestone/internal/member"
	"github.com/lodestone-kv/lodestone/internal/rpcstatus"
	"github.com/lodestone-kv/lodestone/raftnode"
)

// clusterService serves membership and status. Membership changes run on
// the leader: a follower forwards them over the peer connection.
type clusterService struct {
	lodestonepb.UnimplementedClusterServer
	s *core
}

func (c *clusterService) Members(ctx context.Context, _ *lodestonepb.MembersRequest) (*lodestonepb.MembersResponse, error) {
	return &lodestonepb.MembersResponse{Header: c.s.header(c.s.store.Index()), Members: c.s.store.Members()}, nil
}

func (c *clusterService) AddMember(ctx context.Context, req *lodestonepb.AddMemberRequest) (*lodestonepb.AddMemberResponse, error) {
	// A new member joins as a learner, which no quorum waits on, and the
	// leader promotes it once it has caught up (promote.go); voter_now
	// adds a voter at once, but only one that answers.
	m := &lodestonepb.Member{
		Id: member.ID(req.Name), Name: req.Name, PeerAddr: req.PeerAddr,
		GrpcAddr: req.GrpcAddr, HttpAddr: req.HttpAddr,
		Learner: !req.VoterNow, AutoPromote: !req.VoterNow && !req.Learner,
	}
	if req.Learner && req.VoterNow {
		return nil, rpcstatus.Invalidf("a member is added either as a learner or as a voter now, not both")
	}
	if err := c.validateNewMember(m); err != nil {
		return nil, err
	}
	typ := raftpb.ConfChangeAddLearnerNode
	if req.VoterNow {
		typ = raftpb.ConfChangeAddNode
		if err := c.probeNewVoter(ctx, m); err != nil {
			return nil, err
		}
	}
	index, err := c.s.changeConf(ctx, raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: typ, NodeID: m.Id}}}, m)
	if err != nil {
		return nil, rpcstatus.Of(err)
	}
	return &lodestonepb.AddMemberResponse{Header: c.s.header(index), Member: m, Members: c.s.store.Members()}, nil
}

func (c *clusterService) validateNewMember(m *lodestonepb.Member) error {
	if m.Name == "" {
		return rpcstatus.Invalidf("member name must not be empty")
	}
	if strings.ContainsAny(m.Name, "=, \t\n") {
		return rpcstatus.Invalidf("member name %q must not contain '=', ',' or spaces", m.Name)
	}
	if _, _, err := net.SplitHostPort(m.PeerAddr); err != nil {
		return rpcstatus.Invalidf("peer address %q is not host:port", m.PeerAddr)
	}
	for field, addr := range map[string]string{"grpc": m.GrpcAddr, "http": m.HttpAddr} {
		if addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return rpcstatus.Invalidf("%s address %q is not host:port", field, addr)
		}
	}
	for _, cur := range c.s.store.Members() {
		switch {
		case cur.Id == m.Id:
			return rpcstatus.Of(fmt.Errorf("%w: a member named %q already exists (id %x)", raftnode.ErrInvalidMember, cur.Name, cur.Id))
		case cur.PeerAddr == m.PeerAddr:
			return rpcstatus.Of(fmt.Errorf("%w: member %q already uses peer address %s", raftnode.ErrInvalidMember, cur.Name, m.PeerAddr))
		}
	}
	return nil
}

// probeNewVoter refuses a voter added outright that does not answer on
// its peer port as a member would (peer.Transport.Probe, with TLS when the
// cluster uses it): an unanswered voter can cost a small cluster its
// quorum until an operator runs 'lodestone recover'.
func (c *clusterService) probeNewVoter(ctx context.Context, m *lodestonepb.Member) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.s.transport.Probe(ctx, m.PeerAddr); err != nil {
		return status.Errorf(codes.FailedPrecondition,
			"refused to add %q as a voter now: its peer address %s does not answer as a member of this cluster (%v); "+
				"start it first (with --join), or add it without voter_now to join as a learner that is promoted once it has caught up",
			m.Name, m.PeerAddr, err)
	}
	return nil
}

// resolve finds a member by id or name.
func (c *clusterService) resolve(ref *lodestonepb.MemberRef) (*lodestonepb.Member, error) {
	if ref == nil || (ref.Id == 0 && ref.Name == "") {
		return nil, rpcstatus.Invalidf("name a member by id or name")
	}
	for _, m := range c.s.store.Members() {
		if (ref.Id != 0 && m.Id == ref.Id) || (ref.Name != "" && m.Name == ref.Name) {
			return m, nil
		}
	}
	return nil, rpcstatus.Of(fmt.Errorf("%w: no member with id %x or name %q; list them with 'lodestone members'", raftnode.ErrUnknownMember, ref.Id, ref.Name))
}

func (c *clusterService) RemoveMember(ctx context.Context, req *lodestonepb.RemoveMemberRequest) (*lodestonepb.RemoveMemberResponse, error) {
	m, err := c.resolve(req.Member)
	if err != nil {
		return nil, err
	}
	if !m.Learner && !req.Force {
		var left []string
		for _, x := range c.s.store.Members() {
			if !x.Learner && x.Id != m.Id {
				left = append(left, x.Name)
			}
		}
		if len(left) == 1 {
			return nil, status.Errorf(codes.FailedPrecondition,
				"refused to remove voter %q: it would leave %s as the only voter, and the cluster would stop at that member's first failure; "+
					"add a member first, or remove it anyway with force (--force)", m.Name, left[0])
		}
	}
	index, err := c.s.changeConf(ctx, raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeRemoveNode, NodeID: m.Id}}}, m)
	if err != nil {
		return nil, rpcstatus.Of(err)
	}
	return &lodestonepb.RemoveMemberResponse{Header: c.s.header(index), Members: c.s.store.Members()}, nil
}

func (c *clusterService) PromoteMember(ctx context.Context, req *lodestonepb.PromoteMemberRequest) (*lodestonepb.PromoteMemberResponse, error) {
	m, err := c.resolve(req.Member)
	if err != nil {
		return nil, err
	}
	if !m.Learner {
		return nil, rpcstatus.Of(fmt.Errorf("%w: member %q is already a voter", raftnode.ErrInvalidMember, m.Name))
	}
	index, err := c.s.changeConf(ctx, raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddNode, NodeID: m.Id}}}, m)
	if err != nil {
		return nil, rpcstatus.Of(err)
	}
	return &lodestonepb.PromoteMemberResponse{Header: c.s.header(index), Members: c.s.store.Members()}, nil
}

func (c *clusterService) TransferLeader(ctx context.Context, req *lodestonepb.TransferLeaderRequest) (*lodestonepb.TransferLeaderResponse, error) {
	var to uint64
	if req.To != nil && (req.To.Id != 0 || req.To.Name != "") {
		m, err := c.resolve(req.To)
		if err != nil {
			return nil, err
		}
		to = m.Id
	}
	lead, err := c.s.transferLeader(ctx, to)
	if err != nil {
		return nil, rpcstatus.Of(err)
	}
	return &lodestonepb.TransferLeaderResponse{Header: c.s.header(c.s.store.Index()), LeaderId: lead}, nil
}

func (c *clusterService) Status(ctx context.Context, _ *lodestonepb.StatusRequest) (*lodestonepb.StatusResponse, error) {
	st := c.s.raft.Status()
	resp := &lodestonepb.StatusResponse{
		Header:       c.s.header(c.s.store.Index()),
		LeaderId:     st.Lead,
		Term:         st.Term,
		CommitIndex:  st.Commit,
		AppliedIndex: c.s.raft.Applied(),
		RaftState:    st.State.String(),
		Log:          c.s.logStats(),
		Version:      buildinfo.Get().Version,
	}
	for _, m := range c.s.store.Members() {
		if m.Id == c.s.raft.ID() {
			resp.Self = m
		}
		if m.Id == st.Lead {
			resp.LeaderName = m.Name
		}
	}
	if resp.Self == nil {
		peerAddr := c.s.cfg.InitialCluster[c.s.cfg.Name]
		if peerAddr == "" {
			peerAddr = c.s.peerAddr
		}
		resp.Self = &lodestonepb.Member{Id: c.s.raft.ID(), Name: c.s.cfg.Name, PeerAddr: peerAddr, GrpcAddr: c.s.advertiseGRPC, HttpAddr: c.s.advertiseHTTP}
	}
	return resp, nil
}

// changeConf runs a membership change on the leader, forwarding it there
// when this node follows, then waits until this node has applied it.
func (s *core) changeConf(ctx context.Context, cc raftpb.ConfChangeV2, m *lodestonepb.Member) (uint64, error) {
	var index uint64
	var err error
	if s.raft.Status().State == raftnode.StateLeader {
		index, err = s.raft.ChangeConf(ctx, cc, m)
	} else {
		index, err = s.forwardConfChange(ctx, cc, m)
	}
	if err != nil {
		return 0, err
	}
	return index, s.raft.WaitApplied(ctx, index)
}

func (s *core) forwardConfChange(ctx context.Context, cc raftpb.ConfChangeV2, m *lodestonepb.Member) (uint64, error) {
	peer, err := s.leaderPeer()
	if err != nil {
		return 0, err
	}
	id := s.transport.Cluster()
	cctx, err := proto.Marshal(&lodestonepb.ConfChangeContext{Member: m, ClusterId: id[:]})
	if err != nil {
		return 0, fmt.Errorf("encode member: %w", err)
	}
	cc.Context = cctx
	b, err := cc.Marshal()
	if err != nil {
		return 0, fmt.Errorf("encode conf change: %w", err)
	}
	resp, err := peer.ChangeConf(ctx, &lodestonepb.ConfChangeRequest{Change: b})
	if err != nil {
		return 0, err
	}
	return resp.Index, nil
}

func (s *core) transferLeader(ctx context.Context, to uint64) (uint64, error) {
	if s.raft.Status().State == raftnode.StateLeader {
		return s.raft.TransferLeader(ctx, to)
	}
	peer, err := s.leaderPeer()
	if err != nil {
		return 0, err
	}
	resp, err := peer.TransferLeader(ctx, &lodestonepb.TransferLeaderRequest{To: &lodestonepb.MemberRef{Id: to}})
	if err != nil {
		return 0, err
	}
	// Wait until this node has seen the new leader too, so the caller's
	// next request here goes to the right place.
	for {
		changed := s.raft.LeaderChanged()
		if s.raft.Status().Lead == resp.LeaderId {
			return resp.LeaderId, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return resp.LeaderId, nil
		}
	}
}

// leaderPeer is a Peer client on the transport's connection to the leader.
func (s *core) leaderPeer() (lodestonepb.PeerClient, error) {
	lead := s.raft.Status().Lead
	if lead == 0 {
		return nil, raftnode.ErrNoLeader
	}
	c, ok := s.transport.Client(lead)
	if !ok {
		return nil, fmt.Errorf("%w: leader %x has no known peer address", raftnode.ErrNoLeader, lead)
	}
	return c, nil
}
