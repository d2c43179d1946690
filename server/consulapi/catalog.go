package consulapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/buildinfo"
)

// maxBodyBytes bounds a catalog, agent or session request body: these
// carry names, tags, meta and check definitions, never values, so a body
// past a few names' worth is refused before it is decoded.
const maxBodyBytes = 1 << 20

// decodeBody reads a JSON body into v; an empty body leaves v unchanged.
func decodeBody(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		// NB: the server's body cap (a chunked body has no length to
		// refuse up front).
		return &httpError{http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes", mbe.Limit)}
	}
	if err != nil {
		return badRequest("read request body: %v", err)
	}
	if len(body) > maxBodyBytes {
		return &httpError{http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes", maxBodyBytes)}
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest("Request decode failed: %v", err)
	}
	return nil
}

// serviceIn is api.AgentService / api.AgentServiceRegistration as a
// registration carries it (Service or Name is the name).
type serviceIn struct {
	Kind              string
	ID                string
	Service           string
	Name              string
	Tags              []string
	Meta              map[string]string
	Port              int
	Address           string
	TaggedAddresses   map[string]serviceAddrJSON
	Weights           *weightsJSON
	EnableTagOverride bool
}

func (s *serviceIn) pb() (*lodestonepb.Service, error) {
	if s.Kind != "" {
		return nil, badRequest("service kind %q is not supported; register plain services", s.Kind)
	}
	name := s.Service
	if name == "" {
		name = s.Name
	}
	if name == "" {
		return nil, badRequest("Missing service name")
	}
	if s.Port < 0 || s.Port > 65535 {
		return nil, badRequest("Invalid service port %d: must be 0..65535", s.Port)
	}
	out := &lodestonepb.Service{Id: s.ID, Name: name, Tags: s.Tags, Meta: s.Meta, Port: uint32(s.Port),
		Address: s.Address, EnableTagOverride: s.EnableTagOverride}
	// NB: Consul's client always sends Weights (a struct, not a pointer),
	// as zeros when unset; zeros mean the default, as in Consul.
	if s.Weights != nil && (s.Weights.Passing != 0 || s.Weights.Warning != 0) {
		out.Weights = &lodestonepb.Weights{Passing: int32(s.Weights.Passing), Warning: int32(s.Weights.Warning)}
	}
	if len(s.TaggedAddresses) > 0 {
		out.TaggedAddresses = map[string]*lodestonepb.ServiceAddress{}
		for k, v := range s.TaggedAddresses {
			if v.Port < 0 || v.Port > 65535 {
				return nil, badRequest("Invalid tagged address %q port %d: must be 0..65535", k, v.Port)
			}
			out.TaggedAddresses[k] = &lodestonepb.ServiceAddress{Address: v.Address, Port: uint32(v.Port)}
		}
	}
	return out, nil
}

// pb reads a check as a catalog registration carries it
// (api.HealthCheck / api.AgentCheck: the same fields as we write them).
func (c *healthCheckJSON) pb() (*lodestonepb.Check, error) {
	st, err := parseStatus("check status", c.Status)
	if err != nil {
		return nil, err
	}
	d := c.Definition
	def := &lodestonepb.CheckDefinition{Http: d.HTTP, Method: d.Method, Body: d.Body, TlsServerName: d.TLSServerName,
		TlsSkipVerify: d.TLSSkipVerify, Tcp: d.TCP, Udp: d.UDP, Grpc: d.GRPC, GrpcUseTls: d.GRPCUseTLS,
		Interval: d.Interval.PB(), Timeout: d.Timeout.PB(), DeregisterCriticalServiceAfter: d.DeregisterCriticalServiceAfter.PB(),
		Header: headerPB(d.Header)}
	return &lodestonepb.Check{Node: c.Node, CheckId: c.CheckID, Name: c.Name, Status: st, Notes: c.Notes,
		Output: c.Output, ServiceId: c.ServiceID, Type: c.Type, Definition: def}, nil
}

// registerIn is api.CatalogRegistration.
type registerIn struct {
	ID              string
	Node            string
	Address         string
	Datacenter      string
	TaggedAddresses map[string]string
	NodeMeta        map[string]string
	Service         *serviceIn
	Check           *healthCheckJSON
	Checks          []*healthCheckJSON
	SkipNodeUpdate  bool
}

func (a *API) catalogRegister(w http.ResponseWriter, r *http.Request) error {
	var in registerIn
	if err := decodeBody(r, &in); err != nil {
		return err
	}
	if in.Node == "" {
		return consulError("Must provide node")
	}
	if in.Address == "" && !in.SkipNodeUpdate {
		return consulError("Must provide address if SkipNodeUpdate is not set")
	}
	req := &lodestonepb.CatalogRegisterRequest{SkipNodeUpdate: in.SkipNodeUpdate, Node: &lodestonepb.Node{
		Id: in.ID, Name: in.Node, Address: in.Address, Datacenter: in.Datacenter, TaggedAddresses: in.TaggedAddresses, Meta: in.NodeMeta,
	}}
	if in.Service != nil {
		svc, err := in.Service.pb()
		if err != nil {
			return err
		}
		req.Service = svc
	}
	checks := in.Checks
	if in.Check != nil {
		checks = append([]*healthCheckJSON{in.Check}, checks...)
	}
	for _, c := range checks {
		pc, err := c.pb()
		if err != nil {
			return err
		}
		if pc.Node == "" {
			pc.Node = in.Node
		}
		req.Checks = append(req.Checks, pc)
	}
	if _, _, err := a.apply(r, &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: req}}); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, true)
	return nil
}

// deregisterIn is api.CatalogDeregistration.
type deregisterIn struct {
	Node      string
	ServiceID string
	CheckID   string
}

func (a *API) catalogDeregister(w http.ResponseWriter, r *http.Request) error {
	var in deregisterIn
	if err := decodeBody(r, &in); err != nil {
		return err
	}
	if in.Node == "" {
		return consulError("Must provide node")
	}
	req := &lodestonepb.CatalogDeregisterRequest{Node: in.Node, ServiceId: in.ServiceID, CheckId: in.CheckID}
	if _, _, err := a.apply(r, &lodestonepb.Command{Op: &lodestonepb.Command_CatalogDeregister{CatalogDeregister: req}}); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, true)
	return nil
}

// readDep is the common head of every catalog, health and session read:
// parse the query options, block on d, make the read consistent unless
// ?stale. The caller then reads the store and calls setMeta with the
// read's QueryMeta.Index. It returns the caller's Authorizer, for the
// caller to filter what it reads.
func (a *API) readDep(w http.ResponseWriter, r *http.Request, d Dep) (*acl.Authorizer, error) {
	az, err := a.authorizer(r)
	if err != nil {
		return nil, err
	}
	q, err := a.parseQuery(r)
	if err != nil {
		return nil, err
	}
	if err := a.blockOn(w, r, q, d, nil); err != nil {
		return nil, err
	}
	return az, a.read(r.Context(), q)
}

func (a *API) catalogServices(w http.ResponseWriter, r *http.Request) error {
	f, err := parseListFilter(Query(r.URL))
	if err != nil {
		return err
	}
	az, err := a.readDep(w, r, ServicesDep())
	if err != nil {
		return err
	}
	svcs, m := a.b.Store().Services()
	svcs = acl.FilterServices(az, svcs)
	out := make(map[string][]string, len(svcs))
	for _, s := range svcs {
		if !f.active() {
			out[s.Name] = nonNil(s.Tags)
			continue
		}
		// NB: as Consul: ?filter and ?node-meta select instances (the
		// /v1/catalog/service shape); a name is listed with the tags of
		// the instances that pass.
		rows, err := a.catalogRows(az, f, s.Name, nil)
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			continue
		}
		var tags []string
		for _, row := range rows {
			tags = append(tags, row.ServiceTags...)
		}
		slices.Sort(tags)
		out[s.Name] = slices.Compact(nonNil(tags))
	}
	a.setMeta(w, m.Index)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// catalogRows is /v1/catalog/service/:name's answer: the instances of name
// with tags that az may read and f keeps.
func (a *API) catalogRows(az *acl.Authorizer, f listFilter, name string, tags []string) ([]catalogServiceJSON, error) {
	insts, _ := a.b.Store().ServiceInstances(name, tags, false)
	if !az.Allowed(acl.ResourceService, name, acl.AccessRead) {
		insts = nil
	}
	insts = acl.FilterInstances(az, insts)
	out := make([]catalogServiceJSON, 0, len(insts))
	for _, in := range insts {
		if f.nodeMatches(in.Node.GetMeta()) {
			out = append(out, catalogServiceOut(in.Node, in.Service))
		}
	}
	return filterItems(f, out)
}

func (a *API) catalogService(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("service")
	f, err := parseListFilter(Query(r.URL))
	if err != nil {
		return err
	}
	az, err := a.readDep(w, r, ServiceDep(name))
	if err != nil {
		return err
	}
	m := a.b.Store().ServiceIndex(name)
	out, err := a.catalogRows(az, f, name, Query(r.URL).All("tag"))
	if err != nil {
		return err
	}
	a.setMeta(w, m)
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (a *API) catalogNodes(w http.ResponseWriter, r *http.Request) error {
	f, err := parseListFilter(Query(r.URL))
	if err != nil {
		return err
	}
	az, err := a.readDep(w, r, NodesDep())
	if err != nil {
		return err
	}
	nodes, m := a.b.Store().Nodes()
	nodes = acl.FilterNodes(az, nodes)
	out := make([]*nodeJSON, 0, len(nodes))
	for _, n := range nodes {
		if f.nodeMatches(n.Meta) {
			out = append(out, nodeOut(n))
		}
	}
	if out, err = filterItems(f, out); err != nil {
		return err
	}
	a.setMeta(w, m.Index)
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (a *API) catalogNode(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("node")
	az, err := a.readDep(w, r, NodeDep(name))
	if err != nil {
		return err
	}
	ns, m := a.b.Store().Node(name)
	a.setMeta(w, m.Index)
	if ns == nil || !az.Allowed(acl.ResourceNode, name, acl.AccessRead) {
		// Consul answers an unknown node with 200 and null.
		writeJSON(w, http.StatusOK, nil)
		return nil
	}
	out := struct {
		Node     *nodeJSON
		Services map[string]*agentServiceJSON
	}{Node: nodeOut(ns.Node), Services: map[string]*agentServiceJSON{}}
	for _, s := range acl.FilterNodeServices(az, ns.Services) {
		out.Services[s.Id] = serviceOut(s)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// serviceEntryJSON is api.ServiceEntry.
type serviceEntryJSON struct {
	Node    *nodeJSON
	Service *agentServiceJSON
	Checks  []healthCheckJSON
}

func (a *API) healthService(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("service")
	v := Query(r.URL)
	passing, err := boolParam(v, "passing")
	if err != nil {
		return err
	}
	f, err := parseListFilter(v)
	if err != nil {
		return err
	}
	az, err := a.readDep(w, r, ServiceDep(name))
	if err != nil {
		return err
	}
	hs, m := a.b.Store().HealthService(name, v.All("tag"), passing)
	if !az.Allowed(acl.ResourceService, name, acl.AccessRead) {
		hs = nil
	}
	hs = acl.FilterHealth(az, hs)
	out := make([]serviceEntryJSON, 0, len(hs))
	for _, h := range hs {
		if f.nodeMatches(h.Node.GetMeta()) {
			out = append(out, serviceEntryJSON{Node: nodeOut(h.Node), Service: serviceOut(h.Service), Checks: checksOut(h.Checks)})
		}
	}
	if out, err = filterItems(f, out); err != nil {
		return err
	}
	a.setMeta(w, m.Index)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// boolParam reads a Consul flag parameter: present with no value, or a
// boolean value ("passing", "passing=1", "passing=false").
func boolParam(v Params, name string) (bool, error) {
	s, ok := v.Lookup(name)
	if !ok {
		return false, nil
	}
	if s == "" {
		return true, nil
	}
	switch strings.ToLower(s) {
	case "1", "t", "true":
		return true, nil
	case "0", "f", "false":
		return false, nil
	}
	return false, badRequest("Invalid %s %q: use true or false", name, s)
}

func (a *API) healthChecks(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("service")
	f, err := parseListFilter(Query(r.URL))
	if err != nil {
		return err
	}
	az, err := a.readDep(w, r, ServiceDep(name))
	if err != nil {
		return err
	}
	cs, m := a.b.Store().ServiceChecks(name)
	return a.writeChecks(w, f, m.Index, acl.FilterChecks(az, cs))
}

func (a *API) healthNode(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("node")
	f, err := parseListFilter(Query(r.URL))
	if err != nil {
		return err
	}
	// NB: Consul takes no ?node-meta here: the node is named.
	f.nodeMeta = nil
	az, err := a.readDep(w, r, NodeDep(name))
	if err != nil {
		return err
	}
	cs, m := a.b.Store().NodeChecks(name)
	return a.writeChecks(w, f, m.Index, acl.FilterChecks(az, cs))
}

func (a *API) healthState(w http.ResponseWriter, r *http.Request) error {
	state := r.PathValue("state")
	st := lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED
	if state != "any" {
		var err error
		if st, err = parseStatus("state", state); err != nil || st == lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED {
			return badRequest("Invalid check state %q: use any, passing, warning or critical", state)
		}
	}
	f, err := parseListFilter(Query(r.URL))
	if err != nil {
		return err
	}
	az, err := a.readDep(w, r, ChecksDep())
	if err != nil {
		return err
	}
	cs, m := a.b.Store().ChecksInState(st)
	return a.writeChecks(w, f, m.Index, acl.FilterChecks(az, cs))
}

// writeChecks answers a check listing read at index with the checks f
// keeps.
func (a *API) writeChecks(w http.ResponseWriter, f listFilter, index uint64, cs []*lodestonepb.Check) error {
	meta := map[string]map[string]string{} // node -> its meta, for ?node-meta
	out := make([]healthCheckJSON, 0, len(cs))
	for _, c := range cs {
		if len(f.nodeMeta) > 0 {
			nm, seen := meta[c.Node]
			if !seen {
				ns, _ := a.b.Store().Node(c.Node)
				nm = ns.GetNode().GetMeta()
				meta[c.Node] = nm
			}
			if !f.nodeMatches(nm) {
				continue
			}
		}
		out = append(out, checkOut(c))
	}
	out, err := filterItems(f, out)
	if err != nil {
		return err
	}
	a.setMeta(w, index)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// --- agent listings (the agent's other endpoints are in agent.go) ---------

// agentServices is /v1/agent/services: this agent's services by id.
func (a *API) agentServices(w http.ResponseWriter, r *http.Request) error {
	az, err := a.authorizer(r)
	if err != nil {
		return err
	}
	node, _ := a.b.Agent()
	ns, _ := a.b.Store().Node(node)
	out := map[string]*agentServiceJSON{}
	for _, s := range acl.FilterNodeServices(az, ns.GetServices()) {
		out[s.Id] = serviceOut(s)
	}
	// ?filter (filter.go)
	if out, err = filterAgentListing(Query(r.URL), out); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// agentChecks is /v1/agent/checks: this agent's checks by id.
func (a *API) agentChecks(w http.ResponseWriter, r *http.Request) error {
	az, err := a.authorizer(r)
	if err != nil {
		return err
	}
	node, _ := a.b.Agent()
	checks, _ := a.b.Store().NodeChecks(node)
	out := map[string]healthCheckJSON{}
	for _, c := range acl.FilterChecks(az, checks) {
		out[c.CheckId] = checkOut(c)
	}
	// ?filter (filter.go)
	if out, err = filterAgentListing(Query(r.URL), out); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (a *API) agentSelf(w http.ResponseWriter, r *http.Request) error {
	az, err := a.authorizer(r)
	if err != nil {
		return err
	}
	node, addr := a.b.Agent()
	if err := az.Check(acl.ResourceAgent, node, acl.AccessRead); err != nil {
		return err
	}
	// NB: Consul's Config carries its build as Version, Revision and
	// BuildDate; clients that log or check the server's version read them.
	b := buildinfo.Get()
	self := map[string]any{
		"Config": map[string]any{"NodeName": node, "Datacenter": defaultDatacenter, "Server": true,
			"Version": b.Version, "Revision": b.Commit, "BuildDate": b.Date},
		"Member": map[string]any{"Name": node, "Addr": addr},
	}
	a.addSelf(self, node) // agent.go
	writeJSON(w, http.StatusOK, self)
	return nil
}
