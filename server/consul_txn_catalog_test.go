package server

import (
	"strings"
	"testing"

	consul "github.com/hashicorp/consul/api"
)

// /v1/txn with Node, Service and Check operations through the official
// client: they apply with KV operations as one, and a failing one leaves
// everything as it was.
func TestConsulTxnCatalogOps(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	cl := consulClient(t, c, c.followersOf(lead)[0])
	ok, resp, _, err := cl.Txn().Txn(consul.TxnOps{
		{Node: &consul.NodeTxnOp{Verb: consul.NodeSet, Node: consul.Node{Node: "edge-1", Address: "10.0.0.1", Meta: map[string]string{"env": "prod"}}}},
		{Service: &consul.ServiceTxnOp{Verb: consul.ServiceSet, Node: "edge-1", Service: consul.AgentService{ID: "web-1", Service: "web", Port: 80, Tags: []string{"v1"}}}},
		{Check: &consul.CheckTxnOp{Verb: consul.CheckSet, Check: consul.HealthCheck{Node: "edge-1", CheckID: "web-1-alive", Name: "alive", ServiceID: "web-1", Status: consul.HealthPassing}}},
		{KV: &consul.KVTxnOp{Verb: consul.KVSet, Key: "cfg/web", Value: []byte("on")}},
		{Service: &consul.ServiceTxnOp{Verb: consul.ServiceGet, Node: "edge-1", Service: consul.AgentService{ID: "web-1"}}},
	}, nil)
	if err != nil || !ok || len(resp.Errors) != 0 || len(resp.Results) != 5 {
		t.Fatalf("txn: ok=%v %+v %v", ok, resp, err)
	}
	if n := resp.Results[0].Node; n == nil || n.Node != "edge-1" || n.Meta["env"] != "prod" {
		t.Errorf("node result %+v", n)
	}
	svc := resp.Results[4].Service
	if svc == nil || svc.ID != "web-1" || svc.Port != 80 || svc.ModifyIndex == 0 {
		t.Fatalf("service get result %+v", svc)
	}
	if ch := resp.Results[2].Check; ch == nil || ch.ServiceName != "web" || ch.Status != consul.HealthPassing {
		t.Errorf("check result %+v", ch)
	}
	entries, _, err := cl.Health().Service("web", "", true, nil)
	if err != nil || len(entries) != 1 || entries[0].Node.Meta["env"] != "prod" {
		t.Fatalf("passing web after the txn: %+v %v", entries, err)
	}

	// A CAS at the current index applies; a stale one fails the whole
	// transaction, KV operation included, with Consul's words.
	ok, resp, _, err = cl.Txn().Txn(consul.TxnOps{
		{Service: &consul.ServiceTxnOp{Verb: consul.ServiceCAS, Node: "edge-1", Service: consul.AgentService{ID: "web-1", Service: "web", Port: 81, ModifyIndex: svc.ModifyIndex}}},
	}, nil)
	if err != nil || !ok {
		t.Fatalf("cas at the current index: %v %+v %v", ok, resp, err)
	}
	ok, resp, _, err = cl.Txn().Txn(consul.TxnOps{
		{KV: &consul.KVTxnOp{Verb: consul.KVSet, Key: "cfg/web", Value: []byte("off")}},
		{Service: &consul.ServiceTxnOp{Verb: consul.ServiceCAS, Node: "edge-1", Service: consul.AgentService{ID: "web-1", Service: "web", Port: 82, ModifyIndex: svc.ModifyIndex}}},
	}, nil)
	if err != nil || ok || len(resp.Errors) != 1 || resp.Errors[0].OpIndex != 1 ||
		resp.Errors[0].What != `failed to set service "web-1" on node "edge-1", index is stale` {
		t.Fatalf("stale cas: ok=%v %+v %v", ok, resp, err)
	}
	if kv, _, _ := cl.KV().Get("cfg/web", nil); kv == nil || string(kv.Value) != "on" {
		t.Fatalf("cfg/web after a failed txn: %+v", kv)
	}
	if insts, _, _ := cl.Catalog().Service("web", "", nil); len(insts) != 1 || insts[0].ServicePort != 81 {
		t.Fatalf("web after a failed txn: %+v", insts)
	}
	// A service on a node that does not exist fails with the store's reason.
	ok, resp, _, err = cl.Txn().Txn(consul.TxnOps{
		{Service: &consul.ServiceTxnOp{Verb: consul.ServiceSet, Node: "nowhere", Service: consul.AgentService{ID: "x", Service: "x"}}},
	}, nil)
	if err != nil || ok || len(resp.Errors) != 1 || !strings.Contains(resp.Errors[0].What, "nowhere") {
		t.Fatalf("service on a missing node: ok=%v %+v %v", ok, resp, err)
	}
	// Deleting the node removes its services and checks.
	ok, resp, _, err = cl.Txn().Txn(consul.TxnOps{
		{Node: &consul.NodeTxnOp{Verb: consul.NodeDelete, Node: consul.Node{Node: "edge-1"}}},
	}, nil)
	if err != nil || !ok || len(resp.Results) != 0 {
		t.Fatalf("node delete: ok=%v %+v %v", ok, resp, err)
	}
	if insts, _, _ := cl.Catalog().Service("web", "", nil); len(insts) != 0 {
		t.Fatalf("web after its node was deleted: %+v", insts)
	}
}

// A catalog operation in a txn needs what the registration it amounts to
// needs: a token that may write keys but not the service is refused, and
// nothing of the txn applies.
func TestConsulTxnCatalogOpsNeedTheirPermission(t *testing.T) {
	c := newTestCluster(t, 1, withACLs)
	lead := c.waitLeader()
	boot, _, err := consulAs(t, c, lead, "").ACL().Bootstrap()
	if err != nil {
		t.Fatal(err)
	}
	mgmt := consulAs(t, c, lead, boot.SecretID)
	if _, err := mgmt.Catalog().Register(&consul.CatalogRegistration{Node: "edge-1", Address: "10.0.0.1"}, nil); err != nil {
		t.Fatal(err)
	}
	writer := consulAs(t, c, lead, tokenWith(t, mgmt, "kv-writer", `key_prefix "" { policy = "write" }
node_prefix "" { policy = "read" }`))
	_, _, _, err = writer.Txn().Txn(consul.TxnOps{
		{KV: &consul.KVTxnOp{Verb: consul.KVSet, Key: "cfg/web", Value: []byte("on")}},
		{Service: &consul.ServiceTxnOp{Verb: consul.ServiceSet, Node: "edge-1", Service: consul.AgentService{ID: "web-1", Service: "web"}}},
	}, nil)
	// NB: the client's Txn reports a refusal as "Failed request: <body>".
	if err == nil || !strings.Contains(err.Error(), "Permission denied") || !strings.Contains(err.Error(), "service:write") {
		t.Fatalf("txn with a service set without service:write: %v, want permission denied", err)
	}
	if kv, _, _ := mgmt.KV().Get("cfg/web", nil); kv != nil {
		t.Fatalf("a refused txn wrote %+v", kv)
	}
	if insts, _, _ := mgmt.Catalog().Service("web", "", nil); len(insts) != 0 {
		t.Fatalf("a refused txn registered %+v", insts)
	}
	_, _, _, err = writer.Txn().Txn(consul.TxnOps{{Node: &consul.NodeTxnOp{Verb: consul.NodeDelete, Node: consul.Node{Node: "edge-1"}}}}, nil)
	if err == nil || !strings.Contains(err.Error(), "Permission denied") || !strings.Contains(err.Error(), "node:write") {
		t.Fatalf("txn with a node delete without node:write: %v, want permission denied", err)
	}
	if nodes, _, _ := mgmt.Catalog().Nodes(nil); len(nodes) == 0 {
		t.Fatal("a refused txn deleted the node")
	}
}
