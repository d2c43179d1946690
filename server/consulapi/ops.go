package consulapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/lodestone-kv/lodestone/acl"
)

// Operator is what the operator endpoints need from the node beside
// Backend. A Backend that does not implement it answers them 501.
type Operator interface {
	// RaftMembers lists the Raft configuration (voters and learners) and
	// the index of its last change.
	RaftMembers() ([]RaftMember, uint64)
	// RemoveMember removes the member with Raft id id (hex, as RaftMembers
	// names it) or peer address address, through the same path and checks
	// as `lodestone members remove` without --force. An unknown member is
	// ErrUnknownMember.
	RemoveMember(ctx context.Context, id, address string) error
	// MemberHealth is this server's view of every member's health: on the
	// leader, from the contact and progress it tracks for each; on a
	// follower, of itself and the leader only.
	MemberHealth() []MemberHealth
}

// ErrUnknownMember is RemoveMember's error for a member not in the Raft
// configuration.
var ErrUnknownMember = errors.New("member not in the Raft configuration")

// RaftMember is one member of the Raft configuration.
type RaftMember struct {
	ID       string // the Raft id, hex
	Name     string
	PeerAddr string
	Voter    bool
	// AutoPromote marks a learner the leader promotes once it caught up
	// (Consul's "staging"); a learner without it stays a non-voter.
	AutoPromote bool
	Leader      bool
}

// MemberHealth is one member's health as the answering server knows it.
type MemberHealth struct {
	RaftMember
	Version string
	// Known says whether this server hears from the member at all (a
	// follower knows only itself and the leader).
	Known bool
	// LastContact is how long ago the member was last heard from (0 for
	// the answering server itself and, on a follower, for the leader when
	// it is heard within a heartbeat).
	LastContact time.Duration
	LastTerm    uint64
	// LastIndex is the last index the member is known to hold; 0 when the
	// answering server does not track it.
	LastIndex uint64
	Healthy   bool
	// StableSince is when Healthy last changed as this server saw it.
	StableSince time.Time
}

// registerOps adds the operator, datacenter and node-services routes.
func (a *API) registerOps(handle func(string, func(http.ResponseWriter, *http.Request) error)) {
	handle("GET /v1/catalog/datacenters", a.catalogDatacenters)
	handle("GET /v1/catalog/node-services/{node...}", a.catalogNodeServices)
	handle("GET /v1/operator/raft/configuration", a.raftConfiguration)
	handle("DELETE /v1/operator/raft/peer", a.raftRemovePeer)
	handle("GET /v1/operator/autopilot/health", a.autopilotHealth)
	handle("GET /v1/operator/autopilot/state", a.autopilotState)
	a.registerSnapshot(handle) // snapshot.go
}

// catalogDatacenters is /v1/catalog/datacenters: Lodestone serves one.
// Consul asks no permission for it.
func (a *API) catalogDatacenters(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, []string{a.cfg.Datacenter})
	return nil
}

// nodeServicesJSON is api.CatalogNodeServiceList (Consul 1.7+).
type nodeServicesJSON struct {
	Node     *nodeJSON
	Services []*agentServiceJSON
}

// catalogNodeServices is /v1/catalog/node-services/:node: the node and its
// services as a list (filterable, unlike /v1/catalog/node/:node's map).
func (a *API) catalogNodeServices(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("node")
	f, err := parseListFilter(Query(r.URL))
	if err != nil {
		return err
	}
	az, err := a.readDep(w, r, NodeDep(name))
	if err != nil {
		return err
	}
	ns, m := a.b.Store().Node(name)
	a.setMeta(w, m.Index)
	if ns == nil || !az.Allowed(acl.ResourceNode, name, acl.AccessRead) {
		// NB: Consul answers an unknown (or unreadable) node with 200, a
		// null Node and no services.
		writeJSON(w, http.StatusOK, nodeServicesJSON{Services: []*agentServiceJSON{}})
		return nil
	}
	out := nodeServicesJSON{Node: nodeOut(ns.Node), Services: []*agentServiceJSON{}}
	for _, s := range acl.FilterNodeServices(az, ns.Services) {
		out.Services = append(out.Services, serviceOut(s))
	}
	if out.Services, err = filterItems(f, out.Services); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// operator returns the node's Operator face and checks want on the
// operator resource, as Consul's operator endpoints do.
func (a *API) operator(r *http.Request, want acl.Access) (Operator, error) {
	az, err := a.authorizer(r)
	if err != nil {
		return nil, err
	}
	if err := az.Check(acl.ResourceOperator, "", want); err != nil {
		return nil, err
	}
	op, ok := a.b.(Operator)
	if !ok {
		return nil, &httpError{http.StatusNotImplemented, "operator endpoints are not served by this node"}
	}
	return op, nil
}

// raftProtocolVersion is what Consul's servers report; clients only show it.
const raftProtocolVersion = "3"

func (a *API) raftConfiguration(w http.ResponseWriter, r *http.Request) error {
	op, err := a.operator(r, acl.AccessRead)
	if err != nil {
		return err
	}
	members, index := op.RaftMembers()
	out := consul.RaftConfiguration{Index: index, Servers: []*consul.RaftServer{}}
	for _, m := range members {
		out.Servers = append(out.Servers, &consul.RaftServer{ID: m.ID, Node: m.Name, Address: m.PeerAddr,
			Leader: m.Leader, Voter: m.Voter, ProtocolVersion: raftProtocolVersion})
	}
	a.setMeta(w, index)
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (a *API) raftRemovePeer(w http.ResponseWriter, r *http.Request) error {
	op, err := a.operator(r, acl.AccessWrite)
	if err != nil {
		return err
	}
	v := Query(r.URL)
	id, hasID := v.Lookup("id")
	address, hasAddress := v.Lookup("address")
	switch {
	case !hasID && !hasAddress:
		return badRequest("Must specify either ?id with the server's ID or ?address with IP:port of peer to remove")
	case hasID && hasAddress:
		return badRequest("Must specify only one of ?id or ?address")
	}
	err = op.RemoveMember(r.Context(), id, address)
	switch {
	case errors.Is(err, ErrUnknownMember) && hasID:
		return &httpError{http.StatusInternalServerError, fmt.Sprintf("id %q was not found in the Raft configuration", id)}
	case errors.Is(err, ErrUnknownMember):
		return &httpError{http.StatusInternalServerError, fmt.Sprintf("address %q was not found in the Raft configuration", address)}
	case err != nil:
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// healthSummary is what both autopilot endpoints report of the cluster:
// healthy when every member is, and how many healthy voters could fail
// without losing the quorum.
func healthSummary(ms []MemberHealth) (healthy bool, tolerance, optimistic int) {
	voters, healthyVoters := 0, 0
	healthy = true
	for _, m := range ms {
		healthy = healthy && m.Healthy
		if m.Voter {
			voters++
			if m.Healthy {
				healthyVoters++
			}
		}
	}
	quorum := voters/2 + 1
	return healthy, max(healthyVoters-quorum, 0), max(voters-quorum, 0)
}

func readable(d time.Duration) *consul.ReadableDuration {
	rd := consul.ReadableDuration(d)
	return &rd
}

// serfStatus is Consul's SerfStatus of a member: Lodestone's servers need
// no gossip, so it says whether the answering server hears the member.
func serfStatus(m MemberHealth) string {
	switch {
	case !m.Known:
		return "none"
	case m.Healthy:
		return "alive"
	}
	return "failed"
}

// autopilotHealth is /v1/operator/autopilot/health: 200 when every member
// is healthy, 429 otherwise, as Consul answers.
func (a *API) autopilotHealth(w http.ResponseWriter, r *http.Request) error {
	op, err := a.operator(r, acl.AccessRead)
	if err != nil {
		return err
	}
	ms := op.MemberHealth()
	healthy, tolerance, _ := healthSummary(ms)
	out := consul.OperatorHealthReply{Healthy: healthy, FailureTolerance: tolerance, Servers: []consul.ServerHealth{}}
	for _, m := range ms {
		out.Servers = append(out.Servers, consul.ServerHealth{ID: m.ID, Name: m.Name, Address: m.PeerAddr,
			SerfStatus: serfStatus(m), Version: m.Version, Leader: m.Leader, LastContact: readable(m.LastContact),
			LastTerm: m.LastTerm, LastIndex: m.LastIndex, Healthy: m.Healthy, Voter: m.Voter, StableSince: m.StableSince})
	}
	code := http.StatusOK
	if !healthy {
		code = http.StatusTooManyRequests
	}
	writeJSON(w, code, out)
	return nil
}

// autopilotState is /v1/operator/autopilot/state. A learner the leader
// will promote is "staging"; one kept a learner is a read replica.
func (a *API) autopilotState(w http.ResponseWriter, r *http.Request) error {
	op, err := a.operator(r, acl.AccessRead)
	if err != nil {
		return err
	}
	ms := op.MemberHealth()
	healthy, tolerance, optimistic := healthSummary(ms)
	out := consul.AutopilotState{Healthy: healthy, FailureTolerance: tolerance, OptimisticFailureTolerance: optimistic,
		Servers: map[string]consul.AutopilotServer{}, Voters: []string{}}
	for _, m := range ms {
		s := consul.AutopilotServer{ID: m.ID, Name: m.Name, Address: m.PeerAddr, NodeStatus: serfStatus(m),
			Version: m.Version, LastContact: readable(m.LastContact), LastTerm: m.LastTerm, LastIndex: m.LastIndex,
			Healthy: m.Healthy, StableSince: m.StableSince, Meta: map[string]string{}, NodeType: consul.AutopilotTypeVoter}
		switch {
		case m.Leader:
			s.Status = consul.AutopilotServerLeader
			out.Leader = m.ID
		case m.Voter:
			s.Status = consul.AutopilotServerVoter
		case m.AutoPromote:
			s.Status = consul.AutopilotServerStaging
		default:
			s.Status, s.ReadReplica, s.NodeType = consul.AutopilotServerNonVoter, true, consul.AutopilotTypeReadReplica
			out.ReadReplicas = append(out.ReadReplicas, m.ID)
		}
		if m.Voter {
			out.Voters = append(out.Voters, m.ID)
		}
		out.Servers[m.ID] = s
	}
	slices.Sort(out.Voters)
	writeJSON(w, http.StatusOK, out)
	return nil
}
