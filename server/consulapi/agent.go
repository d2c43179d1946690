package consulapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/checks"
	"github.com/lodestone-kv/lodestone/gossip"
	"github.com/lodestone-kv/lodestone/server/localagent"
)

// The agent endpoints: the server is the agent of one catalog node
// (Backend.Agent). Registrations go to its local agent
// (Backend.LocalAgent), which runs their checks on this server and writes
// their transitions; the caller's token is checked here first, on the
// catalog write the request amounts to (acl.CheckCommand), and a refusal
// changes nothing.
//
// An id at the end of a path is the rest of the path, slashes included
// (service "db/pg1", check "service:db/pg1"), percent-encoded or not, as
// Consul reads it: routes use {id...}.

// Membership is this server's place in the gossip pool and the cluster,
// for /v1/agent/self, members, join and leave; the server implements it.
type Membership interface {
	// Members is the pool as this server sees it, and this server's name
	// in it; ok is false when the server runs without gossip.
	Members() (members []gossip.Member, self string, ok bool)
	// Join contacts addrs and merges their pool into this server's.
	Join(addrs []string) (int, error)
	// Leave makes this server leave the cluster and then stop.
	Leave(ctx context.Context) error
	// NodeID is this server's node id, as a UUID.
	NodeID() string
	// Stats are /v1/agent/self's Stats: sections of string values.
	Stats() map[string]map[string]string
}

// authorize checks that r's token may propose cmd (acl.CheckCommand),
// as apply does, without proposing it: the local agent writes instead.
func (a *API) authorize(r *http.Request, cmd *lodestonepb.Command) error {
	az, err := a.authorizer(r)
	if err != nil {
		return err
	}
	catchUp := func(ctx context.Context) error { return a.b.LeaderBarrier(ctx, time.Now()) }
	return acl.Recheck(r.Context(), catchUp, func() error { return acl.CheckCommand(az, a.b.Store(), cmd) })
}

// checkAgent checks want on the agent resource of this server's node.
func (a *API) checkAgent(r *http.Request, res acl.Resource, want acl.Access) (*acl.Authorizer, error) {
	az, err := a.authorizer(r)
	if err != nil {
		return nil, err
	}
	node, _ := a.b.Agent()
	return az, az.Check(res, node, want)
}

// ensureAgentNode registers this server's agent node when it is missing,
// so agent registrations and sessions have a node to live on.
func (a *API) ensureAgentNode(r *http.Request) (string, error) {
	node, _ := a.b.Agent()
	return node, a.b.LocalAgent().EnsureNode(r.Context())
}

// localError answers the local agent's refusals as Consul's agent does.
func localError(err error, id string) error {
	var de *checks.DefinitionError
	switch {
	case errors.As(err, &de):
		return badRequest("%s", de.Msg)
	case errors.Is(err, localagent.ErrUnknownService):
		return &httpError{http.StatusNotFound, fmt.Sprintf("Unknown service ID %q. Ensure that the service ID is passed, not the service name.", id)}
	case errors.Is(err, localagent.ErrUnknownCheck):
		return &httpError{http.StatusNotFound, fmt.Sprintf("Unknown check ID %q. Ensure that the check ID is passed, not the check name.", id)}
	case errors.Is(err, checks.ErrNotTTL):
		return &httpError{http.StatusInternalServerError, fmt.Sprintf("CheckID %q does not have associated TTL", id)}
	}
	return err
}

// agentServiceIn is api.AgentServiceRegistration.
type agentServiceIn struct {
	serviceIn
	Check  *checks.Definition
	Checks []*checks.Definition
}

func (a *API) agentServiceRegister(w http.ResponseWriter, r *http.Request) error {
	var in agentServiceIn
	if err := decodeBody(r, &in); err != nil {
		return err
	}
	svc, err := in.serviceIn.pb()
	if err != nil {
		return err
	}
	replace, err := boolParam(Query(r.URL), "replace-existing-checks")
	if err != nil {
		return err
	}
	node, _ := a.b.Agent()
	defs := in.Checks
	if in.Check != nil {
		defs = append([]*checks.Definition{in.Check}, defs...)
	}
	var recs []*lodestonepb.Check
	for i, d := range defs {
		if d == nil {
			return badRequest("Invalid check: check %d is null", i+1)
		}
		rec, err := d.Catalog(node, svc, i, len(defs))
		if err != nil {
			return localError(err, "")
		}
		recs = append(recs, rec)
	}
	cmd := &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: &lodestonepb.CatalogRegisterRequest{
		Node: &lodestonepb.Node{Name: node}, SkipNodeUpdate: true, Service: svc, Checks: recs}}}
	if err := a.authorize(r, cmd); err != nil {
		return err
	}
	if err := a.b.LocalAgent().AddService(r.Context(), svc, recs, replace); err != nil {
		return localError(err, svc.Id)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (a *API) agentServiceDeregister(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	node, _ := a.b.Agent()
	cmd := &lodestonepb.Command{Op: &lodestonepb.Command_CatalogDeregister{CatalogDeregister: &lodestonepb.CatalogDeregisterRequest{
		Node: node, ServiceId: id}}}
	if err := a.authorize(r, cmd); err != nil {
		return err
	}
	if err := a.b.LocalAgent().RemoveService(r.Context(), id); err != nil {
		return localError(err, id)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// agentCheckUpdate serves /v1/agent/check/{pass,warn,fail}/:id: a TTL
// check's report, with ?note as the output.
func (a *API) agentCheckUpdate(st lodestonepb.HealthStatus) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		return a.updateAgentCheck(w, r, st, Query(r.URL).Get("note"))
	}
}

// agentCheckUpdateBody serves /v1/agent/check/update/:id, which newer
// clients use: the status and output come in a JSON body.
func (a *API) agentCheckUpdateBody(w http.ResponseWriter, r *http.Request) error {
	var in struct{ Status, Output string }
	if err := decodeBody(r, &in); err != nil {
		return err
	}
	st, err := lodestonepb.ParseHealthStatus(in.Status)
	if err != nil || st == lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED {
		return badRequest("Invalid check status: '%s'", in.Status)
	}
	return a.updateAgentCheck(w, r, st, in.Output)
}

func (a *API) updateAgentCheck(w http.ResponseWriter, r *http.Request, st lodestonepb.HealthStatus, output string) error {
	id := r.PathValue("id")
	node, _ := a.b.Agent()
	cmd := &lodestonepb.Command{Op: &lodestonepb.Command_CheckUpdate{CheckUpdate: &lodestonepb.UpdateCheckRequest{
		Node: node, CheckId: id, Status: st, Output: output}}}
	if err := a.authorize(r, cmd); err != nil {
		return err
	}
	if err := a.b.LocalAgent().UpdateTTL(r.Context(), id, st, output); err != nil {
		return localError(err, id)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// agentCheckRegIn is api.AgentCheckRegistration.
type agentCheckRegIn struct {
	ID        string
	ServiceID string
	checks.Definition
}

func (a *API) agentCheckRegister(w http.ResponseWriter, r *http.Request) error {
	var in agentCheckRegIn
	if err := decodeBody(r, &in); err != nil {
		return err
	}
	if in.Name == "" {
		return badRequest("Missing check name")
	}
	if in.CheckID == "" {
		in.CheckID = in.ID
	}
	node, _ := a.b.Agent()
	rec, err := in.Definition.Catalog(node, nil, 0, 1)
	if err != nil {
		return localError(err, "")
	}
	rec.ServiceId = in.ServiceID
	if in.ServiceID != "" {
		if _, _, ok := a.b.LocalAgent().Service(in.ServiceID); !ok {
			return &httpError{http.StatusNotFound, fmt.Sprintf("ServiceID %q does not exist", in.ServiceID)}
		}
	}
	cmd := &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: &lodestonepb.CatalogRegisterRequest{
		Node: &lodestonepb.Node{Name: node}, SkipNodeUpdate: true, Checks: []*lodestonepb.Check{rec}}}}
	if err := a.authorize(r, cmd); err != nil {
		return err
	}
	err = a.b.LocalAgent().AddCheck(r.Context(), rec)
	if errors.Is(err, localagent.ErrUnknownService) {
		return &httpError{http.StatusNotFound, fmt.Sprintf("ServiceID %q does not exist", in.ServiceID)}
	}
	if err != nil {
		return localError(err, rec.CheckId)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (a *API) agentCheckDeregister(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	node, _ := a.b.Agent()
	cmd := &lodestonepb.Command{Op: &lodestonepb.Command_CatalogDeregister{CatalogDeregister: &lodestonepb.CatalogDeregisterRequest{
		Node: node, CheckId: id}}}
	if err := a.authorize(r, cmd); err != nil {
		return err
	}
	if err := a.b.LocalAgent().RemoveCheck(r.Context(), id); err != nil {
		return localError(err, id)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// agentService is GET /v1/agent/service/:id: one local service as
// api.AgentService, with Consul's hash-based blocking (?hash: wait until
// the service's content hash is no longer that one, or ?wait passes).
func (a *API) agentService(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	az, err := a.authorizer(r)
	if err != nil {
		return err
	}
	q, err := a.parseQuery(r)
	if err != nil {
		return err
	}
	hash := Query(r.URL).Get("hash")
	deadline := time.NewTimer(jittered(q.wait))
	defer deadline.Stop()
	for {
		svc, changed, ok := a.b.LocalAgent().Service(id)
		if !ok {
			return &httpError{http.StatusNotFound, "unknown service ID: " + id}
		}
		if err := az.Check(acl.ResourceService, svc.Name, acl.AccessRead); err != nil {
			return err
		}
		out, sum, err := a.hashedService(svc)
		if err != nil {
			return err
		}
		if hash == "" || hash != sum {
			w.Header().Set("X-Consul-ContentHash", sum)
			writeJSON(w, http.StatusOK, out)
			return nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			hash = "" // answer as it is
		case <-r.Context().Done():
			return r.Context().Err()
		}
	}
}

// hashedService is svc as api.AgentService with its ContentHash: a hash
// of the answer without it, so it changes when the answer does.
func (a *API) hashedService(svc *lodestonepb.Service) (*agentServiceJSON, string, error) {
	out := serviceOut(svc)
	out.Datacenter = a.cfg.Datacenter
	b, err := json.Marshal(out)
	if err != nil {
		return nil, "", err
	}
	h := fnv.New64a()
	h.Write(b)
	out.ContentHash = strconv.FormatUint(h.Sum64(), 16)
	return out, out.ContentHash, nil
}

// agentMemberJSON is api.AgentMember.
type agentMemberJSON struct {
	Name        string
	Addr        string
	Port        uint16
	Tags        map[string]string
	Status      int
	ProtocolMin uint8
	ProtocolMax uint8
	ProtocolCur uint8
	DelegateMin uint8
	DelegateMax uint8
	DelegateCur uint8
}

// memberOut is m as Consul's serf member: status codes as serf's, the
// role as Consul's tags name it ("consul" for servers, "node" for agents).
func (a *API) memberOut(m gossip.Member, name string) agentMemberJSON {
	host, port, err := net.SplitHostPort(m.Addr)
	if err != nil {
		host = m.Addr
	}
	p, _ := strconv.ParseUint(port, 10, 16)
	role := "node"
	if m.Role == gossip.RoleServer {
		role = "consul"
	}
	status := 0
	switch m.State {
	case gossip.StateAlive:
		status = 1
	case gossip.StateLeft:
		status = 3
	case gossip.StateFailed:
		status = 4
	}
	return agentMemberJSON{Name: name, Addr: host, Port: uint16(p), Status: status,
		Tags:        map[string]string{"role": role, "dc": a.cfg.Datacenter, "segment": "", "vsn": "2"},
		ProtocolMin: 1, ProtocolMax: 5, ProtocolCur: 2, DelegateMin: 2, DelegateMax: 5, DelegateCur: 4}
}

// self is this server as a pool member, also without gossip.
func (a *API) self() agentMemberJSON {
	node, addr := a.b.Agent()
	members, self, ok := a.b.Membership().Members()
	if ok {
		for _, m := range members {
			if m.Name == self {
				return a.memberOut(m, m.Name)
			}
		}
	}
	return a.memberOut(gossip.Member{Name: node, Addr: addr, Role: gossip.RoleServer, State: gossip.StateAlive}, node)
}

// agentMembers is /v1/agent/members: the gossip pool (this server alone
// without gossip), members the token may not read (node:read) left out.
// ?wan lists the WAN pool Consul servers share: with one datacenter, its
// servers, named <node>.<datacenter>.
func (a *API) agentMembers(w http.ResponseWriter, r *http.Request) error {
	az, err := a.authorizer(r)
	if err != nil {
		return err
	}
	v := Query(r.URL)
	wan := v.Get("wan") != ""
	segment := v.Get("segment")
	switch {
	case wan && segment != "" && segment != "_all":
		return badRequest("Cannot provide a segment with wan=true")
	case !wan && segment != "" && segment != "_all":
		return &httpError{http.StatusInternalServerError, "Network segments are not supported in this version of Consul"}
	}
	members, _, ok := a.b.Membership().Members()
	var out []agentMemberJSON
	if !ok {
		out = append(out, a.self())
	}
	for _, m := range members {
		if wan && m.Role != gossip.RoleServer {
			continue
		}
		name := m.Name
		if wan {
			name += "." + a.cfg.Datacenter
		}
		out = append(out, a.memberOut(m, name))
	}
	kept := out[:0]
	for _, m := range out {
		if az.Allowed(acl.ResourceNode, m.Name, acl.AccessRead) {
			kept = append(kept, m)
		}
	}
	sort.Slice(kept, func(i, j int) bool { return kept[i].Name < kept[j].Name })
	if kept == nil {
		kept = []agentMemberJSON{}
	}
	writeJSON(w, http.StatusOK, kept)
	return nil
}

// addSelf completes /v1/agent/self with the fields consul/api and
// Consul's tools read: the node's id and datacenters, this server as a
// pool member, the stats and the node's metadata.
func (a *API) addSelf(self map[string]any, node string) {
	cfg := self["Config"].(map[string]any)
	cfg["Datacenter"], cfg["PrimaryDatacenter"], cfg["NodeID"] = a.cfg.Datacenter, a.cfg.Datacenter, a.b.Membership().NodeID()
	self["Member"] = a.self()
	self["Stats"] = a.b.Membership().Stats()
	meta := map[string]string{}
	if ns, _ := a.b.Store().Node(node); ns != nil && ns.Node != nil {
		for k, v := range ns.Node.Meta {
			meta[k] = v
		}
	}
	self["Meta"] = meta
	self["Coord"] = nil
}

// agentJoin is PUT /v1/agent/join/:address: join the gossip pool through
// address. Lodestone has no WAN pool: ?wan is refused.
func (a *API) agentJoin(w http.ResponseWriter, r *http.Request) error {
	if _, err := a.checkAgent(r, acl.ResourceAgent, acl.AccessWrite); err != nil {
		return err
	}
	addr := r.PathValue("address")
	if Query(r.URL).Get("wan") != "" {
		return &httpError{http.StatusInternalServerError, "WAN join is not supported: Lodestone serves one datacenter and has no WAN pool"}
	}
	if addr == "" {
		return badRequest("Missing address to join: use /v1/agent/join/<host:port>")
	}
	if _, err := a.b.Membership().Join([]string{addr}); err != nil {
		return &httpError{http.StatusInternalServerError, err.Error()}
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// agentLeave is PUT /v1/agent/leave: this server leaves the cluster and
// stops (Membership.Leave).
func (a *API) agentLeave(w http.ResponseWriter, r *http.Request) error {
	if _, err := a.checkAgent(r, acl.ResourceAgent, acl.AccessWrite); err != nil {
		return err
	}
	if err := a.b.Membership().Leave(r.Context()); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// enableParam reads maintenance's required ?enable, in Consul's words.
func enableParam(r *http.Request) (bool, error) {
	raw, ok := Query(r.URL).Lookup("enable")
	if !ok {
		return false, badRequest("Missing value for enable")
	}
	enable, err := strconv.ParseBool(raw)
	if err != nil {
		return false, badRequest("Invalid value for enable: %q", raw)
	}
	return enable, nil
}

// agentMaintenance is PUT /v1/agent/maintenance?enable=&reason=: node
// maintenance (a critical _node_maintenance check); node:write.
func (a *API) agentMaintenance(w http.ResponseWriter, r *http.Request) error {
	enable, err := enableParam(r)
	if err != nil {
		return err
	}
	if _, err := a.checkAgent(r, acl.ResourceNode, acl.AccessWrite); err != nil {
		return err
	}
	if err := a.b.LocalAgent().SetNodeMaintenance(r.Context(), enable, Query(r.URL).Get("reason")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// agentServiceMaintenance is PUT /v1/agent/service/maintenance/:id:
// service maintenance (a critical _service_maintenance:<id> check);
// service:write on the service.
func (a *API) agentServiceMaintenance(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if id == "" {
		return badRequest("Missing service ID")
	}
	enable, err := enableParam(r)
	if err != nil {
		return err
	}
	az, err := a.authorizer(r)
	if err != nil {
		return err
	}
	svc, _, ok := a.b.LocalAgent().Service(id)
	if !ok {
		return localError(localagent.ErrUnknownService, id)
	}
	if err := az.Check(acl.ResourceService, svc.Name, acl.AccessWrite); err != nil {
		return err
	}
	err = a.b.LocalAgent().SetServiceMaintenance(r.Context(), id, enable, Query(r.URL).Get("reason"))
	if errors.Is(err, localagent.ErrUnknownService) {
		return &httpError{http.StatusNotFound, fmt.Sprintf("No service registered with ID %q", id)}
	}
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}
