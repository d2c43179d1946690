package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/lodestone-kv/lodestone/internal/testnet"
)

// lodestone dev serves DNS: the demo service it registers answers SRV
// with both instances.
func TestDevServesDNS(t *testing.T) {
	dnsAddr := testnet.FreeAddrOn(t, "127.0.0.1", true)
	args := []string{"dev", "--data-dir", filepath.Join(t.TempDir(), "dev"), "--grpc", testnet.FreeAddr(t), "--http", testnet.FreeAddr(t),
		"--peer", testnet.FreeAddr(t), "--gateway", testnet.FreeAddr(t), "--gateway-admin", testnet.FreeAddr(t), "--dns", dnsAddr, "--log-level", "warn"}
	ctx, cancel := context.WithCancel(context.Background())
	var out syncWriter
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, strings.NewReader(""), &out, &out, func(string) string { return "" }) }()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("dev exited %d: %s", code, out.String())
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		m := new(dns.Msg).SetQuestion("demo.service.consul.", dns.TypeSRV)
		resp, _, err := (&dns.Client{Timeout: time.Second}).Exchange(m, dnsAddr)
		if err == nil && len(resp.Answer) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("demo.service.consul SRV on dev's %s: %v, %v\n%s", dnsAddr, resp, err, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(out.String(), "dns:     "+dnsAddr) {
		t.Fatalf("dev's banner does not name its DNS address:\n%s", out.String())
	}
}

// Bad DNS flags are refused with what is wrong, before anything starts.
func TestServerDNSFlagErrors(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"server", "--name", "a", "--data-dir", t.TempDir(), "--listen-grpc", "127.0.0.1:0",
		"--listen-peer", "127.0.0.1:0", "--listen-http", "127.0.0.1:0"}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--dns-service-ttl", "web=soon"}, 2, "name=duration"},
		{[]string{"--dns-token", "x", "--dns-token-file", tokenFile}, 2, "not both"},
		{[]string{"--dns-token-file", filepath.Join(t.TempDir(), "missing")}, 2, "--dns-token-file"},
		{[]string{"--listen-dns", "nowhere"}, 1, "listen-dns"},
		{[]string{"--listen-dns", "127.0.0.1:0", "--dns-udp-answer-limit", "0"}, 1, "between 1 and 8"},
		{[]string{"--listen-dns", "127.0.0.1:0", "--dns-recursors", "resolver.example"}, 1, "IP address"},
		{[]string{"--listen-dns", "127.0.0.1:0", "--dns-domain", "bad domain"}, 1, "not a domain name"},
	} {
		r := cli(t, nil, "", append(append([]string{}, base...), tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d saying %q", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
	}
}
