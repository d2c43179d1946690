package server

import (
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
)

// The operator endpoints through the official client: the Raft
// configuration, autopilot's view of member health, and removing a peer
// by address and by id with Consul's refusals.
func TestConsulOperatorRaftAndAutopilot(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	cl := consulClient(t, c, lead)

	conf, err := cl.Operator().RaftGetConfiguration(nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	leaders := 0
	for _, s := range conf.Servers {
		names = append(names, s.Node)
		if !s.Voter || s.ProtocolVersion != "3" || s.Address != c.peers[s.Node] || s.ID != raftID(c.servers[s.Node].ID()) {
			t.Errorf("server %+v: want a voter at %s with id %s", s, c.peers[s.Node], raftID(c.servers[s.Node].ID()))
		}
		if s.Leader {
			leaders++
			if s.Node != lead {
				t.Errorf("leader reported as %s, want %s", s.Node, lead)
			}
		}
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "n1,n2,n3" || leaders != 1 || conf.Index == 0 {
		t.Fatalf("configuration %v with %d leaders at index %d, want n1..n3, one leader", names, leaders, conf.Index)
	}

	// Every member answers heartbeats: healthy, one failure tolerated.
	var health *consul.OperatorHealthReply
	waitFor(t, 10*time.Second, func() bool {
		health, err = cl.Operator().AutopilotServerHealth(nil)
		return err == nil && health.Healthy
	})
	if health.FailureTolerance != 1 || len(health.Servers) != 3 {
		t.Fatalf("health %+v, want 3 servers and a failure tolerance of 1", health)
	}
	for _, s := range health.Servers {
		if !s.Healthy || s.SerfStatus != "alive" || s.LastContact == nil || *s.LastContact > consul.ReadableDuration(time.Second) || s.StableSince.IsZero() {
			t.Errorf("server health %+v, want healthy and heard within a second", s)
		}
		if s.Name == lead && (!s.Leader || s.LastIndex == 0 || s.LastTerm == 0) {
			t.Errorf("leader's health %+v, want Leader with its index and term", s)
		}
	}
	state, err := cl.Operator().AutopilotState(nil)
	if err != nil || !state.Healthy || len(state.Voters) != 3 || state.Leader != raftID(c.servers[lead].ID()) ||
		state.Servers[state.Leader].Status != consul.AutopilotServerLeader || state.OptimisticFailureTolerance != 1 {
		t.Fatalf("autopilot state %+v %v", state, err)
	}

	// A stopped member is unhealthy: the health endpoint answers 429.
	followers := c.followersOf(lead)
	down := followers[0]
	c.stop(down)
	waitFor(t, 10*time.Second, func() bool {
		health, err = cl.Operator().AutopilotServerHealth(nil)
		return err == nil && !health.Healthy
	})
	if health.FailureTolerance != 0 {
		t.Fatalf("with a member down: failure tolerance %d, want 0", health.FailureTolerance)
	}
	resp, err := http.Get("http://" + c.servers[lead].HTTPAddr() + "/v1/operator/autopilot/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("unhealthy autopilot health: %d, want 429", resp.StatusCode)
	}

	// Remove the stopped member by its peer address. NB: the strict
	// reconfiguration check wants the remaining follower heard within a
	// few heartbeats; on a loaded machine a beat can be late, which the
	// refusal says, so that refusal is retried.
	var rmErr error
	waitFor(t, 10*time.Second, func() bool {
		rmErr = cl.Operator().RaftRemovePeerByAddress(c.peers[down], nil)
		return rmErr == nil || !strings.Contains(rmErr.Error(), "reachable")
	})
	if rmErr != nil {
		t.Fatalf("remove %s by address: %v", down, rmErr)
	}
	conf, err = cl.Operator().RaftGetConfiguration(nil)
	if err != nil || len(conf.Servers) != 2 {
		t.Fatalf("after removal: %+v %v, want 2 servers", conf, err)
	}
	// Consul's answers for a peer it does not know and for a bad request.
	err = cl.Operator().RaftRemovePeerByID("0123abcd", nil)
	if err == nil || !strings.Contains(err.Error(), "500") || !strings.Contains(err.Error(), `id "0123abcd" was not found in the Raft configuration`) {
		t.Fatalf("remove an unknown id: %v", err)
	}
	err = cl.Operator().RaftRemovePeerByAddress(c.peers[down], nil)
	if err == nil || !strings.Contains(err.Error(), "was not found in the Raft configuration") {
		t.Fatalf("remove a removed address: %v", err)
	}
	for _, query := range []string{"", "?id=1&address=x:1"} {
		req, _ := http.NewRequest(http.MethodDelete, "http://"+c.servers[lead].HTTPAddr()+"/v1/operator/raft/peer"+query, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "Must specify") {
			t.Fatalf("DELETE raft/peer%s: %d %s, want 400", query, resp.StatusCode, body)
		}
	}
	// Removing a voter of two would leave one: refused, nothing changes.
	other := followers[1]
	err = cl.Operator().RaftRemovePeerByID(raftID(c.servers[other].ID()), nil)
	if err == nil || !strings.Contains(err.Error(), "500") || !strings.Contains(err.Error(), "only voter") {
		t.Fatalf("remove down to one voter: %v, want a 500 that says so", err)
	}
	if conf, err = cl.Operator().RaftGetConfiguration(nil); err != nil || len(conf.Servers) != 2 {
		t.Fatalf("after the refused removal: %+v %v, want 2 servers", conf, err)
	}
	dcs, err := cl.Catalog().Datacenters()
	if err != nil || len(dcs) != 1 || dcs[0] != "dc1" {
		t.Fatalf("datacenters %v %v, want [dc1]", dcs, err)
	}
}

// Each new endpoint checks its permission as Consul does: a token without
// it is refused with 403 and changes nothing.
func TestConsulOpsEndpointsNeedTheirPermission(t *testing.T) {
	c := newTestCluster(t, 1, withACLs)
	lead := c.waitLeader()
	mgmtToken, _, err := consulAs(t, c, lead, "").ACL().Bootstrap()
	if err != nil {
		t.Fatal(err)
	}
	mgmt := consulAs(t, c, lead, mgmtToken.SecretID)
	if _, err := mgmt.Catalog().Register(&consul.CatalogRegistration{Node: "edge-1", Address: "10.0.0.1",
		Service: &consul.AgentService{ID: "web-1", Service: "web"}}, nil); err != nil {
		t.Fatal(err)
	}
	// Reads of everything but the operator resource.
	reader := consulAs(t, c, lead, tokenWith(t, mgmt, "reader", `node_prefix "" { policy = "read" }
service_prefix "" { policy = "read" }`))
	operatorReader := consulAs(t, c, lead, tokenWith(t, mgmt, "op-reader", `operator = "read"`))
	nobody := consulAs(t, c, lead, tokenWith(t, mgmt, "nobody", `key "x" { policy = "read" }`))

	_, err = reader.Operator().RaftGetConfiguration(nil)
	wantDenied(t, "raft configuration without operator:read", err)
	_, err = reader.Operator().AutopilotServerHealth(nil)
	wantDenied(t, "autopilot health without operator:read", err)
	_, err = reader.Operator().AutopilotState(nil)
	wantDenied(t, "autopilot state without operator:read", err)
	if conf, err := operatorReader.Operator().RaftGetConfiguration(nil); err != nil || len(conf.Servers) != 1 {
		t.Fatalf("raft configuration with operator:read: %+v %v", conf, err)
	}
	if _, err := operatorReader.Operator().AutopilotState(nil); err != nil {
		t.Fatalf("autopilot state with operator:read: %v", err)
	}
	// Removing a peer needs operator:write; the member stays.
	wantDenied(t, "remove peer with operator:read", operatorReader.Operator().RaftRemovePeerByAddress(c.peers[lead], nil))
	if conf, err := mgmt.Operator().RaftGetConfiguration(nil); err != nil || len(conf.Servers) != 1 {
		t.Fatalf("after a refused removal: %+v %v", conf, err)
	}

	// node-services needs node:read on the node and service:read per service.
	list, _, err := nobody.Catalog().NodeServiceList("edge-1", nil)
	if err != nil || list.Node != nil || len(list.Services) != 0 {
		t.Fatalf("node-services without node:read: %+v %v, want nothing", list, err)
	}
	list, _, err = reader.Catalog().NodeServiceList("edge-1", nil)
	if err != nil || list.Node == nil || len(list.Services) != 1 {
		t.Fatalf("node-services with node and service read: %+v %v", list, err)
	}
	// Consul asks no permission for the datacenter list, but a token
	// nobody issued is refused.
	if dcs, err := nobody.Catalog().Datacenters(); err != nil || len(dcs) != 1 {
		t.Fatalf("datacenters: %v %v", dcs, err)
	}
	_, err = consulAs(t, c, lead, "00000000-0000-4000-8000-000000000000").Catalog().Datacenters()
	wantDenied(t, "datacenters with an unknown token", err)
	// Filters run after ACLs: they never reveal what a token may not read.
	nodes, _, err := nobody.Catalog().Nodes(&consul.QueryOptions{Filter: `Node == "edge-1"`})
	if err != nil || len(nodes) != 0 {
		t.Fatalf("filtered nodes without node:read: %+v %v", nodes, err)
	}
}
