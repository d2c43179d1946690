package main

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/testnet"
)

// healthz serves /healthz with code and body.
func healthz(t *testing.T, code int, body string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(code)
		w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestHealthcheckPlain(t *testing.T) {
	ok := healthz(t, http.StatusOK, "ok\n")
	sick := healthz(t, http.StatusServiceUnavailable, "raft loop stopped:\n disk full\n")
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(5 * time.Second):
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(slow.Close)
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want string // in stdout when 0, else in stderr
	}{
		{"healthy", nil, []string{"--url", ok.URL + "/healthz"}, 0, "healthy: GET " + ok.URL + "/healthz: 200 OK"},
		{"url from the environment", map[string]string{envHealthcheckURL: ok.URL + "/healthz"}, nil, 0, "200 OK"},
		// NB: an agent's container has the client TLS variables set for
		// its registry, and its own /healthz is plain HTTP.
		{"http ignores TLS files", map[string]string{"LODESTONE_CACERT": "/nonexistent/ca.pem"}, []string{"--url", ok.URL + "/healthz"}, 0, "200 OK"},
		{"503 with why", nil, []string{"--url", sick.URL + "/healthz"}, 1, "503 Service Unavailable: raft loop stopped: disk full"},
		{"404", nil, []string{"--url", ok.URL + "/nope"}, 1, "404 Not Found"},
		{"nobody listening", nil, []string{"--url", "http://" + testnet.FreeAddr(t) + "/healthz"}, 1, "connection refused"},
		{"too slow", nil, []string{"--url", slow.URL + "/healthz", "--timeout", "200ms"}, 1, "Timeout"},
		{"not http", nil, []string{"--url", "ftp://127.0.0.1/healthz"}, 1, "want http:// or https://"},
		{"no host", nil, []string{"--url", "http:///healthz"}, 1, "want http:// or https://"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := cli(t, tc.env, "", append([]string{"healthcheck"}, tc.args...)...)
			if r.code != tc.code {
				t.Fatalf("exit %d, want %d; stdout %q stderr %q", r.code, tc.code, r.stdout, r.stderr)
			}
			out := r.stdout
			if tc.code != 0 {
				out = r.stderr
				if n := strings.Count(out, "\n"); n != 1 {
					t.Errorf("stderr has %d lines, want one: %q", n, out)
				}
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("output %q, want it to contain %q", out, tc.want)
			}
		})
	}
}

// An https URL is checked with the client TLS flags, client certificate
// included, as a server started with --tls-verify-incoming-http wants.
func TestHealthcheckMutualTLS(t *testing.T) {
	dir := createTLSFiles(t)
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "server-n1.pem"), filepath.Join(dir, "server-n1-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, "lodestone-ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA certificate in lodestone-ca.pem")
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) }))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	url := srv.URL + "/healthz"
	ca, cert, key := filepath.Join(dir, "lodestone-ca.pem"), filepath.Join(dir, "client-ops.pem"), filepath.Join(dir, "client-ops-key.pem")
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		code int
		want string
	}{
		{"flags", nil, []string{"--ca-file", ca, "--cert-file", cert, "--key-file", key}, 0, "200 OK"},
		{"environment", map[string]string{"LODESTONE_CACERT": ca, "LODESTONE_CLIENT_CERT": cert, "LODESTONE_CLIENT_KEY": key}, nil, 0, "200 OK"},
		{"no client certificate", nil, []string{"--ca-file", ca}, 1, "certificate required"},
		{"server not trusted", nil, nil, 1, "certificate signed by unknown authority"},
		{"unreadable CA file", nil, []string{"--ca-file", filepath.Join(dir, "nope.pem")}, 1, "nope.pem"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := cli(t, tc.env, "", append([]string{"healthcheck", "--url", url}, tc.args...)...)
			out := r.stdout
			if tc.code != 0 {
				out = r.stderr
			}
			if r.code != tc.code || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d (want %d); stdout %q stderr %q; want %q", r.code, tc.code, r.stdout, r.stderr, tc.want)
			}
		})
	}
}
