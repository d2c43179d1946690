package ui

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/store"
)

// dataWait is how long a data page's stream waits on one blocking index
// before it asks again (a quiet page re-renders that often, sends nothing).
const dataWait = 5 * time.Minute

// waitOn is a data page's wait: until d's index passes index.
func (u *UI) waitOn(d consulapi.Dep, index uint64) func(context.Context) error {
	return func(ctx context.Context) error { return u.b.Wait(ctx, d, index, dataWait) }
}

// catalogDep is every catalog read: services, nodes and checks.
func catalogDep() consulapi.Dep {
	return consulapi.Dep{Key: "\x00catalog/", Prefix: true, Index: func(s *store.Store) uint64 { return catalogIndex(s) }}
}

// catalogIndex is catalogDep's index in any Reader. NB: the same as the
// Dep's, or a stream's wait would return at once, again and again.
func catalogIndex(st Reader) uint64 {
	return max(st.ServicesIndex(), st.NodesIndex(), st.ChecksIndex())
}

// health is a count of instances or checks by state.
type health struct{ Passing, Warning, Critical int }

func (h *health) add(s lodestonepb.HealthStatus) {
	switch s {
	case lodestonepb.HealthStatus_HEALTH_PASSING:
		h.Passing++
	case lodestonepb.HealthStatus_HEALTH_WARNING:
		h.Warning++
	default:
		h.Critical++
	}
}

func (h health) has(state string) bool {
	switch state {
	case "passing":
		return h.Passing > 0
	case "warning":
		return h.Warning > 0
	case "critical":
		return h.Critical > 0
	}
	return true
}

type serviceRow struct {
	Name      string
	Tags      []string
	Instances int
	Health    health
}

type nodeRow struct {
	Name, Address string
	Services      int
	Checks        health
}

type servicesData struct {
	Name, Tag, State string
	States           []string
	Services         []serviceRow
	Nodes            []nodeRow
	NodesCut         int
	Index            uint64
}

// maxNodeRows bounds the node table; the filter narrows it.
const maxNodeRows = 500

func (u *UI) services(ctx context.Context, r *http.Request, rc *request) (*built, error) {
	q := r.URL.Query()
	d := &servicesData{Name: strings.TrimSpace(q.Get("name")), Tag: strings.TrimSpace(q.Get("tag")), State: q.Get("state"),
		States: []string{"", "passing", "warning", "critical"}}
	if !slices.Contains(d.States, d.State) {
		return nil, badRequest("state %q: use passing, warning or critical, or leave it empty for all", d.State)
	}
	st := u.b.Store()
	d.Index = catalogIndex(st)
	name := strings.ToLower(d.Name)
	sums, _ := st.Services()
	for _, s := range acl.FilterServices(rc.az, sums) {
		if name != "" && !strings.Contains(strings.ToLower(s.Name), name) {
			continue
		}
		if d.Tag != "" && !slices.ContainsFunc(s.Tags, func(t string) bool { return strings.EqualFold(t, d.Tag) }) {
			continue
		}
		insts, _ := st.HealthService(s.Name, nil, false)
		row := serviceRow{Name: s.Name, Tags: s.Tags}
		for _, in := range acl.FilterHealth(rc.az, insts) {
			if d.Tag != "" && !slices.ContainsFunc(in.Service.GetTags(), func(t string) bool { return strings.EqualFold(t, d.Tag) }) {
				continue
			}
			row.Instances++
			row.Health.add(in.Status)
		}
		if row.Instances == 0 && d.Tag != "" || !row.Health.has(d.State) {
			continue
		}
		d.Services = append(d.Services, row)
	}
	if d.Tag == "" {
		nodes, _ := st.Nodes()
		for _, n := range acl.FilterNodes(rc.az, nodes) {
			if name != "" && !strings.Contains(strings.ToLower(n.Name), name) {
				continue
			}
			row := nodeRow{Name: n.Name, Address: n.Address}
			checks, _ := st.NodeChecks(n.Name)
			for _, c := range acl.FilterChecks(rc.az, checks) {
				row.Checks.add(c.Status)
			}
			if !row.Checks.has(d.State) {
				continue
			}
			if ns, _ := st.Node(n.Name); ns != nil {
				row.Services = len(acl.FilterNodeServices(rc.az, ns.Services))
			}
			if len(d.Nodes) == maxNodeRows {
				d.NodesCut++
				continue
			}
			d.Nodes = append(d.Nodes, row)
		}
	}
	return &built{title: "Services and nodes", data: d, wait: u.waitOn(catalogDep(), d.Index)}, nil
}

type instanceRow struct {
	Node, Address, ID string
	Port              uint32
	Tags              []string
	Status            lodestonepb.HealthStatus
	Checks            []*lodestonepb.Check
}

type serviceData struct {
	Name      string
	Instances []instanceRow
	Health    health
	Index     uint64
}

func (u *UI) service(ctx context.Context, r *http.Request, rc *request) (*built, error) {
	name := r.PathValue("name")
	if err := rc.az.Check(acl.ResourceService, name, acl.AccessRead); err != nil {
		return nil, err
	}
	insts, meta := u.b.Store().HealthService(name, nil, false)
	d := &serviceData{Name: name, Index: meta.Index}
	for _, in := range acl.FilterHealth(rc.az, insts) {
		addr := in.Service.GetAddress()
		if addr == "" {
			addr = in.Node.GetAddress()
		}
		d.Instances = append(d.Instances, instanceRow{Node: in.Node.GetName(), Address: addr, ID: in.Service.GetId(),
			Port: in.Service.GetPort(), Tags: in.Service.GetTags(), Status: in.Status, Checks: acl.FilterChecks(rc.az, in.Checks)})
		d.Health.add(in.Status)
	}
	if len(insts) == 0 {
		if sums, _ := u.b.Store().Services(); !slices.ContainsFunc(sums, func(s *lodestonepb.ServiceSummary) bool { return s.Name == name }) {
			return nil, notFound("no service named %q is registered", name)
		}
	}
	return &built{title: "Service " + name, data: d, wait: u.waitOn(consulapi.ServiceDep(name), d.Index)}, nil
}

type nodeData struct {
	Node     *lodestonepb.Node
	Services []*lodestonepb.Service
	Checks   []*lodestonepb.Check
	Index    uint64
}

func (u *UI) node(ctx context.Context, r *http.Request, rc *request) (*built, error) {
	name := r.PathValue("node")
	if err := rc.az.Check(acl.ResourceNode, name, acl.AccessRead); err != nil {
		return nil, err
	}
	st := u.b.Store()
	ns, meta := st.Node(name)
	if ns == nil {
		return nil, notFound("no node named %q is registered", name)
	}
	checks, _ := st.NodeChecks(name)
	d := &nodeData{Node: ns.Node, Services: acl.FilterNodeServices(rc.az, ns.Services), Checks: acl.FilterChecks(rc.az, checks), Index: meta.Index}
	return &built{title: "Node " + name, data: d, wait: u.waitOn(consulapi.NodeDep(name), d.Index)}, nil
}
