package server

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// oneTokenSource is an acl.Source holding one token with one policy.
type oneTokenSource struct {
	tok *acl.Token
	pol *acl.Policy
}

func (s oneTokenSource) ACLIndex() uint64 { return 1 }
func (s oneTokenSource) TokenBySecret(secret string) (*acl.Token, bool) {
	return s.tok, secret == s.tok.SecretId
}
func (s oneTokenSource) Policy(id string) (*acl.Policy, bool) { return s.pol, id == s.pol.Id }
func (oneTokenSource) Role(string) (*acl.Role, bool)          { return nil, false }

// BenchmarkAuthzUnaryPut is what the gRPC door adds to every put with ACLs
// on (default deny), as kvbench's secure runs exercise it: the token from
// the call's metadata, its cached Authorizer, the Put rule, and a handler
// that does nothing.
func BenchmarkAuthzUnaryPut(b *testing.B) {
	const secret = "8f1e4c2a-5b6d-4e7f-9a0b-1c2d3e4f5a6b"
	src := oneTokenSource{
		tok: &acl.Token{AccessorId: "a1", SecretId: secret, Policies: []*acl.Link{{Id: "p1"}}},
		pol: &acl.Policy{Id: "p1", Name: "kvbench", Rules: `key_prefix "kvbench/" { policy = "write" }`},
	}
	z := newAuthz(acl.NewResolver(src, acl.Config{Enabled: true, DefaultPolicy: acl.AccessDeny}), nil,
		func(context.Context) error { return nil }, prometheus.NewRegistry())
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(
		":authority", "127.0.0.1:8502", "content-type", "application/grpc", "user-agent", "grpc-go/1.85.0",
		"x-consul-token", secret))
	req := &lodestonepb.PutRequest{Key: []byte("kvbench/017/000012345"), Value: make([]byte, 256)}
	info := &grpc.UnaryServerInfo{FullMethod: lodestonepb.KV_Put_FullMethodName}
	resp := &lodestonepb.PutResponse{}
	handler := func(context.Context, any) (any, error) { return resp, nil }
	b.ReportAllocs()
	for b.Loop() {
		if _, err := z.unary(ctx, req, info, handler); err != nil {
			b.Fatal(err)
		}
	}
}
