package gateway_test

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/gateway"
	"github.com/lodestone-kv/lodestone/gateway/gatewaytest"
	"github.com/lodestone-kv/lodestone/tlsutil"
)

// TestFrontTLSBySNI serves two hosts, each with its own certificate
// chosen by SNI, and the admin port over TLS.
func TestFrontTLSBySNI(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsutil.CreateCA(tlsutil.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	issue := func(name string, dns ...string) tlsutil.SNIEntry {
		p, err := tlsutil.CreateCert(tlsutil.CertOptions{Kind: tlsutil.KindServer, Node: name, CA: ca, DNSNames: dns})
		if err != nil {
			t.Fatal(err)
		}
		e := tlsutil.SNIEntry{CertFile: filepath.Join(dir, name+".pem"), KeyFile: filepath.Join(dir, name+"-key.pem")}
		if err := tlsutil.WriteFiles(p, e.CertFile, e.KeyFile); err != nil {
			t.Fatal(err)
		}
		return e
	}
	a, b := issue("a", "a.example.com"), issue("b", "b.example.com")
	a.Host, b.Host = "a.example.com", "b.example.com"
	sni, err := tlsutil.LoadSNI("", []tlsutil.SNIEntry{a, b}, tlsutil.Options{})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := tlsutil.Load(tlsutil.Files{CertFile: a.CertFile, KeyFile: a.KeyFile}, tlsutil.Options{})
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.Cert, 0o644); err != nil {
		t.Fatal(err)
	}
	roots, err := tlsutil.Load(tlsutil.Files{CAFile: caFile}, tlsutil.Options{})
	if err != nil {
		t.Fatal(err)
	}

	echo := func(name string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s %s", name, r.Header.Get("X-Forwarded-Proto"))
		})
	}
	oa, ob := startOrigin(t, echo("A"), false), startOrigin(t, echo("B"), false)
	src := gatewaytest.NewSource()
	src.PutRoute(gateway.Route{Name: "a", Host: "a.example.com", PathPrefix: "/", Service: "sa"})
	src.PutRoute(gateway.Route{Name: "b", Host: "b.example.com", PathPrefix: "/", Service: "sb"})
	src.PutInstance(oa.instance("sa", "a1", nil))
	idx := src.PutInstance(ob.instance("sb", "b1", nil))
	cfg := testConfig(t, src)
	cfg.FrontTLS = sni.ServerConfig("http/1.1")
	cfg.AdminTLS, err = admin.ServerConfig(tlsutil.ServerPolicy{})
	if err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, cfg)
	if err := g.WaitIndex(testCtx(t, 10*time.Second), idx); err != nil {
		t.Fatal(err)
	}

	for host, want := range map[string]string{"a.example.com": "A https", "b.example.com": "B https"} {
		tr := &http.Transport{TLSClientConfig: roots.ClientConfig(host)}
		c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		req, _ := http.NewRequest("GET", "https://"+g.Addr()+"/x", nil)
		req.Host = host
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", host, err)
		}
		body := readAll(t, resp)
		if got := resp.TLS.PeerCertificates[0].DNSNames; !contains(fmt.Sprint(got), host) {
			t.Errorf("%s: served the certificate for %v", host, got)
		}
		if body != want {
			t.Errorf("%s: body %q, want %q", host, body, want)
		}
		tr.CloseIdleConnections()
	}
	// A name with no certificate and no default fails the handshake.
	conn, err := tls.Dial("tcp", g.Addr(), roots.ClientConfig("c.example.com"))
	if err == nil {
		conn.Close()
		t.Fatal("handshake for an unknown host succeeded")
	}

	tr := &http.Transport{TLSClientConfig: roots.ClientConfig("a.example.com")}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + g.AdminAddr() + "/healthz")
	if err != nil {
		t.Fatalf("admin over TLS: %v", err)
	}
	readAll(t, resp)
	if resp.TLS == nil || resp.StatusCode != 200 {
		t.Fatalf("admin over TLS: %s", resp.Status)
	}
}
