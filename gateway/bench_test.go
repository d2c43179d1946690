package gateway_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/gateway"
	"github.com/lodestone-kv/lodestone/internal/testnet"
)

// rawOrigin is a minimal HTTP/1.1 keep-alive responder (cheaper than
// net/http, so a benchmark's profile is the gateway's).
func rawOrigin(tb testing.TB, body string) (string, int) {
	resp := []byte(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	addr := testnet.Serve(tb, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			for {
				line, err := br.ReadSlice('\n')
				if err != nil {
					return
				}
				if len(line) <= 2 {
					break
				}
			}
			if _, err := c.Write(resp); err != nil {
				return
			}
		}
	})
	host, port, _ := net.SplitHostPort(addr)
	p, _ := strconv.Atoi(port)
	return host, p
}

// rawGet sends GETs on one keep-alive connection and reads the answers,
// with as little client work as possible.
type rawClient struct {
	c  net.Conn
	br *bufio.Reader
}

func (rc *rawClient) get(req []byte) error {
	if _, err := rc.c.Write(req); err != nil {
		return err
	}
	resp, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return err
}

// BenchmarkProxyHTTP1 measures one proxied request end to end (client and
// origin on loopback) through the gateway. Run with -cpu 1 to see the
// cost per request on one core; profile with -cpuprofile.
func BenchmarkProxyHTTP1(b *testing.B) { benchKeepAlive(b, 64) }

// BenchmarkProxyHTTP1NewConn is BenchmarkProxyHTTP1 with a new client
// connection per request (Connection: close), the connection-churn
// shape; the gateway keeps its origin connections.
func BenchmarkProxyHTTP1NewConn(b *testing.B) {
	g := benchGateway(b, 64)
	req := []byte("GET /bench HTTP/1.1\r\nHost: bench\r\nUser-Agent: bench\r\nConnection: close\r\n\r\n")
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c, err := net.Dial("tcp", g.Addr())
			if err != nil {
				b.Error(err)
				return
			}
			err = (&rawClient{c: c, br: bufio.NewReader(c)}).get(req)
			c.Close()
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkProxyHTTP1Body64K is BenchmarkProxyHTTP1 with 64 KiB
// responses.
func BenchmarkProxyHTTP1Body64K(b *testing.B) {
	b.SetBytes(64 << 10)
	benchKeepAlive(b, 64<<10)
}

// benchKeepAlive drives the gateway with keep-alive clients, one
// connection per goroutine, for bodies of size bytes.
func benchKeepAlive(b *testing.B, size int) {
	g := benchGateway(b, size)
	req := []byte("GET /bench HTTP/1.1\r\nHost: bench\r\nUser-Agent: bench\r\n\r\n")
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.Dial("tcp", g.Addr())
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		rc := &rawClient{c: c, br: bufio.NewReader(c)}
		for pb.Next() {
			if err := rc.get(req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// benchGateway starts a gateway routing every path to a raw origin that
// answers with a body of size bytes.
func benchGateway(b *testing.B, size int) *gateway.Gateway {
	host, port := rawOrigin(b, strings.Repeat("x", size))
	src := fakeWithRoute("svc")
	idx := src.PutInstance(gateway.Instance{Service: "svc", ID: "o", Address: host, Port: port, Healthy: true})
	cfg := gateway.DefaultConfig()
	cfg.Listen, cfg.AdminListen, cfg.Source = "127.0.0.1:0", "127.0.0.1:0", src
	g, err := gateway.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	g.Start()
	b.Cleanup(func() { g.Close() })
	ctx, cancel := testCtxB(10 * time.Second)
	defer cancel()
	g.WaitIndex(ctx, idx)
	return g
}
