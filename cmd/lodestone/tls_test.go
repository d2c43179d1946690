package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/internal/testnet"
	"github.com/lodestone-kv/lodestone/tlsutil"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// createTLSFiles runs `lodestone tls` as an operator would and returns dir.
func createTLSFiles(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	ca, key := filepath.Join(dir, "lodestone-ca.pem"), filepath.Join(dir, "lodestone-ca-key.pem")
	for _, args := range [][]string{
		{"tls", "ca", "create", "--dir", dir},
		{"tls", "cert", "create", "--server", "--node", "n1", "--ca", ca, "--key", key, "--dir", dir,
			"--additional-dnsname", "registry.example.com", "--additional-ipaddress", "10.1.2.3"},
		{"tls", "cert", "create", "--peer", "--node", "n1", "--ca", ca, "--key", key, "--dir", dir},
		{"tls", "cert", "create", "--client", "--node", "ops", "--ca", ca, "--key", key, "--dir", dir},
	} {
		if r := cli(t, nil, "", args...); r.code != 0 {
			t.Fatalf("%v: exit %d: %s", args, r.code, r.stderr)
		}
	}
	return dir
}

// TestTLSCreateCommands checks the names, usages and file modes `lodestone
// tls` writes, and that a server serves them to a CLI client.
func TestTLSCreateCommands(t *testing.T) {
	dir := createTLSFiles(t)
	server := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	for name, want := range map[string]struct {
		dns []string
		ips []string
		eku []x509.ExtKeyUsage
	}{
		"server-n1":  {[]string{"server.lodestone", "n1.server.lodestone", "localhost", "registry.example.com"}, []string{"127.0.0.1", "10.1.2.3"}, server},
		"peer-n1":    {[]string{"server.lodestone", "n1.server.lodestone", "localhost"}, []string{"127.0.0.1"}, server},
		"client-ops": {[]string{"client.lodestone", "ops.client.lodestone", "localhost"}, nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
	} {
		c := readCert(t, filepath.Join(dir, name+".pem"))
		var ips []string
		for _, ip := range c.IPAddresses {
			ips = append(ips, ip.String())
		}
		if !slices.Equal(c.DNSNames, want.dns) || !slices.Equal(ips, want.ips) || !slices.Equal(c.ExtKeyUsage, want.eku) {
			t.Errorf("%s: DNS %v IPs %v EKU %v; want %v %v %v", name, c.DNSNames, ips, c.ExtKeyUsage, want.dns, want.ips, want.eku)
		}
		if st, err := os.Stat(filepath.Join(dir, name+"-key.pem")); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s key: %v mode %v, want 0600", name, err, st.Mode())
		}
	}
	if ca := readCert(t, filepath.Join(dir, "lodestone-ca.pem")); !ca.IsCA {
		t.Error("the CA is not a CA")
	}
	if r := cli(t, nil, "", "tls", "ca", "create", "--dir", dir); r.code == 0 || !strings.Contains(r.stderr, "already exists") {
		t.Errorf("a second CA over the first: exit %d: %s", r.code, r.stderr)
	}

	grpcAddr := testnet.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncWriter
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"server", "--name", "n1", "--data-dir", t.TempDir(), "--listen-grpc", grpcAddr,
			"--listen-peer", testnet.FreeAddr(t), "--listen-http", testnet.FreeAddr(t),
			"--tls-ca-file", filepath.Join(dir, "lodestone-ca.pem"),
			"--tls-cert-file", filepath.Join(dir, "server-n1.pem"), "--tls-key-file", filepath.Join(dir, "server-n1-key.pem"),
			"--tls-peer-cert-file", filepath.Join(dir, "peer-n1.pem"), "--tls-peer-key-file", filepath.Join(dir, "peer-n1-key.pem"),
			"--tls-verify-incoming-grpc"}, strings.NewReader(""), &logs, &logs, func(string) string { return "" })
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("server exit %d: %s", code, logs.String())
		}
	}()
	env := map[string]string{"LODESTONE_CACERT": filepath.Join(dir, "lodestone-ca.pem"),
		"CONSUL_CLIENT_CERT": filepath.Join(dir, "client-ops.pem"), "LODESTONE_CLIENT_KEY": filepath.Join(dir, "client-ops-key.pem")}
	var r result
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if r = cli(t, env, "", "--endpoints", grpcAddr, "kv", "put", "k", "v"); r.code == 0 {
			break
		}
	}
	if r.code != 0 {
		t.Fatalf("kv put over TLS: exit %d: %s\nserver: %s", r.code, r.stderr, logs.String())
	}
	// Without a client certificate the server refuses.
	r = cli(t, map[string]string{"LODESTONE_CACERT": env["LODESTONE_CACERT"]}, "", "--endpoints", grpcAddr, "--timeout", "2s", "kv", "get", "k")
	if r.code == 0 {
		t.Fatal("kv get without a client certificate succeeded")
	}
}

type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestServerRefusesPlaintextOffLoopback: no TLS on 0.0.0.0 refuses, with
// the reason and the fix; --insecure-plaintext starts.
func TestServerRefusesPlaintextOffLoopback(t *testing.T) {
	args := []string{"server", "--name", "a", "--data-dir", t.TempDir(), "--listen-grpc", "0.0.0.0:0",
		"--listen-peer", "127.0.0.1:0", "--listen-http", "127.0.0.1:0"}
	r := cli(t, nil, "", args...)
	if r.code == 0 || !strings.Contains(r.stderr, "--listen-grpc 0.0.0.0:0") || !strings.Contains(r.stderr, "lodestone tls") ||
		!strings.Contains(r.stderr, "--insecure-plaintext") {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var logs syncWriter
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append(args, "--insecure-plaintext"), strings.NewReader(""), &logs, &logs, func(string) string { return "" })
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "server started") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != 0 || !strings.Contains(logs.String(), "server started") {
		t.Fatalf("with --insecure-plaintext: exit %d: %s", code, logs.String())
	}
}

// TestServerReloadsOnSIGHUP rotates a real `lodestone server` process's
// certificate and sends it SIGHUP while a client writes without pause.
func TestServerReloadsOnSIGHUP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "lodestone")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	dir := createTLSFiles(t)
	caPEM := tlsutil.PEM{}
	var err error
	if caPEM.Cert, err = os.ReadFile(filepath.Join(dir, "lodestone-ca.pem")); err != nil {
		t.Fatal(err)
	}
	if caPEM.Key, err = os.ReadFile(filepath.Join(dir, "lodestone-ca-key.pem")); err != nil {
		t.Fatal(err)
	}
	grpcAddr := testnet.FreeAddr(t)
	var logs syncWriter
	cmd := exec.Command(bin, "server", "--name", "n1", "--data-dir", t.TempDir(), "--listen-grpc", grpcAddr,
		"--listen-peer", testnet.FreeAddr(t), "--listen-http", testnet.FreeAddr(t),
		"--tls-ca-file", filepath.Join(dir, "lodestone-ca.pem"),
		"--tls-cert-file", filepath.Join(dir, "server-n1.pem"), "--tls-key-file", filepath.Join(dir, "server-n1-key.pem"),
		"--tls-verify-incoming-grpc", "--tls-reload-interval", "-1s")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if t.Failed() {
			t.Logf("server: %s", logs.String())
		}
	}()
	clientStore, err := tlsutil.Load(tlsutil.Files{CAFile: filepath.Join(dir, "lodestone-ca.pem"),
		CertFile: filepath.Join(dir, "client-ops.pem"), KeyFile: filepath.Join(dir, "client-ops-key.pem")}, tlsutil.Options{})
	if err != nil {
		t.Fatal(err)
	}
	serial := func() (*big.Int, error) {
		conn, err := tls.Dial("tcp", grpcAddr, clientStore.ClientConfig("server.lodestone"))
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber, nil
	}
	var old *big.Int
	for deadline := time.Now().Add(15 * time.Second); old == nil && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		old, _ = serial()
	}
	if old == nil {
		t.Fatal("server never served TLS")
	}
	c, err := client.New(client.Config{Endpoints: []string{grpcAddr}, TLS: clientStore.ClientConfig("")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := c.Put(ctx, "warm", []byte("x")); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("first write: %v", err)
		}
	}

	stop := make(chan struct{})
	var writes, failures atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := c.Put(ctx, "rot", []byte(fmt.Sprint(i))); err != nil {
				failures.Add(1)
				t.Errorf("write %d: %v", i, err)
			}
			writes.Add(1)
		}
	}()
	time.Sleep(100 * time.Millisecond)
	p, err := tlsutil.CreateCert(tlsutil.CertOptions{Kind: tlsutil.KindServer, Node: "n1", CA: caPEM})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		name string
		data []byte
	}{{"server-n1-key.pem", p.Key}, {"server-n1.pem", p.Cert}} {
		path := filepath.Join(dir, f.name)
		if err := os.WriteFile(path+".new", f.data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	var now *big.Int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if now, err = serial(); err == nil && now.Cmp(old) != 0 {
			break
		}
	}
	close(stop)
	wg.Wait()
	if now == nil || now.Cmp(old) == 0 {
		t.Fatalf("after SIGHUP new handshakes see serial %x, still the old one (%v)", now, err)
	}
	if failures.Load() != 0 || writes.Load() < 5 {
		t.Fatalf("%d of %d writes failed", failures.Load(), writes.Load())
	}
	if !strings.Contains(logs.String(), "TLS material reloaded") {
		t.Errorf("no reload in the server's log")
	}
}
