package main

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/lodestone-kv/lodestone/server"
)

// defaultDNSAddr is Consul's DNS port on loopback.
const defaultDNSAddr = "127.0.0.1:8600"

// dnsOptions are the DNS flags beyond server.DNSConfig's own fields.
type dnsOptions struct {
	tokenFile string
}

// addDNSFlags exposes server.DNSConfig on lodestone server; listenFlag
// names the address flag (--listen-dns, dev's --dns).
func addDNSFlags(f *pflag.FlagSet, d *server.DNSConfig, o *dnsOptions, listenFlag string) {
	f.StringVar(&d.Listen, listenFlag, defaultDNSAddr, "address of Consul's DNS interface, UDP and TCP (\"\": off); when the default is taken the server runs without DNS and warns, an address given here must bind")
	f.StringVar(&d.Domain, "dns-domain", d.Domain, "the DNS zone answered: <service>.service.<domain>, <node>.node.<domain>")
	f.BoolVar(&d.OnlyPassing, "dns-only-passing", d.OnlyPassing, "answer only instances whose every check passes (default: warning instances too; critical ones never)")
	f.Var(&d.ServiceTTL, "dns-service-ttl", "TTL of a service's answers, as name=duration; a name ending in * is a prefix, * alone every service; repeat for more (default 0s)")
	f.DurationVar(&d.NodeTTL, "dns-node-ttl", d.NodeTTL, "TTL of node answers")
	f.StringSliceVar(&d.Recursors, "dns-recursors", nil, "DNS servers (IP[:port], comma-separated) that questions outside the domain are forwarded to, in order (default: refused)")
	f.DurationVar(&d.RecursorTimeout, "dns-recursor-timeout", d.RecursorTimeout, "how long each recursor has to answer a forwarded question")
	f.StringVar(&d.Token, "dns-token", "", "ACL token secret DNS answers are read with (default: the anonymous token); it needs service:read and node:read for what it answers")
	f.StringVar(&o.tokenFile, "dns-token-file", "", "file holding the --dns-token secret (keeps it out of the process list)")
	f.IntVar(&d.UDPAnswerLimit, "dns-udp-answer-limit", d.UDPAnswerLimit, "most answers in a UDP reply to a client without EDNS0 (1-8, Consul's udp_answer_limit)")
	f.BoolVar(&d.EnableTruncate, "dns-enable-truncate", d.EnableTruncate, "set the TC bit when a UDP reply leaves answers out, so the client retries over TCP (false: a silent subset, Consul's default)")
	f.IntVar(&d.MaxTCPConnections, "dns-max-tcp-connections", d.MaxTCPConnections, "most open TCP connections on the DNS port; more are closed at once (lodestone_dns_refused_total)")
	f.IntVar(&d.UDPReaders, "dns-udp-readers", d.UDPReaders, "goroutines reading the DNS UDP socket on its fast path (0: one per GOMAXPROCS; only an address that is not a wildcard has the fast path)")
	f.IntVar(&d.UDPHandoffQueue, "dns-udp-handoff-queue", d.UDPHandoffQueue, "UDP questions the fast path passes to the full handler that may wait; more are dropped (lodestone_dns_refused_total)")
	f.IntVar(&d.AnswerCacheBytes, "dns-answer-cache-bytes", d.AnswerCacheBytes, "bytes of packed service answers kept; past it all are dropped and built again (lodestone_dns_answer_cache_flushes_total)")
}

// finishDNS applies what the flags imply beyond their values: the default
// address is optional, and the token may come from a file.
func finishDNS(cmd *cobra.Command, d *server.DNSConfig, o *dnsOptions, listenFlag string) error {
	d.ListenOptional = !cmd.Flags().Changed(listenFlag)
	if o.tokenFile == "" {
		return nil
	}
	if d.Token != "" {
		return usagef(cmd, "give --dns-token or --dns-token-file, not both")
	}
	tok, err := readToken(cmd, "--dns-token-file", o.tokenFile)
	d.Token = tok
	return err
}
