// Package dnsapi serves Consul's DNS interface over the catalog a server
// holds in memory, so that resolvers, dig and anything that looks up
// web.service.consul find healthy instances without an HTTP client.
//
// # Names
//
// Under the configured domain (default "consul."), case-insensitively:
//
//	[<tag>.]<service>.service[.<dc>[.dc]].<domain>   A, AAAA, SRV, ANY (and TXT as Consul: the A records)
//	_<service>._<tag>.service[.<dc>].<domain>        RFC 2782; the tag "tcp" means no tag; "service" may be left out for SRV
//	<node>.node[.<dc>[.dc]].<domain>                 A, AAAA, ANY, TXT (the node's meta, RFC 1464)
//	<hex ip>.addr[.<dc>].<domain>                    the address an SRV target of that form stands for
//
// A dc other than Config.Datacenter answers NXDOMAIN, as Consul answers a
// datacenter it has no path to. Prepared queries, connect, ingress,
// virtual, peer and PTR names are not served (NXDOMAIN inside the domain;
// PTR names are outside it). SOA in the domain answers the SOA, NS answers
// nothing, AXFR is not implemented.
//
// # What is answered
//
// A service name answers its instances whose checks (their own and their
// node's) are not critical; with Config.OnlyPassing, only those whose
// every check passes (Consul's only_passing). An instance answers with its
// service address, or its node's when it has none; an address that is a
// host name answers as a CNAME (A, AAAA) or as the SRV target, and is not
// resolved further. SRV records carry priority 1, the instance's weight
// for its state (Weights.Passing or Weights.Warning) and its port; their
// target is <node>.node.<dc>.<domain> when the instance uses its node's
// address and <hex ip>.addr.<dc>.<domain> when it has an address of its
// own, with the address in the additional section and the node's meta as
// TXT beside it, as Consul does. Answers are shuffled on every query, and
// duplicates (one address twice, one node:address:port twice) are left
// out. A name with no instance to answer (none registered, none healthy,
// none the token may read) is NXDOMAIN; a name with instances but no
// record of the asked type is NOERROR with nothing (RFC 2308 NODATA).
// Both carry the domain's SOA in the authority section.
//
// # Sizes
//
// A UDP answer fits the client's EDNS0 buffer (512 bytes without EDNS0,
// and at most Config.UDPAnswerLimit answers then, as Consul's
// udp_answer_limit); what does not fit is left out and, with
// Config.EnableTruncate (the default here; off by default in Consul), the
// TC bit set, so the client asks again over TCP, which answers everything
// up to 64 KiB. The additional section keeps only the records of the SRV
// targets that stayed.
//
// # Where answers come from
//
// From the store of the server the question reaches, as a ?stale read:
// what that member has applied, with no Raft round and no message to the
// leader. A member applies a write within milliseconds of the leader, so
// an instance whose check goes critical leaves the very next answer of
// the member that took the update and, on the others, the next one after
// they apply it. Per service the answerable instances are kept as a view
// built once per change of the service's index (store.ServiceIndex), and
// the packed answers built from it are kept too while the view and the
// ACLs stay, shuffled on every copy by moving their records in the packed
// bytes (shuffle.go; a truncated answer is kept in up to 16 orders each
// naming a different instance first instead, cache.go): a question asked
// before costs a lookup in the store's index and a copy.
//
// # The UDP fast path
//
// On a socket bound to one address (the default 127.0.0.1:8600 is), a
// fixed set of readers (Config.UDPReaders, one per GOMAXPROCS by default)
// own the UDP socket, read datagrams in batches (recvmmsg on Linux),
// answer each question whose packed answer is kept with a copy of it
// under the question's id and RD and CD bits, and write the answers in
// one call (sendmmsg). It exists because miekg/dns's UDP server starts a
// goroutine and unpacks a message per datagram, and on a *net.UDPConn
// reads each with its control message (IP_PKTINFO) to learn the address
// to answer from: measured, that was most of Lodestone's user-space CPU
// per answer against a C server's. It reads only the plainest questions
// (one question of type A, AAAA or SRV in class IN, a name of letters,
// digits, hyphens and underscores, at most an OPT record whose options
// are cookies or padding, nothing after): every other datagram, and
// every question with no current kept answer, goes as it came to
// miekg/dns's server and the handler, which answer it as they always
// did and keep the answer for the next. The fast path's answers are the
// handler's (TestFastPathAnswersAsTheHandler) and cost no allocation
// (TestFastPathAnswersWithoutAllocating). Answers are kept by the name
// in the case it came in (cache.go says why), so questions from a
// resolver that randomises case (0x20) reach the handler each time. A
// socket bound to a wildcard
// address keeps miekg/dns's server alone, which answers from the address
// each datagram came to.
//
// # ACLs
//
// Answers are read with Config.Token (empty: the anonymous token): a
// service needs service:read, its instances node:read on their nodes, a
// node node:read; what the token may not read is left out, and a name
// left with nothing is NXDOMAIN, never REFUSED, so it reveals nothing.
// With ACLs on and default deny, nothing is answered until an operator
// grants the DNS token (or the anonymous token) those rules. A token
// nobody issued answers SERVFAIL.
//
// # Outside the domain
//
// Without Config.Recursors (the default) a question outside the domain is
// REFUSED. With them it is forwarded to each in turn, with
// Config.RecursorTimeout each, and the first answer that is not an error
// (NOERROR or NXDOMAIN) is returned; none is SERVFAIL. At most
// Config.MaxRecursions are forwarded at once; more are SERVFAIL at once.
//
// # Limits and metrics
//
// TCP connections are capped (Config.MaxTCPConnections; one more is closed
// at once), and each has Config.ReadTimeout for its first query and
// Config.IdleTimeout between queries. The packed answers kept are bounded
// by Config.AnswerCacheBytes (past it all are dropped, counted in
// lodestone_dns_answer_cache_flushes_total; lodestone_dns_answer_cache_bytes
// is their size), and the datagrams the fast path passes to the handler
// wait in a queue of Config.UDPHandoffQueue (one more is dropped).
// lodestone_dns_queries_total{type,rcode} counts answers and
// lodestone_dns_query_duration_seconds times them, from the read to the
// answer ready to write (on the fast path, its batch's);
// lodestone_dns_udp_fast_path_total{outcome} counts the fast path's
// datagrams (answered, not_kept, other); lodestone_dns_refused_total{reason}
// counts what a limit refused (tcp_connections, recursions, udp_handoff);
// lodestone_dns_tcp_connections is the open TCP connections.
package dnsapi
