package tlsutil

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func mustCA(t *testing.T) PEM {
	t.Helper()
	ca, err := CreateCA(CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustCert(t *testing.T, o CertOptions) PEM {
	t.Helper()
	p, err := CreateCert(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func write(t *testing.T, dir, name string, p PEM) Files {
	t.Helper()
	f := Files{CertFile: filepath.Join(dir, name+".pem"), KeyFile: filepath.Join(dir, name+"-key.pem")}
	if err := os.WriteFile(f.CertFile, p.Cert, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.KeyFile, p.Key, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestLoadRefuses(t *testing.T) {
	dir := t.TempDir()
	ca, other := mustCA(t), mustCA(t)
	caf := write(t, dir, "ca", ca)
	good := write(t, dir, "good", mustCert(t, CertOptions{Kind: KindServer, Node: "n1", CA: ca}))
	foreign := write(t, dir, "foreign", mustCert(t, CertOptions{Kind: KindServer, Node: "n1", CA: other}))
	expired := write(t, dir, "expired", mustCert(t, CertOptions{Kind: KindServer, Node: "n1", CA: ca,
		NotBefore: time.Now().Add(-48 * time.Hour), Days: 1}))
	for name, tc := range map[string]struct {
		f    Files
		want string
	}{
		"missing":  {Files{CAFile: caf.CertFile, CertFile: filepath.Join(dir, "nope.pem"), KeyFile: good.KeyFile}, "no such file"},
		"mismatch": {Files{CAFile: caf.CertFile, CertFile: good.CertFile, KeyFile: foreign.KeyFile}, "does not match"},
		"expired":  {Files{CAFile: caf.CertFile, CertFile: expired.CertFile, KeyFile: expired.KeyFile}, "expired at"},
		"other CA": {Files{CAFile: caf.CertFile, CertFile: foreign.CertFile, KeyFile: foreign.KeyFile}, "does not chain"},
		"no key":   {Files{CAFile: caf.CertFile, CertFile: good.CertFile}, "both or neither"},
		"bad CA":   {Files{CAFile: good.KeyFile, CertFile: good.CertFile, KeyFile: good.KeyFile}, "no PEM CERTIFICATE"},
	} {
		if _, err := Load(tc.f, Options{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one containing %q", name, err, tc.want)
		}
	}
	if _, err := Load(Files{CAFile: caf.CertFile, CertFile: good.CertFile, KeyFile: good.KeyFile}, Options{}); err != nil {
		t.Fatal(err)
	}
}

func TestReloadKeepsOldOnFailure(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t)
	caf := write(t, dir, "ca", ca)
	f := write(t, dir, "srv", mustCert(t, CertOptions{Kind: KindServer, Node: "n1", CA: ca}))
	f.CAFile = caf.CertFile
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	s, err := Load(f, Options{Name: "server", Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	old := s.Leaf().SerialNumber
	if err := os.WriteFile(f.KeyFile, mustCert(t, CertOptions{Kind: KindServer, Node: "n1", CA: ca}).Key, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err == nil {
		t.Fatal("reload of a mismatched pair succeeded")
	}
	if s.Leaf().SerialNumber.Cmp(old) != 0 {
		t.Fatal("failed reload replaced the certificate")
	}
	if got := testutil.ToFloat64(m.reloads.WithLabelValues("server", "failure")); got != 1 {
		t.Fatalf("failures = %v", got)
	}
	write(t, dir, "srv", mustCert(t, CertOptions{Kind: KindServer, Node: "n1", CA: ca}))
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if s.Leaf().SerialNumber.Cmp(old) == 0 {
		t.Fatal("reload kept the old certificate")
	}
	if got := testutil.ToFloat64(m.notAfter.WithLabelValues("server")); got != float64(s.Leaf().NotAfter.Unix()) {
		t.Fatalf("not_after gauge = %v", got)
	}
}

func TestSNI(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t)
	a := write(t, dir, "a", mustCert(t, CertOptions{Kind: KindServer, Node: "a", CA: ca, DNSNames: []string{"a.example.com"}}))
	w := write(t, dir, "w", mustCert(t, CertOptions{Kind: KindServer, Node: "w", CA: ca}))
	d := write(t, dir, "d", mustCert(t, CertOptions{Kind: KindServer, Node: "d", CA: ca}))
	s, err := LoadSNI("", []SNIEntry{{Host: "a.example.com", CertFile: a.CertFile, KeyFile: a.KeyFile},
		{Host: "*.example.com", CertFile: w.CertFile, KeyFile: w.KeyFile},
		{Host: DefaultHost, CertFile: d.CertFile, KeyFile: d.KeyFile}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]string{"a.example.com": "a.server.lodestone", "B.example.com": "w.server.lodestone",
		"x.y.example.com": "d.server.lodestone", "": "d.server.lodestone"} {
		c, err := s.GetCertificate(&tls.ClientHelloInfo{ServerName: host})
		if err != nil || c.Leaf.Subject.CommonName != want {
			t.Errorf("%q: got %v %v, want %s", host, c, err, want)
		}
	}
}

func TestHandshakePolicy(t *testing.T) {
	dir := t.TempDir()
	ca := mustCA(t)
	caf := write(t, dir, "ca", ca)
	srvF := write(t, dir, "srv", mustCert(t, CertOptions{Kind: KindPeer, Node: "n1", CA: ca}))
	srvF.CAFile = caf.CertFile
	cliF := write(t, dir, "cli", mustCert(t, CertOptions{Kind: KindClient, Node: "c", CA: ca}))
	cliF.CAFile = caf.CertFile
	srv, err := Load(srvF, Options{})
	if err != nil {
		t.Fatal(err)
	}
	cli, err := Load(cliF, Options{})
	if err != nil {
		t.Fatal(err)
	}
	scfg, err := srv.ServerConfig(ServerPolicy{ClientAuth: RequireClientCert, ClientName: "server.lodestone"})
	if err != nil {
		t.Fatal(err)
	}
	handshake := func(ccfg *tls.Config) error {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		errc := make(chan error, 1)
		go func() { errc <- tls.Server(a, scfg).Handshake(); a.Close() }()
		cerr := tls.Client(b, ccfg).Handshake()
		b.Close()
		serr := <-errc
		if serr != nil {
			return serr
		}
		return cerr
	}
	// A peer certificate passes; a client one from the same CA does not.
	if err := handshake(srv.ClientConfig("server.lodestone")); err != nil {
		t.Fatalf("peer handshake: %v", err)
	}
	if err := handshake(cli.ClientConfig("server.lodestone")); err == nil || !strings.Contains(err.Error(), "server.lodestone") {
		t.Fatalf("client certificate on the peer port: %v", err)
	}
	// The server's name is checked.
	if err := handshake(srv.ClientConfig("evil.example")); err == nil {
		t.Fatal("wrong server name accepted")
	}
	if err := handshake(srv.ClientConfig("")); err == nil {
		t.Fatal("no server name accepted")
	}
}
