package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestQueryConnKeepsItsConnection reads through a queryConn the way a
// query does, against a net/http server: every read on one connection,
// the index and value parsed, a 404 answered with its index.
func TestQueryConnKeepsItsConnection(t *testing.T) {
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
	qc := newQueryConn(&net.Dialer{}, strings.TrimPrefix(srv.URL, "http://"))
	defer qc.close()
	ctx := context.Background()
	for _, c := range []struct {
		index   uint64
		got     uint64
		changed bool
		val     string
	}{{0, 7, true, "v7"}, {7, 8, true, "v8"}, {8, 7, false, ""}} {
		got, val, changed, err := q.read(ctx, qc, "/v1/kv/k", c.index)
		if err != nil || got != c.got || changed != c.changed || string(val) != c.val {
			t.Fatalf("read after %d: %d %q %v %v, want %d %q %v", c.index, got, val, changed, err, c.got, c.val, c.changed)
		}
	}
	if got, val, _, err := q.read(ctx, qc, "/v1/kv/missing", 0); err != nil || got != 7 || val != nil {
		t.Fatalf("read of a missing key: %d %q %v, want index 7 and no value", got, val, err)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d connections for four reads, want 1", n)
	}
}

// TestQueryConnCloseCutsOffARead: close ends a read the server holds.
func TestQueryConnCloseCutsOffARead(t *testing.T) {
	held := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(held)
		<-r.Context().Done()
	}))
	defer srv.Close()
	qc := newQueryConn(&net.Dialer{}, strings.TrimPrefix(srv.URL, "http://"))
	errc := make(chan error, 1)
	go func() {
		_, _, _, err := qc.get(context.Background(), "/v1/kv/k?wait=10000ms&index=1", time.Now().Add(time.Minute))
		errc <- err
	}()
	<-held
	qc.close()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("a read cut off by close succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("close did not end the read")
	}
	if _, _, _, err := qc.get(context.Background(), "/v1/kv/k", time.Now().Add(time.Minute)); err == nil {
		t.Fatal("get after close succeeded")
	}
}
