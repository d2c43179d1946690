package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/tlsutil"
)

// tlsFixture is a CA, a server certificate every member shares, a client
// certificate, and the certificates a server must refuse.
type tlsFixture struct {
	dir                    string
	ca                     tlsutil.PEM
	caFile                 string
	server, client         tlsutil.Files
	foreignClient, expired tlsutil.Files
}

func newTLSFixture(t testing.TB) *tlsFixture {
	t.Helper()
	dir := t.TempDir()
	ca, err := tlsutil.CreateCA(tlsutil.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := tlsutil.CreateCA(tlsutil.CAOptions{CommonName: "another cluster"})
	if err != nil {
		t.Fatal(err)
	}
	f := &tlsFixture{dir: dir, ca: ca, caFile: filepath.Join(dir, "ca.pem")}
	if err := os.WriteFile(f.caFile, ca.Cert, 0o644); err != nil {
		t.Fatal(err)
	}
	f.server = f.issue(t, "server", tlsutil.CertOptions{Kind: tlsutil.KindServer, Node: "n", CA: ca})
	f.client = f.issue(t, "client", tlsutil.CertOptions{Kind: tlsutil.KindClient, Node: "c", CA: ca})
	f.foreignClient = f.issue(t, "foreign", tlsutil.CertOptions{Kind: tlsutil.KindClient, Node: "c", CA: other})
	f.expired = f.issue(t, "expired", tlsutil.CertOptions{Kind: tlsutil.KindClient, Node: "c", CA: ca,
		NotBefore: time.Now().Add(-72 * time.Hour), Days: 1})
	return f
}

// issue writes a new certificate of o to <name>.pem and <name>-key.pem,
// replacing what is there (a rotation).
func (f *tlsFixture) issue(t testing.TB, name string, o tlsutil.CertOptions) tlsutil.Files {
	t.Helper()
	p, err := tlsutil.CreateCert(o)
	if err != nil {
		t.Fatal(err)
	}
	files := tlsutil.Files{CAFile: f.caFile, CertFile: filepath.Join(f.dir, name+".pem"), KeyFile: filepath.Join(f.dir, name+"-key.pem")}
	// NB: key first, then certificate, each renamed into place, as a
	// careful rotation tool does.
	for _, w := range []struct {
		path string
		data []byte
	}{{files.KeyFile, p.Key}, {files.CertFile, p.Cert}} {
		tmp := w.path + ".tmp"
		if err := os.WriteFile(tmp, w.data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, w.path); err != nil {
			t.Fatal(err)
		}
	}
	return files
}

// rawTLS is a TLS config from files that loads the material once,
// without the CA check Load does (the expired certificate must be sent).
func rawTLS(t testing.TB, caFile string, f *tlsutil.Files) *tls.Config {
	t.Helper()
	ca, err := tlsutil.Load(tlsutil.Files{CAFile: caFile}, tlsutil.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := ca.ClientConfig("server.lodestone")
	if f != nil {
		pair, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	return cfg
}

func withTLS(f *tlsFixture, verifyIncoming bool) clusterOption {
	return func(c *Config) {
		c.TLS = TLSConfig{CAFile: f.caFile, CertFile: f.server.CertFile, KeyFile: f.server.KeyFile,
			VerifyIncomingGRPC: verifyIncoming, VerifyIncomingHTTP: verifyIncoming, ReloadInterval: -1}
	}
}

func (f *tlsFixture) clientCreds(t testing.TB) credentials.TransportCredentials {
	t.Helper()
	s, err := tlsutil.Load(f.client, tlsutil.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return credentials.NewTLS(s.ClientConfig("server.lodestone"))
}

// TestTLSCluster runs three members with TLS on every port and mutual TLS
// between them: writes replicate over TLS Raft streams and a leader
// change (over the peer gRPC service) works.
func TestTLSCluster(t *testing.T) {
	f := newTLSFixture(t)
	c := newTestCluster(t, 3, withTLS(f, true))
	c.creds = f.clientCreds(t)
	lead := c.waitLeader()
	resp := put(t, c.kv(lead), "k", "v1")
	for _, n := range c.names {
		c.waitApplied(n, resp.Header.Index)
		if kv := get(t, c.kv(n), "k", lodestonepb.Consistency_LINEARIZABLE); string(kv.Value) != "v1" {
			t.Fatalf("%s reads %q", n, kv.Value)
		}
	}
	to := c.followersOf(lead)[0]
	if _, err := c.servers[lead].raft.TransferLeader(ctxT(t), c.servers[to].ID()); err != nil {
		t.Fatalf("transfer leadership: %v", err)
	}
	waitFor(t, 10*time.Second, func() bool { return c.agreedLeader() == to })
	resp = put(t, c.kv(c.names[0]), "k", "v2")
	for _, n := range c.names {
		c.waitApplied(n, resp.Header.Index)
	}

	// HTTP answers over TLS with a client certificate.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: rawTLS(t, f.caFile, &f.client)}}
	defer hc.CloseIdleConnections()
	r, err := hc.Get("https://" + c.servers[lead].HTTPAddr() + "/v1/kv/k")
	if err != nil {
		t.Fatalf("consul API over TLS: %v", err)
	}
	r.Body.Close()
	if r.StatusCode != 200 {
		t.Fatalf("consul API over TLS: %s", r.Status)
	}
}

// TestTLSRefusesClients checks that every port refuses a client without a
// certificate, with one from another CA, and with an expired one; the
// peer port also refuses a client certificate of the cluster's own CA.
func TestTLSRefusesClients(t *testing.T) {
	f := newTLSFixture(t)
	c := newTestCluster(t, 1, withTLS(f, true))
	s := c.servers[c.names[0]]
	cases := []struct {
		name  string
		files *tlsutil.Files
		want  string // in the client's error
	}{
		{"no certificate", nil, "certificate required"},
		{"another CA", &f.foreignClient, "bad certificate"},
		{"expired", &f.expired, "bad certificate"},
	}
	ports := map[string]string{"grpc": s.GRPCAddr(), "http": s.HTTPAddr(), "peer": s.PeerAddr()}
	for _, tc := range cases {
		for port, addr := range ports {
			err := handshakeAndRead(rawTLS(t, f.caFile, tc.files), addr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s on %s: got %v, want an error with %q", tc.name, port, err, tc.want)
			}
		}
	}
	// A client certificate is not a member's.
	if err := handshakeAndRead(rawTLS(t, f.caFile, &f.client), s.PeerAddr()); err == nil || !strings.Contains(err.Error(), "bad certificate") {
		t.Errorf("client certificate on the peer port: got %v, want bad certificate", err)
	}
	// The good client passes on both client ports.
	for _, port := range []string{"grpc", "http"} {
		conn, err := tls.Dial("tcp", ports[port], rawTLS(t, f.caFile, &f.client))
		if err != nil {
			t.Fatalf("good client on %s: %v", port, err)
		}
		conn.Close()
	}
}

// handshakeAndRead completes the client side of a handshake and reads:
// under TLS 1.3 a server's refusal of the client certificate arrives
// after the client's handshake is done, as an alert on the first read.
func handshakeAndRead(cfg *tls.Config, addr string) error {
	cfg.NextProtos = []string{"h2", "http/1.1"}
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")); err != nil {
		return err
	}
	_, err = conn.Read(make([]byte, 1))
	if err == nil {
		return fmt.Errorf("the server answered")
	}
	return err
}

// TestTLSRotation replaces the server certificate while a client writes
// without pause: no write fails, and new handshakes see the new serial.
func TestTLSRotation(t *testing.T) {
	f := newTLSFixture(t)
	c := newTestCluster(t, 3, withTLS(f, true))
	c.creds = f.clientCreds(t)
	lead := c.waitLeader()
	s := c.servers[lead]
	serial := func() *big.Int {
		conn, err := tls.Dial("tcp", s.GRPCAddr(), rawTLS(t, f.caFile, &f.client))
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber
	}
	old := serial()

	ctx, cancel := context.WithCancel(context.Background())
	var writes, failures atomic.Int64
	var wg sync.WaitGroup
	kv := c.kv(lead)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := kv.Put(wctx, &lodestonepb.PutRequest{Key: []byte("rot"), Value: []byte(fmt.Sprint(i))})
			wcancel()
			writes.Add(1)
			if err != nil {
				failures.Add(1)
				t.Errorf("write %d during rotation: %v", i, err)
			}
		}
	}()
	time.Sleep(100 * time.Millisecond)
	f.issue(t, "server", tlsutil.CertOptions{Kind: tlsutil.KindServer, Node: "n", CA: f.ca})
	for _, n := range c.names {
		if err := c.servers[n].ReloadTLS(); err != nil {
			t.Fatalf("reload %s: %v", n, err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	cancel()
	wg.Wait()
	if now := serial(); now.Cmp(old) == 0 {
		t.Fatalf("new handshakes still see serial %x", old)
	}
	if failures.Load() != 0 || writes.Load() < 10 {
		t.Fatalf("%d of %d writes failed", failures.Load(), writes.Load())
	}
	// Members still replicate: the peer port serves the new certificate
	// to streams that reconnect after a restart.
	c.stop(c.followersOf(lead)[0])
	c.start(c.followersOf(lead)[0], false)
	resp := put(t, c.kv(lead), "after", "x")
	c.waitApplied(c.followersOf(lead)[0], resp.Header.Index)
}

// TestTLSConfigRefusesPlaintext checks the refusal to serve plain text off
// loopback, and its escape hatch.
func TestTLSConfigRefusesPlaintext(t *testing.T) {
	cfg := singleMemberConfig(t)
	cfg.ListenGRPC = "0.0.0.0:0"
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "--listen-grpc 0.0.0.0:0") || !strings.Contains(err.Error(), "lodestone tls") {
		t.Fatalf("got %v", err)
	}
	cfg.InsecurePlaintext = true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// Gossip off loopback needs its key, TLS or not.
	cfg = singleMemberConfig(t)
	cfg.Gossip.Pool.BindAddr = "0.0.0.0:8301"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--gossip-encrypt") {
		t.Fatalf("unencrypted gossip off loopback: %v", err)
	}
	cfg.Gossip.Pool.EncryptKey = "MTIzNDU2Nzg5MDEyMzQ1Ng=="
	if err := cfg.Validate(); err != nil {
		t.Fatalf("encrypted gossip refused: %v", err)
	}
	cfg = singleMemberConfig(t)
	cfg.TLS = TLSConfig{CertFile: "x.pem"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--tls-ca-file") {
		t.Fatalf("half a TLS config: %v", err)
	}
}
