package server

import (
	"context"
	"errors"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/rpcstatus"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/store"
)

// blockingRead waits, for a read with a wait index, until what it depends
// on changes after it (or the wait elapses), then makes the read
// linearizable unless it asked for stale.
func (s *core) blockingRead(ctx context.Context, d consulapi.Dep, c lodestonepb.Consistency, waitIndex uint64, waitMS uint32) error {
	wait := time.Duration(waitMS) * time.Millisecond
	if wait <= 0 || wait > s.cfg.MaxBlockingWait {
		wait = s.cfg.MaxBlockingWait
	}
	if waitIndex != 0 {
		g := s.sessionMetrics.blocking.WithLabelValues("grpc")
		g.Inc()
		defer g.Dec()
	}
	if err := consulapi.Block(ctx, s.hub, s.store, d, waitIndex, wait); err != nil {
		if errors.Is(err, consulapi.ErrBadWait) {
			return rpcstatus.Invalidf("blocking read: %v", err)
		}
		return rpcstatus.Of(err)
	}
	return rpcstatus.Of(s.read(ctx, c))
}

// catalogService serves the Catalog gRPC API with the store's (Consul's)
// semantics. Reads report in header.index the index of the data they
// depend on (Consul's X-Consul-Index): pass it back as wait_index to block
// until that data changes.
type catalogService struct {
	lodestonepb.UnimplementedCatalogServer
	s *core
}

func (c *catalogService) Register(ctx context.Context, req *lodestonepb.CatalogRegisterRequest) (*lodestonepb.CatalogRegisterResponse, error) {
	_, index, err := c.s.write(ctx, &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: req}})
	if err != nil {
		return nil, rejectedStatus(err)
	}
	return &lodestonepb.CatalogRegisterResponse{Header: c.s.header(index)}, nil
}

func (c *catalogService) Deregister(ctx context.Context, req *lodestonepb.CatalogDeregisterRequest) (*lodestonepb.CatalogDeregisterResponse, error) {
	res, index, err := c.s.write(ctx, &lodestonepb.Command{Op: &lodestonepb.Command_CatalogDeregister{CatalogDeregister: req}})
	if err != nil {
		return nil, rejectedStatus(err)
	}
	out := res.GetCatalogDeregister()
	if out == nil {
		out = &lodestonepb.CatalogDeregisterResponse{}
	}
	out.Header = c.s.header(index)
	return out, nil
}

func (c *catalogService) UpdateCheck(ctx context.Context, req *lodestonepb.UpdateCheckRequest) (*lodestonepb.UpdateCheckResponse, error) {
	res, index, err := c.s.write(ctx, &lodestonepb.Command{Op: &lodestonepb.Command_CheckUpdate{CheckUpdate: req}})
	if err != nil {
		return nil, rejectedStatus(err)
	}
	out := res.GetCheckUpdate()
	if out == nil {
		out = &lodestonepb.UpdateCheckResponse{}
	}
	out.Header = c.s.header(index)
	return out, nil
}

func (c *catalogService) header(m store.QueryMeta) *lodestonepb.ResponseHeader {
	return c.s.header(m.Index)
}

func (c *catalogService) Services(ctx context.Context, req *lodestonepb.ServicesRequest) (*lodestonepb.ServicesResponse, error) {
	if err := c.s.blockingRead(ctx, consulapi.ServicesDep(), req.Consistency, req.WaitIndex, req.WaitMs); err != nil {
		return nil, err
	}
	svcs, m := c.s.store.Services()
	return &lodestonepb.ServicesResponse{Header: c.header(m), Services: svcs}, nil
}

func (c *catalogService) Service(ctx context.Context, req *lodestonepb.ServiceRequest) (*lodestonepb.ServiceResponse, error) {
	if req.Name == "" {
		return nil, rpcstatus.Invalidf("service name is empty; name the service to list")
	}
	if err := c.s.blockingRead(ctx, consulapi.ServiceDep(req.Name), req.Consistency, req.WaitIndex, req.WaitMs); err != nil {
		return nil, err
	}
	insts, m := c.s.store.ServiceInstances(req.Name, req.Tags, req.PassingOnly)
	return &lodestonepb.ServiceResponse{Header: c.header(m), Instances: insts}, nil
}

func (c *catalogService) Nodes(ctx context.Context, req *lodestonepb.NodesRequest) (*lodestonepb.NodesResponse, error) {
	if err := c.s.blockingRead(ctx, consulapi.NodesDep(), req.Consistency, req.WaitIndex, req.WaitMs); err != nil {
		return nil, err
	}
	nodes, m := c.s.store.Nodes()
	return &lodestonepb.NodesResponse{Header: c.header(m), Nodes: nodes}, nil
}

func (c *catalogService) Node(ctx context.Context, req *lodestonepb.NodeRequest) (*lodestonepb.NodeResponse, error) {
	if req.Name == "" {
		return nil, rpcstatus.Invalidf("node name is empty; name the node to read")
	}
	if err := c.s.blockingRead(ctx, consulapi.NodeDep(req.Name), req.Consistency, req.WaitIndex, req.WaitMs); err != nil {
		return nil, err
	}
	ns, m := c.s.store.Node(req.Name)
	return &lodestonepb.NodeResponse{Header: c.header(m), Node: ns}, nil
}

func (c *catalogService) Checks(ctx context.Context, req *lodestonepb.ChecksRequest) (*lodestonepb.ChecksResponse, error) {
	if (req.Node == "") == (req.ServiceName == "") {
		return nil, rpcstatus.Invalidf("set exactly one of node and service_name")
	}
	d := consulapi.NodeDep(req.Node)
	if req.ServiceName != "" {
		d = consulapi.ServiceDep(req.ServiceName)
	}
	if err := c.s.blockingRead(ctx, d, req.Consistency, req.WaitIndex, req.WaitMs); err != nil {
		return nil, err
	}
	var checks []*lodestonepb.Check
	var m store.QueryMeta
	if req.Node != "" {
		checks, m = c.s.store.NodeChecks(req.Node)
	} else {
		checks, m = c.s.store.ServiceChecks(req.ServiceName)
	}
	return &lodestonepb.ChecksResponse{Header: c.header(m), Checks: checks}, nil
}

func (c *catalogService) HealthService(ctx context.Context, req *lodestonepb.HealthServiceRequest) (*lodestonepb.HealthServiceResponse, error) {
	if req.Name == "" {
		return nil, rpcstatus.Invalidf("service name is empty; name the service to read")
	}
	if err := c.s.blockingRead(ctx, consulapi.ServiceDep(req.Name), req.Consistency, req.WaitIndex, req.WaitMs); err != nil {
		return nil, err
	}
	hs, m := c.s.store.HealthService(req.Name, req.Tags, req.PassingOnly)
	return &lodestonepb.HealthServiceResponse{Header: c.header(m), Instances: hs}, nil
}

func (c *catalogService) ChecksInState(ctx context.Context, req *lodestonepb.ChecksInStateRequest) (*lodestonepb.ChecksInStateResponse, error) {
	if _, ok := lodestonepb.HealthStatus_name[int32(req.State)]; !ok {
		return nil, rpcstatus.Invalidf("unknown health state %d; use passing, warning, critical or unspecified (any)", req.State)
	}
	if err := c.s.blockingRead(ctx, consulapi.ChecksDep(), req.Consistency, req.WaitIndex, req.WaitMs); err != nil {
		return nil, err
	}
	checks, m := c.s.store.ChecksInState(req.State)
	return &lodestonepb.ChecksInStateResponse{Header: c.header(m), Checks: checks}, nil
}
