package dnsapi

import (
	"math"
	"strings"

	"github.com/miekg/dns"
)

// Trimming follows Consul's trimUDPResponse and trimTCPResponse: answers
// are cut from the end (they are shuffled, so which stay is random), and
// the additional section keeps only what the remaining SRV targets need.

const (
	// maxUDPDatagram caps an EDNS0 buffer size: past it an IPv4 datagram
	// cannot carry the reply, whatever the client says.
	maxUDPDatagram = math.MaxUint16 - 68
	// maxTCPMessage is a TCP reply's limit: 64 KiB less the header.
	maxTCPMessage = 65523
	// udpHeader is kept free below the client's buffer size, as Consul.
	udpHeader = 8
)

// udpLimit is the largest reply a UDP client takes: its EDNS0 buffer
// size, or 512 bytes without EDNS0.
func udpLimit(req *dns.Msg) int {
	size := dns.MinMsgSize
	if edns := req.IsEdns0(); edns != nil && int(edns.UDPSize()) > size {
		size = int(edns.UDPSize())
	}
	return min(size, maxUDPDatagram)
}

// trimUDP fits resp to a UDP reply to req and says whether answers were
// left out. A client without EDNS0 gets at most answerLimit answers.
func trimUDP(req, resp *dns.Msg, answerLimit int) bool {
	n := len(resp.Answer)
	limit := udpLimit(req)
	var index map[string]dns.RR
	if len(resp.Extra) > 0 {
		index = indexRRs(resp.Extra)
	}
	compress := resp.Compress
	if limit == dns.MinMsgSize && n > answerLimit {
		// NB: sized uncompressed, as Consul does, so that a relay that
		// expands compression still fits 512 bytes; sent compressed.
		resp.Compress = false
		resp.Answer = resp.Answer[:answerLimit]
		syncExtra(index, resp)
	}
	fit(resp, limit-udpHeader, index)
	resp.Compress = compress
	return len(resp.Answer) < n
}

// trimTCP fits resp to a TCP reply and says whether answers were left out.
func trimTCP(q dns.Question, resp *dns.Msg) bool {
	n := len(resp.Answer)
	// NB: more records than these never fit 64 KiB; cutting first saves
	// the search below sizing them.
	most := 4096
	if q.Qtype == dns.TypeSRV {
		most = 1024
	}
	var index map[string]dns.RR
	if len(resp.Extra) > 0 {
		index = indexRRs(resp.Extra)
	}
	if n > most {
		resp.Answer = resp.Answer[:most]
		syncExtra(index, resp)
	}
	fit(resp, maxTCPMessage, index)
	return len(resp.Answer) < n
}

// fit drops answers from the end of resp until it packs into limit bytes
// (keeping at least one), dropping the authority section first.
func fit(resp *dns.Msg, limit int, index map[string]dns.RR) {
	for len(resp.Answer) > 1 {
		size := resp.Len()
		if size <= limit {
			return
		}
		resp.Ns = nil
		if size-limit > 100 {
			resp.Answer = resp.Answer[:largestFit(resp, limit, index)]
		} else {
			resp.Answer = resp.Answer[:len(resp.Answer)-1]
		}
		syncExtra(index, resp)
	}
}

// largestFit is how many of resp's answers fit limit, found by binary
// search; at least 1.
func largestFit(resp *dns.Msg, limit int, index map[string]dns.RR) int {
	all := resp.Answer
	lo, hi := 1, len(all) // lo fits or is 1; hi does not fit
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		resp.Answer = all[:mid]
		syncExtra(index, resp)
		if resp.Len() <= limit {
			lo = mid
		} else {
			hi = mid
		}
	}
	resp.Answer = all
	return lo
}

// indexRRs indexes records by lowercase owner name; the first of a name
// wins, as in Consul.
func indexRRs(rrs []dns.RR) map[string]dns.RR {
	index := make(map[string]dns.RR, len(rrs))
	for _, rr := range rrs {
		if rr.Header().Rrtype == dns.TypeOPT {
			continue
		}
		name := strings.ToLower(rr.Header().Name)
		if _, ok := index[name]; !ok {
			index[name] = rr
		}
	}
	return index
}

// syncExtra sets resp's additional section to the records its SRV answers'
// targets need (following CNAMEs), and its OPT record.
func syncExtra(index map[string]dns.RR, resp *dns.Msg) {
	if index == nil {
		return
	}
	var opt dns.RR
	for _, rr := range resp.Extra {
		if rr.Header().Rrtype == dns.TypeOPT {
			opt = rr
		}
	}
	extra := make([]dns.RR, 0, len(resp.Answer)+1)
	seen := make(map[string]struct{}, len(resp.Answer))
	for _, rr := range resp.Answer {
		srv, ok := rr.(*dns.SRV)
		if !ok {
			continue
		}
		target := strings.ToLower(srv.Target)
		for {
			if _, ok := seen[target]; ok {
				break
			}
			seen[target] = struct{}{}
			rr, ok := index[target]
			if !ok {
				break
			}
			extra = append(extra, rr)
			c, ok := rr.(*dns.CNAME)
			if !ok {
				break
			}
			target = strings.ToLower(c.Target)
		}
	}
	if opt != nil {
		extra = append(extra, opt)
	}
	resp.Extra = extra
}
