package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// clusterService serves membership and status. Membership changes run on
// the leader: a follower forwards them over the peer connection.
type clusterService struct {
	lodestonepb.UnimplementedClusterServer
	s *Server
}

func (c *clusterService) Members(ctx context.Context, _ *lodestonepb.MembersRequest) (*lodestonepb.MembersResponse, error) {
	return &lodestonepb.MembersResponse{Header: c.s.kv.header(c.s.store.Index()), Members: c.s.store.Members()}, nil
}

func (c *clusterService) AddMember(ctx context.Context, req *lodestonepb.AddMemberRequest) (*lodestonepb.AddMemberResponse, error) {
	m := &lodestonepb.Member{
		Id: MemberID(req.Name), Name: req.Name, PeerAddr: req.PeerAddr,
		GrpcAddr: req.GrpcAddr, HttpAddr: req.HttpAddr, Learner: req.Learner,
	}
	if err := c.validateNewMember(m); err != nil {
		return nil, err
	}
	typ := raftpb.ConfChangeAddNode
	if req.Learner {
		typ = raftpb.ConfChangeAddLearnerNode
	}
	index, err := c.s.changeConf(ctx, raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: typ, NodeID: m.Id}}}, m)
	if err != nil {
		return nil, toStatus(err)
	}
	return &lodestonepb.AddMemberResponse{Header: c.s.kv.header(index), Member: m, Members: c.s.store.Members()}, nil
}

func (c *clusterService) validateNewMember(m *lodestonepb.Member) error {
	if m.Name == "" {
		return invalidf("member name must not be empty")
	}
	if strings.ContainsAny(m.Name, "=, \t\n") {
		return invalidf("member name %q must not contain '=', ',' or spaces", m.Name)
	}
	if _, _, err := net.SplitHostPort(m.PeerAddr); err != nil {
		return invalidf("peer address %q is not host:port", m.PeerAddr)
	}
	for field, addr := range map[string]string{"grpc": m.GrpcAddr, "http": m.HttpAddr} {
		if addr == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return invalidf("%s address %q is not host:port", field, addr)
		}
	}
	for _, cur := range c.s.store.Members() {
		switch {
		case cur.Id == m.Id:
			return toStatus(fmt.Errorf("%w: a member named %q already exists (id %x)", errInvalidMember, cur.Name, cur.Id))
		case cur.PeerAddr == m.PeerAddr:
			return toStatus(fmt.Errorf("%w: member %q already uses peer address %s", errInvalidMember, cur.Name, m.PeerAddr))
		}
	}
	return nil
}

// resolve finds a member by id or name.
func (c *clusterService) resolve(ref *lodestonepb.MemberRef) (*lodestonepb.Member, error) {
	if ref == nil || (ref.Id == 0 && ref.Name == "") {
		return nil, invalidf("name a member by id or name")
	}
	for _, m := range c.s.store.Members() {
		if (ref.Id != 0 && m.Id == ref.Id) || (ref.Name != "" && m.Name == ref.Name) {
			return m, nil
		}
	}
	return nil, toStatus(fmt.Errorf("%w: no member with id %x or name %q; list them with 'lodestone members'", errUnknownMember, ref.Id, ref.Name))
}

func (c *clusterService) RemoveMember(ctx context.Context, req *lodestonepb.RemoveMemberRequest) (*lodestonepb.RemoveMemberResponse, error) {
	m, err := c.resolve(req.Member)
	if err != nil {
		return nil, err
	}
	index, err := c.s.changeConf(ctx, raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeRemoveNode, NodeID: m.Id}}}, m)
	if err != nil {
		return nil, toStatus(err)
	}
	return &lodestonepb.RemoveMemberResponse{Header: c.s.kv.header(index), Members: c.s.store.Members()}, nil
}

func (c *clusterService) PromoteMember(ctx context.Context, req *lodestonepb.PromoteMemberRequest) (*lodestonepb.PromoteMemberResponse, error) {
	m, err := c.resolve(req.Member)
	if err != nil {
		return nil, err
	}
	if !m.Learner {
		return nil, toStatus(fmt.Errorf("%w: member %q is already a voter", errInvalidMember, m.Name))
	}
	index, err := c.s.changeConf(ctx, raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddNode, NodeID: m.Id}}}, m)
	if err != nil {
		return nil, toStatus(err)
	}
	return &lodestonepb.PromoteMemberResponse{Header: c.s.kv.header(index), Members: c.s.store.Members()}, nil
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
		return nil, toStatus(err)
	}
	return &lodestonepb.TransferLeaderResponse{Header: c.s.kv.header(c.s.store.Index()), LeaderId: lead}, nil
}

func (c *clusterService) Status(ctx context.Context, _ *lodestonepb.StatusRequest) (*lodestonepb.StatusResponse, error) {
	st := c.s.node.publishedStatus()
	resp := &lodestonepb.StatusResponse{
		Header:       c.s.kv.header(c.s.store.Index()),
		LeaderId:     st.lead,
		Term:         st.term,
		CommitIndex:  st.commit,
		AppliedIndex: c.s.node.applied.current(),
		RaftState:    st.state.String(),
		Log:          c.s.logStats(),
		Version:      Version,
	}
	for _, m := range c.s.store.Members() {
		if m.Id == c.s.node.id {
			resp.Self = m
		}
		if m.Id == st.lead {
			resp.LeaderName = m.Name
		}
	}
	if resp.Self == nil {
		resp.Self = &lodestonepb.Member{Id: c.s.node.id, Name: c.s.cfg.Name, PeerAddr: c.s.PeerAddr(), GrpcAddr: c.s.GRPCAddr(), HttpAddr: c.s.HTTPAddr()}
	}
	return resp, nil
}

// changeConf runs a membership change on the leader, forwarding it there
// when this node follows, then waits until this node has applied it.
func (s *Server) changeConf(ctx context.Context, cc raftpb.ConfChangeV2, m *lodestonepb.Member) (uint64, error) {
	var index uint64
	var err error
	if s.node.publishedStatus().state == raft.StateLeader {
		index, err = s.node.changeConf(ctx, cc, m)
	} else {
		index, err = s.forwardConfChange(ctx, cc, m)
	}
	if err != nil {
		return 0, err
	}
	return index, s.node.waitApplied(ctx, index)
}

func (s *Server) forwardConfChange(ctx context.Context, cc raftpb.ConfChangeV2, m *lodestonepb.Member) (uint64, error) {
	peer, done, err := s.leaderPeer()
	if err != nil {
		return 0, err
	}
	defer done()
	cctx, err := proto.Marshal(&lodestonepb.ConfChangeContext{Member: m})
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

func (s *Server) transferLeader(ctx context.Context, to uint64) (uint64, error) {
	if s.node.publishedStatus().state == raft.StateLeader {
		return s.node.transferLeader(ctx, to)
	}
	peer, done, err := s.leaderPeer()
	if err != nil {
		return 0, err
	}
	defer done()
	resp, err := peer.TransferLeader(ctx, &lodestonepb.TransferLeaderRequest{To: &lodestonepb.MemberRef{Id: to}})
	if err != nil {
		return 0, err
	}
	// Wait until this node has seen the new leader too, so the caller's
	// next request here goes to the right place.
	for {
		changed := s.node.leaderChanged()
		if s.node.publishedStatus().lead == resp.LeaderId {
			return resp.LeaderId, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return resp.LeaderId, nil
		}
	}
}

// leaderPeer opens a connection to the leader's peer listener for one
// forwarded request. NB: it is not the transport's connection, which is
// closed the moment a removal of the leader applies here — while the
// forwarded removal itself still waits for its answer.
func (s *Server) leaderPeer() (lodestonepb.PeerClient, func(), error) {
	lead := s.node.publishedStatus().lead
	if lead == raft.None {
		return nil, nil, errNoLeader
	}
	addr, ok := s.node.transport.peerAddr(lead)
	if !ok {
		return nil, nil, fmt.Errorf("%w: leader %x has no known peer address", errNoLeader, lead)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("dial leader at %s: %w", addr, err)
	}
	return lodestonepb.NewPeerClient(conn), func() { conn.Close() }, nil
}

// peerService serves the Peer API: Raft traffic and leader-side requests.
type peerService struct {
	lodestonepb.UnimplementedPeerServer
	s *Server
}

func (p *peerService) Snapshot(stream lodestonepb.Peer_SnapshotServer) error {
	return p.s.node.transport.receiveSnapshot(stream)
}

func (p *peerService) ChangeConf(ctx context.Context, req *lodestonepb.ConfChangeRequest) (*lodestonepb.ConfChangeResponse, error) {
	var cc raftpb.ConfChangeV2
	if err := cc.Unmarshal(req.Change); err != nil {
		return nil, invalidf("decode conf change: %v", err)
	}
	var cctx lodestonepb.ConfChangeContext
	if err := proto.Unmarshal(cc.Context, &cctx); err != nil {
		return nil, invalidf("decode conf change context: %v", err)
	}
	index, err := p.s.node.changeConf(ctx, cc, cctx.Member)
	if err != nil {
		return nil, toStatus(err)
	}
	return &lodestonepb.ConfChangeResponse{Index: index, Members: p.s.store.Members()}, nil
}

func (p *peerService) TransferLeader(ctx context.Context, req *lodestonepb.TransferLeaderRequest) (*lodestonepb.TransferLeaderResponse, error) {
	lead, err := p.s.node.transferLeader(ctx, req.GetTo().GetId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &lodestonepb.TransferLeaderResponse{LeaderId: lead}, nil
}

// LeaderIndexStream answers each request as LeaderIndex does, a refusal
// included, so the stream outlives a leader that cannot answer yet.
func (p *peerService) LeaderIndexStream(stream lodestonepb.Peer_LeaderIndexStreamServer) error {
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		resp := &lodestonepb.LeaderIndexResponse{}
		if resp.Index, resp.Term, err = p.s.node.leaderIndex(req.GetTerm()); err != nil {
			resp.Refused = true
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

func (p *peerService) LeaderIndex(ctx context.Context, req *lodestonepb.LeaderIndexRequest) (*lodestonepb.LeaderIndexResponse, error) {
	index, term, err := p.s.node.leaderIndex(req.GetTerm())
	if err != nil {
		return nil, toStatus(err)
	}
	return &lodestonepb.LeaderIndexResponse{Index: index, Term: term}, nil
}
