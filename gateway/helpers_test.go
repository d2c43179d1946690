package gateway_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/gateway"
	"github.com/lodestone-kv/lodestone/gateway/gatewaytest"
)

// syncBuffer collects logs; printed when a test fails.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// testLogger returns a debug logger whose output is printed if t fails.
func testLogger(t *testing.T) *slog.Logger {
	var buf syncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			out := buf.String()
			if len(out) > 30000 {
				out = out[len(out)-30000:]
			}
			t.Logf("logs (tail):\n%s", out)
		}
	})
	return slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// testConfig is a gateway config on free loopback ports with small
// timeouts. Edit it before startGateway.
func testConfig(t *testing.T, src gateway.Source) gateway.Config {
	cfg := gateway.DefaultConfig()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Source = src
	cfg.Shards = 4
	cfg.Seed = 1
	cfg.ConnectTimeout = 300 * time.Millisecond
	cfg.ResponseHeaderTimeout = 2 * time.Second
	cfg.IdleTimeout = 2 * time.Second
	cfg.Logger = testLogger(t)
	return cfg
}

// startGateway starts a gateway for cfg, closed when the test ends.
func startGateway(t *testing.T, cfg gateway.Config) *gateway.Gateway {
	t.Helper()
	g, err := gateway.New(cfg)
	if err != nil {
		t.Fatalf("gateway.New: %v", err)
	}
	g.Start()
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Errorf("gateway Close: %v", err)
		}
	})
	return g
}

// httpClient returns a client whose connections are closed when the test
// ends (goleak checks for the rest).
func httpClient(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// origin is a real HTTP server on a loopback port.
type origin struct {
	srv   *http.Server
	ln    net.Listener
	host  string
	port  int
	conns atomic.Int64 // connections accepted
	reqs  atomic.Int64 // requests served
}

// startOrigin serves h on a fresh loopback port (HTTP/1.1, plus h2c when
// h2c) until the test ends.
func startOrigin(t *testing.T, h http.Handler, h2c bool) *origin {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOrigin(t, ln, h, h2c, nil)
}

func serveOrigin(t *testing.T, ln net.Listener, h http.Handler, h2c bool, tlsCfg *tls.Config) *origin {
	o := &origin{ln: ln}
	o.host, o.port = splitAddr(t, ln.Addr().String())
	o.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			o.reqs.Add(1)
			h.ServeHTTP(w, r)
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				o.conns.Add(1)
			}
		},
		ReadHeaderTimeout: 10 * time.Second,
	}
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(h2c)
	if tlsCfg != nil {
		o.srv.TLSConfig = tlsCfg
		p.SetHTTP2(true)
		ln = tls.NewListener(ln, tlsCfg)
	}
	o.srv.Protocols = &p
	done := make(chan struct{})
	go func() {
		defer close(done)
		o.srv.Serve(ln)
	}()
	t.Cleanup(func() {
		o.srv.Close()
		<-done
	})
	return o
}

func splitAddr(t *testing.T, addr string) (string, int) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(p)
	return host, port
}

// instance describes o as a registry instance.
func (o *origin) instance(service, id string, meta map[string]string) gateway.Instance {
	return gateway.Instance{Service: service, ID: id, Address: o.host, Port: o.port, Healthy: true, Meta: meta}
}

// blackhole returns an address that never accepts: a listening socket with
// a backlog of zero whose only queue slot is taken, so further SYNs are
// dropped and connects hang.
func blackhole(t *testing.T) (string, int) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*syscall.SockaddrInet4).Port
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	filler, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("fill the blackhole's queue: %v", err)
	}
	t.Cleanup(func() { filler.Close() })
	// Prove it: a connect now hangs.
	if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
		c.Close()
		t.Fatalf("blackhole %s accepted a connection", addr)
	}
	return "127.0.0.1", port
}

// silentListener accepts connections and never answers.
func silentListener(t *testing.T) (string, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return splitAddr(t, ln.Addr().String())
}

// selfSignedTLS returns a server TLS config with a fresh self-signed
// certificate for 127.0.0.1 and "origin.test", and a pool trusting it.
func selfSignedTLS(t *testing.T, protos ...string) (*tls.Config, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "origin.test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"origin.test"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		IsCA:         true,

		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		NextProtos:   protos,
	}, pool
}

// get sends a GET to the gateway with the given host and path.
func get(t *testing.T, c *http.Client, g *gateway.Gateway, host, path string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+g.Addr()+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s%s: %v", host, path, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("GET %s%s: read body: %v", host, path, err)
	}
	return resp, string(b)
}

// nameHandler answers with its name and the request's path.
func nameHandler(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", name, r.URL.Path)
	})
}

// fakeWithRoute returns a fake source with route "all" → service.
// gatewayTo starts a gateway whose route "svc" has o as its one instance
// (id) and waits until its table holds it.
func gatewayTo(t *testing.T, o *origin, id string) (*gateway.Gateway, *gatewaytest.Source) {
	t.Helper()
	src := fakeWithRoute("svc")
	idx := src.PutInstance(o.instance("svc", id, nil))
	g := startGateway(t, testConfig(t, src))
	if err := g.WaitIndex(testCtx(t, 10*time.Second), idx); err != nil {
		t.Fatal(err)
	}
	return g, src
}

func fakeWithRoute(service string) *gatewaytest.Source {
	src := gatewaytest.NewSource()
	src.PutRoute(gateway.Route{Name: "all", PathPrefix: "/", Service: service})
	return src
}

func newTLSClientConfig(roots *x509.CertPool) *tls.Config {
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func jsonDecode(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }

func testCtxB(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
