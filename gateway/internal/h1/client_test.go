package h1_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/gateway/internal/h1"
	"github.com/lodestone-kv/lodestone/internal/testnet"
)

// origin accepts connections and runs script on each, one at a time,
// with the requests it reads; it stops when the test ends.
func origin(t *testing.T, script func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	return testnet.Serve(t, func(c net.Conn) { script(c, bufio.NewReader(c)) })
}

// answer reads requests and writes resp to each, count times (0: until
// the connection ends), and passes every request to seen when not nil.
func answer(resp string, count int, seen chan<- *http.Request) func(net.Conn, *bufio.Reader) {
	return func(c net.Conn, br *bufio.Reader) {
		for i := 0; count == 0 || i < count; i++ {
			r, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			if seen != nil {
				seen <- r
			}
			if _, err := io.WriteString(c, resp); err != nil {
				return
			}
		}
	}
}

func dialOrigin(t *testing.T, addr string) *h1.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	hc := h1.NewConn(c, c)
	t.Cleanup(func() { hc.Close() })
	return hc
}

var opts = h1.ExchangeOptions{HeaderTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second}

func request(method, target string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	r.Header.Set("User-Agent", "test")
	return r
}

// TestExchangeResponses: each response framing is read whole, and
// Finish allows reuse exactly when the connection is clean and both
// sides keep it.
func TestExchangeResponses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		method   string
		resp     string
		body     string
		readAll  bool
		reusable bool
	}{
		{"content-length", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello", "hello", true, true},
		{"empty body", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "", true, true},
		{"no reason phrase", "GET", "HTTP/1.1 201\r\nContent-Length: 2\r\n\r\nok", "ok", true, true},
		{"chunked", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", "abcde", true, true},
		{"chunked with trailer", "GET", "HTTP/1.1 200 OK\r\nTrailer: X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\nX-Sum: 1\r\n\r\n", "ab", true, true},
		{"early hints skipped", "GET", "HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "ok", true, true},
		{"HEAD", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "", true, true},
		{"no content", "GET", "HTTP/1.1 204 No Content\r\n\r\n", "", true, true},
		{"origin closes", "GET", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", "ok", true, false},
		{"close-delimited", "GET", "HTTP/1.1 200 OK\r\n\r\nuntil EOF", "until EOF", true, false},
		{"HTTP/1.0", "GET", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", "ok", true, false},
		{"body not read to its end", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", "", false, false},
		{"bytes after the body", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokJUNK", "ok", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := origin(t, func(c net.Conn, br *bufio.Reader) {
				answer(tc.resp, 1, nil)(c, br)
				if tc.name == "close-delimited" || tc.name == "HTTP/1.0" {
					return // closes: the end of the body
				}
				br.ReadByte() // keeps the connection until the client closes it
			})
			hc := dialOrigin(t, addr)
			resp, b, err := hc.Exchange(request(tc.method, "/x"), "/x", time.Now(), opts)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode < 200 {
				t.Fatalf("got the informational %d", resp.StatusCode)
			}
			var got []byte
			if tc.readAll {
				if got, err = io.ReadAll(resp.Body); err != nil {
					t.Fatalf("read body: %v", err)
				}
			}
			if string(got) != tc.body {
				t.Errorf("body %q, want %q", got, tc.body)
			}
			if tc.name == "chunked with trailer" && resp.Trailer.Get("X-Sum") != "1" {
				t.Errorf("trailer %v, want X-Sum: 1", resp.Trailer)
			}
			if got := b.Finish(); got != tc.reusable {
				t.Errorf("Finish = %v, want %v", got, tc.reusable)
			}
		})
	}
}

// TestExchangeKeepAlive: a reusable connection carries the next
// exchange, and the plain response's reused header is the new one's.
func TestExchangeKeepAlive(t *testing.T) {
	addr := origin(t, func(c net.Conn, br *bufio.Reader) {
		for i := 0; ; i++ {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			if i == 0 {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nX-First: 1\r\nContent-Length: 3\r\n\r\none")
			} else {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Second: 2\r\nContent-Length: 3\r\n\r\ntwo")
			}
		}
	})
	hc := dialOrigin(t, addr)
	for i, want := range []string{"one", "two"} {
		resp, b, err := hc.Exchange(request("GET", "/"), "/", time.Now(), opts)
		if err != nil {
			t.Fatalf("exchange %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if string(body) != want {
			t.Errorf("exchange %d: body %q, want %q", i, body, want)
		}
		if i == 1 && resp.Header.Get("X-First") != "" {
			t.Errorf("the second response still has the first's header: %v", resp.Header)
		}
		if !b.Finish() {
			t.Fatalf("exchange %d: connection not reusable", i)
		}
	}
}

// TestExchangeFieldsOnly: with FieldsOnly a plain response without a
// Connection field has no Header (the caller renders its fields); with
// one it has.
func TestExchangeFieldsOnly(t *testing.T) {
	for _, tc := range []struct {
		resp   string
		header bool
	}{
		{"HTTP/1.1 200 OK\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n", false},
		{"HTTP/1.1 200 OK\r\nConnection: X-A\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n", true},
	} {
		hc := dialOrigin(t, origin(t, answer(tc.resp, 1, nil)))
		o := opts
		o.FieldsOnly = true
		resp, b, err := hc.Exchange(request("GET", "/"), "/", time.Now(), o)
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Header != nil; got != tc.header {
			t.Errorf("%q: Header present %v, want %v", tc.resp, got, tc.header)
		}
		b.Finish()
	}
}

// TestExchangeRequest: what the origin receives: the request line with
// the given target, the end-to-end fields, the forwarding fields, and no
// hop-by-hop ones.
func TestExchangeRequest(t *testing.T) {
	seen := make(chan *http.Request, 1)
	hc := dialOrigin(t, origin(t, answer("HTTP/1.1 204 No Content\r\n\r\n", 1, seen)))
	r := request("POST", "/client/path?q=1")
	r.Host = "api.example.com"
	r.RemoteAddr = "192.0.2.7:5555"
	r.Header.Set("Connection", "X-Private, keep-alive")
	r.Header.Set("X-Private", "hop")
	r.Header.Set("Keep-Alive", "timeout=5")
	r.Header.Set("Te", "trailers, deflate")
	r.Header.Add("X-Forwarded-For", "203.0.113.1")
	r.Header.Add("X-Multi", "a")
	r.Header.Add("X-Multi", "b")
	_, b, err := hc.Exchange(r, "/origin/path?q=1", time.Now(), opts)
	if err != nil {
		t.Fatal(err)
	}
	b.Finish()
	got := <-seen
	if got.Method != "POST" || got.RequestURI != "/origin/path?q=1" || got.Host != "api.example.com" {
		t.Errorf("request line: %s %s host %q", got.Method, got.RequestURI, got.Host)
	}
	for k, want := range map[string]string{
		"X-Forwarded-For":   "203.0.113.1, 192.0.2.7",
		"X-Forwarded-Proto": "http",
		"X-Forwarded-Host":  "api.example.com",
		"Te":                "trailers",
		"User-Agent":        "test",
		"Content-Length":    "0",
		"X-Private":         "",
		"Keep-Alive":        "",
		"Connection":        "",
	} {
		if got := strings.Join(got.Header[k], ","); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	if got, want := got.Header["X-Multi"], []string{"a", "b"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("X-Multi: %q, want %q", got, want)
	}
}

// TestExchangeFailures: each way an exchange fails maps to its error.
func TestExchangeFailures(t *testing.T) {
	t.Run("origin closed the idle connection", func(t *testing.T) {
		hc := dialOrigin(t, origin(t, func(c net.Conn, br *bufio.Reader) {}))
		_, _, err := hc.Exchange(request("GET", "/"), "/", time.Now(), opts)
		if !errors.Is(err, h1.ErrStaleConn) {
			t.Errorf("error %v, want ErrStaleConn", err)
		}
	})
	t.Run("cut inside the header", func(t *testing.T) {
		hc := dialOrigin(t, origin(t, func(c net.Conn, br *bufio.Reader) {
			http.ReadRequest(br)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Le")
		}))
		_, _, err := hc.Exchange(request("GET", "/"), "/", time.Now(), opts)
		if err == nil || errors.Is(err, h1.ErrStaleConn) {
			t.Errorf("error %v, want a failure that is not ErrStaleConn (the origin answered)", err)
		}
	})
	t.Run("header timeout", func(t *testing.T) {
		hc := dialOrigin(t, origin(t, func(c net.Conn, br *bufio.Reader) {
			http.ReadRequest(br)
			br.ReadByte() // never answers
		}))
		o := opts
		o.HeaderTimeout = 50 * time.Millisecond
		_, _, err := hc.Exchange(request("GET", "/"), "/", time.Now(), o)
		if !errors.Is(err, h1.ErrHeaderTimeout) {
			t.Errorf("error %v, want ErrHeaderTimeout", err)
		}
	})
	t.Run("idle body", func(t *testing.T) {
		hc := dialOrigin(t, origin(t, func(c net.Conn, br *bufio.Reader) {
			http.ReadRequest(br)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\npart")
			br.ReadByte() // sends no more
		}))
		o := opts
		o.IdleTimeout = 50 * time.Millisecond
		resp, b, err := hc.Exchange(request("GET", "/"), "/", time.Now(), o)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		if string(got) != "part" || !errors.Is(err, h1.ErrIdleTimeout) {
			t.Errorf("body %q, %v; want %q, ErrIdleTimeout", got, err, "part")
		}
		if !b.Waited() {
			t.Error("Waited false after a read that went to the socket")
		}
		if b.Finish() {
			t.Error("a body cut short left its connection reusable")
		}
	})
	t.Run("client gone", func(t *testing.T) {
		arrived := make(chan struct{})
		hc := dialOrigin(t, origin(t, func(c net.Conn, br *bufio.Reader) {
			http.ReadRequest(br)
			close(arrived)
			br.ReadByte() // never answers
		}))
		ctx, cancel := context.WithCancel(context.Background())
		stop := context.AfterFunc(ctx, hc.Abort)
		defer stop()
		go func() {
			<-arrived
			cancel()
		}()
		_, _, err := hc.Exchange(request("GET", "/").WithContext(ctx), "/", time.Now(), opts)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("error %v, want context.Canceled", err)
		}
	})
}

// TestClientHook: the client's going away aborts the exchange attached
// to its connection's hook, and Detach says the hook fired.
func TestClientHook(t *testing.T) {
	addr := origin(t, func(c net.Conn, br *bufio.Reader) {
		http.ReadRequest(br)
		br.ReadByte() // never answers
	})
	s := serve(t, func(w http.ResponseWriter, r *http.Request) bool {
		hook := w.(*h1.ResponseWriter).Hook()
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return false
		}
		hc := h1.NewConn(nc, nc)
		defer hc.Close()
		hook.Attach(hc)
		_, _, err = hc.Exchange(r, "/", time.Now(), opts)
		clean := hook.Detach()
		if errors.Is(err, context.Canceled) && !clean {
			io.WriteString(w, "aborted")
		}
		return false
	}, nil)
	c, br := dial(t, s.addr)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	// NB: the client half-closes: the watch sees the close, and the
	// handler's answer can still come back.
	c.(*net.TCPConn).CloseWrite()
	if _, body := readAnswer(t, br, "GET"); body != "aborted" {
		t.Errorf("handler saw %q, want the exchange aborted by the hook", body)
	}
}

// TestExchangeLargeBody: a Content-Length body longer than the read
// buffer, part of it with the header and the rest in the socket already
// or still to come, is read whole, in order, and leaves the connection
// reusable; the next response on it is read whole too.
func TestExchangeLargeBody(t *testing.T) {
	const size = 200 << 10
	body := make([]byte, size)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	head := "HTTP/1.1 200 OK\r\nContent-Length: 204800\r\n\r\n"
	addr := origin(t, func(c net.Conn, br *bufio.Reader) {
		for i := 0; ; i++ {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			if i == 0 {
				// All at once: the rest is in the socket when the
				// header is read.
				c.Write(append([]byte(head), body...))
				continue
			}
			// Some with the header, the rest later.
			c.Write(append([]byte(head), body[:1000]...))
			time.Sleep(20 * time.Millisecond)
			c.Write(body[1000:])
		}
	})
	hc := dialOrigin(t, addr)
	for i := range 2 {
		resp, b, err := hc.Exchange(request("GET", "/"), "/", time.Now(), opts)
		if err != nil {
			t.Fatalf("exchange %d: %v", i, err)
		}
		if resp.ContentLength != size {
			t.Fatalf("exchange %d: Content-Length %d", i, resp.ContentLength)
		}
		got, err := io.ReadAll(io.LimitReader(b, size+1))
		if err != nil {
			t.Fatalf("exchange %d: read: %v", i, err)
		}
		if string(got) != string(body) {
			t.Fatalf("exchange %d: body of %d bytes differs from the %d sent", i, len(got), size)
		}
		if !b.Finish() {
			t.Fatalf("exchange %d: connection not reusable after a whole body", i)
		}
	}
}

// TestCloseIdleResets: CloseIdle ends an idle connection with a reset,
// which the origin reads as ECONNRESET; Close ends it with a FIN (EOF).
func TestCloseIdleResets(t *testing.T) {
	for _, tc := range []struct {
		name  string
		close func(*h1.Conn) error
		want  error
	}{
		{"CloseIdle", (*h1.Conn).CloseIdle, syscall.ECONNRESET},
		{"Close", (*h1.Conn).Close, io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ended := make(chan error, 1)
			addr := origin(t, func(c net.Conn, br *bufio.Reader) {
				answer("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 1, nil)(c, br)
				_, err := br.ReadByte()
				ended <- err
			})
			hc := dialOrigin(t, addr)
			resp, b, err := hc.Exchange(request("GET", "/"), "/", time.Now(), opts)
			if err != nil {
				t.Fatal(err)
			}
			io.ReadAll(resp.Body)
			if !b.Finish() {
				t.Fatal("connection not reusable after a whole response")
			}
			if err := tc.close(hc); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-ended:
				if !errors.Is(err, tc.want) {
					t.Errorf("the origin's read ended with %v, want %v", err, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the origin's read did not end")
			}
		})
	}
}
