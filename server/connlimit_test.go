package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// TestHTTPConnectionLimit: with --max-http-connections 2, a parked
// blocking query and an idle connection fill the listener; a third
// client is not served until one of them closes.
func TestHTTPConnectionLimit(t *testing.T) {
	c := newTestCluster(t, 1, func(cfg *Config) { cfg.MaxHTTPConnections = 2 })
	s := c.servers[c.waitLeader()]
	addr := s.HTTPAddr()

	resp, err := http.Get("http://" + addr + "/v1/kv/limit/none")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	index := resp.Header.Get("X-Consul-Index")
	// NB: that client's connection must not hold a slot.
	http.DefaultClient.CloseIdleConnections()
	waitFor(t, 10*time.Second, func() bool { return s.httpConns.Open() == 0 })

	parked, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer parked.Close()
	if _, err := fmt.Fprintf(parked, "GET /v1/kv/limit/k?index=%s&wait=5m HTTP/1.1\r\nHost: x\r\n\r\n", index); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return s.park.Len() == 1 })
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return s.httpConns.Open() == 2 })

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 300 * time.Millisecond}
	if resp, err := client.Get("http://" + addr + "/v1/status/leader"); err == nil {
		resp.Body.Close()
		t.Fatalf("a third connection was served over a limit of 2: %s", resp.Status)
	}
	idle.Close()
	client.Timeout = 10 * time.Second
	resp, err = client.Get("http://" + addr + "/v1/status/leader")
	if err != nil {
		t.Fatalf("after a slot was freed: %v", err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("after a slot was freed: %s, %v", resp.Status, err)
	}
	if n := s.park.Len(); n != 1 {
		t.Fatalf("%d parked after the limit test, want the one query still waiting", n)
	}
}

// TestGRPCConnectionLimit: with --max-connections 1, a second client's
// request waits while the first client's connection is open, and is
// served once it closes (the same connLimit as the HTTP listener's).
func TestGRPCConnectionLimit(t *testing.T) {
	c := newTestCluster(t, 1, func(cfg *Config) { cfg.MaxConnections = 1 })
	s := c.servers[c.waitLeader()]
	addr := s.GRPCAddr()
	open := func() float64 { return counterValue(t, s.Registry(), "lodestone_grpc_connections", nil) }
	get := func(conn *grpc.ClientConn, within time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		_, err := lodestonepb.NewKVClient(conn).Get(ctx, &lodestonepb.GetRequest{Key: []byte("k")})
		return err
	}
	dial := func() *grpc.ClientConn {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		return conn
	}
	// NB: the harness's own client holds no connection to this listener
	// before a test asks it for one.
	first := dial()
	if err := get(first, 10*time.Second); err != nil {
		t.Fatalf("first client: %v", err)
	}
	second := dial()
	defer second.Close()
	if err := get(second, 300*time.Millisecond); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("second client over a limit of 1: %v, want DeadlineExceeded", err)
	}
	if n := open(); n != 1 {
		t.Errorf("lodestone_grpc_connections = %v with one accepted and one waiting, want 1", n)
	}
	// The second client's connection waits in the listen queue, and is
	// accepted once the first one's slot is free.
	first.Close()
	if err := get(second, 10*time.Second); err != nil {
		t.Fatalf("second client after the first closed: %v", err)
	}
	second.Close()
	waitFor(t, 10*time.Second, func() bool { return open() == 0 })
}
