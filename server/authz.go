package server

import (
	"context"
	"errors"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/token"
)

// authz is the native API's door: every gRPC call resolves its token and
// passes its method's rule (grpcRules) before the service sees it, and the
// reads that Consul filters are filtered on the way out. A method with no
// rule is refused, so a new RPC is closed until someone decides who may
// call it.
type authz struct {
	resolver *acl.Resolver
	catalog  acl.Catalog
	denied   *prometheus.CounterVec
	// catchUp brings this member to what the leader has committed, for
	// acl.Recheck.
	catchUp func(context.Context) error
}

func newAuthz(resolver *acl.Resolver, st acl.Catalog, catchUp func(context.Context) error, reg prometheus.Registerer) *authz {
	z := &authz{resolver: resolver, catalog: st, catchUp: catchUp, denied: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lodestone_acl_denied_total",
		Help: "Requests refused by ACLs, by API (grpc, http) and reason (permission, token).",
	}, []string{"api", "reason"})}
	reg.MustRegister(z.denied)
	return z
}

// authorize resolves the secret; a secret nobody issued (after catching
// up, acl.Recheck) is a denial.
func (z *authz) authorize(ctx context.Context, api, secret string) (*acl.Authorizer, error) {
	var a *acl.Authorizer
	err := acl.Recheck(ctx, z.catchUp, func() (err error) {
		a, err = z.resolver.Resolve(secret)
		return err
	})
	if err != nil {
		z.denied.WithLabelValues(api, "token").Inc()
		return nil, err
	}
	return a, nil
}

// deniedStatus turns an ACL error into the gRPC status clients see.
func deniedStatus(err error) error {
	var de *acl.DeniedError
	if errors.As(err, &de) || errors.Is(err, acl.ErrNotFound) {
		return status.Error(codes.PermissionDenied, err.Error())
	}
	return err
}

func (z *authz) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !z.resolver.Enabled() {
		return handler(ctx, req)
	}
	a, err := z.authorize(ctx, "grpc", token.FromContext(ctx))
	if err != nil {
		return nil, deniedStatus(err)
	}
	rule, ok := grpcRules[info.FullMethod]
	if !ok {
		z.denied.WithLabelValues("grpc", "permission").Inc()
		return nil, status.Errorf(codes.PermissionDenied, "Permission denied: %s has no ACL rule, so no token may call it", info.FullMethod)
	}
	if rule.check != nil {
		if err := acl.Recheck(ctx, z.catchUp, func() error { return rule.check(z, a, req) }); err != nil {
			z.denied.WithLabelValues("grpc", "permission").Inc()
			return nil, deniedStatus(err)
		}
	}
	resp, err := handler(ctx, req)
	if err == nil && rule.filter != nil {
		rule.filter(a, req, resp)
	}
	return resp, err
}

func (z *authz) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !z.resolver.Enabled() {
		return handler(srv, ss)
	}
	a, err := z.authorize(ss.Context(), "grpc", token.FromContext(ss.Context()))
	if err != nil {
		return deniedStatus(err)
	}
	switch info.FullMethod {
	case lodestonepb.Watch_Watch_FullMethodName:
		return handler(srv, &watchAuthz{ServerStream: ss, z: z, a: a})
	case lodestonepb.KV_GetStream_FullMethodName:
		return handler(srv, &getStreamAuthz{ServerStream: ss, z: z, secret: token.FromContext(ss.Context())})
	case lodestonepb.Admin_SaveSnapshot_FullMethodName:
		// The snapshot holds every secret, ACL tokens included: only a
		// token that may manage ACLs may copy it.
		if err := acl.Recheck(ss.Context(), z.catchUp, func() error { return a.Check(acl.ResourceACL, "", acl.AccessWrite) }); err != nil {
			z.denied.WithLabelValues("grpc", "permission").Inc()
			return deniedStatus(err)
		}
		return handler(srv, ss)
	}
	z.denied.WithLabelValues("grpc", "permission").Inc()
	return status.Errorf(codes.PermissionDenied, "Permission denied: %s has no ACL rule, so no token may call it", info.FullMethod)
}

// getStreamAuthz authorizes each request of a GetStream as the unary
// interceptor does a GetMany's: the token is resolved again for every
// request, so a stream keeps no right its token lost since it opened, and
// the keys it may not read are answered unserved (GetMany's filter).
// NB: GetStream answers its requests one at a time and in order, so the
// response sent is always that of the request received last.
type getStreamAuthz struct {
	grpc.ServerStream
	z      *authz
	secret string

	a   *acl.Authorizer
	req any
}

func (g *getStreamAuthz) RecvMsg(m any) error {
	if err := g.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	a, err := g.z.authorize(g.Context(), "grpc", g.secret)
	if err != nil {
		return streamRefusal{deniedStatus(err)}
	}
	g.a, g.req = a, m
	return nil
}

func (g *getStreamAuthz) SendMsg(m any) error {
	grpcRules[lodestonepb.KV_GetMany_FullMethodName].filter(g.a, g.req, m)
	return g.ServerStream.SendMsg(m)
}

// watchAuthz checks each watch a stream creates (acl.CheckWatch).
type watchAuthz struct {
	grpc.ServerStream
	z *authz
	a *acl.Authorizer
}

func (w *watchAuthz) RecvMsg(m any) error {
	if err := w.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	c := m.(*lodestonepb.WatchRequest).GetCreate()
	if c == nil {
		return nil
	}
	if err := acl.Recheck(w.Context(), w.z.catchUp, func() error { return acl.CheckWatch(w.a, c) }); err != nil {
		w.z.denied.WithLabelValues("grpc", "permission").Inc()
		return deniedStatus(err)
	}
	return nil
}

// grpcRule is what one method needs: check runs before the service,
// filter trims what the token may not see from a successful answer to req.
type grpcRule struct {
	check  func(z *authz, a *acl.Authorizer, req any) error
	filter func(a *acl.Authorizer, req, resp any)
}

// open methods reveal nothing a token guards: Status and Members give the
// addresses clients need to find the leader (Consul's /v1/status/*).
var open = grpcRule{}

func need(res acl.Resource, want acl.Access) grpcRule {
	return grpcRule{check: func(_ *authz, a *acl.Authorizer, _ any) error { return a.Check(res, "", want) }}
}

// write is the rule of a method whose request is a Command's op: the
// write rules of acl.CheckCommand, the same the HTTP API applies.
func write(op func(req any) *lodestonepb.Command) grpcRule {
	return grpcRule{check: func(z *authz, a *acl.Authorizer, req any) error {
		return acl.CheckCommand(a, z.catalog, op(req))
	}}
}

var grpcRules = map[string]grpcRule{
	lodestonepb.KV_Get_FullMethodName: {check: func(_ *authz, a *acl.Authorizer, req any) error {
		return acl.CheckKey(a, req.(*lodestonepb.GetRequest).Key, acl.AccessRead)
	}},
	// NB: a key the token may not read is answered unserved, not denied,
	// so one caller's key does not fail the Gets coalesced with it; the
	// client's Get of it alone is then denied (and counted) as any Get.
	lodestonepb.KV_GetMany_FullMethodName: {filter: func(a *acl.Authorizer, req, resp any) {
		keys := req.(*lodestonepb.GetManyRequest).Keys
		for i, r := range resp.(*lodestonepb.GetManyResponse).Results {
			if r.Served && acl.CheckKey(a, keys[i], acl.AccessRead) != nil {
				r.Served, r.Kv = false, nil
			}
		}
	}},
	lodestonepb.KV_Range_FullMethodName: {filter: func(a *acl.Authorizer, _, resp any) {
		r := resp.(*lodestonepb.RangeResponse)
		r.Kvs = acl.FilterKVs(a, r.Kvs)
	}},
	// NB: the KV writes, the busiest calls, check their request as
	// acl.CheckCommand would its Command, without wrapping it in one.
	lodestonepb.KV_Put_FullMethodName: {check: func(_ *authz, a *acl.Authorizer, req any) error {
		return acl.CheckPut(a, req.(*lodestonepb.PutRequest))
	}},
	lodestonepb.KV_Delete_FullMethodName: {check: func(_ *authz, a *acl.Authorizer, req any) error {
		return acl.CheckDelete(a, req.(*lodestonepb.DeleteRequest))
	}},
	lodestonepb.KV_Txn_FullMethodName: {check: func(_ *authz, a *acl.Authorizer, req any) error {
		return acl.CheckTxn(a, req.(*lodestonepb.TxnRequest))
	}},

	lodestonepb.Catalog_Register_FullMethodName: write(func(req any) *lodestonepb.Command {
		return &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: req.(*lodestonepb.CatalogRegisterRequest)}}
	}),
	lodestonepb.Catalog_Deregister_FullMethodName: write(func(req any) *lodestonepb.Command {
		return &lodestonepb.Command{Op: &lodestonepb.Command_CatalogDeregister{CatalogDeregister: req.(*lodestonepb.CatalogDeregisterRequest)}}
	}),
	lodestonepb.Catalog_UpdateCheck_FullMethodName: write(func(req any) *lodestonepb.Command {
		return &lodestonepb.Command{Op: &lodestonepb.Command_CheckUpdate{CheckUpdate: req.(*lodestonepb.UpdateCheckRequest)}}
	}),
	lodestonepb.Catalog_Services_FullMethodName: {filter: func(a *acl.Authorizer, _, resp any) {
		r := resp.(*lodestonepb.ServicesResponse)
		r.Services = acl.FilterServices(a, r.Services)
	}},
	lodestonepb.Catalog_Service_FullMethodName: {
		check: func(_ *authz, a *acl.Authorizer, req any) error {
			return a.Check(acl.ResourceService, req.(*lodestonepb.ServiceRequest).Name, acl.AccessRead)
		},
		filter: func(a *acl.Authorizer, _, resp any) {
			r := resp.(*lodestonepb.ServiceResponse)
			r.Instances = acl.FilterInstances(a, r.Instances)
		},
	},
	lodestonepb.Catalog_HealthService_FullMethodName: {
		check: func(_ *authz, a *acl.Authorizer, req any) error {
			return a.Check(acl.ResourceService, req.(*lodestonepb.HealthServiceRequest).Name, acl.AccessRead)
		},
		filter: func(a *acl.Authorizer, _, resp any) {
			r := resp.(*lodestonepb.HealthServiceResponse)
			r.Instances = acl.FilterHealth(a, r.Instances)
		},
	},
	lodestonepb.Catalog_Nodes_FullMethodName: {filter: func(a *acl.Authorizer, _, resp any) {
		r := resp.(*lodestonepb.NodesResponse)
		r.Nodes = acl.FilterNodes(a, r.Nodes)
	}},
	lodestonepb.Catalog_Node_FullMethodName: {
		check: func(_ *authz, a *acl.Authorizer, req any) error {
			return a.Check(acl.ResourceNode, req.(*lodestonepb.NodeRequest).Name, acl.AccessRead)
		},
		filter: func(a *acl.Authorizer, _, resp any) {
			r := resp.(*lodestonepb.NodeResponse)
			if r.Node != nil {
				// NB: a new message: the stored one is shared and immutable.
				r.Node = &lodestonepb.NodeServices{Node: r.Node.Node, Services: acl.FilterNodeServices(a, r.Node.Services)}
			}
		},
	},
	lodestonepb.Catalog_Checks_FullMethodName: {filter: func(a *acl.Authorizer, _, resp any) {
		r := resp.(*lodestonepb.ChecksResponse)
		r.Checks = acl.FilterChecks(a, r.Checks)
	}},
	lodestonepb.Catalog_ChecksInState_FullMethodName: {filter: func(a *acl.Authorizer, _, resp any) {
		r := resp.(*lodestonepb.ChecksInStateResponse)
		r.Checks = acl.FilterChecks(a, r.Checks)
	}},

	lodestonepb.Session_Create_FullMethodName: write(func(req any) *lodestonepb.Command {
		return &lodestonepb.Command{Op: &lodestonepb.Command_SessionCreate{SessionCreate: req.(*lodestonepb.CreateSessionRequest)}}
	}),
	lodestonepb.Session_Destroy_FullMethodName: write(func(req any) *lodestonepb.Command {
		return &lodestonepb.Command{Op: &lodestonepb.Command_SessionDestroy{SessionDestroy: req.(*lodestonepb.DestroySessionRequest)}}
	}),
	lodestonepb.Session_Renew_FullMethodName: write(func(req any) *lodestonepb.Command {
		return &lodestonepb.Command{Op: &lodestonepb.Command_SessionRenew{SessionRenew: req.(*lodestonepb.RenewSessionRequest)}}
	}),
	lodestonepb.Session_Info_FullMethodName: {filter: func(a *acl.Authorizer, _, resp any) {
		r := resp.(*lodestonepb.SessionInfoResponse)
		if r.Session != nil && !a.Allowed(acl.ResourceSession, r.Session.Node, acl.AccessRead) {
			r.Session = nil
		}
	}},
	lodestonepb.Session_List_FullMethodName:     {filter: filterSessions},
	lodestonepb.Session_ListNode_FullMethodName: {filter: filterSessions},

	lodestonepb.Cluster_Members_FullMethodName:        open,
	lodestonepb.Cluster_Status_FullMethodName:         open,
	lodestonepb.Cluster_AddMember_FullMethodName:      need(acl.ResourceOperator, acl.AccessWrite),
	lodestonepb.Cluster_RemoveMember_FullMethodName:   need(acl.ResourceOperator, acl.AccessWrite),
	lodestonepb.Cluster_PromoteMember_FullMethodName:  need(acl.ResourceOperator, acl.AccessWrite),
	lodestonepb.Cluster_TransferLeader_FullMethodName: need(acl.ResourceOperator, acl.AccessWrite),

	lodestonepb.Admin_SetAdmission_FullMethodName: need(acl.ResourceOperator, acl.AccessWrite),
	lodestonepb.Admin_GetAdmission_FullMethodName: need(acl.ResourceOperator, acl.AccessRead),
}

func filterSessions(a *acl.Authorizer, _, resp any) {
	r := resp.(*lodestonepb.ListSessionsResponse)
	r.Sessions = acl.FilterSessions(a, r.Sessions)
}

// guard wraps an HTTP handler of the server's own (pprof, fault hooks) so
// it runs only for a token allowed want on res.
func (z *authz) guard(res acl.Resource, want acl.Access, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if z.resolver.Enabled() {
			a, err := z.authorize(r.Context(), "http", token.FromRequest(r))
			if err == nil {
				err = a.Check(res, "", want)
				if err != nil {
					z.denied.WithLabelValues("http", "permission").Inc()
				}
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusForbidden)
				return
			}
		}
		h(w, r)
	}
}
