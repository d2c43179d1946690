package rawhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestConnFraming reads every framing a server may choose, on a real
// net/http server over loopback, and keeps the connection alive across
// them except where the server closes it.
func TestConnFraming(t *testing.T) {
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/length":
			w.Header().Set("Content-Length", "5")
			io.WriteString(w, "hello")
		case "/chunked":
			io.WriteString(w, "first ")
			w.(http.Flusher).Flush()
			io.WriteString(w, strings.Repeat("x", 5000))
		case "/echo":
			w.Write(body)
		case "/close":
			w.Header().Set("Connection", "close")
			io.WriteString(w, "bye")
		default:
			http.Error(w, "no such thing", http.StatusNotFound)
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := New(srv.URL)
	defer c.Close()
	ctx := context.Background()
	get := func(path string) (int, string) {
		t.Helper()
		code, body, err := c.Do(ctx, AppendRequest(nil, http.MethodGet, c.Addr(), path, nil))
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return code, string(body)
	}
	if code, body := get("/length"); code != 200 || body != "hello" {
		t.Errorf("/length: %d %q", code, body)
	}
	if code, body := get("/chunked"); code != 200 || body != "first "+strings.Repeat("x", 5000) {
		t.Errorf("/chunked: %d, %d bytes", code, len(body))
	}
	if code, body := get("/nothing"); code != 404 || body != "no such thing\n" {
		t.Errorf("/nothing: %d %q", code, body)
	}
	code, body, err := c.Do(ctx, AppendRequest(nil, http.MethodPut, c.Addr(), "/echo", []byte("a body")))
	if err != nil || code != 200 || string(body) != "a body" {
		t.Errorf("PUT /echo: %d %q %v", code, body, err)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections for four keep-alive exchanges, want 1", n)
	}
	if code, body := get("/close"); code != 200 || body != "bye" {
		t.Errorf("/close: %d %q", code, body)
	}
	if code, body := get("/length"); code != 200 || body != "hello" {
		t.Errorf("/length after a close: %d %q", code, body)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d connections, want a second one after Connection: close", n)
	}
}

// An op whose server never answers ends with its context.
func TestConnDeadline(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer srv.Close()
	defer close(release)
	c := New(srv.URL)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, _, err := c.Do(ctx, AppendRequest(nil, http.MethodGet, c.Addr(), "/", nil))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("do against a silent server: %v, want context.DeadlineExceeded", err)
	}
	if c.open() {
		t.Error("the connection stayed open after a failed op")
	}
}

// The request the gets send is one a real server parses as meant.
func TestAppendRequest(t *testing.T) {
	var got string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = fmt.Sprintf("%s %s %s %q %q", r.Method, r.URL.Path, r.Host, r.Header.Get("Accept-Encoding"), b)
	}))
	defer srv.Close()
	c := New(srv.URL)
	defer c.Close()
	if _, _, err := c.Do(context.Background(), AppendRequest(nil, http.MethodPut, c.Addr(), "/v1/kv/a/b", []byte("v"))); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`PUT /v1/kv/a/b %s "" "v"`, c.Addr()); got != want {
		t.Errorf("server saw %s, want %s", got, want)
	}
}

// Header gives the named headers of the last answer, and only those.
func TestConnHeader(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/with" {
			w.Header().Set("X-Consul-Index", "42")
			w.Header().Set("X-Other", "1")
		}
	}))
	defer srv.Close()
	c := New(srv.URL, "X-Consul-Index")
	defer c.Close()
	for _, want := range []struct{ path, index string }{{"/with", "42"}, {"/without", ""}, {"/with", "42"}} {
		if _, _, err := c.Do(context.Background(), AppendRequest(nil, http.MethodGet, c.Addr(), want.path, nil)); err != nil {
			t.Fatal(err)
		}
		if got := c.Header("X-Consul-Index"); got != want.index {
			t.Errorf("%s: X-Consul-Index %q, want %q", want.path, got, want.index)
		}
		if got := c.Header("X-Other"); got != "" {
			t.Errorf("%s: X-Other %q, not asked for", want.path, got)
		}
	}
}

// Close from another goroutine ends an op the server holds.
func TestConnCloseCutsOffAnOp(t *testing.T) {
	held := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(held)
		<-r.Context().Done()
	}))
	defer srv.Close()
	c := New(srv.URL)
	errc := make(chan error, 1)
	go func() {
		_, _, err := c.Do(context.Background(), AppendRequest(nil, http.MethodGet, c.Addr(), "/", nil))
		errc <- err
	}()
	<-held
	c.Close()
	if err := <-errc; err == nil {
		t.Fatal("an op cut off by Close succeeded")
	}
}

// open reports whether the client holds a connection.
func (c *Conn) open() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn != nil
}
