package client

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Catalog and health: the Catalog gRPC service. Writes (Register,
// Deregister, UpdateCheck) follow the write retry rules of the package
// doc; reads take the same ReadOptions as Get (Stale, WaitIndex). A read's
// Header.Index is the index of the data it read (Consul's X-Consul-Index):
// pass it to WaitIndex to block until that data changes.

func readSettingsOf(opts []ReadOption) readSettings {
	var s readSettings
	for _, o := range opts {
		o(&s)
	}
	return s
}

// Register upserts a node and, optionally, one service and checks on it
// (Consul's /v1/catalog/register). A node id owned by another node, a
// service or check on a missing node, or a check of a service not on the
// node fails with ErrCASFailed (FailedPrecondition) and changes nothing.
func (c *Client) Register(ctx context.Context, req *lodestonepb.CatalogRegisterRequest) (*lodestonepb.CatalogRegisterResponse, error) {
	return invoke(ctx, c, callSpec{op: fmt.Sprintf("register node %q", req.GetNode().GetName()), write: true},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.CatalogRegisterResponse, error) {
			return lodestonepb.NewCatalogClient(cc).Register(ctx, req)
		}, (*lodestonepb.CatalogRegisterResponse).GetHeader)
}

// Deregister removes a node with everything on it (serviceID and checkID
// empty), or one service with its checks, or one check. Missing things are
// not an error: the answer counts what was removed.
func (c *Client) Deregister(ctx context.Context, node, serviceID, checkID string) (*lodestonepb.CatalogDeregisterResponse, error) {
	req := &lodestonepb.CatalogDeregisterRequest{Node: node, ServiceId: serviceID, CheckId: checkID}
	return invoke(ctx, c, callSpec{op: fmt.Sprintf("deregister %q", node), write: true},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.CatalogDeregisterResponse, error) {
			return lodestonepb.NewCatalogClient(cc).Deregister(ctx, req)
		}, (*lodestonepb.CatalogDeregisterResponse).GetHeader)
}

// UpdateCheck records a check's status and output (an agent's
// transition). A missing check fails with ErrCASFailed.
func (c *Client) UpdateCheck(ctx context.Context, node, checkID string, status lodestonepb.HealthStatus, output string) (*lodestonepb.UpdateCheckResponse, error) {
	req := &lodestonepb.UpdateCheckRequest{Node: node, CheckId: checkID, Status: status, Output: output}
	return invoke(ctx, c, callSpec{op: fmt.Sprintf("update check %q on %q", checkID, node), write: true},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.UpdateCheckResponse, error) {
			return lodestonepb.NewCatalogClient(cc).UpdateCheck(ctx, req)
		}, (*lodestonepb.UpdateCheckResponse).GetHeader)
}

// Services lists every service name with the union of its tags.
func (c *Client) Services(ctx context.Context, opts ...ReadOption) (*lodestonepb.ServicesResponse, error) {
	s := readSettingsOf(opts)
	req := &lodestonepb.ServicesRequest{Consistency: s.consistency, WaitIndex: s.waitIndex, WaitMs: s.waitMS}
	return invoke(ctx, c, callSpec{op: "list services"},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.ServicesResponse, error) {
			return lodestonepb.NewCatalogClient(cc).Services(ctx, req)
		}, (*lodestonepb.ServicesResponse).GetHeader)
}

// Nodes lists every node.
func (c *Client) Nodes(ctx context.Context, opts ...ReadOption) (*lodestonepb.NodesResponse, error) {
	s := readSettingsOf(opts)
	req := &lodestonepb.NodesRequest{Consistency: s.consistency, WaitIndex: s.waitIndex, WaitMs: s.waitMS}
	return invoke(ctx, c, callSpec{op: "list nodes"},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.NodesResponse, error) {
			return lodestonepb.NewCatalogClient(cc).Nodes(ctx, req)
		}, (*lodestonepb.NodesResponse).GetHeader)
}

// Node reads one node with its services; the answer's Node is nil when
// it is not registered.
func (c *Client) Node(ctx context.Context, name string, opts ...ReadOption) (*lodestonepb.NodeResponse, error) {
	s := readSettingsOf(opts)
	req := &lodestonepb.NodeRequest{Name: name, Consistency: s.consistency, WaitIndex: s.waitIndex, WaitMs: s.waitMS}
	return invoke(ctx, c, callSpec{op: fmt.Sprintf("read node %q", name)},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.NodeResponse, error) {
			return lodestonepb.NewCatalogClient(cc).Node(ctx, req)
		}, (*lodestonepb.NodeResponse).GetHeader)
}

// HealthFilter narrows Health and ServiceInstances: instances carrying
// every one of Tags (case-insensitive), and with PassingOnly only those
// whose checks all pass (Consul's ?tag= and ?passing).
type HealthFilter struct {
	Tags        []string
	PassingOnly bool
}

// Health lists the instances of service name with their node, checks and
// aggregated status (Consul's /v1/health/service/:name).
func (c *Client) Health(ctx context.Context, name string, f HealthFilter, opts ...ReadOption) (*lodestonepb.HealthServiceResponse, error) {
	s := readSettingsOf(opts)
	req := &lodestonepb.HealthServiceRequest{Name: name, Tags: f.Tags, PassingOnly: f.PassingOnly,
		Consistency: s.consistency, WaitIndex: s.waitIndex, WaitMs: s.waitMS}
	return invoke(ctx, c, callSpec{op: fmt.Sprintf("health of %q", name)},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.HealthServiceResponse, error) {
			return lodestonepb.NewCatalogClient(cc).HealthService(ctx, req)
		}, (*lodestonepb.HealthServiceResponse).GetHeader)
}

// NodeChecks lists the checks of one node.
func (c *Client) NodeChecks(ctx context.Context, node string, opts ...ReadOption) (*lodestonepb.ChecksResponse, error) {
	s := readSettingsOf(opts)
	req := &lodestonepb.ChecksRequest{Node: node, Consistency: s.consistency, WaitIndex: s.waitIndex, WaitMs: s.waitMS}
	return c.checks(ctx, fmt.Sprintf("checks of node %q", node), req)
}

// ServiceChecks lists the service checks of every instance of service
// name (node-level checks excluded, as Consul's /v1/health/checks).
func (c *Client) ServiceChecks(ctx context.Context, name string, opts ...ReadOption) (*lodestonepb.ChecksResponse, error) {
	s := readSettingsOf(opts)
	req := &lodestonepb.ChecksRequest{ServiceName: name, Consistency: s.consistency, WaitIndex: s.waitIndex, WaitMs: s.waitMS}
	return c.checks(ctx, fmt.Sprintf("checks of service %q", name), req)
}

func (c *Client) checks(ctx context.Context, op string, req *lodestonepb.ChecksRequest) (*lodestonepb.ChecksResponse, error) {
	return invoke(ctx, c, callSpec{op: op},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.ChecksResponse, error) {
			return lodestonepb.NewCatalogClient(cc).Checks(ctx, req)
		}, (*lodestonepb.ChecksResponse).GetHeader)
}

// ChecksInState lists the checks in state (HEALTH_STATUS_UNSPECIFIED: all).
func (c *Client) ChecksInState(ctx context.Context, state lodestonepb.HealthStatus, opts ...ReadOption) (*lodestonepb.ChecksInStateResponse, error) {
	s := readSettingsOf(opts)
	req := &lodestonepb.ChecksInStateRequest{State: state, Consistency: s.consistency, WaitIndex: s.waitIndex, WaitMs: s.waitMS}
	return invoke(ctx, c, callSpec{op: "checks in state " + state.String()},
		func(ctx context.Context, cc *grpc.ClientConn) (*lodestonepb.ChecksInStateResponse, error) {
			return lodestonepb.NewCatalogClient(cc).ChecksInState(ctx, req)
		}, (*lodestonepb.ChecksInStateResponse).GetHeader)
}
