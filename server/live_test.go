package server

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// TestReloadChangesLimitsLive: a value over max-value-bytes is refused on
// both doors, accepted once Reload raises the limit, and refused again
// once it lowers it; a LiveConfig that does not fit the rest of the
// running configuration changes nothing.
func TestReloadChangesLimitsLive(t *testing.T) {
	c := newTestCluster(t, 1, func(cfg *Config) { cfg.Limits.MaxValueBytes = 1024 })
	name := c.waitLeader()
	s := c.servers[name]
	kv := c.kv(name)
	big := bytes.Repeat([]byte("v"), 2000)
	putBig := func() error {
		_, err := kv.Put(ctxT(t), &lodestonepb.PutRequest{Key: []byte("big"), Value: big})
		return err
	}
	httpPut := func() int {
		req, err := http.NewRequest(http.MethodPut, "http://"+s.HTTPAddr()+"/v1/kv/big-http", bytes.NewReader(big))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if err := putBig(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("2000-byte value under a 1024-byte limit: %v, want InvalidArgument", err)
	}
	if code := httpPut(); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("HTTP 2000-byte value under a 1024-byte limit: %d, want 413", code)
	}

	live := s.cfg.Live()
	live.Limits.MaxValueBytes = 4096
	if err := s.Reload(live); err != nil {
		t.Fatal(err)
	}
	if err := putBig(); err != nil {
		t.Fatalf("after raising the limit to 4096: %v", err)
	}
	if code := httpPut(); code != http.StatusOK {
		t.Fatalf("HTTP after raising the limit to 4096: %d", code)
	}

	// Values that would not fit --max-request-bytes are refused whole.
	tooBig := live
	tooBig.Limits.MaxValueBytes = s.cfg.MaxRequestBytes
	tooBig.MaxWatchesPerStream = 1
	if err := s.Reload(tooBig); err == nil || !strings.Contains(err.Error(), "max-request-bytes") {
		t.Fatalf("Reload with values larger than requests: %v, want a max-request-bytes error", err)
	}
	if got := s.live(); got.Limits.MaxValueBytes != 4096 || got.MaxWatchesPerStream != s.cfg.MaxWatchesPerStream {
		t.Fatalf("a refused Reload changed the live config: %+v", got)
	}

	live.Limits.MaxValueBytes = 1024
	if err := s.Reload(live); err != nil {
		t.Fatal(err)
	}
	if err := putBig(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("after lowering the limit again: %v, want InvalidArgument", err)
	}
}

// TestReloadChangesPerClientCap: a per-client cap set by Reload closes
// the next connection over it at once; turned off again, the same
// client connects. Connections open across the change are counted.
func TestReloadChangesPerClientCap(t *testing.T) {
	c := newTestCluster(t, 1)
	s := c.servers[c.waitLeader()]
	addr := s.HTTPAddr()
	first := dialFrom(t, "127.0.0.1", addr)
	defer first.Close()
	if resp, err := roundTrip(first, bufio.NewReader(first), "/v1/status/leader"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("first connection: %v %v", resp, err)
	}

	live := s.cfg.Live()
	live.MaxHTTPConnectionsPerClient = 1
	if err := s.Reload(live); err != nil {
		t.Fatal(err)
	}
	over := dialFrom(t, "127.0.0.1", addr)
	defer over.Close()
	over.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := over.Read(make([]byte, 1)); err == nil {
		t.Fatalf("connection over a cap of 1 read %d bytes, want it closed at once", n)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("connection over a cap of 1 was left open")
	}

	live.MaxHTTPConnectionsPerClient = -1
	if err := s.Reload(live); err != nil {
		t.Fatal(err)
	}
	second := dialFrom(t, "127.0.0.1", addr)
	defer second.Close()
	if resp, err := roundTrip(second, bufio.NewReader(second), "/v1/status/leader"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("with the cap off again: %v %v", resp, err)
	}
}
