package dnsapi

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// fastCatalog holds the records of the other tests: instances by node
// and by their own address, IPv6, warning and critical ones, tags, an
// external service, weights, node meta, and a service too large for UDP.
func fastCatalog(t *testing.T) *catalog {
	c := newCatalog(t)
	c.register("n1", "10.0.0.1", "web1", "web", "", 8080, passing, "v1")
	c.register("n2", "10.0.0.2", "web2", "web", "10.1.0.2", 8081, noCheck, "v2")
	c.register("n3", "10.0.0.3", "web3", "web", "2001:db8::3", 8082, warning)
	c.register("n4", "10.0.0.4", "web4", "web", "", 8083, critical)
	c.register("n5", "10.0.0.5", "db1", "db", "", 5432, passing, "primary")
	c.register("n6", "10.0.0.6", "db2", "db", "", 5432, passing, "replica", "v1.2")
	c.register("ext", "db.example.com", "extdb", "extdb", "", 5432, passing)
	c.apply(registerNode("Web-Node.1", "10.0.0.7", map[string]string{"rack": "r1", "rfc1035-raw": "as is"}))
	c.apply(registerWeighted("n8", "10.0.0.8", "api1", "api", 10, 2, warning))
	for i := range 200 {
		c.register(fmt.Sprintf("node-%03d", i), fmt.Sprintf("10.9.%d.%d", i/256, i%256+1),
			fmt.Sprintf("big%d", i), "big", "", uint32(20000+i), passing)
	}
	return c
}

// Every question the other tests ask, in every EDNS0 shape, with RD and
// CD on and off, answers the same on the fast path as from the handler
// (a server on a wildcard address has no fast path), and the fast path
// answers each service question once its answer is kept.
func TestFastPathAnswersAsTheHandler(t *testing.T) {
	c := fastCatalog(t)
	var ttls TTLs
	if err := ttls.Set("web=10s"); err != nil {
		t.Fatal(err)
	}
	cfg := func(cfg *Config) { cfg.ServiceTTL = ttls }
	fast := serve(t, c, cfg)
	full := serveAt(t, c, "0.0.0.0:0", cfg)
	if fast.fast == nil || full.fast != nil {
		t.Fatalf("fast path on 127.0.0.1: %v, on 0.0.0.0: %v; want it on the bound address only", fast.fast != nil, full.fast != nil)
	}
	_, port, _ := net.SplitHostPort(full.Addr())
	fullAddr := net.JoinHostPort("127.0.0.1", port)

	names := []string{"web.service.consul.", "WEB.Service.Consul.", "v1.web.service.consul.", "_web._tcp.service.consul.",
		"_db._replica.service.consul.", "_db._primary.consul.", "db.service.dc1.consul.", "db.service.dc1.dc.consul.",
		"REPLICA.db.service.consul.", "v1.2.db.service.consul.", "extdb.service.consul.", "big.service.consul.",
		"api.service.consul.", "nosuch.service.consul.", "db.service.dc2.consul.", "db.query.consul.",
		"web-node.1.node.consul.", "n1.node.dc1.consul.", "0a010002.addr.dc1.consul.", "consul.", "example.com."}
	qtypes := []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypeTXT, dns.TypeANY, dns.TypeMX, dns.TypeSOA}
	served := 0
	for _, name := range names {
		for _, qtype := range qtypes {
			for i, size := range []uint16{0, 512, 1232, 4096} {
				q := new(dns.Msg).SetQuestion(name, qtype)
				q.RecursionDesired, q.CheckingDisabled = i%2 == 0, i == 1
				if size > 0 {
					q.SetEdns0(size, i == 3)
				}
				what := fmt.Sprintf("%s %s EDNS0 %d", name, dns.TypeToString[qtype], size)
				want := exchangeUDP(t, fullAddr, q)
				// NB: the first ask keeps one answer, the second all its
				// variants; the third is the fast path's.
				before := value(t, fast.fast.answered)
				for range 3 {
					sameAnswer(t, what, exchangeUDP(t, fast.Addr(), q), want)
				}
				service := strings.Contains(strings.ToLower(name), ".service.") || strings.HasPrefix(name, "_")
				if service && cacheable(qtype) && want.Rcode == dns.RcodeSuccess && len(want.Answer) > 0 {
					if value(t, fast.fast.answered) == before {
						t.Fatalf("%s: the fast path answered none of three asks", what)
					}
					served++
				}
			}
		}
	}
	if served < 100 {
		t.Fatalf("the fast path answered %d question shapes; the names above have over 100", served)
	}
}

// Questions the fast path does not read go to the handler as they came
// and are answered as the handler answers them.
func TestFastPathPassesOtherShapes(t *testing.T) {
	c := fastCatalog(t)
	fast := serve(t, c, nil)
	full := serveAt(t, c, "0.0.0.0:0", nil)
	_, port, _ := net.SplitHostPort(full.Addr())
	fullAddr := net.JoinHostPort("127.0.0.1", port)

	withOption := func(o dns.EDNS0) *dns.Msg {
		m := new(dns.Msg).SetQuestion("web.service.consul.", dns.TypeA)
		m.SetEdns0(1232, false)
		m.IsEdns0().Option = append(m.IsEdns0().Option, o)
		return m
	}
	shapes := map[string]func() *dns.Msg{
		"cookie": func() *dns.Msg {
			return withOption(&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef"})
		},
		"padding": func() *dns.Msg { return withOption(&dns.EDNS0_PADDING{Padding: make([]byte, 20)}) },
		"nsid":    func() *dns.Msg { return withOption(&dns.EDNS0_NSID{Code: dns.EDNS0NSID}) },
		"two questions": func() *dns.Msg {
			m := new(dns.Msg).SetQuestion("web.service.consul.", dns.TypeA)
			m.Question = append(m.Question, m.Question[0])
			return m
		},
		"update": func() *dns.Msg {
			m := new(dns.Msg).SetQuestion("web.service.consul.", dns.TypeA)
			m.Opcode = dns.OpcodeUpdate
			return m
		},
		"notify": func() *dns.Msg {
			m := new(dns.Msg).SetQuestion("web.service.consul.", dns.TypeA)
			m.Opcode = dns.OpcodeNotify
			return m
		},
		"chaos class": func() *dns.Msg {
			m := new(dns.Msg).SetQuestion("web.service.consul.", dns.TypeA)
			m.Question[0].Qclass = dns.ClassCHAOS
			return m
		},
		"dot in a label":  func() *dns.Msg { return new(dns.Msg).SetQuestion(`we\.b.service.consul.`, dns.TypeA) },
		"byte in a label": func() *dns.Msg { return new(dns.Msg).SetQuestion(`\255web.service.consul.`, dns.TypeSRV) },
		"two OPT": func() *dns.Msg {
			m := new(dns.Msg).SetQuestion("web.service.consul.", dns.TypeA)
			m.SetEdns0(1232, false)
			m.Extra = append(m.Extra, &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: 512}})
			return m
		},
	}
	for name, shape := range shapes {
		q := shape()
		want := exchangeUDP(t, fullAddr, q)
		before := value(t, fast.fast.other)
		for range 3 {
			sameAnswer(t, name, exchangeUDP(t, fast.Addr(), q), want)
		}
		if name != "cookie" && name != "padding" && value(t, fast.fast.other) != before+3 {
			t.Fatalf("%s: the fast path took it (other went %v to %v, want +3)", name, before, value(t, fast.fast.other))
		}
	}

	// Bytes after the question: miekg/dns's rules, via the handler.
	q := new(dns.Msg).SetQuestion("web.service.consul.", dns.TypeA)
	wire, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	wire = append(wire, 1, 2, 3)
	sameAnswer(t, "trailing bytes", exchangeRaw(t, fast.Addr(), wire), exchangeRaw(t, fullAddr, wire))
}

// A kept answer is answered on the fast path with no allocation: read,
// answer and write one question on a socket of its own.
func TestFastPathAnswersWithoutAllocating(t *testing.T) {
	c := newCatalog(t)
	for i := range 10 {
		c.register(fmt.Sprintf("n%d", i), fmt.Sprintf("10.0.0.%d", i+1), fmt.Sprintf("web%d", i), "web", "", 80, passing)
	}
	s := serve(t, c, nil)
	q := new(dns.Msg).SetQuestion("web.service.consul.", dns.TypeSRV)
	q.SetEdns0(1232, false)
	wire, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	// NB: the first ask keeps one variant for variantUses answers; the
	// ask after those keeps all ten, enough for the rounds below.
	for range variantUses + 2 {
		exchangeRaw(t, s.Addr(), wire)
	}

	srv, client := udpPair(t)
	f := newFastPath(s.Server, srv, 1, 16)
	bc, err := newBatchConn(srv)
	if err != nil {
		t.Fatal(err)
	}
	in, out := make([]datagram, batchSize), make([]datagram, batchSize)
	for i := range in {
		in[i].b = make([]byte, maxDatagram)
	}
	key := make([]byte, 0, 512)
	var scratch shuffleScratch
	reply := make([]byte, 4096)
	srvAddr := srv.LocalAddr().(*net.UDPAddr).AddrPort()
	round := func() {
		if _, err := client.WriteToUDPAddrPort(wire, srvAddr); err != nil {
			t.Fatal(err)
		}
		in[0].b = in[0].b[:maxDatagram]
		n, err := bc.read(in)
		if err != nil || n != 1 {
			t.Fatalf("read %d datagrams: %v", n, err)
		}
		if !f.answer(&in[0], &out[0], &key, &scratch) {
			t.Fatal("the fast path did not answer a kept question")
		}
		if err := bc.write(out[:1]); err != nil {
			t.Fatal(err)
		}
		n, _, err = client.ReadFromUDPAddrPort(reply)
		if err != nil || n < headerLen || binary.BigEndian.Uint16(reply[6:]) != 10 {
			t.Fatalf("reply of %d bytes, %v", n, err)
		}
	}
	if allocs := testing.AllocsPerRun(100, round); allocs != 0 {
		t.Fatalf("%.1f allocations per answer on the fast path, want 0", allocs)
	}
}

// A full handoff queue drops the datagram and counts it; closed, nothing
// is queued.
func TestFastPathHandoffQueueBound(t *testing.T) {
	l, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := New(newCatalog(t), l, func() Config { c := DefaultConfig(); c.UDPHandoffQueue = 2; return c }(), nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := datagram{b: []byte("not a question"), addr: netip.MustParseAddrPort("127.0.0.1:9")}
	for range 3 {
		s.fast.pass(&d)
	}
	if got := value(t, s.fast.dropped); got != 1 || len(s.fast.handoff.in) != 2 {
		t.Fatalf("queue of 2 after 3 passed: %d queued, %v dropped; want 2 and 1", len(s.fast.handoff.in), got)
	}
	b := make([]byte, 64)
	n, from, err := s.fast.handoff.ReadFrom(b)
	if err != nil || string(b[:n]) != "not a question" || from.String() != "127.0.0.1:9" {
		t.Fatalf("handed off %q from %v, %v", b[:n], from, err)
	}
	s.fast.handoff.SetReadDeadline(time.Now().Add(-time.Second))
	s.fast.handoff.in <- handoff{} // NB: a deadline past wins over a waiting datagram
	if _, _, err := s.fast.handoff.ReadFrom(b); !isTimeout(err) {
		t.Fatalf("read past its deadline: %v, want a timeout", err)
	}
	s.fast.handoff.SetReadDeadline(time.Time{})
	s.fast.handoff.Close()
	for len(s.fast.handoff.in) > 0 {
		<-s.fast.handoff.in
	}
	if _, _, err := s.fast.handoff.ReadFrom(b); err == nil {
		t.Fatal("read from a closed handoff succeeded")
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// Past AnswerCacheBytes the kept answers are dropped, counted, and built
// again; answers stay right.
func TestAnswerCacheBound(t *testing.T) {
	c := newCatalog(t)
	for i := range 8 {
		c.register(fmt.Sprintf("n%d", i), fmt.Sprintf("10.0.0.%d", i+1), fmt.Sprintf("s%d", i), fmt.Sprintf("svc%d", i), "", 80, passing)
	}
	s := serve(t, c, func(cfg *Config) { cfg.AnswerCacheBytes = 300 })
	for round := range 3 {
		for i := range 8 {
			name := fmt.Sprintf("svc%d.service.consul.", i)
			wantRecords(t, name, askUDP(t, s.Addr(), name, dns.TypeA).Answer, dns.TypeA, fmt.Sprintf("%s A 10.0.0.%d", name, i+1))
			if got := s.cache.size(); got > 300 {
				t.Fatalf("round %d: %d bytes kept, bound 300", round, got)
			}
		}
	}
	if got := counter(t, s, "lodestone_dns_answer_cache_flushes_total", "", ""); got < 1 {
		t.Fatalf("flushes counted %v, want some", got)
	}
	none := serve(t, c, func(cfg *Config) { cfg.AnswerCacheBytes = 0 })
	for range 3 {
		askUDP(t, none.Addr(), "svc0.service.consul.", dns.TypeA)
	}
	if none.cache.size() != 0 || value(t, none.fast.answered) != 0 {
		t.Fatalf("AnswerCacheBytes 0 kept %d bytes and answered %v from them", none.cache.size(), value(t, none.fast.answered))
	}
}

func TestFastPathConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		mutate func(*Config)
		want   string
	}{
		{func(c *Config) { c.UDPReaders = -1 }, "UDP readers"},
		{func(c *Config) { c.UDPReaders = maxUDPReaders + 1 }, "UDP readers"},
		{func(c *Config) { c.UDPHandoffQueue = 0 }, "handoff queue"},
		{func(c *Config) { c.AnswerCacheBytes = -1 }, "answer cache"},
	} {
		cfg := DefaultConfig()
		tc.mutate(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error saying %q", err, tc.want)
		}
	}
	// Several readers share the socket and all answer.
	c := newCatalog(t)
	c.register("n1", "10.0.0.1", "web", "web", "", 80, passing)
	s := serve(t, c, func(cfg *Config) { cfg.UDPReaders = 4 })
	for range 20 {
		wantRecords(t, "4 readers", askUDP(t, s.Addr(), "web.service.consul.", dns.TypeA).Answer, dns.TypeA, "web.service.consul. A 10.0.0.1")
	}
}

// udpPair is a server and a client socket on loopback.
func udpPair(t *testing.T) (srv, client *net.UDPConn) {
	t.Helper()
	var err error
	if srv, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	if client, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	client.SetDeadline(time.Now().Add(30 * time.Second))
	return srv, client
}

func value(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func exchangeUDP(t testing.TB, addr string, q *dns.Msg) *dns.Msg {
	t.Helper()
	q.Id = dns.Id()
	wire, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return exchangeRaw(t, addr, wire)
}

// exchangeRaw sends a datagram and reads the reply with its id.
func exchangeRaw(t testing.TB, addr string, wire []byte) *dns.Msg {
	t.Helper()
	conn, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write(wire); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65535)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("no reply from %s: %v", addr, err)
	}
	m := new(dns.Msg)
	if err := m.Unpack(buf[:n]); err != nil {
		t.Fatalf("reply does not unpack: %v", err)
	}
	if m.Id != binary.BigEndian.Uint16(wire) {
		t.Fatalf("reply id %d, asked %d", m.Id, binary.BigEndian.Uint16(wire))
	}
	return m
}

var soaSerial = regexp.MustCompile(`(SOA\s+\S+\s+\S+\s+)\d+`)

// sameAnswer says whether got answers as want does: header, question,
// OPT, and each section's records in any order (answers are shuffled),
// SOA serials aside (they are the time). A truncated answer keeps a
// random subset, so then only its counts are compared.
func sameAnswer(t testing.TB, what string, got, want *dns.Msg) {
	t.Helper()
	gh, wh := got.MsgHdr, want.MsgHdr
	gh.Id, wh.Id = 0, 0 // NB: each exchange has its own; exchangeRaw checks it
	if gh != wh || !slices.Equal(got.Question, want.Question) {
		t.Fatalf("%s: header or question differ\n got %+v %v\nwant %+v %v", what, got.MsgHdr, got.Question, want.MsgHdr, want.Question)
	}
	for i, sec := range [][2][]dns.RR{{got.Answer, want.Answer}, {got.Ns, want.Ns}, {got.Extra, want.Extra}} {
		g, w := texts(sec[0]), texts(sec[1])
		if want.Truncated {
			g, w = kinds(sec[0]), kinds(sec[1])
		}
		if !slices.Equal(g, w) {
			t.Fatalf("%s: section %d differs\n got %q\nwant %q", what, i, g, w)
		}
	}
}

func texts(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		out = append(out, soaSerial.ReplaceAllString(rr.String(), "${1}SERIAL"))
	}
	slices.Sort(out)
	return out
}

// kinds are the records' type and TTL.
func kinds(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		h := rr.Header()
		out = append(out, fmt.Sprintf("%d %s", h.Ttl, dns.TypeToString[h.Rrtype]))
	}
	slices.Sort(out)
	return out
}

// Kept answers are shuffled in their bytes: every copy unpacks to the
// same records (the SRV targets' addresses and meta still named right),
// every instance comes first about as often, and a truncated answer is
// copied as it is.
func TestShuffledCopiesKeepTheirRecords(t *testing.T) {
	c := newCatalog(t)
	for i := range 8 {
		own := ""
		if i%2 == 1 {
			own = fmt.Sprintf("10.1.0.%d", i+1) // NB: an address of its own: an .addr. target
		}
		c.apply(registerNode(fmt.Sprintf("n%d", i), fmt.Sprintf("10.0.0.%d", i+1), map[string]string{"rack": fmt.Sprint(i % 3)}))
		c.register(fmt.Sprintf("n%d", i), fmt.Sprintf("10.0.0.%d", i+1), fmt.Sprintf("s%d", i), "spread", own, uint32(8000+i), passing)
	}
	c.register("n0", "10.0.0.1", "s0b", "spread", "", 9000, passing) // NB: a second instance on n0: its extras are shared
	for i := range 40 {
		c.register(fmt.Sprintf("big-%02d", i), fmt.Sprintf("10.2.0.%d", i+1), fmt.Sprintf("b%d", i), "big", "", 80, passing)
	}
	s := serve(t, c, nil)
	for _, tc := range []struct {
		name     string
		qtype    uint16
		size     uint16
		shuffled bool
	}{
		{"spread.service.consul.", dns.TypeA, 1232, true},
		{"spread.service.consul.", dns.TypeSRV, 4096, true},
		{"spread.service.consul.", dns.TypeSRV, 0, false}, // NB: 3 of 9 answers: truncated
		{"big.service.consul.", dns.TypeSRV, 1232, false},
	} {
		what := fmt.Sprintf("%s %s EDNS0 %d", tc.name, dns.TypeToString[tc.qtype], tc.size)
		q := new(dns.Msg).SetQuestion(tc.name, tc.qtype)
		if tc.size > 0 {
			q.SetEdns0(tc.size, false)
		}
		ask(t, s.Addr(), "udp", tc.name, tc.qtype, tc.size)
		e := s.cache.get(keyOf(q, false))
		if e == nil || e.shuffled != tc.shuffled {
			t.Fatalf("%s: kept %v, shuffled in its bytes %v; want kept, shuffled %v", what, e != nil, e != nil && e.shuffled, tc.shuffled)
		}
		if !tc.shuffled {
			continue
		}
		orig := new(dns.Msg)
		if err := orig.Unpack(e.variants[0]); err != nil {
			t.Fatal(err)
		}
		firsts := map[string]int{}
		dst := make([]byte, len(e.variants[0]))
		var scratch shuffleScratch
		const copies = 900
		for range copies {
			e.shufflers[0].copyShuffled(dst, e.variants[0], &scratch)
			m := new(dns.Msg)
			if err := m.Unpack(dst); err != nil {
				t.Fatalf("%s: a shuffled copy does not unpack: %v", what, err)
			}
			sameAnswer(t, what+" shuffled", m, orig)
			firsts[m.Answer[0].String()]++
		}
		// NB: each count is Binomial(900, 1/9), mean 100, deviation 9.4.
		if len(firsts) != len(orig.Answer) {
			t.Fatalf("%s: %d of %d answers ever came first", what, len(firsts), len(orig.Answer))
		}
		for rr, n := range firsts {
			if n < 50 || n > 150 {
				t.Fatalf("%s: %s came first %d times in %d, want about %d", what, rr, n, copies, copies/len(orig.Answer))
			}
		}
	}
}

// The fast path answers on an IPv6 address as on an IPv4 one.
func TestFastPathIPv6(t *testing.T) {
	probe, err := net.ListenPacket("udp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	probe.Close()
	c := newCatalog(t)
	c.register("n1", "10.0.0.1", "web", "web", "", 80, passing)
	s := serveAt(t, c, "[::1]:0", nil)
	if s.fast == nil {
		t.Fatal("no fast path on [::1]")
	}
	for range 5 {
		wantRecords(t, "over IPv6", askUDP(t, s.Addr(), "web.service.consul.", dns.TypeA).Answer, dns.TypeA, "web.service.consul. A 10.0.0.1")
	}
	if value(t, s.fast.answered) == 0 {
		t.Fatal("the fast path answered nothing over IPv6")
	}
}
