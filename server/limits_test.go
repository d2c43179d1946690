package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// kvState is every key with its ModifyIndex: what a refused request must
// leave as it was.
func kvState(s *Server) map[string]uint64 {
	out := map[string]uint64{}
	kvs, _, _ := s.Store().Range(nil, nil, 0, true)
	for _, kv := range kvs {
		out[string(kv.Key)] = kv.ModifyIndex
	}
	return out
}

// counterValue reads one series of a counter from reg (0 if absent).
func counterValue(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue metric
				}
			}
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.Gauge.GetValue()
		}
	}
	return 0
}

// txnBody is a /v1/txn body of n set operations with values of size bytes.
func txnBody(n, size int) []byte {
	var b bytes.Buffer
	val := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{'v'}, size))
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"KV":{"Verb":"set","Key":"txn/%d","Value":"%s"}}`, i, val)
	}
	b.WriteByte(']')
	return b.Bytes()
}

// TestLimitsRefuseBadInput sends every bad input the limits name to a
// running server, over HTTP and gRPC, and checks the answer's status and
// words and that the KV state read back afterwards did not change.
func TestLimitsRefuseBadInput(t *testing.T) {
	c := newTestCluster(t, 1, func(cfg *Config) { cfg.MaxRangeResponseBytes = 64 << 10 })
	name := c.waitLeader()
	s := c.servers[name]
	kv := c.kv(name)
	base := "http://" + s.HTTPAddr()
	// Three 30 KiB values: 90 KiB under big/, over the 64 KiB range cap.
	for i := range 3 {
		if _, err := kv.Put(ctxT(t), &lodestonepb.PutRequest{Key: fmt.Appendf(nil, "big/%d", i), Value: bytes.Repeat([]byte{'b'}, 30<<10)}); err != nil {
			t.Fatal(err)
		}
	}
	put(t, kv, "keep", "v")

	httpDo := func(method, path string, body []byte) (int, string) {
		t.Helper()
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequest(method, base+path, rd)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	grpcCode := func(err error) (int, string) {
		st := status.Convert(err)
		return int(st.Code()), st.Message()
	}
	big := bytes.Repeat([]byte{'x'}, 512<<10+1)
	tests := []struct {
		name     string
		do       func() (int, string)
		wantCode int // HTTP status, or a gRPC code for the grpc cases
		wantMsg  string
		writes   bool // a control case that may change state
	}{
		{name: "http txn 64 values of 512 KiB (44.7 MB)", do: func() (int, string) { return httpDo("PUT", "/v1/txn", txnBody(64, 512<<10)) },
			wantCode: 413, wantMsg: "too large, max size: 524288 bytes (limit max-txn-request-bytes)"},
		{name: "http txn just over 512 KiB", do: func() (int, string) { return httpDo("PUT", "/v1/txn", txnBody(1, 400<<10)) },
			wantCode: 413, wantMsg: "max size: 524288 bytes"},
		{name: "http txn too many operations", do: func() (int, string) { return httpDo("PUT", "/v1/txn", txnBody(65, 1)) },
			wantCode: 413, wantMsg: "Transaction contains too many operations (65 > 64)"},
		{name: "http kv value over max-value-bytes", do: func() (int, string) { return httpDo("PUT", "/v1/kv/keep", big) },
			wantCode: 413, wantMsg: "max size: 524288 bytes (limit max-value-bytes)"},
		{name: "http catalog body over its cap", do: func() (int, string) { return httpDo("PUT", "/v1/catalog/register", big) },
			wantCode: 413, wantMsg: "Request body(524289 bytes) too large, max size: 524288 bytes (limit max-value-bytes)"},
		{name: "http session body over its cap", do: func() (int, string) { return httpDo("PUT", "/v1/session/create", big) },
			wantCode: 413, wantMsg: "(limit max-value-bytes)"},
		{name: "http key not UTF-8", do: func() (int, string) { return httpDo("PUT", "/v1/kv/bad%FFkey", []byte("v")) },
			wantCode: 400, wantMsg: "key must be valid UTF-8 (invalid byte 0xff at byte 3)"},
		{name: "http key over max-key-bytes", do: func() (int, string) { return httpDo("PUT", "/v1/kv/"+strings.Repeat("k", 2049), []byte("v")) },
			wantCode: 400, wantMsg: "key is 2049 bytes; at most 2048 allowed (limit max-key-bytes)"},
		{name: "http key with NUL", do: func() (int, string) { return httpDo("PUT", "/v1/kv/a%00b", []byte("v")) },
			wantCode: 400, wantMsg: "must not contain a NUL byte"},
		{name: "http dc2 kv get", do: func() (int, string) { return httpDo("GET", "/v1/kv/keep?dc=dc2", nil) },
			wantCode: 500, wantMsg: "No path to datacenter"},
		{name: "http dc2 kv put", do: func() (int, string) { return httpDo("PUT", "/v1/kv/keep?dc=dc2", []byte("changed")) },
			wantCode: 500, wantMsg: "No path to datacenter"},
		{name: "http dc2 txn", do: func() (int, string) { return httpDo("PUT", "/v1/txn?dc=dc2", txnBody(1, 1)) },
			wantCode: 500, wantMsg: "No path to datacenter"},
		{name: "http dc2 catalog services", do: func() (int, string) { return httpDo("GET", "/v1/catalog/services?dc=dc2", nil) },
			wantCode: 500, wantMsg: "No path to datacenter"},
		{name: "http dc2 health", do: func() (int, string) { return httpDo("GET", "/v1/health/service/web?dc=dc2", nil) },
			wantCode: 500, wantMsg: "No path to datacenter"},
		{name: "http dc2 session create", do: func() (int, string) { return httpDo("PUT", "/v1/session/create?dc=dc2", nil) },
			wantCode: 500, wantMsg: "No path to datacenter"},
		{name: "http dc2 status leader", do: func() (int, string) { return httpDo("GET", "/v1/status/leader?dc=dc2", nil) },
			wantCode: 500, wantMsg: "No path to datacenter"},
		{name: "http dc1 kv get works", do: func() (int, string) { return httpDo("GET", "/v1/kv/keep?dc=dc1&raw", nil) },
			wantCode: 200, wantMsg: "v"},
		{name: "http recursive get over max-range-response-bytes", do: func() (int, string) { return httpDo("GET", "/v1/kv/big/?recurse", nil) },
			wantCode: 413, wantMsg: "more than 65536 bytes of keys and values under \"big/\" (limit max-range-response-bytes); page with ?keys"},
		{name: "http keys under the cap work", do: func() (int, string) { return httpDo("GET", "/v1/kv/big/?keys", nil) },
			wantCode: 200, wantMsg: `"big/2"`},

		{name: "grpc put key not UTF-8", do: func() (int, string) {
			_, err := kv.Put(ctxT(t), &lodestonepb.PutRequest{Key: []byte("bad\xffkey"), Value: []byte("v")})
			return grpcCode(err)
		}, wantCode: int(codes.InvalidArgument), wantMsg: "key must be valid UTF-8 (invalid byte 0xff at byte 3)"},
		{name: "grpc txn set key not UTF-8", do: func() (int, string) {
			_, err := kv.Txn(ctxT(t), &lodestonepb.TxnRequest{Ops: []*lodestonepb.TxnOp{
				{Verb: lodestonepb.TxnOp_SET, Key: []byte("fine"), Value: []byte("v")},
				{Verb: lodestonepb.TxnOp_SET, Key: []byte("\xc3("), Value: []byte("v")}}})
			return grpcCode(err)
		}, wantCode: int(codes.InvalidArgument), wantMsg: "key must be valid UTF-8 (invalid byte 0xc3 at byte 0)"},
		{name: "grpc put value over max-value-bytes", do: func() (int, string) {
			_, err := kv.Put(ctxT(t), &lodestonepb.PutRequest{Key: []byte("keep"), Value: big})
			return grpcCode(err)
		}, wantCode: int(codes.InvalidArgument), wantMsg: "value is 524289 bytes; at most 524288 allowed (limit max-value-bytes)"},
		{name: "grpc put key over max-key-bytes", do: func() (int, string) {
			_, err := kv.Put(ctxT(t), &lodestonepb.PutRequest{Key: bytes.Repeat([]byte{'k'}, 2049)})
			return grpcCode(err)
		}, wantCode: int(codes.InvalidArgument), wantMsg: "limit max-key-bytes"},
		{name: "grpc txn over max-txn-ops", do: func() (int, string) {
			req := &lodestonepb.TxnRequest{}
			for i := range 65 {
				req.Ops = append(req.Ops, &lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_SET, Key: fmt.Appendf(nil, "t/%d", i)})
			}
			_, err := kv.Txn(ctxT(t), req)
			return grpcCode(err)
		}, wantCode: int(codes.InvalidArgument), wantMsg: "transaction has 65 operations; at most 64 allowed (limit max-txn-ops)"},
		{name: "grpc txn over max-request-bytes", do: func() (int, string) {
			req := &lodestonepb.TxnRequest{}
			for i := range 9 {
				req.Ops = append(req.Ops, &lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_SET, Key: fmt.Appendf(nil, "t/%d", i), Value: big[:512<<10]})
			}
			_, err := kv.Txn(ctxT(t), req)
			return grpcCode(err)
		}, wantCode: int(codes.ResourceExhausted), wantMsg: "larger than max"},
		{name: "grpc range over max-range-keys", do: func() (int, string) {
			_, err := kv.Range(ctxT(t), &lodestonepb.RangeRequest{Prefix: []byte("big/"), Limit: 10001})
			return grpcCode(err)
		}, wantCode: int(codes.InvalidArgument), wantMsg: "limit max-range-keys"},
		{name: "grpc range over max-range-response-bytes pages", do: func() (int, string) {
			resp, err := kv.Range(ctxT(t), &lodestonepb.RangeRequest{Prefix: []byte("big/")})
			if err != nil {
				return grpcCode(err)
			}
			return int(codes.OK), fmt.Sprintf("%d keys, more=%v", len(resp.Kvs), resp.More)
		}, wantCode: int(codes.OK), wantMsg: "2 keys, more=true"},
	}
	before := kvState(s)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, msg := tt.do()
			if code != tt.wantCode || !strings.Contains(msg, tt.wantMsg) {
				t.Errorf("got %d %q, want %d and %q", code, msg, tt.wantCode, tt.wantMsg)
			}
			if after := kvState(s); !tt.writes && !maps.Equal(after, before) {
				t.Errorf("state changed: %v, was %v", after, before)
			}
		})
	}
	// The last page of the byte-capped range: paging moves on.
	resp, err := kv.Range(ctxT(t), &lodestonepb.RangeRequest{Prefix: []byte("big/"), StartAfter: []byte("big/1")})
	if err != nil || len(resp.Kvs) != 1 || resp.More {
		t.Errorf("range after big/1: %v, %v", resp, err)
	}
	for _, want := range []struct{ api, limit string }{
		{"http", "max-txn-request-bytes"}, {"http", "max-txn-ops"}, {"http", "max-value-bytes"},
		{"http", "max-range-response-bytes"}, {"grpc", "max-range-response-bytes"},
	} {
		if n := counterValue(t, s.Registry(), "lodestone_requests_refused_total", map[string]string{"api": want.api, "limit": want.limit}); n < 1 {
			t.Errorf("lodestone_requests_refused_total{api=%q,limit=%q} = %v, want at least 1", want.api, want.limit, n)
		}
	}
}

// dialFrom dials addr from the local IP src (127.0.0.2 is another client
// on loopback).
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, src, err)
	}
	return conn
}

// roundTrip sends one keep-alive GET on conn and reads its answer.
func roundTrip(conn net.Conn, br *bufio.Reader, path string) (*http.Response, error) {
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
		return nil, err
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer conn.SetReadDeadline(time.Time{})
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, err
}

// TestHTTPPerClientCap: one client holding its cap of connections, a
// parked blocking query among them, cannot stop another client's
// requests; its next connection is closed at once and counted.
func TestHTTPPerClientCap(t *testing.T) {
	const perClient = 5
	c := newTestCluster(t, 1, func(cfg *Config) { cfg.MaxHTTPConnections = 20; cfg.MaxHTTPConnectionsPerClient = perClient })
	s := c.servers[c.waitLeader()]
	addr := s.HTTPAddr()

	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	// One parked blocking query, then keep-alive connections up to the cap.
	parked := dialFrom(t, "127.0.0.1", addr)
	held = append(held, parked)
	if _, err := fmt.Fprintf(parked, "GET /v1/kv/cap/k?index=%d&wait=5m HTTP/1.1\r\nHost: x\r\n\r\n", s.raft.Applied()+1000); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return s.park.Len() == 1 })
	for range perClient - 1 {
		conn := dialFrom(t, "127.0.0.1", addr)
		held = append(held, conn)
		if resp, err := roundTrip(conn, bufio.NewReader(conn), "/v1/status/leader"); err != nil || resp.StatusCode != 200 {
			t.Fatalf("connection under the cap: %v %v", resp, err)
		}
	}
	waitFor(t, 10*time.Second, func() bool { return s.httpConns.Open() == perClient })

	over := dialFrom(t, "127.0.0.1", addr)
	defer over.Close()
	over.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := over.Read(make([]byte, 1)); err == nil {
		t.Fatalf("connection over the per-client cap read %d bytes, want it closed at once", n)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("connection over the per-client cap was left open")
	}
	if n := counterValue(t, s.Registry(), "lodestone_connections_refused_total", map[string]string{"listener": "http", "reason": "per_client"}); n != 1 {
		t.Errorf("lodestone_connections_refused_total{listener=http} = %v, want 1", n)
	}

	other := dialFrom(t, "127.0.0.2", addr)
	defer other.Close()
	if resp, err := roundTrip(other, bufio.NewReader(other), "/v1/status/leader"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("a second client while the first holds its cap: %v %v", resp, err)
	}
	if s.park.Len() != 1 {
		t.Fatalf("%d parked, want the first client's query still parked", s.park.Len())
	}
}

// TestGRPCPerClientCap: the same on the gRPC listener.
func TestGRPCPerClientCap(t *testing.T) {
	c := newTestCluster(t, 1, func(cfg *Config) { cfg.MaxGRPCConnectionsPerClient = 2 })
	s := c.servers[c.waitLeader()]
	dial := func(src string) *grpc.ClientConn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	get := func(conn *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := lodestonepb.NewKVClient(conn).Get(ctx, &lodestonepb.GetRequest{Key: []byte("k"), Consistency: lodestonepb.Consistency_STALE})
		return err
	}
	for i := range 2 {
		if err := get(dial("127.0.0.1")); err != nil {
			t.Fatalf("connection %d under the cap: %v", i, err)
		}
	}
	if err := get(dial("127.0.0.1")); err == nil {
		t.Fatal("a third connection from one client was served over a cap of 2")
	}
	if n := counterValue(t, s.Registry(), "lodestone_connections_refused_total", map[string]string{"listener": "grpc", "reason": "per_client"}); n < 1 {
		t.Errorf("lodestone_connections_refused_total{listener=grpc} = %v, want at least 1", n)
	}
	if err := get(dial("127.0.0.2")); err != nil {
		t.Fatalf("a second client while the first holds its cap: %v", err)
	}
}

// TestHTTPIdleTimeoutClosesIdleConnections: 3,000 keep-alive connections
// that each sent one request, some answered from a parked blocking
// query, are all closed once idle for the idle timeout.
func TestHTTPIdleTimeoutClosesIdleConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 3,000 connections")
	}
	const conns, parkedConns = 3000, 100
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < 2*conns+1000 {
		lim.Cur = min(lim.Max, 2*conns+1000)
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 2*conns+1000 {
			t.Skipf("need %d file descriptors (both ends in this process), have %d: %v", 2*conns+1000, lim.Cur, err)
		}
	}
	const idle = 3 * time.Second
	c := newTestCluster(t, 1, func(cfg *Config) { cfg.HTTPIdleTimeout = idle; cfg.MaxHTTPConnectionsPerClient = -1 })
	s := c.servers[c.waitLeader()]
	addr := s.HTTPAddr()
	open := func() float64 { return counterValue(t, s.Registry(), "lodestone_http_connections", nil) }

	held := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	index := s.raft.Applied()
	used := make([]time.Time, conns)
	for i := range conns {
		conn := dialFrom(t, "127.0.0.1", addr)
		held = append(held, conn)
		path := "/v1/status/leader"
		if i < parkedConns {
			// Parked, then answered when its short wait runs out.
			path = fmt.Sprintf("/v1/kv/idle/k?index=%d&wait=50ms", index+1000)
		}
		if resp, err := roundTrip(conn, bufio.NewReader(conn), path); err != nil || resp.StatusCode/100 != 2 && resp.StatusCode != 404 {
			t.Fatalf("connection %d: %v %v", i, resp, err)
		}
		used[i] = time.Now()
	}
	opened := time.Now()
	// NB: opening them all may take longer than idle (-race on 2 cores):
	// those used within the last half of it must still be open.
	recent := 0
	for _, at := range used {
		if opened.Sub(at) < idle/2 {
			recent++
		}
	}
	if n := open(); n < float64(recent) || recent == 0 {
		t.Fatalf("lodestone_http_connections = %v right after %d requests, want at least the %d used within %v open", n, conns, recent, idle/2)
	}
	// NB: the last connection was idle for at most idle when this began;
	// a parked one goes back to the http.Server after a second and is
	// closed there after idle.
	waitFor(t, 3*idle+20*time.Second, func() bool { return open() == 0 })
	if took := time.Since(opened); took > 3*idle+10*time.Second {
		t.Errorf("idle connections closed after %v, want about %v", took, idle)
	}
	// The server closed them: a read sees the end.
	held[0].SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := held[0].Read(make([]byte, 1)); err == nil {
		t.Error("an idle connection is still readable after the idle timeout")
	}
}
