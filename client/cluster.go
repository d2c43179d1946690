package client

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// ByName refers to a member by name.
func ByName(name string) *lodestonepb.MemberRef { return &lodestonepb.MemberRef{Name: name} }

// ByID refers to a member by id.
func ByID(id uint64) *lodestonepb.MemberRef { return &lodestonepb.MemberRef{Id: id} }

func refString(r *lodestonepb.MemberRef) string {
	if r.GetName() != "" {
		return fmt.Sprintf("%q", r.GetName())
	}
	if r.GetId() != 0 {
		return fmt.Sprintf("%x", r.GetId())
	}
	return ""
}

// Members lists the cluster's members as the replicated membership knows
// them. It is a read. The client also takes the members' gRPC addresses
// and the leader from the answer, so later calls prefer the leader.
func (c *Client) Members(ctx context.Context) (*lodestonepb.MembersResponse, error) {
	resp, err := invoke(ctx, c, callSpec{op: "members"},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.MembersResponse, error) {
			return lodestonepb.NewClusterClient(cc).Members(ctx, &lodestonepb.MembersRequest{})
		}, (*lodestonepb.MembersResponse).GetHeader)
	if err == nil {
		c.observeMembers(resp.GetHeader(), resp.GetMembers())
	}
	return resp, err
}

// MemberOption adjusts a membership change: VoterNow for AddMember, Force
// for RemoveMember.
type MemberOption func(*memberOptions)

type memberOptions struct{ voterNow, force bool }

// VoterNow makes AddMember add a voter at once instead of a learner the
// leader promotes once it has caught up. The server refuses it unless the
// new member already answers on its peer port.
func VoterNow() MemberOption { return func(o *memberOptions) { o.voterNow = true } }

// Force lets RemoveMember remove a voter that leaves a single one.
func Force() MemberOption { return func(o *memberOptions) { o.force = true } }

func memberOpts(opts []MemberOption) memberOptions {
	var o memberOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

// AddMember adds a member; m's Id is ignored (the server derives it from
// the name). It is a write. Start the new server after the call returns.
// The member joins as a learner, and the leader makes it a voter once it
// has caught up; with m.Learner set it stays a learner until promoted
// (PromoteMember), and with VoterNow it is a voter at once.
func (c *Client) AddMember(ctx context.Context, m *lodestonepb.Member, opts ...MemberOption) (*lodestonepb.AddMemberResponse, error) {
	req := &lodestonepb.AddMemberRequest{
		Name:     m.GetName(),
		PeerAddr: m.GetPeerAddr(),
		GrpcAddr: m.GetGrpcAddr(),
		HttpAddr: m.GetHttpAddr(),
		Learner:  m.GetLearner(),
		VoterNow: memberOpts(opts).voterNow,
	}
	resp, err := invoke(ctx, c, callSpec{op: fmt.Sprintf("add member %q", m.GetName()), write: true},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.AddMemberResponse, error) {
			return lodestonepb.NewClusterClient(cc).AddMember(ctx, req)
		}, (*lodestonepb.AddMemberResponse).GetHeader)
	if err == nil {
		c.observeMembers(resp.GetHeader(), resp.GetMembers())
	}
	return resp, err
}

// RemoveMember removes the member ref names (see ByName, ByID). It is a
// write; an unknown member returns ErrNotFound. Removing a voter that
// leaves a single one needs Force.
func (c *Client) RemoveMember(ctx context.Context, ref *lodestonepb.MemberRef, opts ...MemberOption) (*lodestonepb.RemoveMemberResponse, error) {
	req := &lodestonepb.RemoveMemberRequest{Member: ref, Force: memberOpts(opts).force}
	resp, err := invoke(ctx, c, callSpec{op: "remove member " + refString(ref), write: true},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.RemoveMemberResponse, error) {
			return lodestonepb.NewClusterClient(cc).RemoveMember(ctx, req)
		}, (*lodestonepb.RemoveMemberResponse).GetHeader)
	if err == nil {
		c.observeMembers(resp.GetHeader(), resp.GetMembers())
	}
	return resp, err
}

// PromoteMember turns the learner ref names into a voter. It is a write.
func (c *Client) PromoteMember(ctx context.Context, ref *lodestonepb.MemberRef) (*lodestonepb.PromoteMemberResponse, error) {
	req := &lodestonepb.PromoteMemberRequest{Member: ref}
	resp, err := invoke(ctx, c, callSpec{op: "promote member " + refString(ref), write: true},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.PromoteMemberResponse, error) {
			return lodestonepb.NewClusterClient(cc).PromoteMember(ctx, req)
		}, (*lodestonepb.PromoteMemberResponse).GetHeader)
	if err == nil {
		c.observeMembers(resp.GetHeader(), resp.GetMembers())
	}
	return resp, err
}

// TransferLeader moves leadership to the voter to names; nil lets the
// server pick the most up-to-date voter. The answer's LeaderId is the new
// leader. It is treated as a write.
func (c *Client) TransferLeader(ctx context.Context, to *lodestonepb.MemberRef) (*lodestonepb.TransferLeaderResponse, error) {
	req := &lodestonepb.TransferLeaderRequest{To: to}
	op := "transfer leadership"
	if name := refString(to); name != "" {
		op += " to " + name
	}
	resp, err := invoke(ctx, c, callSpec{op: op, write: true},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.TransferLeaderResponse, error) {
			return lodestonepb.NewClusterClient(cc).TransferLeader(ctx, req)
		}, (*lodestonepb.TransferLeaderResponse).GetHeader)
	if err == nil && resp.GetLeaderId() != 0 {
		c.mu.Lock()
		c.book.leaderID = resp.GetLeaderId()
		c.mu.Unlock()
	}
	return resp, err
}

// Status returns one server's view of the cluster and of its Raft log.
// With endpoint "" any server answers (a read, with failover); otherwise
// exactly endpoint is asked, once, without failover, whether or not it is
// among the configured endpoints.
func (c *Client) Status(ctx context.Context, endpoint string) (*lodestonepb.StatusResponse, error) {
	resp, err := invoke(ctx, c, callSpec{op: "status", only: endpoint},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.StatusResponse, error) {
			return lodestonepb.NewClusterClient(cc).Status(ctx, &lodestonepb.StatusRequest{})
		}, (*lodestonepb.StatusResponse).GetHeader)
	if err == nil && resp.GetSelf() != nil {
		c.mu.Lock()
		c.book.observeMember(resp.GetSelf())
		c.mu.Unlock()
	}
	return resp, err
}
