package main

import (
	"context"
	"encoding/base64"
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

// TestRawConnFraming reads every framing a server may choose, on a real
// net/http server over loopback, and keeps the connection alive across
// them except where the server closes it.
func TestRawConnFraming(t *testing.T) {
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
	c := newRawConn(srv.URL)
	defer c.close()
	ctx := context.Background()
	get := func(path string) (int, string) {
		t.Helper()
		code, body, err := c.do(ctx, appendRequest(nil, http.MethodGet, c.addr, path, nil))
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
	code, body, err := c.do(ctx, appendRequest(nil, http.MethodPut, c.addr, "/echo", []byte("a body")))
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
func TestRawConnDeadline(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer srv.Close()
	defer close(release)
	c := newRawConn(srv.URL)
	defer c.close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, _, err := c.do(ctx, appendRequest(nil, http.MethodGet, c.addr, "/", nil))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("do against a silent server: %v, want context.DeadlineExceeded", err)
	}
	if c.conn != nil {
		t.Error("the connection stayed open after a failed op")
	}
}

// kvAnswer is a get's answer as Consul and Lodestone write it.
func kvAnswer(key string, value []byte) []byte {
	return fmt.Appendf(nil, `[{"LockIndex":0,"Key":%q,"Flags":0,"Value":%q,"CreateIndex":12,"ModifyIndex":13}]`+"\n",
		key, base64.StdEncoding.EncodeToString(value))
}

// The scan and the full decode accept and refuse the same answers.
func TestCheckGetAnswer(t *testing.T) {
	key := getKey(42)
	value := make([]byte, 256)
	ok := kvAnswer(key, value)
	for name, check := range map[string]func([]byte, int) error{
		"scan": func(b []byte, size int) error { _, err := checkGetAnswer(nil, key, b, size); return err },
		"json": func(b []byte, size int) error { return checkGetJSON(key, b, size) },
	} {
		if err := check(ok, 256); err != nil {
			t.Errorf("%s: a right answer: %v", name, err)
		}
		for what, bad := range map[string][]byte{
			"other key":    kvAnswer(getKey(43), value),
			"key prefix":   kvAnswer(key+"0", value),
			"short value":  kvAnswer(key, value[:255]),
			"two entries":  []byte(strings.Replace(string(ok), "}]", "},"+strings.TrimPrefix(strings.TrimSpace(string(ok)), "["), 1)),
			"empty array":  []byte("[]"),
			"not base64":   []byte(strings.Replace(string(ok), `"Value":"`, `"Value":"!`, 1)),
			"null value":   kvAnswer(key, nil),
			"not an array": []byte(strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(string(ok)), "["), "]")),
		} {
			if err := check(bad, 256); !errors.Is(err, errWrongAnswer) {
				t.Errorf("%s: %s: %v, want errWrongAnswer", name, what, err)
			}
		}
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
	c := newRawConn(srv.URL)
	defer c.close()
	if _, _, err := c.do(context.Background(), appendRequest(nil, http.MethodPut, c.addr, "/v1/kv/a/b", []byte("v"))); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`PUT /v1/kv/a/b %s "" "v"`, c.addr); got != want {
		t.Errorf("server saw %s, want %s", got, want)
	}
}
