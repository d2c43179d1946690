package server

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/miekg/dns"
)

// withDNS serves DNS on a free loopback port.
func withDNS(mutate func(*DNSConfig)) clusterOption {
	return func(c *Config) {
		c.DNS.Listen = "127.0.0.1:0"
		if mutate != nil {
			mutate(&c.DNS)
		}
	}
}

// dnsAsk sends one question to a member's DNS port over network.
func dnsAsk(t *testing.T, s *Server, network, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg).SetQuestion(name, qtype)
	m.SetEdns0(1232, false)
	c := &dns.Client{Net: network, Timeout: 5 * time.Second}
	resp, _, err := c.Exchange(m, s.DNSAddr())
	if err != nil {
		t.Fatalf("%s %s over %s at %s: %v", name, dns.TypeToString[qtype], network, s.DNSAddr(), err)
	}
	return resp
}

// srvPorts is an SRV answer as "target:port", sorted; "NXDOMAIN" when the
// name does not exist.
func srvPorts(t *testing.T, s *Server, name string) []string {
	t.Helper()
	m := dnsAsk(t, s, "tcp", name, dns.TypeSRV)
	if m.Rcode == dns.RcodeNameError {
		return []string{"NXDOMAIN"}
	}
	if m.Rcode != dns.RcodeSuccess {
		t.Fatalf("%s SRV: %s", name, dns.RcodeToString[m.Rcode])
	}
	var out []string
	for _, rr := range m.Answer {
		srv := rr.(*dns.SRV)
		out = append(out, fmt.Sprintf("%s:%d", srv.Target, srv.Port))
	}
	sort.Strings(out)
	return out
}

func waitSRV(t *testing.T, s *Server, name string, want ...string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want)) // NB: a copy; callers reuse theirs
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := srvPorts(t, s, name)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s SRV on %s: got %v, want %v", name, s.cfg.Name, got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The acceptance run for DNS on a 3-member cluster: services
// registered through the Consul API on the leader are answered by every
// member's DNS, passing instances only; a check going critical removes
// its instance from the next answer of the member that took the update,
// and from every member's within the time to apply it.
func TestDNSAnswersWhatTheConsulAPIRegistered(t *testing.T) {
	c := newTestCluster(t, 3, withDNS(nil))
	lead := c.waitLeader()
	cl := consulClient(t, c, lead)
	for i, st := range []string{consul.HealthPassing, consul.HealthPassing, consul.HealthWarning, consul.HealthCritical} {
		_, err := cl.Catalog().Register(&consul.CatalogRegistration{Node: fmt.Sprintf("web-%d", i), Address: fmt.Sprintf("10.0.0.%d", i+1),
			Service: &consul.AgentService{ID: "web", Service: "web", Port: 8080 + i, Tags: []string{fmt.Sprintf("t%d", i%2)}},
			Check:   &consul.AgentCheck{CheckID: "web-check", Name: "web", ServiceID: "web", Status: st}}, nil)
		if err != nil {
			t.Fatalf("register web-%d: %v", i, err)
		}
	}
	// The leader's agent also runs one instance with a TTL check.
	if err := cl.Agent().ServiceRegister(&consul.AgentServiceRegistration{ID: "web-ttl", Name: "web", Port: 9000,
		Check: &consul.AgentServiceCheck{TTL: "30s", Status: consul.HealthPassing}}); err != nil {
		t.Fatal(err)
	}
	all := []string{"web-0.node.dc1.consul.:8080", "web-1.node.dc1.consul.:8081", "web-2.node.dc1.consul.:8082",
		lead + ".node.dc1.consul.:9000"}
	for _, name := range c.names {
		waitSRV(t, c.servers[name], "web.service.consul.", all...)
		waitSRV(t, c.servers[name], "t1.web.service.consul.", all[1])
		waitSRV(t, c.servers[name], "_web._t0.service.dc1.consul.", all[0], all[2])
	}
	a := dnsAsk(t, c.servers[c.follower()], "udp", "web.service.consul.", dns.TypeA)
	if got := len(a.Answer); got != 4 || a.Rcode != dns.RcodeSuccess {
		t.Fatalf("web A on a follower: %d answers (%s), want 4", got, dns.RcodeToString[a.Rcode])
	}

	// The TTL check fails: the leader's next answer leaves it out.
	if err := cl.Agent().FailTTL("service:web-ttl", "down"); err != nil {
		t.Fatal(err)
	}
	if got := srvPorts(t, c.servers[lead], "web.service.consul."); !slices.Equal(got, slices.Sorted(slices.Values(all[:3]))) {
		t.Fatalf("leader's answer right after the check failed: %v, want %v", got, all[:3])
	}
	for _, name := range c.names {
		waitSRV(t, c.servers[name], "web.service.consul.", all[:3]...)
	}
	if err := cl.Agent().PassTTL("service:web-ttl", "up"); err != nil {
		t.Fatal(err)
	}
	if got := srvPorts(t, c.servers[lead], "web.service.consul."); !slices.Equal(got, slices.Sorted(slices.Values(all))) {
		t.Fatalf("leader's answer right after the check passed: %v, want %v", got, all)
	}

	// Deregistered is gone: NXDOMAIN once nothing is left.
	for i := range 4 {
		if _, err := cl.Catalog().Deregister(&consul.CatalogDeregistration{Node: fmt.Sprintf("web-%d", i)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.Agent().ServiceDeregister("web-ttl"); err != nil {
		t.Fatal(err)
	}
	for _, name := range c.names {
		waitSRV(t, c.servers[name], "web.service.consul.", "NXDOMAIN")
	}
	// The node lookup answers the agent node's address.
	n := dnsAsk(t, c.servers[lead], "udp", lead+".node.consul.", dns.TypeA)
	if len(n.Answer) != 1 || n.Answer[0].(*dns.A).A.String() != "127.0.0.1" {
		t.Fatalf("%s.node.consul A: %v, want 127.0.0.1", lead, n.Answer)
	}
}

// A 200-instance service registered through the Consul API: UDP answers
// what fits with TC set, TCP answers all 200.
func TestDNSLargeServiceTruncatesOverUDP(t *testing.T) {
	c := newTestCluster(t, 1, withDNS(nil))
	s := c.servers[c.waitLeader()]
	cl := consulClient(t, c, s.cfg.Name)
	const n = 200
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				_, err := cl.Catalog().Register(&consul.CatalogRegistration{Node: fmt.Sprintf("big-%03d", i),
					Address: fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), Service: &consul.AgentService{ID: "big", Service: "big", Port: 10000 + i}}, nil)
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	udp := dnsAsk(t, s, "udp", "big.service.consul.", dns.TypeSRV)
	if !udp.Truncated || len(udp.Answer) == 0 || len(udp.Answer) >= n {
		t.Fatalf("UDP: tc=%v with %d answers, want tc with part of %d", udp.Truncated, len(udp.Answer), n)
	}
	tcp := dnsAsk(t, s, "tcp", "big.service.consul.", dns.TypeSRV)
	ports := map[uint16]bool{}
	for _, rr := range tcp.Answer {
		ports[rr.(*dns.SRV).Port] = true
	}
	if tcp.Truncated || len(ports) != n {
		t.Fatalf("TCP: tc=%v with %d distinct ports, want all %d", tcp.Truncated, len(ports), n)
	}
}

// With ACLs on, answers are read with the DNS token: nothing while the
// token does not exist (SERVFAIL), then exactly what its rules let it
// read; the anonymous token, with default deny, reads nothing.
func TestDNSReadsWithItsToken(t *testing.T) {
	const secret = "5f1d6a39-8f0e-4a8c-9d7e-0c1f4e9b2a71"
	c := newTestCluster(t, 1, withACLs, withDNS(func(d *DNSConfig) { d.Token = secret }))
	s := c.servers[c.waitLeader()]
	boot, _, err := consulAs(t, c, s.cfg.Name, "").ACL().Bootstrap()
	if err != nil {
		t.Fatal(err)
	}
	mgmt := consulAs(t, c, s.cfg.Name, boot.SecretID)
	for i, name := range []string{"web", "db"} {
		if _, err := mgmt.Catalog().Register(&consul.CatalogRegistration{Node: name + "-node", Address: fmt.Sprintf("10.0.0.%d", i+1),
			Service: &consul.AgentService{ID: name, Service: name, Port: 80}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if m := dnsAsk(t, s, "udp", "web.service.consul.", dns.TypeA); m.Rcode != dns.RcodeServerFailure {
		t.Fatalf("before the DNS token exists: %s, want SERVFAIL", dns.RcodeToString[m.Rcode])
	}

	// service:read alone: the instances' nodes are not readable.
	pol, _, err := mgmt.ACL().PolicyCreate(&consul.ACLPolicy{Name: "dns", Rules: `service "web" { policy = "read" }`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := mgmt.ACL().TokenCreate(&consul.ACLToken{SecretID: secret, Description: "dns",
		Policies: []*consul.ACLTokenPolicyLink{{ID: pol.ID}}}, nil); err != nil {
		t.Fatal(err)
	}
	wantNX := func(what, name string) {
		t.Helper()
		if m := dnsAsk(t, s, "udp", name, dns.TypeA); m.Rcode != dns.RcodeNameError || len(m.Answer) != 0 {
			t.Fatalf("%s: %s with %v, want NXDOMAIN and nothing", what, dns.RcodeToString[m.Rcode], m.Answer)
		}
	}
	wantNX("service read without node read", "web.service.consul.")
	wantNX("node without node read", "web-node.node.consul.")

	pol.Rules = `service "web" { policy = "read" }
node_prefix "" { policy = "read" }`
	if _, _, err := mgmt.ACL().PolicyUpdate(pol, nil); err != nil {
		t.Fatal(err)
	}
	if m := dnsAsk(t, s, "udp", "web.service.consul.", dns.TypeA); len(m.Answer) != 1 || m.Answer[0].(*dns.A).A.String() != "10.0.0.1" {
		t.Fatalf("web with service and node read: %v, want 10.0.0.1", m.Answer)
	}
	wantNX("a service the token may not read", "db.service.consul.")
	if m := dnsAsk(t, s, "udp", "db-node.node.consul.", dns.TypeA); len(m.Answer) != 1 {
		t.Fatalf("a node the token may read: %v", m.Answer)
	}

	// Taking the right away takes the answer away at once, however often
	// it was answered (answers are kept packed).
	for range 50 {
		dnsAsk(t, s, "udp", "web.service.consul.", dns.TypeA)
	}
	pol.Rules = `node_prefix "" { policy = "read" }`
	if _, _, err := mgmt.ACL().PolicyUpdate(pol, nil); err != nil {
		t.Fatal(err)
	}
	wantNX("after service read was taken away", "web.service.consul.")
}

func TestDNSAnonymousWithDefaultDenyAnswersNothing(t *testing.T) {
	c := newTestCluster(t, 1, withACLs, withDNS(nil))
	s := c.servers[c.waitLeader()]
	boot, _, err := consulAs(t, c, s.cfg.Name, "").ACL().Bootstrap()
	if err != nil {
		t.Fatal(err)
	}
	mgmt := consulAs(t, c, s.cfg.Name, boot.SecretID)
	if _, err := mgmt.Catalog().Register(&consul.CatalogRegistration{Node: "web-node", Address: "10.0.0.1",
		Service: &consul.AgentService{ID: "web", Service: "web", Port: 80}}, nil); err != nil {
		t.Fatal(err)
	}
	if m := dnsAsk(t, s, "udp", "web.service.consul.", dns.TypeA); m.Rcode != dns.RcodeNameError {
		t.Fatalf("anonymous, default deny: %s with %v, want NXDOMAIN", dns.RcodeToString[m.Rcode], m.Answer)
	}
	// Granting the anonymous token read opens DNS, as in Consul.
	pol, _, err := mgmt.ACL().PolicyCreate(&consul.ACLPolicy{Name: "dns-anon",
		Rules: `service_prefix "" { policy = "read" }
node_prefix "" { policy = "read" }`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	anon, _, err := mgmt.ACL().TokenRead("00000000-0000-0000-0000-000000000002", nil)
	if err != nil {
		t.Fatal(err)
	}
	anon.Policies = append(anon.Policies, &consul.ACLTokenPolicyLink{ID: pol.ID})
	if _, _, err := mgmt.ACL().TokenUpdate(anon, nil); err != nil {
		t.Fatal(err)
	}
	if m := dnsAsk(t, s, "udp", "web.service.consul.", dns.TypeA); len(m.Answer) != 1 {
		t.Fatalf("anonymous granted read: %s with %v, want the instance", dns.RcodeToString[m.Rcode], m.Answer)
	}
}

// The default address is optional: a server whose default DNS address is
// taken starts without DNS; an address asked for must bind.
func TestDNSListenOptional(t *testing.T) {
	holder := newTestCluster(t, 1, withDNS(nil))
	taken := holder.servers[holder.names[0]].DNSAddr()

	cfg := testConfig()
	cfg.Name, cfg.DataDir = "opt", t.TempDir()
	cfg.ListenPeer, cfg.ListenGRPC, cfg.ListenHTTP = freeAddr(t), "127.0.0.1:0", "127.0.0.1:0"
	cfg.InitialCluster = map[string]string{"opt": cfg.ListenPeer}
	cfg.DNS.Listen = taken
	if s, err := New(cfg); err == nil {
		s.Close()
		t.Fatalf("a server asked for the taken DNS address %s started", taken)
	} else if !strings.Contains(err.Error(), taken) {
		t.Fatalf("error %q does not name the address", err)
	}
	cfg.DNS.ListenOptional = true
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("optional DNS address taken: %v", err)
	}
	s.Start()
	defer s.Close()
	if s.DNSAddr() != "" {
		t.Fatalf("DNSAddr %q, want none", s.DNSAddr())
	}
}

// The DNS acceptance with a check the server runs itself: an HTTP
// check registered through the server's agent API against an origin; when
// the origin stops, the instance leaves the DNS answer within one check
// interval (the probe that sees it down, one Raft write, the answer), and
// comes back when the origin returns.
func TestDNSDropsAnInstanceWithinOneCheckInterval(t *testing.T) {
	c := newTestCluster(t, 1, withFastChecks, withDNS(nil))
	n := c.waitLeader()
	s := c.servers[n]
	cl := consulClient(t, c, n)
	o := newOrigin(t)
	const interval = time.Second // Consul's shortest
	waitFor(t, 10*time.Second, s.selfPublished)
	for id, port := range map[string]int{"web1": 8081, "web2": 8082} {
		chk := &consul.AgentServiceCheck{TTL: "1h", Status: consul.HealthPassing}
		if id == "web1" {
			chk = &consul.AgentServiceCheck{HTTP: o.url(), Interval: interval.String()}
		}
		if err := cl.Agent().ServiceRegister(&consul.AgentServiceRegistration{ID: id, Name: "web", Port: port, Check: chk}); err != nil {
			t.Fatal(err)
		}
	}
	both := []string{n + ".node.dc1.consul.:8081", n + ".node.dc1.consul.:8082"}
	waitSRV(t, s, "web.service.consul.", both...)

	for _, step := range []struct {
		do   func()
		want []string
	}{{o.stop, both[1:]}, {o.start, both}} {
		began := time.Now()
		step.do()
		for !slices.Equal(srvPorts(t, s, "web.service.consul."), step.want) {
			if time.Since(began) > interval+interval/2 { // NB: half an interval for the write on a loaded machine
				t.Fatalf("web SRV %v after %v, want %v within one check interval (%v) and the write", srvPorts(t, s, "web.service.consul."), time.Since(began), step.want, interval)
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Logf("answer changed %v after the origin changed (check interval %v)", time.Since(began).Round(time.Millisecond), interval)
	}
}
