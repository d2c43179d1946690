package dnsapi

import (
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store"
)

// instance is one answerable service instance, with what its records need
// worked out once per view.
type instance struct {
	node     string
	nodeAddr address
	svcAddr  address // zero: the instance uses its node's address
	port     uint16
	weight   uint16
	tags     []string // lowercase
	nodeMeta map[string]string
	// srvKey is what makes two SRV answers the same: node, service
	// address and port.
	srvKey string
}

// address is an IP address or a host name (an external service).
type address struct {
	ip   net.IP // 4 bytes for IPv4; nil for a host name or no address
	host string // fully qualified, when not an IP
}

func parseAddress(s string) address {
	if s == "" {
		return address{}
	}
	if ip := net.ParseIP(s); ip != nil {
		if v4 := ip.To4(); v4 != nil {
			ip = v4
		}
		return address{ip: ip}
	}
	return address{host: strings.ToLower(dnsFqdn(s))}
}

func (a address) empty() bool { return a.ip == nil && a.host == "" }

func dnsFqdn(s string) string {
	if strings.HasSuffix(s, ".") {
		return s
	}
	return s + "."
}

// serviceView is the answerable instances of one service at one index of
// the store. It is immutable once built, except for its ACL-filtered copy.
type serviceView struct {
	index     uint64 // store.ServiceIndex the view was read at
	ttl       time.Duration
	instances []*instance
	filtered  atomic.Pointer[filteredView]
}

// filteredView is a view's instances that one Authorizer may read.
type filteredView struct {
	authz     *acl.Authorizer
	instances []*instance
}

// readable is v's instances on nodes authz may read, kept for the next
// query with the same Authorizer (a resolver hands out one per token
// until the ACLs change).
func (v *serviceView) readable(authz *acl.Authorizer) []*instance {
	if f := v.filtered.Load(); f != nil && f.authz == authz {
		return f.instances
	}
	out := v.instances
	for i, in := range v.instances {
		if !authz.Allowed(acl.ResourceNode, in.node, acl.AccessRead) {
			out = make([]*instance, 0, len(v.instances)-1)
			out = append(out, v.instances[:i]...)
			for _, w := range v.instances[i+1:] {
				if authz.Allowed(acl.ResourceNode, w.node, acl.AccessRead) {
					out = append(out, w)
				}
			}
			break
		}
	}
	v.filtered.Store(&filteredView{authz: authz, instances: out})
	return out
}

// maxViews bounds the views kept; past it the cache starts over. Views
// are kept only for names that had instances, so it is reached only by a
// catalog with that many services all looked up.
const maxViews = 100_000

// views builds and keeps the serviceView of every service asked for.
type views struct {
	st          *store.Store
	onlyPassing bool
	ttls        TTLs

	mu     sync.RWMutex
	byName map[string]*serviceView // by lowercase name
	names  atomic.Pointer[nameIndex]
}

func newViews(st *store.Store, onlyPassing bool, ttls TTLs) *views {
	return &views{st: st, onlyPassing: onlyPassing, ttls: ttls, byName: map[string]*serviceView{}}
}

// get is the view of service name (lowercase), nil when nothing is
// registered under it in any case. The store's index for the name says
// whether the kept view is current, so an unchanged service costs one
// index lookup.
func (vs *views) get(name string) *serviceView {
	idx := vs.st.ServiceIndex(name)
	vs.mu.RLock()
	v := vs.byName[name]
	vs.mu.RUnlock()
	if v != nil && v.index == idx {
		return v
	}
	hs, meta := vs.st.HealthService(name, nil, false)
	if len(hs) == 0 {
		vs.forget(name)
		// NB: names are case-insensitive in DNS and in Consul's catalog;
		// one registered as "Web" is looked up here, uncached.
		return vs.otherCase(name)
	}
	v = vs.build(name, meta.Index, hs)
	vs.mu.Lock()
	if len(vs.byName) >= maxViews {
		vs.byName = map[string]*serviceView{}
	}
	vs.byName[name] = v
	vs.mu.Unlock()
	return v
}

func (vs *views) forget(name string) {
	vs.mu.RLock()
	_, ok := vs.byName[name]
	vs.mu.RUnlock()
	if ok {
		vs.mu.Lock()
		delete(vs.byName, name)
		vs.mu.Unlock()
	}
}

// otherCase is the view of the services whose name is name in another
// case, nil when there are none.
func (vs *views) otherCase(name string) *serviceView {
	var hs []*lodestonepb.ServiceHealth
	for _, canonical := range vs.nameIndex().byLower[name] {
		if canonical != name {
			h, _ := vs.st.HealthService(canonical, nil, false)
			hs = append(hs, h...)
		}
	}
	if len(hs) == 0 {
		return nil
	}
	return vs.build(name, 0, hs)
}

func (vs *views) build(name string, index uint64, hs []*lodestonepb.ServiceHealth) *serviceView {
	v := &serviceView{index: index, ttl: vs.ttls.For(name)}
	for _, h := range hs {
		if in := vs.instance(h); in != nil {
			v.instances = append(v.instances, in)
		}
	}
	return v
}

// instance is h as an answerable instance, nil when its state or
// addresses leave it out of every answer.
func (vs *views) instance(h *lodestonepb.ServiceHealth) *instance {
	w := h.GetService().GetWeights()
	var weight int32
	switch h.Status {
	case lodestonepb.HealthStatus_HEALTH_PASSING:
		weight = w.GetPassing()
	case lodestonepb.HealthStatus_HEALTH_WARNING:
		if vs.onlyPassing {
			return nil
		}
		weight = w.GetWarning()
	default:
		return nil
	}
	if w == nil {
		weight = 1
	}
	in := &instance{node: h.Node.GetName(), nodeAddr: parseAddress(h.Node.GetAddress()),
		svcAddr: parseAddress(h.Service.Address), port: uint16(h.Service.Port),
		weight: uint16(max(0, min(weight, 65535))), nodeMeta: h.Node.GetMeta()}
	if in.nodeAddr.empty() && in.svcAddr.empty() {
		return nil
	}
	for _, t := range h.Service.Tags {
		in.tags = append(in.tags, strings.ToLower(t))
	}
	in.srvKey = in.node + "\x00" + h.Service.Address + "\x00" + strconv.Itoa(int(in.port))
	return in
}

// nameIndex maps lowercase service names to the names registered.
type nameIndex struct {
	servicesIndex uint64
	built         time.Time
	byLower       map[string][]string
}

// nameIndexMaxAge bounds how often the name index is rebuilt: a rebuild
// lists every service, so under steady registrations it would otherwise
// cost a catalog walk per change. Only names registered in another case
// than asked wait for it.
const nameIndexMaxAge = time.Second

func (vs *views) nameIndex() *nameIndex {
	idx := vs.st.ServicesIndex()
	cur := vs.names.Load()
	if cur != nil && (cur.servicesIndex == idx || time.Since(cur.built) < nameIndexMaxAge) {
		return cur
	}
	svcs, _ := vs.st.Services()
	n := &nameIndex{servicesIndex: idx, built: time.Now(), byLower: make(map[string][]string, len(svcs))}
	for _, s := range svcs {
		l := strings.ToLower(s.Name)
		n.byLower[l] = append(n.byLower[l], s.Name)
	}
	vs.names.Store(n)
	return n
}

// nodeNames finds nodes by name case-insensitively: the name as asked
// first, then through an index of lowercase names rebuilt at most once per
// nameIndexMaxAge after a node changed.
type nodeNames struct {
	st    *store.Store
	index atomic.Pointer[nodeIndex]
}

type nodeIndex struct {
	nodesIndex uint64
	built      time.Time
	byLower    map[string]*lodestonepb.Node
}

// lookup is node name (lowercase), or nil.
func (nn *nodeNames) lookup(name string) *lodestonepb.Node {
	if ns, _ := nn.st.Node(name); ns != nil {
		return ns.Node
	}
	idx := nn.st.NodesIndex()
	cur := nn.index.Load()
	if cur == nil || (cur.nodesIndex != idx && time.Since(cur.built) >= nameIndexMaxAge) {
		nodes, _ := nn.st.Nodes()
		cur = &nodeIndex{nodesIndex: idx, built: time.Now(), byLower: make(map[string]*lodestonepb.Node, len(nodes))}
		for _, n := range nodes {
			cur.byLower[strings.ToLower(n.Name)] = n
		}
		nn.index.Store(cur)
	}
	return cur.byLower[name]
}
