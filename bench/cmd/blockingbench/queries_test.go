package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/rawhttp"
)

// TestReadFollowsTheIndex reads the way a query does, against a net/http
// server: every read on one connection, the index and value parsed, a
// value decoded only when the index moved, a 404 answered with its index.
func TestReadFollowsTheIndex(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("wait") != "10000ms" {
			http.Error(w, "no wait", http.StatusBadRequest)
			return
		}
		index := "7"
		if r.URL.Query().Get("index") == "7" {
			index = "8"
		}
		w.Header().Set("X-Consul-Index", index)
		if r.URL.Path == "/v1/kv/missing" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		fmt.Fprintf(w, `[{"Key":"k","Value":%q}]`, base64.StdEncoding.EncodeToString([]byte("v"+index)))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	q := &queries{spec: querySpec{Wait: 10 * time.Second}}
	c := rawhttp.New(srv.URL, "X-Consul-Index")
	defer c.Close()
	ctx := context.Background()
	for _, want := range []struct {
		index   uint64
		got     uint64
		changed bool
		val     string
	}{{0, 7, true, "v7"}, {7, 8, true, "v8"}, {8, 7, false, ""}} {
		a, err := q.read(ctx, c, "/v1/kv/k", want.index)
		if err != nil || a.got != want.got || a.changed != want.changed || string(a.val) != want.val {
			t.Fatalf("read after %d: %d %q %v %v, want %d %q %v", want.index, a.got, a.val, a.changed, err, want.got, want.val, want.changed)
		}
	}
	if a, err := q.read(ctx, c, "/v1/kv/missing", 0); err != nil || a.got != 7 || a.val != nil {
		t.Fatalf("read of a missing key: %d %q %v, want index 7 and no value", a.got, a.val, err)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for four reads, want 1", n)
	}
}
