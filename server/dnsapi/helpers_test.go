package dnsapi

import (
	"context"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// catalog is a real store fed real commands, as the Raft loop feeds a
// server's, and the Backend the DNS server reads it through.
type catalog struct {
	t     testing.TB
	st    *store.Store
	mu    sync.Mutex
	index uint64
	acls  *acl.Resolver
}

func newCatalog(t testing.TB) *catalog {
	c := &catalog{t: t, st: store.New()}
	c.acls = acl.NewResolver(c.st, acl.Config{})
	return c
}

func (c *catalog) Store() *store.Store { return c.st }
func (c *catalog) Authorize(_ context.Context, secret string) (*acl.Authorizer, error) {
	return c.acls.Resolve(secret)
}

func (c *catalog) apply(cmd *lodestonepb.Command) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.index++
	res, _ := c.st.Apply(c.index, cmd)
	if res.GetRejected() != nil {
		c.t.Fatalf("command refused: %v", res.GetRejected())
	}
}

// register puts service name (id) on node at nodeAddr with the given
// service address, port, tags and check status (unspecified: no check).
func (c *catalog) register(node, nodeAddr, id, name, svcAddr string, port uint32, st lodestonepb.HealthStatus, tags ...string) {
	c.t.Helper()
	r := &lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: node, Address: nodeAddr},
		Service: &lodestonepb.Service{Id: id, Name: name, Address: svcAddr, Port: port, Tags: tags}}
	if st != lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED {
		r.Checks = []*lodestonepb.Check{{CheckId: "check:" + id, Name: "check", ServiceId: id, Status: st}}
	}
	c.apply(&lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: r}})
}

func (c *catalog) setCheck(node, id string, st lodestonepb.HealthStatus) {
	c.t.Helper()
	c.apply(&lodestonepb.Command{Op: &lodestonepb.Command_CheckUpdate{CheckUpdate: &lodestonepb.UpdateCheckRequest{
		Node: node, CheckId: "check:" + id, Status: st}}})
}

var (
	passing  = lodestonepb.HealthStatus_HEALTH_PASSING
	warning  = lodestonepb.HealthStatus_HEALTH_WARNING
	critical = lodestonepb.HealthStatus_HEALTH_CRITICAL
	noCheck  = lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED
)

// running is a Server answering on a free loopback port.
type running struct {
	*Server
	reg *prometheus.Registry
}

func serve(t testing.TB, b Backend, mutate func(*Config)) *running {
	t.Helper()
	return serveAt(t, b, "127.0.0.1:0", mutate)
}

// serveAt is serve on addr: a wildcard address has no UDP fast path.
func serveAt(t testing.TB, b Backend, addr string, mutate func(*Config)) *running {
	t.Helper()
	cfg := DefaultConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	l, err := Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := New(b, l, cfg, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, fn := range []func() error{s.ServeUDP, s.ServeTCP} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(); err != nil {
				t.Errorf("serve: %v", err)
			}
		}()
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		wg.Wait()
	})
	return &running{Server: s, reg: reg}
}

// ask sends one question over net ("udp" or "tcp"); edns is the EDNS0
// buffer size to advertise (0: no EDNS0).
func ask(t testing.TB, addr, net, name string, qtype uint16, edns uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	if edns > 0 {
		m.SetEdns0(edns, false)
	}
	c := &dns.Client{Net: net, Timeout: 5 * time.Second, UDPSize: 65535}
	resp, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s over %s: %v", name, dns.TypeToString[qtype], net, err)
	}
	return resp
}

func askUDP(t testing.TB, addr, name string, qtype uint16) *dns.Msg {
	t.Helper()
	return ask(t, addr, "udp", name, qtype, 4096)
}

// records lists an answer's records of one type as text without TTL and
// class: "A 10.0.0.1", "SRV 1 1 8080 n1.node.dc1.consul.", sorted.
func records(rrs []dns.RR, rrtype uint16) []string {
	var out []string
	for _, rr := range rrs {
		if rr.Header().Rrtype != rrtype {
			continue
		}
		f := strings.Fields(rr.String())
		out = append(out, strings.Join(append([]string{f[0]}, f[3:]...), " "))
	}
	sort.Strings(out)
	return out
}

func wantRecords(t testing.TB, what string, rrs []dns.RR, rrtype uint16, want ...string) {
	t.Helper()
	got := records(rrs, rrtype)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Fatalf("%s: %s records\n got %q\nwant %q", what, dns.TypeToString[rrtype], got, want)
	}
}

func wantRcode(t testing.TB, what string, m *dns.Msg, rcode int) {
	t.Helper()
	if m.Rcode != rcode {
		t.Fatalf("%s: rcode %s, want %s\n%v", what, dns.RcodeToString[m.Rcode], dns.RcodeToString[rcode], m)
	}
}

// wantSOA checks a negative answer carries the domain's SOA.
func wantSOA(t testing.TB, what string, m *dns.Msg) {
	t.Helper()
	if len(m.Ns) != 1 || m.Ns[0].Header().Rrtype != dns.TypeSOA || m.Ns[0].Header().Name != "consul." {
		t.Fatalf("%s: authority %v, want the SOA of consul.", what, m.Ns)
	}
	if len(m.Answer) != 0 {
		t.Fatalf("%s: answers %v, want none", what, m.Answer)
	}
}

func registerWeighted(node, addr, id, name string, passingWeight, warningWeight int32, st lodestonepb.HealthStatus) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: &lodestonepb.CatalogRegisterRequest{
		Node: &lodestonepb.Node{Name: node, Address: addr},
		Service: &lodestonepb.Service{Id: id, Name: name, Port: 80,
			Weights: &lodestonepb.Weights{Passing: passingWeight, Warning: warningWeight}},
		Checks: []*lodestonepb.Check{{CheckId: "check:" + id, Name: "check", ServiceId: id, Status: st}}}}}
}

func registerNode(name, addr string, meta map[string]string) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: &lodestonepb.CatalogRegisterRequest{
		Node: &lodestonepb.Node{Name: name, Address: addr, Meta: meta}}}}
}
