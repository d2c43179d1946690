package dnsapi

import (
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"net"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/lodestone-kv/lodestone/acl"
)

var (
	// errNameNotFound answers NXDOMAIN.
	errNameNotFound = errors.New("DNS name not found")
	// errNoData answers NOERROR with no records (RFC 2308 NODATA).
	errNoData = errors.New("no records of the type asked")
)

// ServeDNS answers one question (dns.Handler).
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	start := time.Now()
	_, tcp := w.RemoteAddr().(*net.TCPAddr)
	rcode := dns.RcodeSuccess
	var resp *dns.Msg
	packed := s.fromCache(req, tcp)
	if packed == nil {
		if resp, packed = s.respond(req, tcp); packed == nil {
			rcode = resp.Rcode
		}
	}
	var qtype uint16
	if len(req.Question) > 0 {
		qtype = req.Question[0].Qtype
	}
	// NB: counted before it is written, so that a client holding its
	// answer finds it counted.
	s.metrics.observe(qtype, rcode, time.Since(start))
	var err error
	if packed != nil {
		_, err = w.Write(*packed)
		putBuffer(packed)
	} else {
		err = w.WriteMsg(resp)
	}
	if err != nil {
		s.logger.Debug("could not write a DNS answer", "client", w.RemoteAddr().String(), "err", err)
	}
}

// respond answers req: a message, or a packed service answer.
func (s *Server) respond(req *dns.Msg, tcp bool) (*dns.Msg, *[]byte) {
	if len(req.Question) != 1 {
		m := new(dns.Msg)
		return m.SetRcode(req, dns.RcodeFormatError), nil
	}
	name := strings.ToLower(req.Question[0].Name)
	if name != s.domain && !strings.HasSuffix(name, s.dotDomain) {
		if len(s.recursors) > 0 {
			return s.recurse(req, tcp), nil
		}
		m := new(dns.Msg)
		return m.SetRcode(req, dns.RcodeRefused), nil
	}
	return s.answer(req, name, tcp)
}

// reply is the empty reply to req: authoritative, recursion available
// only with recursors.
func (s *Server) reply(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Compress = true
	m.Authoritative = true
	m.RecursionAvailable = len(s.recursors) > 0
	return m
}

// answer answers a question in the domain; name is its name in lowercase.
func (s *Server) answer(req *dns.Msg, name string, tcp bool) (*dns.Msg, *[]byte) {
	q := req.Question[0]
	m := s.reply(req)
	switch q.Qtype {
	case dns.TypeSOA:
		m.Answer = []dns.RR{soa(s.domain)}
	case dns.TypeNS:
		// NB: no server names itself; Consul answers the consul
		// service's servers, which Lodestone does not register.
	case dns.TypeAXFR, dns.TypeIXFR:
		m.Rcode = dns.RcodeNotImplemented
	default:
		p, err := s.parse(q, strings.TrimSuffix(name, s.domain))
		if err == nil && p.kind == "service" && cacheable(q.Qtype) {
			var b *[]byte
			if b, err = s.packService(req, p, tcp); err == nil {
				return nil, b
			}
		} else if err == nil {
			err = s.dispatch(q, p, m)
		}
		switch {
		case err == nil:
		case errors.Is(err, errNoData):
			m.Ns = []dns.RR{soa(s.domain)}
		case errors.Is(err, errNameNotFound):
			m.Rcode = dns.RcodeNameError
			m.Ns = []dns.RR{soa(s.domain)}
		default:
			s.logger.Debug("DNS question failed", "name", q.Name, "err", err)
			m.Rcode = dns.RcodeServerFailure
		}
	}
	s.finish(req, m, tcp)
	return m, nil
}

// finish adds EDNS0 and fits m to the transport.
func (s *Server) finish(req, m *dns.Msg, tcp bool) {
	setEDNS(req, m)
	var trimmed bool
	if tcp {
		trimmed = trimTCP(req.Question[0], m)
	} else {
		trimmed = trimUDP(req, m, s.cfg.UDPAnswerLimit)
	}
	m.Truncated = trimmed && s.cfg.EnableTruncate
}

// setEDNS answers EDNS0 with EDNS0, echoing the client's buffer size as
// Consul does.
func setEDNS(req, m *dns.Msg) {
	if edns := req.IsEdns0(); edns != nil {
		m.SetEdns0(edns.UDPSize(), false)
	}
}

// question is what a name in the domain asks for.
type question struct {
	kind         string // service, node or addr
	service, tag string
	node         string
	addr         string // hex
}

// parse reads rest (the lowercase name less the domain, with its trailing
// dot) as Consul does.
func (s *Server) parse(q dns.Question, rest string) (question, error) {
	labels := dns.SplitDomainName(rest)
	var kind string
	var parts, suffixes []string
	for i := len(labels) - 1; i >= 0 && kind == ""; i-- {
		switch labels[i] {
		case "service", "node", "addr", "connect", "virtual", "ingress", "query":
			kind, parts, suffixes = labels[i], labels[:i], labels[i+1:]
		default:
			// NB: an RFC 2782 SRV name may leave "service" out.
			if q.Qtype == dns.TypeSRV && strings.HasPrefix(labels[i], "_") {
				kind, parts, suffixes = "service", labels[:i+1], labels[i+1:]
			}
		}
	}
	switch kind {
	case "service":
		if len(parts) == 0 || !s.inDC(suffixes) {
			return question{}, errNameNotFound
		}
		service, tag := serviceAndTag(parts)
		return question{kind: kind, service: service, tag: tag}, nil
	case "node":
		if len(parts) == 0 || !s.inDC(suffixes) {
			return question{}, errNameNotFound
		}
		// NB: a node name may hold dots.
		return question{kind: kind, node: strings.Join(parts, ".")}, nil
	case "addr":
		if len(parts) != 1 {
			return question{}, errNameNotFound
		}
		return question{kind: kind, addr: parts[0]}, nil
	}
	// NB: prepared queries, connect, ingress and virtual names are
	// Consul's, and not served here.
	return question{}, errNameNotFound
}

// dispatch answers p into m.
func (s *Server) dispatch(q dns.Question, p question, m *dns.Msg) error {
	switch p.kind {
	case "service":
		v, insts, err := s.lookupService(p.service, p.tag)
		if err != nil {
			return err
		}
		order := make([]*instance, len(insts))
		copy(order, insts)
		rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		return s.fillService(q, v, order, m)
	case "node":
		return s.nodeAnswer(q, p.node, m)
	}
	return s.addrAnswer(q, p.addr, m)
}

// inDC says whether the labels after the kind name this datacenter:
// none, "<dc>", or "<dc>.dc".
func (s *Server) inDC(suffixes []string) bool {
	switch len(suffixes) {
	case 0:
		return true
	case 1:
		return suffixes[0] == s.names.dc
	case 2:
		return suffixes[1] == "dc" && suffixes[0] == s.names.dc
	}
	return false
}

// serviceAndTag reads the labels before "service": RFC 2782's
// _<service>._<tag> (a tag of "tcp" is none), or [<tag>.]<service>, a tag
// that may hold dots.
func serviceAndTag(parts []string) (service, tag string) {
	n := len(parts)
	if n == 2 && strings.HasPrefix(parts[0], "_") && strings.HasPrefix(parts[1], "_") {
		tag = parts[1][1:]
		if tag == "tcp" {
			tag = ""
		}
		return parts[0][1:], tag
	}
	return parts[n-1], strings.Join(parts[:n-1], ".")
}

// lookupService is the view of service and its instances the DNS token
// may read, with tag if one is given; errNameNotFound when none.
func (s *Server) lookupService(service, tag string) (*serviceView, []*instance, error) {
	authz, err := s.authorizer()
	if err != nil {
		return nil, nil, err
	}
	if !authz.Allowed(acl.ResourceService, service, acl.AccessRead) {
		return nil, nil, errNameNotFound
	}
	v := s.views.get(service)
	if v == nil {
		return nil, nil, errNameNotFound
	}
	insts := v.readable(authz)
	if tag != "" {
		insts = withTag(insts, tag)
	}
	if len(insts) == 0 {
		return nil, nil, errNameNotFound
	}
	return v, insts, nil
}

// fillService answers q with the instances in order; errNoData when none
// has a record of the type asked.
func (s *Server) fillService(q dns.Question, v *serviceView, order []*instance, m *dns.Msg) error {
	ttl := ttlSeconds(v.ttl)
	if q.Qtype == dns.TypeSRV {
		s.addSRV(q, order, ttl, m)
	} else {
		addAddresses(s.names, q, order, ttl, m)
	}
	if len(m.Answer) == 0 {
		return errNoData
	}
	return nil
}

func withTag(insts []*instance, tag string) []*instance {
	var out []*instance
	for _, in := range insts {
		for _, t := range in.tags {
			if t == tag {
				out = append(out, in)
				break
			}
		}
	}
	return out
}

// addAddresses answers a non-SRV question with each instance's address,
// once per address; CNAMEs only when no instance has an address record
// to give (Consul's addServiceNodeRecordsToMessage).
func addAddresses(n naming, q dns.Question, order []*instance, ttl uint32, m *dns.Msg) {
	var cnames []dns.RR
	seen := newSeenSet(len(order))
	for _, in := range order {
		rrs, _ := n.serviceRecords(q, in, ttl)
		if len(rrs) == 0 || !seen.add(recordKey(rrs[0])) {
			continue
		}
		if _, ok := rrs[0].(*dns.CNAME); ok {
			if cnames == nil {
				cnames = rrs
			}
			continue
		}
		m.Answer = append(m.Answer, rrs...)
	}
	if len(m.Answer) == 0 {
		m.Answer = cnames
	}
}

// addSRV answers an SRV question: one record per node:address:port, and
// the targets' addresses and node meta in the additional section.
func (s *Server) addSRV(q dns.Question, order []*instance, ttl uint32, m *dns.Msg) {
	seen := newSeenSet(len(order))
	extras := newSeenSet(len(order))
	for _, in := range order {
		if !seen.add(in.srvKey) {
			continue
		}
		answer, extra := s.names.serviceRecords(q, in, ttl)
		m.Answer = append(m.Answer, answer...)
		for _, rr := range extra {
			if extras.add(rr.Header().Name) {
				m.Extra = append(m.Extra, rr)
			}
		}
		if node := s.names.nodeFQDN(in.node); len(in.nodeMeta) > 0 && extras.add("meta "+node) {
			m.Extra = append(m.Extra, metaTXT(node, in.nodeMeta, ttl)...)
		}
	}
}

// recordKey is what makes two address answers the same.
func recordKey(rr dns.RR) string {
	switch r := rr.(type) {
	case *dns.A:
		return string(r.A)
	case *dns.AAAA:
		return string(r.AAAA)
	case *dns.CNAME:
		return r.Target
	}
	return rr.String()
}

// seenSet remembers strings; a linear scan while small, a map past that.
type seenSet struct {
	list []string
	m    map[string]struct{}
}

func newSeenSet(n int) *seenSet {
	if n > 16 {
		return &seenSet{m: make(map[string]struct{}, n)}
	}
	return &seenSet{list: make([]string, 0, n)}
}

// add reports whether k is new, and remembers it.
func (s *seenSet) add(k string) bool {
	if s.m != nil {
		if _, ok := s.m[k]; ok {
			return false
		}
		s.m[k] = struct{}{}
		return true
	}
	for _, x := range s.list {
		if x == k {
			return false
		}
	}
	s.list = append(s.list, k)
	return true
}

// nodeAnswer answers a node lookup (Consul's handleNodeQuery): its
// address, and its meta as TXT (the answer for TXT and ANY, additional
// otherwise). Other types answer NOERROR with nothing, as Consul.
func (s *Server) nodeAnswer(q dns.Question, node string, m *dns.Msg) error {
	switch q.Qtype {
	case dns.TypeANY, dns.TypeA, dns.TypeAAAA, dns.TypeTXT:
	default:
		return nil
	}
	authz, err := s.authorizer()
	if err != nil {
		return err
	}
	n := s.nodes.lookup(node)
	if n == nil || !authz.Allowed(acl.ResourceNode, n.Name, acl.AccessRead) {
		return errNameNotFound
	}
	ttl := ttlSeconds(s.cfg.NodeTTL)
	if q.Qtype != dns.TypeTXT {
		m.Answer = nodeRecords(q, parseAddress(n.Address), ttl)
	}
	meta := metaTXT(q.Name, n.Meta, ttl)
	if q.Qtype == dns.TypeTXT || q.Qtype == dns.TypeANY {
		m.Answer = append(m.Answer, meta...)
	} else {
		m.Extra = append(m.Extra, meta...)
	}
	return nil
}

// addrAnswer answers <hex ip>.addr names, the SRV targets of instances
// with addresses of their own: the record is the answer when the type
// asks for it, additional otherwise (as Consul).
func (s *Server) addrAnswer(q dns.Question, label string, m *dns.Msg) error {
	b, err := hex.DecodeString(label)
	if err != nil || (len(b) != net.IPv4len && len(b) != net.IPv6len) {
		return errNameNotFound
	}
	ip := net.IP(b)
	ttl := ttlSeconds(s.cfg.NodeTTL)
	if rr := ipRecord(q.Qtype, q.Name, ip, ttl); rr != nil && q.Qtype != dns.TypeSRV && q.Qtype != dns.TypeTXT {
		m.Answer = append(m.Answer, rr)
		return nil
	}
	m.Extra = append(m.Extra, ipRecord(dns.TypeANY, q.Name, ip, ttl))
	return nil
}

// recurse forwards a question outside the domain to the recursors in
// turn (Consul's handleRecurse): the first answer that is not an error is
// returned as is, otherwise SERVFAIL.
func (s *Server) recurse(req *dns.Msg, tcp bool) *dns.Msg {
	select {
	case s.recursions <- struct{}{}:
		defer func() { <-s.recursions }()
	default:
		s.metrics.refused.WithLabelValues(reasonRecursions).Inc()
		return servfail(req)
	}
	network := "udp"
	if tcp {
		network = "tcp"
	}
	c := &dns.Client{Net: network, Timeout: s.cfg.RecursorTimeout}
	for _, r := range s.recursors {
		resp, _, err := c.Exchange(req, r)
		if resp != nil && resp.Rcode != dns.RcodeSuccess && resp.Rcode != dns.RcodeNameError {
			s.logger.Debug("recursor answered an error", "recursor", r, "rcode", dns.RcodeToString[resp.Rcode])
			continue
		}
		if err == nil || (resp != nil && resp.Truncated) {
			resp.Compress = true
			return resp
		}
		s.logger.Debug("recursor did not answer", "recursor", r, "err", err)
	}
	return servfail(req)
}

func servfail(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, dns.RcodeServerFailure)
	m.RecursionAvailable = true
	setEDNS(req, m)
	return m
}
