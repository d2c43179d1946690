package peer

import (
	"context"
	"fmt"
	"io"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/clusterid"
	"github.com/lodestone-kv/lodestone/internal/rpcstatus"
)

// Local is what the peer gRPC service asks of this member: the calls a
// follower forwards to its leader, and the leader's commit index.
// *raftnode.Node is one.
type Local interface {
	ChangeConf(ctx context.Context, cc raftpb.ConfChangeV2, m *lodestonepb.Member) (uint64, error)
	TransferLeader(ctx context.Context, to uint64) (uint64, error)
	LeaderIndex(term uint64) (index, leaderTerm uint64, err error)
}

// service is the Peer gRPC service: snapshots in, and what followers ask
// of the leader.
type service struct {
	lodestonepb.UnimplementedPeerServer
	t       *Transport
	local   Local
	members func() []*lodestonepb.Member
}

func (s *service) Snapshot(stream lodestonepb.Peer_SnapshotServer) error {
	return s.t.receiveSnapshot(stream)
}

func (s *service) ChangeConf(ctx context.Context, req *lodestonepb.ConfChangeRequest) (*lodestonepb.ConfChangeResponse, error) {
	var cc raftpb.ConfChangeV2
	if err := cc.Unmarshal(req.Change); err != nil {
		return nil, rpcstatus.Invalidf("decode conf change: %v", err)
	}
	var cctx lodestonepb.ConfChangeContext
	if err := proto.Unmarshal(cc.Context, &cctx); err != nil {
		return nil, rpcstatus.Invalidf("decode conf change context: %v", err)
	}
	// The caller's own cluster was checked on the way in; this is the
	// cluster it announces the member for.
	if len(cctx.ClusterId) > 0 {
		announced, err := clusterid.FromBytes(cctx.ClusterId)
		if err != nil || announced != s.t.Cluster() {
			return nil, s.t.refused(remoteAddr(ctx), &RefusedError{Reason: refusedMemberCluster, Code: codes.PermissionDenied,
				Msg: fmt.Sprintf("member %q is announced for cluster %s, this server is in cluster %s", cctx.Member.GetName(), announced, s.t.Cluster())})
		}
	}
	index, err := s.local.ChangeConf(ctx, cc, cctx.Member)
	if err != nil {
		return nil, rpcstatus.Of(err)
	}
	return &lodestonepb.ConfChangeResponse{Index: index, Members: s.members()}, nil
}

func (s *service) TransferLeader(ctx context.Context, req *lodestonepb.TransferLeaderRequest) (*lodestonepb.TransferLeaderResponse, error) {
	lead, err := s.local.TransferLeader(ctx, req.GetTo().GetId())
	if err != nil {
		return nil, rpcstatus.Of(err)
	}
	return &lodestonepb.TransferLeaderResponse{LeaderId: lead}, nil
}

// LeaderIndexStream answers a follower's questions for the commit index,
// one message each way per question (AskLeaderIndex is the other end).
func (s *service) LeaderIndexStream(stream lodestonepb.Peer_LeaderIndexStreamServer) error {
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		resp := &lodestonepb.LeaderIndexResponse{}
		if resp.Index, resp.Term, err = s.local.LeaderIndex(req.GetTerm()); err != nil {
			resp.Refused = true
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

func (s *service) LeaderIndex(ctx context.Context, req *lodestonepb.LeaderIndexRequest) (*lodestonepb.LeaderIndexResponse, error) {
	index, term, err := s.local.LeaderIndex(req.GetTerm())
	if err != nil {
		return nil, rpcstatus.Of(err)
	}
	return &lodestonepb.LeaderIndexResponse{Index: index, Term: term}, nil
}
