package dnsapi

import (
	"encoding/hex"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// The records of an answer, built as Consul's DNS server builds them
// (agent/dns.go in Consul 1.16): the same owner names, targets and
// additional records, so resolvers and scripts that parse Consul's answers
// parse these.

func ttlSeconds(d time.Duration) uint32 { return uint32(d / time.Second) }

// ipRecord is an A or AAAA record for ip when qtype asks for that family
// (SRV, ANY and TXT take both, as Consul's makeARecord), else nil.
func ipRecord(qtype uint16, name string, ip net.IP, ttl uint32) dns.RR {
	if v4 := ip.To4(); v4 != nil {
		switch qtype {
		case dns.TypeA, dns.TypeSRV, dns.TypeANY, dns.TypeTXT:
			return &dns.A{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl}, A: v4}
		}
		return nil
	}
	switch qtype {
	case dns.TypeAAAA, dns.TypeSRV, dns.TypeANY, dns.TypeTXT:
		return &dns.AAAA{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: ttl}, AAAA: ip}
	}
	return nil
}

func cname(name, target string, ttl uint32) dns.RR {
	return &dns.CNAME{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: ttl}, Target: target}
}

// naming holds the names records point at: the response domain and the
// datacenter label, lowercase, as in <node>.node.<dc>.<domain>.
type naming struct {
	domain string // "consul."
	dc     string
}

func (n naming) nodeFQDN(node string) string { return node + ".node." + n.dc + "." + n.domain }

func (n naming) addrFQDN(ip net.IP) string {
	return hex.EncodeToString(ip) + ".addr." + n.dc + "." + n.domain
}

// serviceRecords are the answer and additional records of one instance
// for question q (Consul's makeNodeServiceRecords).
func (n naming) serviceRecords(q dns.Question, in *instance, ttl uint32) (answer, extra []dns.RR) {
	switch {
	case in.svcAddr.empty() && in.nodeAddr.ip != nil:
		return n.viaNode(q, in, ttl)
	case in.svcAddr.empty():
		return n.viaHost(q, in, in.nodeAddr.host, ttl)
	case in.svcAddr.ip != nil:
		return n.viaIP(q, in, in.svcAddr.ip, ttl)
	case in.svcAddr.host == strings.ToLower(q.Name) && in.nodeAddr.ip != nil:
		// NB: a service whose address is the very name asked would CNAME
		// to itself; Consul answers its node's address instead.
		return n.viaNode(q, in, ttl)
	}
	return n.viaHost(q, in, in.svcAddr.host, ttl)
}

func (n naming) srv(q dns.Question, in *instance, target string, ttl uint32) dns.RR {
	return &dns.SRV{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeSRV, Class: dns.ClassINET, Ttl: ttl},
		Priority: 1, Weight: in.weight, Port: in.port, Target: target}
}

// viaNode answers with the node's IP; an SRV names the node.
func (n naming) viaNode(q dns.Question, in *instance, ttl uint32) (answer, extra []dns.RR) {
	if q.Qtype != dns.TypeSRV {
		return one(ipRecord(q.Qtype, q.Name, in.nodeAddr.ip, ttl)), nil
	}
	target := n.nodeFQDN(in.node)
	rr := ipRecord(q.Qtype, target, in.nodeAddr.ip, ttl)
	if rr == nil {
		return nil, nil
	}
	return []dns.RR{n.srv(q, in, target, ttl)}, []dns.RR{rr}
}

// viaIP answers with the service's own IP; an SRV names the address.
func (n naming) viaIP(q dns.Question, in *instance, ip net.IP, ttl uint32) (answer, extra []dns.RR) {
	if q.Qtype != dns.TypeSRV {
		return one(ipRecord(q.Qtype, q.Name, ip, ttl)), nil
	}
	target := n.addrFQDN(ip)
	return []dns.RR{n.srv(q, in, target, ttl)}, []dns.RR{ipRecord(q.Qtype, target, ip, ttl)}
}

// viaHost answers an address that is a host name: a CNAME, or the SRV
// target. Consul resolves the name further through its recursors; this
// leaves that to the client.
func (n naming) viaHost(q dns.Question, in *instance, host string, ttl uint32) (answer, extra []dns.RR) {
	if q.Qtype == dns.TypeSRV {
		return []dns.RR{n.srv(q, in, host, ttl)}, nil
	}
	return []dns.RR{cname(q.Name, host, ttl)}, nil
}

func one(rr dns.RR) []dns.RR {
	if rr == nil {
		return nil
	}
	return []dns.RR{rr}
}

// nodeRecords answer a node lookup (Consul's makeRecordFromNode).
func nodeRecords(q dns.Question, addr address, ttl uint32) []dns.RR {
	if addr.ip == nil {
		if addr.host == "" {
			return nil
		}
		return []dns.RR{cname(q.Name, addr.host, ttl)}
	}
	return one(ipRecord(q.Qtype, q.Name, addr.ip, ttl))
}

// metaTXT is a node's meta as TXT records named name, one per key in key
// order, RFC 1464 encoded unless the key starts with "rfc1035-" (Consul's
// makeTXTRecordFromNodeMeta).
func metaTXT(name string, meta map[string]string, ttl uint32) []dns.RR {
	if len(meta) == 0 {
		return nil
	}
	keys := make([]string, 0, len(meta))
	for k := range meta {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]dns.RR, 0, len(keys))
	for _, k := range keys {
		txt := meta[k]
		if !strings.HasPrefix(strings.ToLower(k), "rfc1035-") {
			txt = rfc1464(k, txt)
		}
		out = append(out, &dns.TXT{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: ttl}, Txt: []string{txt}})
	}
	return out
}

// rfc1464 encodes key=value: "`" and "=" in the key, and its leading and
// trailing spaces, are quoted with "`".
func rfc1464(key, value string) string {
	key = strings.ReplaceAll(key, "`", "``")
	key = strings.ReplaceAll(key, "=", "`=")
	trimmed := strings.TrimLeft(key, " ")
	lead := len(key) - len(trimmed)
	inner := strings.TrimRight(trimmed, " ")
	trail := len(trimmed) - len(inner)
	key = strings.Repeat("` ", lead) + inner + strings.Repeat("` ", trail)
	return key + "=" + strings.ReplaceAll(value, "`", "``")
}

// soa is the domain's SOA record, with Consul's default timers.
func soa(domain string) *dns.SOA {
	return &dns.SOA{Hdr: dns.RR_Header{Name: domain, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 0},
		Ns: "ns." + domain, Mbox: "hostmaster." + domain, Serial: uint32(time.Now().Unix()),
		Refresh: 3600, Retry: 600, Expire: 86400, Minttl: 0}
}
