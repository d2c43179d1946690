package client

import (
	"context"

	"google.golang.org/grpc"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// SetAdmission replicates an admission policy that every server enforces;
// a policy with Enabled false turns admission control off. It is a write.
// The Admin service is never gated by admission control itself.
func (c *Client) SetAdmission(ctx context.Context, p *lodestonepb.AdmissionPolicy) (*lodestonepb.SetAdmissionResponse, error) {
	return invoke(ctx, c, callSpec{op: "admission set", write: true},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.SetAdmissionResponse, error) {
			return lodestonepb.NewAdminClient(cc).SetAdmission(ctx, &lodestonepb.SetAdmissionRequest{Policy: p})
		}, func(*lodestonepb.SetAdmissionResponse) *lodestonepb.ResponseHeader { return nil })
}

// Admission returns the policy in force and the share of its limits the
// ramp allows now. It is a read.
func (c *Client) Admission(ctx context.Context) (*lodestonepb.GetAdmissionResponse, error) {
	return invoke(ctx, c, callSpec{op: "admission show"},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.GetAdmissionResponse, error) {
			return lodestonepb.NewAdminClient(cc).GetAdmission(ctx, &lodestonepb.GetAdmissionRequest{})
		}, func(*lodestonepb.GetAdmissionResponse) *lodestonepb.ResponseHeader { return nil })
}
