package dnsapi

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	dto "github.com/prometheus/client_model/go"
)

// A service answers its healthy instances by address: the service's own,
// or its node's; SRV names the node (node address) or the address (an
// address of its own), with the address in the additional section.
func TestServiceAnswersAddressesAndSRV(t *testing.T) {
	c := newCatalog(t)
	c.register("n1", "10.0.0.1", "web1", "web", "", 8080, passing, "v1")
	c.register("n2", "10.0.0.2", "web2", "web", "10.1.0.2", 8081, noCheck, "v2")
	c.register("n3", "10.0.0.3", "web3", "web", "2001:db8::3", 8082, warning)
	c.register("n4", "10.0.0.4", "web4", "web", "", 8083, critical)
	s := serve(t, c, nil)

	a := askUDP(t, s.Addr(), "web.service.consul.", dns.TypeA)
	wantRcode(t, "web A", a, dns.RcodeSuccess)
	if !a.Authoritative || a.RecursionAvailable {
		t.Fatalf("web A: aa=%v ra=%v, want aa and no ra", a.Authoritative, a.RecursionAvailable)
	}
	wantRecords(t, "web A", a.Answer, dns.TypeA, "web.service.consul. A 10.0.0.1", "web.service.consul. A 10.1.0.2")
	aaaa := askUDP(t, s.Addr(), "web.service.consul.", dns.TypeAAAA)
	wantRecords(t, "web AAAA", aaaa.Answer, dns.TypeAAAA, "web.service.consul. AAAA 2001:db8::3")

	srv := askUDP(t, s.Addr(), "web.service.consul.", dns.TypeSRV)
	wantRecords(t, "web SRV", srv.Answer, dns.TypeSRV,
		"web.service.consul. SRV 1 1 8080 n1.node.dc1.consul.",
		"web.service.consul. SRV 1 1 8081 0a010002.addr.dc1.consul.",
		"web.service.consul. SRV 1 1 8082 20010db8000000000000000000000003.addr.dc1.consul.")
	wantRecords(t, "web SRV extra", srv.Extra, dns.TypeA, "n1.node.dc1.consul. A 10.0.0.1", "0a010002.addr.dc1.consul. A 10.1.0.2")
	wantRecords(t, "web SRV extra", srv.Extra, dns.TypeAAAA, "20010db8000000000000000000000003.addr.dc1.consul. AAAA 2001:db8::3")

	// The SRV targets resolve.
	wantRecords(t, "node target", askUDP(t, s.Addr(), "n1.node.dc1.consul.", dns.TypeA).Answer, dns.TypeA, "n1.node.dc1.consul. A 10.0.0.1")
	wantRecords(t, "addr target", askUDP(t, s.Addr(), "0a010002.addr.dc1.consul.", dns.TypeA).Answer, dns.TypeA, "0a010002.addr.dc1.consul. A 10.1.0.2")
}

// Tags, RFC 2782 names, the datacenter label and case: each selects
// as Consul's do.
func TestServiceNameForms(t *testing.T) {
	c := newCatalog(t)
	c.register("n1", "10.0.0.1", "db1", "db", "", 5432, passing, "primary")
	c.register("n2", "10.0.0.2", "db2", "db", "", 5432, passing, "replica", "v1.2")
	c.register("n3", "10.0.0.3", "Cache1", "Cache", "", 6379, passing)
	s := serve(t, c, nil)

	for _, tc := range []struct {
		name  string
		qtype uint16
		want  []string // A addresses or SRV targets
	}{
		{"db.service.consul.", dns.TypeA, []string{"10.0.0.1", "10.0.0.2"}},
		{"primary.db.service.consul.", dns.TypeA, []string{"10.0.0.1"}},
		{"REPLICA.db.service.consul.", dns.TypeA, []string{"10.0.0.2"}},
		{"v1.2.db.service.consul.", dns.TypeA, []string{"10.0.0.2"}},
		{"db.service.dc1.consul.", dns.TypeA, []string{"10.0.0.1", "10.0.0.2"}},
		{"db.service.dc1.dc.consul.", dns.TypeA, []string{"10.0.0.1", "10.0.0.2"}},
		{"DB.Service.Consul.", dns.TypeA, []string{"10.0.0.1", "10.0.0.2"}},
		{"_db._tcp.service.consul.", dns.TypeSRV, []string{"n1.node.dc1.consul.", "n2.node.dc1.consul."}},
		{"_db._replica.service.consul.", dns.TypeSRV, []string{"n2.node.dc1.consul."}},
		{"_db._tcp.service.dc1.consul.", dns.TypeSRV, []string{"n1.node.dc1.consul.", "n2.node.dc1.consul."}},
		{"_db._primary.consul.", dns.TypeSRV, []string{"n1.node.dc1.consul."}},
		{"cache.service.consul.", dns.TypeA, []string{"10.0.0.3"}},
	} {
		m := askUDP(t, s.Addr(), tc.name, tc.qtype)
		wantRcode(t, tc.name, m, dns.RcodeSuccess)
		var got []string
		for _, rr := range m.Answer {
			switch r := rr.(type) {
			case *dns.A:
				got = append(got, r.A.String())
			case *dns.SRV:
				got = append(got, r.Target)
			}
			if rr.Header().Name != tc.name {
				t.Fatalf("%s: record owner %q, want the name as asked", tc.name, rr.Header().Name)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Fatalf("%s %s: got %v, want %v", tc.name, dns.TypeToString[tc.qtype], got, tc.want)
		}
	}

	for _, name := range []string{"missing.db.service.consul.", "db.service.dc2.consul.", "db.service.dc1.peer.consul.",
		"nosuch.service.consul.", "service.consul.", "consul.", "db.query.consul.", "db.connect.consul."} {
		m := askUDP(t, s.Addr(), name, dns.TypeA)
		wantRcode(t, name, m, dns.RcodeNameError)
		wantSOA(t, name, m)
	}
}

// Critical instances are never answered; warning ones are unless
// OnlyPassing; a check's change shows in the very next answer.
func TestHealthFiltersAnswers(t *testing.T) {
	c := newCatalog(t)
	c.register("n1", "10.0.0.1", "api1", "api", "", 80, passing)
	c.register("n2", "10.0.0.2", "api2", "api", "", 80, warning)
	c.register("n3", "10.0.0.3", "api3", "api", "", 80, critical)
	all := serve(t, c, nil)
	strict := serve(t, c, func(cfg *Config) { cfg.OnlyPassing = true })

	wantRecords(t, "default", askUDP(t, all.Addr(), "api.service.consul.", dns.TypeA).Answer, dns.TypeA,
		"api.service.consul. A 10.0.0.1", "api.service.consul. A 10.0.0.2")
	wantRecords(t, "only passing", askUDP(t, strict.Addr(), "api.service.consul.", dns.TypeA).Answer, dns.TypeA,
		"api.service.consul. A 10.0.0.1")

	c.setCheck("n1", "api1", critical)
	wantRecords(t, "n1 critical", askUDP(t, all.Addr(), "api.service.consul.", dns.TypeA).Answer, dns.TypeA,
		"api.service.consul. A 10.0.0.2")
	m := askUDP(t, strict.Addr(), "api.service.consul.", dns.TypeA)
	wantRcode(t, "no passing instance left", m, dns.RcodeNameError)
	wantSOA(t, "no passing instance left", m)

	c.setCheck("n3", "api3", passing)
	wantRecords(t, "n3 passing", askUDP(t, all.Addr(), "api.service.consul.", dns.TypeA).Answer, dns.TypeA,
		"api.service.consul. A 10.0.0.2", "api.service.consul. A 10.0.0.3")

	// A warning instance carries its warning weight.
	c.apply(registerWeighted("n5", "10.0.0.5", "api5", "api", 10, 2, warning))
	srv := askUDP(t, all.Addr(), "api.service.consul.", dns.TypeSRV)
	for _, rr := range srv.Answer {
		if r := rr.(*dns.SRV); r.Target == "n5.node.dc1.consul." && r.Weight != 2 {
			t.Fatalf("warning instance weight %d, want its warning weight 2", r.Weight)
		}
	}
}

// A name with instances but none of the type asked is NOERROR with the
// SOA; other types of a service answer as Consul does.
func TestNoDataAndOtherTypes(t *testing.T) {
	c := newCatalog(t)
	c.register("n1", "10.0.0.1", "v4", "v4only", "", 80, passing)
	c.register("ext", "db.example.com", "extdb", "extdb", "", 5432, passing)
	s := serve(t, c, nil)

	m := askUDP(t, s.Addr(), "v4only.service.consul.", dns.TypeAAAA)
	wantRcode(t, "AAAA of an IPv4 service", m, dns.RcodeSuccess)
	wantSOA(t, "AAAA of an IPv4 service", m)
	m = askUDP(t, s.Addr(), "v4only.service.consul.", dns.TypeMX)
	wantRcode(t, "MX of a service", m, dns.RcodeSuccess)
	wantSOA(t, "MX of a service", m)

	wantRecords(t, "external service A", askUDP(t, s.Addr(), "extdb.service.consul.", dns.TypeA).Answer, dns.TypeCNAME,
		"extdb.service.consul. CNAME db.example.com.")
	wantRecords(t, "external service SRV", askUDP(t, s.Addr(), "extdb.service.consul.", dns.TypeSRV).Answer, dns.TypeSRV,
		"extdb.service.consul. SRV 1 1 5432 db.example.com.")

	soaAns := askUDP(t, s.Addr(), "v4only.service.consul.", dns.TypeSOA)
	wantRecords(t, "SOA", soaAns.Answer, dns.TypeSOA, fmt.Sprintf("consul. SOA ns.consul. hostmaster.consul. %d 3600 600 86400 0",
		soaAns.Answer[0].(*dns.SOA).Serial))
	wantRcode(t, "AXFR", ask(t, s.Addr(), "tcp", "consul.", dns.TypeAXFR, 0), dns.RcodeNotImplemented)
}

// Node names answer the node's address and meta, case-insensitively.
func TestNodeLookup(t *testing.T) {
	c := newCatalog(t)
	c.apply(registerNode("Web-Node.1", "10.0.0.7", map[string]string{"rack": "r1", "rfc1035-raw": "as is", "k=v": "x"}))
	c.apply(registerNode("v6", "2001:db8::7", nil))
	s := serve(t, c, nil)

	m := askUDP(t, s.Addr(), "web-node.1.node.consul.", dns.TypeA)
	wantRecords(t, "node A", m.Answer, dns.TypeA, "web-node.1.node.consul. A 10.0.0.7")
	wantRecords(t, "node A meta", m.Extra, dns.TypeTXT,
		`web-node.1.node.consul. TXT "k`+"`"+`=v=x"`, `web-node.1.node.consul. TXT "rack=r1"`, `web-node.1.node.consul. TXT "as is"`)
	m = askUDP(t, s.Addr(), "web-node.1.node.dc1.consul.", dns.TypeTXT)
	if len(records(m.Answer, dns.TypeTXT)) != 3 || len(records(m.Answer, dns.TypeA)) != 0 {
		t.Fatalf("node TXT: %v, want the three meta records only", m.Answer)
	}
	wantRecords(t, "v6 AAAA", askUDP(t, s.Addr(), "v6.node.consul.", dns.TypeAAAA).Answer, dns.TypeAAAA, "v6.node.consul. AAAA 2001:db8::7")
	// Consul answers a node's other families and types NOERROR, empty.
	m = askUDP(t, s.Addr(), "v6.node.consul.", dns.TypeA)
	wantRcode(t, "A of an IPv6 node", m, dns.RcodeSuccess)
	if len(m.Answer) != 0 {
		t.Fatalf("A of an IPv6 node: %v", m.Answer)
	}
	m = askUDP(t, s.Addr(), "nosuch.node.consul.", dns.TypeA)
	wantRcode(t, "unknown node", m, dns.RcodeNameError)
	wantSOA(t, "unknown node", m)
	wantRcode(t, "node in another dc", askUDP(t, s.Addr(), "v6.node.dc9.consul.", dns.TypeAAAA), dns.RcodeNameError)
}

// Answers come in varied orders, and every instance comes first about as
// often as any other (cache.go says how).
func TestAnswersShuffled(t *testing.T) {
	c := newCatalog(t)
	for i := range 8 {
		c.register(fmt.Sprintf("n%d", i), fmt.Sprintf("10.0.0.%d", i+1), fmt.Sprintf("s%d", i), "spread", "", 80, passing)
	}
	s := serve(t, c, nil)
	orders := map[string]bool{}
	firsts := map[string]int{}
	const asks = 400
	for range asks {
		m := askUDP(t, s.Addr(), "spread.service.consul.", dns.TypeA)
		var order []string
		for _, rr := range m.Answer {
			order = append(order, rr.(*dns.A).A.String())
		}
		if len(order) != 8 {
			t.Fatalf("got %d answers, want 8", len(order))
		}
		orders[strings.Join(order, ",")] = true
		firsts[order[0]]++
	}
	// NB: each count is Binomial(400, 1/8), mean 50 and deviation 6.6:
	// outside [15, 95] is beyond 5 deviations. Past 256 answers the
	// variants are built again, so more than 8 orders show.
	for addr, n := range firsts {
		if n < 15 || n > 95 {
			t.Errorf("%s came first %d times in %d answers, want about %d", addr, n, asks, asks/8)
		}
	}
	if len(firsts) != 8 || len(orders) < 12 {
		t.Fatalf("%d answers came in %d orders with %d distinct first answers; want at least 12 orders and all 8 first", asks, len(orders), len(firsts))
	}
}

// A large service fills a UDP answer, sets TC, and answers in full over
// TCP; a client without EDNS0 gets UDPAnswerLimit answers.
func TestTruncation(t *testing.T) {
	c := newCatalog(t)
	const n = 200
	for i := range n {
		c.register(fmt.Sprintf("node-%03d", i), fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256+1),
			fmt.Sprintf("big%d", i), "big", "", uint32(20000+i), passing)
	}
	s := serve(t, c, nil)

	plain := ask(t, s.Addr(), "udp", "big.service.consul.", dns.TypeA, 0)
	if !plain.Truncated || len(plain.Answer) != 3 {
		t.Fatalf("UDP without EDNS0: tc=%v with %d answers, want tc with 3", plain.Truncated, len(plain.Answer))
	}
	for _, size := range []uint16{512, 1232, 4096} {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeSRV} {
			m := ask(t, s.Addr(), "udp", "big.service.consul.", qtype, size)
			m.Compress = true // NB: as it came on the wire
			packed, err := m.Pack()
			if err != nil {
				t.Fatal(err)
			}
			// NB: 200 A records fit 4096 bytes compressed; nothing else here does.
			fits := qtype == dns.TypeA && size == 4096
			if m.Truncated == fits || len(m.Answer) == 0 || (len(m.Answer) == n) != fits || len(packed) > int(size) {
				t.Fatalf("UDP %s with EDNS0 %d: tc=%v, %d answers in %d bytes; want tc=%v, %d answers if they fit, at most %d bytes",
					dns.TypeToString[qtype], size, m.Truncated, len(m.Answer), len(packed), !fits, n, size)
			}
			if qtype == dns.TypeSRV && len(records(m.Extra, dns.TypeA)) != len(m.Answer) {
				t.Fatalf("UDP SRV with EDNS0 %d: %d answers but %d addresses; each kept target needs its address",
					size, len(m.Answer), len(records(m.Extra, dns.TypeA)))
			}
			if m.IsEdns0() == nil || m.IsEdns0().UDPSize() != size {
				t.Fatalf("UDP with EDNS0 %d: reply's OPT %v, want the size echoed", size, m.IsEdns0())
			}
		}
	}
	for _, qtype := range []uint16{dns.TypeA, dns.TypeSRV} {
		m := ask(t, s.Addr(), "tcp", "big.service.consul.", qtype, 0)
		if m.Truncated || len(m.Answer) != n {
			t.Fatalf("TCP %s: tc=%v with %d answers, want all %d", dns.TypeToString[qtype], m.Truncated, len(m.Answer), n)
		}
		if qtype == dns.TypeSRV {
			ports := map[uint16]bool{}
			for _, rr := range m.Answer {
				ports[rr.(*dns.SRV).Port] = true
			}
			if len(ports) != n || len(records(m.Extra, dns.TypeA)) != n {
				t.Fatalf("TCP SRV: %d ports, %d addresses; want %d each", len(ports), len(records(m.Extra, dns.TypeA)), n)
			}
		}
	}

	// EnableTruncate off: a subset, silently, as Consul's default.
	quiet := serve(t, c, func(cfg *Config) { cfg.EnableTruncate = false })
	if m := ask(t, quiet.Addr(), "udp", "big.service.consul.", dns.TypeA, 0); m.Truncated || len(m.Answer) != 3 {
		t.Fatalf("without EnableTruncate: tc=%v with %d answers, want no tc and 3", m.Truncated, len(m.Answer))
	}
}

// Service TTLs: the exact name, else the longest prefix, else 0; node
// answers carry the node TTL.
func TestTTLs(t *testing.T) {
	c := newCatalog(t)
	for _, name := range []string{"web", "web-api", "db"} {
		c.register("n-"+name, "10.0.0.1", name, name, "", 80, passing)
	}
	var ttls TTLs
	for _, v := range []string{"web=10s", "web-*=5s", "*=1s"} {
		if err := ttls.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	s := serve(t, c, func(cfg *Config) { cfg.ServiceTTL, cfg.NodeTTL = ttls, 30*time.Second })
	for name, want := range map[string]uint32{"web": 10, "web-api": 5, "db": 1} {
		m := askUDP(t, s.Addr(), name+".service.consul.", dns.TypeSRV)
		for _, rr := range append(m.Answer, m.Extra...) {
			if rr.Header().Rrtype != dns.TypeOPT && rr.Header().Ttl != want {
				t.Fatalf("%s: record %v has TTL %d, want %d", name, rr, rr.Header().Ttl, want)
			}
		}
	}
	if m := askUDP(t, s.Addr(), "n-db.node.consul.", dns.TypeA); m.Answer[0].Header().Ttl != 30 {
		t.Fatalf("node TTL %d, want 30", m.Answer[0].Header().Ttl)
	}
}

// Outside the domain: REFUSED without recursors, forwarded with them,
// SERVFAIL when none answers.
func TestRecursors(t *testing.T) {
	c := newCatalog(t)
	plain := serve(t, c, nil)
	wantRcode(t, "no recursors", askUDP(t, plain.Addr(), "example.com.", dns.TypeA), dns.RcodeRefused)

	upstream := fakeUpstream(t)
	dead := deadAddr(t)
	fwd := serve(t, c, func(cfg *Config) {
		cfg.Recursors = []string{dead, upstream}
		cfg.RecursorTimeout = 200 * time.Millisecond
	})
	for _, network := range []string{"udp", "tcp"} {
		m := ask(t, fwd.Addr(), network, "example.com.", dns.TypeA, 0)
		wantRecords(t, "forwarded over "+network, m.Answer, dns.TypeA, "example.com. A 192.0.2.1")
	}
	wantRcode(t, "upstream NXDOMAIN", askUDP(t, fwd.Addr(), "nosuch.example.com.", dns.TypeA), dns.RcodeNameError)
	if m := askUDP(t, fwd.Addr(), "x.service.consul.", dns.TypeA); !m.RecursionAvailable {
		t.Fatal("with recursors, answers should say recursion is available")
	}

	allDead := serve(t, c, func(cfg *Config) {
		cfg.Recursors = []string{dead}
		cfg.RecursorTimeout = 100 * time.Millisecond
	})
	wantRcode(t, "recursor down", askUDP(t, allDead.Addr(), "example.com.", dns.TypeA), dns.RcodeServerFailure)
}

// fakeUpstream answers example.com A 192.0.2.1 and NXDOMAIN for the rest,
// on UDP and TCP.
func fakeUpstream(t *testing.T) string {
	t.Helper()
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if r.Question[0].Name == "example.com." {
			rr, _ := dns.NewRR("example.com. 60 IN A 192.0.2.1")
			m.Answer = append(m.Answer, rr)
		} else {
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	for _, srv := range []*dns.Server{{PacketConn: l.UDP, Handler: h}, {Listener: l.TCP, Handler: h}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		done := make(chan struct{})
		go func() {
			defer close(done)
			srv.ActivateAndServe()
		}()
		<-started
		t.Cleanup(func() {
			srv.Shutdown()
			<-done
		})
	}
	return l.Addr()
}

// deadAddr is a loopback address where nothing answers: its UDP port is
// bound and never read, its TCP port refuses.
func deadAddr(t *testing.T) string {
	t.Helper()
	u, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	return u.LocalAddr().String()
}

// Queries are counted by type and rcode, and timed.
func TestMetrics(t *testing.T) {
	c := newCatalog(t)
	c.register("n1", "10.0.0.1", "web", "web", "", 80, passing)
	s := serve(t, c, nil)
	for range 3 {
		askUDP(t, s.Addr(), "web.service.consul.", dns.TypeA)
	}
	askUDP(t, s.Addr(), "nosuch.service.consul.", dns.TypeSRV)
	askUDP(t, s.Addr(), "web.service.consul.", dns.TypeHINFO)
	want := map[string]float64{"A/NOERROR": 3, "SRV/NXDOMAIN": 1, "other/NOERROR": 1}
	got := map[string]float64{}
	var observed uint64
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "lodestone_dns_queries_total":
			for _, m := range mf.Metric {
				got[label(m, "type")+"/"+label(m, "rcode")] = m.GetCounter().GetValue()
			}
		case "lodestone_dns_query_duration_seconds":
			observed = mf.Metric[0].GetHistogram().GetSampleCount()
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) || observed != 5 {
		t.Fatalf("queries %v (timed %d), want %v (timed 5)", got, observed, want)
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Past MaxTCPConnections a connection is closed at once and counted; the
// others keep working.
func TestTCPConnectionLimit(t *testing.T) {
	c := newCatalog(t)
	c.register("n1", "10.0.0.1", "web", "web", "", 80, passing)
	s := serve(t, c, func(cfg *Config) { cfg.MaxTCPConnections = 2 })
	var conns []*dns.Conn
	for range 2 {
		conn, err := dns.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conns = append(conns, conn)
		exchange(t, conn)
	}
	extra, err := dns.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	m := new(dns.Msg).SetQuestion("web.service.consul.", dns.TypeA)
	extra.SetDeadline(time.Now().Add(5 * time.Second))
	if err := extra.WriteMsg(m); err == nil {
		if _, err := extra.ReadMsg(); err == nil {
			t.Fatal("a third TCP connection was answered past a limit of 2")
		}
	}
	exchange(t, conns[0])
	if got := counter(t, s, "lodestone_dns_refused_total", "reason", reasonTCP); got != 1 {
		t.Fatalf("refused connections counted %v, want 1", got)
	}
	// A closed connection frees its slot.
	conns[1].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		conn, err := dns.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(time.Second))
		err = conn.WriteMsg(m)
		if err == nil {
			_, err = conn.ReadMsg()
		}
		conn.Close()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no slot after a connection closed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func exchange(t *testing.T, conn *dns.Conn) {
	t.Helper()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if err := conn.WriteMsg(new(dns.Msg).SetQuestion("web.service.consul.", dns.TypeA)); err != nil {
		t.Fatal(err)
	}
	r, err := conn.ReadMsg()
	if err != nil || len(r.Answer) != 1 {
		t.Fatalf("TCP exchange: %v, %v", r, err)
	}
}

func counter(t *testing.T, s *running, name, key, value string) float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.Metric {
			if label(m, key) == value {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"domain", func(c *Config) { c.Domain = "bad domain" }, "not a domain name"},
		{"empty domain", func(c *Config) { c.Domain = "." }, "not a domain name"},
		{"dc", func(c *Config) { c.Datacenter = "a.b" }, "one DNS label"},
		{"recursor", func(c *Config) { c.Recursors = []string{"dns.example.com"} }, "IP address"},
		{"recursor port", func(c *Config) { c.Recursors = []string{"10.0.0.1:99999"} }, "between 1 and 65535"},
		{"answer limit", func(c *Config) { c.UDPAnswerLimit = 9 }, "between 1 and 8"},
		{"tcp", func(c *Config) { c.MaxTCPConnections = 0 }, "max TCP connections"},
		{"node ttl", func(c *Config) { c.NodeTTL = -time.Second }, "node TTL"},
	} {
		cfg := DefaultConfig()
		tc.mutate(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
	cfg := DefaultConfig()
	cfg.Recursors = []string{"10.0.0.2", "10.0.0.3:5353", "::1", "[::1]:53"}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("good recursors refused: %v", err)
	}
	if a, _ := RecursorAddr("10.0.0.2"); a != "10.0.0.2:53" {
		t.Fatalf("recursor without a port: %s, want port 53", a)
	}
}

func TestTTLsSet(t *testing.T) {
	var ttls TTLs
	for _, bad := range []string{"web=", "web=-1s", "web=48h", "w*b=1s", "=1s", "*a*=1s", "ten seconds"} {
		if err := ttls.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
	if ttls.String() != "" {
		t.Fatalf("refused values changed the TTLs: %s", ttls)
	}
	for _, v := range []string{"5s", "Web=10s", "we*=3s", "web-*=2s"} {
		if err := ttls.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string]time.Duration{"web": 10 * time.Second, "web-a": 2 * time.Second, "weird": 3 * time.Second, "db": 5 * time.Second} {
		if got := ttls.For(name); got != want {
			t.Errorf("For(%q) = %v, want %v", name, got, want)
		}
	}
	if got := ttls.String(); got != "web=10s,web-*=2s,we*=3s,*=5s" {
		t.Fatalf("String() = %q", got)
	}
}

// Close works before Serve runs, and twice.
func TestCloseBeforeServe(t *testing.T) {
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(newCatalog(t), l, DefaultConfig(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.ServeUDP(); err != nil {
		t.Fatalf("serve after close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The port is free again.
	l2, err := Listen(s.Addr())
	if err != nil {
		t.Fatalf("port still held after Close: %v", err)
	}
	l2.Close()
}
