package consulapi

import (
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/checks"
)

// Consul's JSON shapes for the catalog, health, agent and session APIs
// (github.com/hashicorp/consul/api types of the same names). Output types
// carry every field Consul's clients read; input types every field we
// store. encoding/json matches field names case-insensitively, as Consul's
// decoder does.

type nodeJSON struct {
	ID              string
	Node            string
	Address         string
	Datacenter      string
	TaggedAddresses map[string]string
	Meta            map[string]string
	CreateIndex     uint64
	ModifyIndex     uint64
}

func nodeOut(n *lodestonepb.Node) *nodeJSON {
	if n == nil {
		return nil
	}
	return &nodeJSON{ID: n.Id, Node: n.Name, Address: n.Address, Datacenter: dcOr(n.Datacenter),
		TaggedAddresses: n.TaggedAddresses, Meta: n.Meta, CreateIndex: n.CreateIndex, ModifyIndex: n.ModifyIndex}
}

// defaultDatacenter is what we report for records registered without one;
// Consul's clients expect a datacenter name.
const defaultDatacenter = "dc1"

func dcOr(dc string) string {
	if dc == "" {
		return defaultDatacenter
	}
	return dc
}

type weightsJSON struct {
	Passing int
	Warning int
}

type serviceAddrJSON struct {
	Address string
	Port    int
}

// agentServiceJSON is api.AgentService.
type agentServiceJSON struct {
	ID                string
	Service           string
	Tags              []string
	Meta              map[string]string
	Port              int
	Address           string
	TaggedAddresses   map[string]serviceAddrJSON `json:",omitempty"`
	Weights           weightsJSON
	EnableTagOverride bool
	CreateIndex       uint64 `json:",omitempty"`
	ModifyIndex       uint64 `json:",omitempty"`
	ContentHash       string `json:",omitempty"`
	Datacenter        string `json:",omitempty"`
}

func weightsOf(s *lodestonepb.Service) weightsJSON {
	if s.Weights == nil {
		return weightsJSON{Passing: 1, Warning: 1}
	}
	return weightsJSON{Passing: int(s.Weights.Passing), Warning: int(s.Weights.Warning)}
}

func taggedOut(m map[string]*lodestonepb.ServiceAddress) map[string]serviceAddrJSON {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]serviceAddrJSON, len(m))
	for k, v := range m {
		out[k] = serviceAddrJSON{Address: v.Address, Port: int(v.Port)}
	}
	return out
}

func serviceOut(s *lodestonepb.Service) *agentServiceJSON {
	return &agentServiceJSON{ID: s.Id, Service: s.Name, Tags: nonNil(s.Tags), Meta: nonNilMap(s.Meta), Port: int(s.Port),
		Address: s.Address, TaggedAddresses: taggedOut(s.TaggedAddresses), Weights: weightsOf(s),
		EnableTagOverride: s.EnableTagOverride, CreateIndex: s.CreateIndex, ModifyIndex: s.ModifyIndex}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func nonNilMap(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// catalogServiceJSON is api.CatalogService: an instance flattened with its
// node.
type catalogServiceJSON struct {
	ID                       string
	Node                     string
	Address                  string
	Datacenter               string
	TaggedAddresses          map[string]string
	NodeMeta                 map[string]string
	ServiceID                string
	ServiceName              string
	ServiceAddress           string
	ServiceTaggedAddresses   map[string]serviceAddrJSON `json:",omitempty"`
	ServiceTags              []string
	ServiceMeta              map[string]string
	ServicePort              int
	ServiceWeights           weightsJSON
	ServiceEnableTagOverride bool
	CreateIndex              uint64
	ModifyIndex              uint64
}

func catalogServiceOut(n *lodestonepb.Node, s *lodestonepb.Service) catalogServiceJSON {
	out := catalogServiceJSON{ServiceID: s.Id, ServiceName: s.Name, ServiceAddress: s.Address,
		ServiceTaggedAddresses: taggedOut(s.TaggedAddresses), ServiceTags: nonNil(s.Tags), ServiceMeta: nonNilMap(s.Meta),
		ServicePort: int(s.Port), ServiceWeights: weightsOf(s), ServiceEnableTagOverride: s.EnableTagOverride,
		CreateIndex: s.CreateIndex, ModifyIndex: s.ModifyIndex, Node: s.Node, Datacenter: defaultDatacenter}
	if n != nil {
		out.ID, out.Address, out.Datacenter, out.TaggedAddresses, out.NodeMeta = n.Id, n.Address, dcOr(n.Datacenter), n.TaggedAddresses, n.Meta
	}
	return out
}

// checkDefJSON is api.HealthCheckDefinition; durations are Go duration
// strings, as Consul writes them.
type checkDefJSON struct {
	HTTP                           string
	Header                         map[string][]string
	Method                         string
	Body                           string
	TLSServerName                  string
	TLSSkipVerify                  bool
	TCP                            string
	UDP                            string
	GRPC                           string
	GRPCUseTLS                     bool
	Interval                       checks.Duration
	Timeout                        checks.Duration
	DeregisterCriticalServiceAfter checks.Duration
}

// healthCheckJSON is api.HealthCheck.
type healthCheckJSON struct {
	Node        string
	CheckID     string
	Name        string
	Status      string
	Notes       string
	Output      string
	ServiceID   string
	ServiceName string
	ServiceTags []string
	Type        string
	Definition  checkDefJSON
	CreateIndex uint64
	ModifyIndex uint64
}

func checkOut(c *lodestonepb.Check) healthCheckJSON {
	out := healthCheckJSON{Node: c.Node, CheckID: c.CheckId, Name: c.Name, Status: lodestonepb.HealthStatusWord(c.Status), Notes: c.Notes,
		Output: c.Output, ServiceID: c.ServiceId, ServiceName: c.ServiceName, ServiceTags: nonNil(c.ServiceTags),
		Type: c.Type, CreateIndex: c.CreateIndex, ModifyIndex: c.ModifyIndex}
	if d := c.Definition; d != nil {
		out.Definition = checkDefJSON{HTTP: d.Http, Method: d.Method, Body: d.Body, TLSServerName: d.TlsServerName,
			TLSSkipVerify: d.TlsSkipVerify, TCP: d.Tcp, UDP: d.Udp, GRPC: d.Grpc, GRPCUseTLS: d.GrpcUseTls,
			Interval: checks.Duration(d.Interval.AsDuration()), Timeout: checks.Duration(d.Timeout.AsDuration()),
			DeregisterCriticalServiceAfter: checks.Duration(d.DeregisterCriticalServiceAfter.AsDuration())}
		out.Definition.Header = headerOut(d.Header)
	}
	return out
}

func checksOut(cs []*lodestonepb.Check) []healthCheckJSON {
	out := make([]healthCheckJSON, len(cs))
	for i, c := range cs {
		out[i] = checkOut(c)
	}
	return out
}

// parseStatus maps Consul's status names; "" is unspecified (the store
// then starts a new check critical, as Consul does).
func parseStatus(field, s string) (lodestonepb.HealthStatus, error) {
	st, err := lodestonepb.ParseHealthStatus(s)
	if err != nil {
		return 0, badRequest("Invalid %s: %v", field, err)
	}
	return st, nil
}

// headerPB and headerOut convert a check definition's HTTP headers.
func headerPB(h map[string][]string) map[string]*lodestonepb.HeaderValues {
	if len(h) == 0 {
		return nil
	}
	out := make(map[string]*lodestonepb.HeaderValues, len(h))
	for k, v := range h {
		out[k] = &lodestonepb.HeaderValues{Values: v}
	}
	return out
}

func headerOut(h map[string]*lodestonepb.HeaderValues) map[string][]string {
	if len(h) == 0 {
		return nil
	}
	out := make(map[string][]string, len(h))
	for k, v := range h {
		out[k] = v.Values
	}
	return out
}
