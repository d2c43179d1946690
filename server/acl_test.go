package server

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/token"
)

func withACLs(c *Config) { c.ACL = acl.Config{Enabled: true, DefaultPolicy: acl.AccessDeny} }

// consulAs is the official client on member name, sending secret.
func consulAs(t *testing.T, c *testCluster, name, secret string) *consul.Client {
	t.Helper()
	return newConsulClient(t, c, name, secret, func(tr http.RoundTripper) http.RoundTripper { return retryNoLeader{tr} })
}

// grpcAs dials member name's client port sending secret with every call.
func grpcAs(t *testing.T, c *testCluster, name, secret string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(c.servers[name].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(token.PerRPC(secret)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// tokenWith creates a policy from rules and a token linked to it.
func tokenWith(t *testing.T, mgmt *consul.Client, name, rules string) string {
	t.Helper()
	p, _, err := mgmt.ACL().PolicyCreate(&consul.ACLPolicy{Name: name, Rules: rules}, nil)
	if err != nil {
		t.Fatalf("create policy %s: %v", name, err)
	}
	tok, _, err := mgmt.ACL().TokenCreate(&consul.ACLToken{Description: name,
		Policies: []*consul.ACLTokenPolicyLink{{ID: p.ID}}}, nil)
	if err != nil {
		t.Fatalf("create token %s: %v", name, err)
	}
	return tok.SecretID
}

func wantDenied(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("%s: got %v, want 403", what, err)
	}
}

func wantGRPCDenied(t *testing.T, what string, err error) {
	t.Helper()
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("%s: got %v, want PermissionDenied", what, err)
	}
}

// TestACLDefaultDenyWithConsulClient is the acceptance run: a
// 3-member cluster with ACLs on and default deny, driven by the official
// Consul client and the native gRPC API. Every denial is followed by a
// read, with the management token, that shows nothing changed.
func TestACLDefaultDenyWithConsulClient(t *testing.T) {
	c := newTestCluster(t, 3, withACLs)
	n := c.names[0]
	anon := consulAs(t, c, n, "")

	// Before bootstrap nobody may do anything.
	_, err := anon.KV().Put(&consul.KVPair{Key: "app/x", Value: []byte("v")}, nil)
	wantDenied(t, "anonymous put", err)
	_, err = consulAs(t, c, n, "bogus-token").KV().Put(&consul.KVPair{Key: "app/db-password", Value: []byte("p")}, nil)
	if err == nil || !strings.Contains(err.Error(), "ACL not found") {
		t.Fatalf("bogus token put: got %v, want 403 ACL not found", err)
	}

	boot, _, err := anon.ACL().Bootstrap()
	if err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	mgmt := consulAs(t, c, n, boot.SecretID)
	if _, _, err := anon.ACL().Bootstrap(); err == nil {
		t.Fatal("a second bootstrap succeeded")
	}

	// The management token can do everything.
	for _, k := range []string{"app/a", "other/x", "secret/c"} {
		if _, err := mgmt.KV().Put(&consul.KVPair{Key: k, Value: []byte("orig")}, nil); err != nil {
			t.Fatalf("management put %s: %v", k, err)
		}
	}
	if _, err := mgmt.Catalog().Register(&consul.CatalogRegistration{Node: "db-node", Address: "10.0.0.9",
		Service: &consul.AgentService{ID: "db1", Service: "db", Port: 5432}}, nil); err != nil {
		t.Fatalf("management register: %v", err)
	}

	// The anonymous token still can do nothing, reads included.
	_, err = anon.KV().Put(&consul.KVPair{Key: "app/x", Value: []byte("v")}, nil)
	wantDenied(t, "anonymous put after bootstrap", err)
	if _, _, err := anon.KV().Get("app/a", nil); err == nil {
		t.Fatal("anonymous read a key")
	}
	if list, _, err := anon.KV().List("", nil); err != nil || len(list) != 0 {
		t.Fatalf("anonymous list: %d entries, err %v; want none", len(list), err)
	}
	if svcs, _, err := anon.Catalog().Services(nil); err != nil || len(svcs) != 0 {
		t.Fatalf("anonymous services: %v, err %v; want none", svcs, err)
	}

	// key_prefix "app/" write: app/x yes, other/x no and unchanged.
	appTok := tokenWith(t, mgmt, "app-write", `key_prefix "app/" { policy = "write" }`)
	app := consulAs(t, c, n, appTok)
	if _, err := app.KV().Put(&consul.KVPair{Key: "app/x", Value: []byte("mine")}, nil); err != nil {
		t.Fatalf("app token put app/x: %v", err)
	}
	_, err = app.KV().Put(&consul.KVPair{Key: "other/x", Value: []byte("theirs")}, nil)
	wantDenied(t, "app token put other/x", err)
	if !strings.Contains(err.Error(), "Permission denied") || !strings.Contains(err.Error(), "key:write") {
		t.Fatalf("denial does not name the permission: %v", err)
	}
	if kv, _, _ := mgmt.KV().Get("other/x", nil); kv == nil || string(kv.Value) != "orig" {
		t.Fatalf("other/x after a denied put: %+v", kv)
	}
	_, err = app.KV().DeleteTree("o", nil)
	wantDenied(t, "app token deletes the tree o*", err)
	// A list through it shows only what it may read.
	list, _, err := app.KV().List("", nil)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range list {
		keys = append(keys, kv.Key)
	}
	if strings.Join(keys, ",") != "app/a,app/x" {
		t.Fatalf("app token list: %v, want [app/a app/x]", keys)
	}
	// Holes: deregistering a node, destroying another's session.
	_, err = app.Catalog().Deregister(&consul.CatalogDeregistration{Node: "db-node"}, nil)
	wantDenied(t, "app token catalog deregister", err)
	if nodes, _, _ := mgmt.Catalog().Node("db-node", nil); nodes == nil {
		t.Fatal("db-node gone after a denied deregister")
	}

	// A service token registers its own service and not another.
	webTok := tokenWith(t, mgmt, "web", `service "web" { policy = "write" }`)
	web := consulAs(t, c, n, webTok)
	if err := web.Agent().ServiceRegister(&consul.AgentServiceRegistration{ID: "web1", Name: "web", Port: 80}); err != nil {
		t.Fatalf("web token registers web: %v", err)
	}
	wantDenied(t, "web token registers api", web.Agent().ServiceRegister(&consul.AgentServiceRegistration{ID: "api1", Name: "api", Port: 81}))
	if svcs, _, _ := mgmt.Catalog().Service("api", "", nil); len(svcs) != 0 {
		t.Fatalf("api registered by a denied request: %v", svcs)
	}

	// api.Lock with the session and key rights.
	lockTok := tokenWith(t, mgmt, "locker", `key_prefix "locks/" { policy = "write" }
session_prefix "" { policy = "write" }`)
	locker := consulAs(t, c, n, lockTok)
	lock, err := locker.LockKey("locks/leader")
	if err != nil {
		t.Fatal(err)
	}
	held, err := lock.Lock(nil)
	if err != nil || held == nil {
		t.Fatalf("lock with the locker token: %v", err)
	}
	sessions, _, err := mgmt.Session().List(nil)
	if err != nil || len(sessions) != 1 {
		t.Fatalf("sessions: %v, %v", sessions, err)
	}
	_, err = app.Session().Destroy(sessions[0].ID, nil)
	wantDenied(t, "app token destroys the locker's session", err)
	if kv, _, _ := mgmt.KV().Get("locks/leader", nil); kv == nil || kv.Session != sessions[0].ID {
		t.Fatalf("lock lost after a denied session destroy: %+v", kv)
	}
	if err := lock.Unlock(); err != nil {
		t.Fatalf("unlock: %v", err)
	}

	// The native API: privileged operations need operator or acl rights.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	appConn := grpcAs(t, c, n, appTok)
	_, err = lodestonepb.NewAdminClient(appConn).SetAdmission(ctx, &lodestonepb.SetAdmissionRequest{Policy: &lodestonepb.AdmissionPolicy{Enabled: true, Writes: 1}})
	wantGRPCDenied(t, "admission set", err)
	if p, _ := c.servers[n].Store().Admission(); p != nil && p.Enabled {
		t.Fatal("admission policy set by a denied request")
	}
	_, err = lodestonepb.NewClusterClient(appConn).AddMember(ctx, &lodestonepb.AddMemberRequest{Name: "evil", PeerAddr: "127.0.0.1:1"})
	wantGRPCDenied(t, "member add", err)
	if got := len(c.servers[n].Store().Members()); got != 3 {
		t.Fatalf("members after a denied add: %d", got)
	}
	snap, err := lodestonepb.NewAdminClient(appConn).SaveSnapshot(ctx, &lodestonepb.SaveSnapshotRequest{})
	if err == nil {
		_, err = snap.Recv()
	}
	wantGRPCDenied(t, "snapshot save", err)
	_, err = lodestonepb.NewKVClient(grpcAs(t, c, n, "bogus-token")).Put(ctx, &lodestonepb.PutRequest{Key: []byte("app/y"), Value: []byte("v")})
	wantGRPCDenied(t, "bogus token gRPC put", err)
	if _, err := lodestonepb.NewKVClient(appConn).Put(ctx, &lodestonepb.PutRequest{Key: []byte("app/y"), Value: []byte("v")}); err != nil {
		t.Fatalf("app token gRPC put app/y: %v", err)
	}
	mgmtConn := grpcAs(t, c, n, boot.SecretID)
	snap, err = lodestonepb.NewAdminClient(mgmtConn).SaveSnapshot(ctx, &lodestonepb.SaveSnapshotRequest{})
	if err == nil {
		_, err = snap.Recv()
	}
	if err != nil {
		t.Fatalf("management snapshot save: %v", err)
	}

	// A follower resolves the same tokens once it has applied them.
	f := c.names[1]
	waitFor(t, 5*time.Second, func() bool {
		_, err := consulAs(t, c, f, appTok).KV().Put(&consul.KVPair{Key: "app/z", Value: []byte("v")}, nil)
		return err == nil
	})
	_, err = consulAs(t, c, f, appTok).KV().Put(&consul.KVPair{Key: "other/z", Value: []byte("v")}, nil)
	wantDenied(t, "app token put other/z on a follower", err)
}

// TestEveryRPCHasAnACLRule keeps the door closed by default: every method
// of every client-facing service has a rule or a stream case, so a new RPC
// cannot go out unguarded by accident.
func TestEveryRPCHasAnACLRule(t *testing.T) {
	streams := map[string]bool{lodestonepb.Watch_Watch_FullMethodName: true, lodestonepb.Admin_SaveSnapshot_FullMethodName: true,
		lodestonepb.KV_GetStream_FullMethodName: true}
	for _, sd := range []grpc.ServiceDesc{lodestonepb.KV_ServiceDesc, lodestonepb.Cluster_ServiceDesc, lodestonepb.Watch_ServiceDesc,
		lodestonepb.Admin_ServiceDesc, lodestonepb.Catalog_ServiceDesc, lodestonepb.Session_ServiceDesc} {
		for _, m := range sd.Methods {
			if name := "/" + sd.ServiceName + "/" + m.MethodName; !hasRule(name) {
				t.Errorf("%s has no ACL rule", name)
			}
		}
		for _, s := range sd.Streams {
			if name := "/" + sd.ServiceName + "/" + s.StreamName; !streams[name] {
				t.Errorf("stream %s has no ACL case", name)
			}
		}
	}
}

func hasRule(name string) bool {
	_, ok := grpcRules[name]
	return ok
}
