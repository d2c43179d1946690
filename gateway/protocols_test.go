package gateway_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/gateway"
)

// TestHTTP1KeepAlive: sequential requests reuse one origin connection,
// whichever shards they pick: a pool with no idle connection borrows
// another shard's before it dials.
func TestHTTP1KeepAlive(t *testing.T) {
	o := startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 1 {
			http.Error(w, "want HTTP/1.1", 500)
			return
		}
		io.WriteString(w, "ok")
	}), false)
	src := fakeWithRoute("svc")
	idx := src.PutInstance(o.instance("svc", "o1", nil))
	cfg := testConfig(t, src)
	g := startGateway(t, cfg)
	g.WaitIndex(testCtx(t, 10*time.Second), idx)
	c := httpClient(t)
	for i := range 100 {
		if resp, body := get(t, c, g, "x", "/"); resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	if got := o.conns.Load(); got != 1 {
		t.Errorf("origin accepted %d connections for 100 sequential requests over %d shards, want 1", got, cfg.Shards)
	}
	if got, want := g.Stats().ConnectionsOpened, o.conns.Load(); got != want {
		t.Errorf("gateway counted %d connections opened, origin accepted %d", got, want)
	}
}

// concurrentThrough sends n requests at once and lets the origin answer
// only when all n are in it, so all n are in flight together.
func concurrentThrough(t *testing.T, g *gateway.Gateway, c *http.Client, n int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			resp, err := c.Get(fmt.Sprintf("http://%s/c/%d", g.Addr(), i))
			if err != nil {
				errs <- err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				errs <- fmt.Errorf("request %d: %d %s", i, resp.StatusCode, b)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// barrierHandler answers once n requests are inside it at the same time.
func barrierHandler(n int, check func(*http.Request) error) http.Handler {
	var mu sync.Mutex
	in := 0
	all := make(chan struct{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := check(r); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		mu.Lock()
		in++
		if in == n {
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
			io.WriteString(w, "ok")
		case <-r.Context().Done():
		}
	})
}

// TestH2CMultiplexes: an h2c origin gets many concurrent requests over one
// connection per pool (one shard here: one connection).
func TestH2CMultiplexes(t *testing.T) {
	const n = 20
	o := startOrigin(t, barrierHandler(n, func(r *http.Request) error {
		if r.ProtoMajor != 2 {
			return fmt.Errorf("proto %s, want HTTP/2", r.Proto)
		}
		return nil
	}), true)
	src := fakeWithRoute("svc")
	idx := src.PutInstance(o.instance("svc", "o1", map[string]string{"protocol": gateway.ProtocolH2C}))
	cfg := testConfig(t, src)
	cfg.Shards, cfg.Replication = 1, 1
	g := startGateway(t, cfg)
	g.WaitIndex(testCtx(t, 10*time.Second), idx)
	concurrentThrough(t, g, httpClient(t), n)
	if got := o.conns.Load(); got != 1 {
		t.Errorf("origin accepted %d connections for %d concurrent h2c requests, want 1 (multiplexed)", got, n)
	}
}

// TestTLSWithALPN: an https origin offering h2 gets HTTP/2 over TLS
// (multiplexed); one offering only http/1.1 gets HTTP/1.1 over TLS.
// Certificates are self-signed, made by the test.
func TestTLSWithALPN(t *testing.T) {
	const n = 10
	for _, tc := range []struct {
		name   string
		protos []string
		major  int
		conns  int64
	}{
		{"h2", []string{"h2", "http/1.1"}, 2, 1},
		{"http1", []string{"http/1.1"}, 1, n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srvTLS, roots := selfSignedTLS(t, tc.protos...)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			o := serveOrigin(t, ln, barrierHandler(n, func(r *http.Request) error {
				if r.TLS == nil || r.ProtoMajor != tc.major {
					return fmt.Errorf("proto %s tls %v, want HTTP/%d over TLS", r.Proto, r.TLS != nil, tc.major)
				}
				return nil
			}), false, srvTLS)
			src := fakeWithRoute("svc")
			idx := src.PutInstance(o.instance("svc", "o1", map[string]string{"protocol": gateway.ProtocolHTTPS, "tls_server_name": "origin.test"}))
			cfg := testConfig(t, src)
			cfg.Shards, cfg.Replication = 1, 1
			cfg.OriginTLS = newTLSClientConfig(roots)
			g := startGateway(t, cfg)
			g.WaitIndex(testCtx(t, 10*time.Second), idx)
			concurrentThrough(t, g, httpClient(t), n)
			if got := o.conns.Load(); got != tc.conns {
				t.Errorf("origin accepted %d connections for %d concurrent requests, want %d", got, n, tc.conns)
			}
		})
	}
}

// TestWebSocketPassesThrough: an Upgrade handshake reaches the origin, the
// 101 reaches the client, and bytes flow both ways over the spliced
// connections.
func TestWebSocketPassesThrough(t *testing.T) {
	o := startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "want an upgrade", 400)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: test\r\n\r\n")
		brw.Flush()
		// Echo lines, upper-cased, until the client closes.
		for {
			line, err := brw.ReadString('\n')
			if err != nil {
				return
			}
			brw.WriteString(strings.ToUpper(line))
			brw.Flush()
		}
	}), false)
	g, _ := gatewayTo(t, o, "o1")

	conn, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: abc\r\nSec-WebSocket-Version: 13\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read handshake: %v", err)
	}
	if resp.StatusCode != 101 || resp.Header.Get("Sec-WebSocket-Accept") != "test" {
		t.Fatalf("handshake: %d %v, want 101 with the origin's headers", resp.StatusCode, resp.Header)
	}
	for _, msg := range []string{"hello\n", "second message\n"} {
		io.WriteString(conn, msg)
		got, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("read echo: %v", err)
		}
		if got != strings.ToUpper(msg) {
			t.Fatalf("echo %q, want %q", got, strings.ToUpper(msg))
		}
	}
	if st := g.Stats(); st.InFlight != 0 {
		t.Errorf("an upgraded connection holds %d admission slots, want 0", st.InFlight)
	}
	// Close ends open splices (http.Server.Shutdown would not) and waits
	// for them: the client sees its connection closed.
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := br.ReadString('\n'); err == nil {
		t.Error("the WebSocket stayed open after the gateway closed")
	}
}

// TestBodiesStream: neither the response nor the request body is buffered
// whole: each side sees the first part before the other sends the second.
func TestBodiesStream(t *testing.T) {
	gotFirst := make(chan struct{})
	sendSecond := make(chan struct{})
	o := startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/down":
			io.WriteString(w, "first;")
			w.(http.Flusher).Flush()
			<-sendSecond
			io.WriteString(w, "second")
		case "/up":
			buf := make([]byte, 6)
			if _, err := io.ReadFull(r.Body, buf); err != nil || string(buf) != "first;" {
				http.Error(w, "bad first part", 500)
				return
			}
			close(gotFirst)
			rest, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "%s%s", buf, rest)
		}
	}), false)
	g, _ := gatewayTo(t, o, "o1")
	c := httpClient(t)

	resp, err := c.Get("http://" + g.Addr() + "/down")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first;" {
		t.Fatalf("first part: %q %v", buf, err)
	}
	close(sendSecond) // only now may the origin send the rest
	rest, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(rest) != "second" {
		t.Fatalf("second part %q", rest)
	}

	pr, pw := io.Pipe()
	done := make(chan string, 1)
	go func() {
		resp, err := c.Post("http://"+g.Addr()+"/up", "text/plain", pr)
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- string(b)
	}()
	io.WriteString(pw, "first;")
	select {
	case <-gotFirst:
	case <-time.After(10 * time.Second):
		t.Fatal("the origin did not see the first part of a streamed request body")
	}
	io.WriteString(pw, "second")
	pw.Close()
	if got := <-done; got != "first;second" {
		t.Fatalf("upload echo %q", got)
	}
}

// TestStaleKeepAliveRetried: an origin that closes every connection after
// one response, without saying so, leaves the pool holding dead
// keep-alive connections; the next request on one must be resent on a
// fresh connection, never surface as a 502.
func TestStaleKeepAliveRetried(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var accepted atomic.Int64
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	host, port := splitAddr(t, ln.Addr().String())
	src := fakeWithRoute("svc")
	idx := src.PutInstance(gateway.Instance{Service: "svc", ID: "o", Address: host, Port: port, Healthy: true})
	cfg := testConfig(t, src)
	cfg.Shards, cfg.Replication = 1, 1
	cfg.MaxRetries = 0 // the resend on a fresh connection is not a retry
	g := startGateway(t, cfg)
	g.WaitIndex(testCtx(t, 10*time.Second), idx)
	c := httpClient(t)
	for i := range 30 {
		if resp, body := get(t, c, g, "x", "/"); resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("request %d: %d %q, want 200 (a dead pooled connection must be replaced)", i, resp.StatusCode, body)
		}
	}
	if got := accepted.Load(); got < 30 {
		t.Errorf("origin accepted %d connections for 30 requests it answered one per connection", got)
	}
}

// TestTargetReachesOriginAsSent: a request the h1.Server parsed goes to
// an h2c origin (through http.Transport, which writes the URL back out)
// with the request-target the client sent. Regression: bytes url.URL
// escapes in a path ('!', the apostrophe, '(', ')', '*') and an empty query ("?")
// were lost, so the origin got "/a%28b%29" for "/a(b)" and "/x" for "/x?".
func TestTargetReachesOriginAsSent(t *testing.T) {
	o := startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.RequestURI)
	}), true)
	src := fakeWithRoute("svc")
	idx := src.PutInstance(o.instance("svc", "o1", map[string]string{"protocol": gateway.ProtocolH2C}))
	g := startGateway(t, testConfig(t, src))
	g.WaitIndex(testCtx(t, 10*time.Second), idx)
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for _, target := range []string{"/a(b)", "/p/!x*y'z", "/x?", "/plain/path?q=1", "/c%2Fd"} {
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", target)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		if string(got) != target {
			t.Errorf("sent %q, origin got %q", target, got)
		}
	}
}
