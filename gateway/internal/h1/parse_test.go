package h1

import (
	"bufio"
	"context"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

func newParseConn() *conn {
	c := &conn{}
	c.req = (&http.Request{}).WithContext(context.Background())
	c.req.Header = make(http.Header, 8)
	return c
}

// checkLikeNetHTTP checks the request parse filled in c.req against what
// http.ReadRequest makes of the same bytes: an accepted request must be
// one net/http reads, and read the same way (rule: the same answer two
// ways).
func checkLikeNetHTTP(t *testing.T, c *conn, in string) {
	t.Helper()
	want, err := http.ReadRequest(bufio.NewReader(strings.NewReader(in)))
	if err != nil {
		t.Fatalf("parse accepted %q, which net/http rejects: %v", in, err)
	}
	got := c.req
	if got.Method != want.Method || got.RequestURI != want.RequestURI || got.Host != want.Host ||
		got.Proto != want.Proto || got.ProtoMajor != want.ProtoMajor || got.ProtoMinor != want.ProtoMinor {
		t.Errorf("request line: got %s %s %s host %q, want %s %s %s host %q",
			got.Method, got.RequestURI, got.Proto, got.Host, want.Method, want.RequestURI, want.Proto, want.Host)
	}
	if *got.URL != *want.URL {
		t.Errorf("URL: got %#v, want %#v", *got.URL, *want.URL)
	}
	if !reflect.DeepEqual(got.Header, want.Header) {
		t.Errorf("header: got %v, want %v", got.Header, want.Header)
	}
	if got.Close != want.Close {
		t.Errorf("Close: got %v, want %v", got.Close, want.Close)
	}
	if got.ContentLength != want.ContentLength {
		t.Errorf("ContentLength: got %d, want %d", got.ContentLength, want.ContentLength)
	}
}

// TestParseRequest: what the Server serves itself and what it leaves to
// net/http. Every accepted case is also read by net/http and compared.
func TestParseRequest(t *testing.T) {
	const get = "GET / HTTP/1.1\r\nHost: x\r\n"
	for _, tc := range []struct {
		name string
		in   string // without the blank line that ends the header
		ok   bool
	}{
		{"plain", get, true},
		{"query", "GET /a/b?q=1&r=%20 HTTP/1.1\r\nHost: x\r\n", true},
		{"escaped path", "GET /c%2Fd HTTP/1.1\r\nHost: x\r\n", true},
		{"path with sub-delims", "GET /a;b=c,d@e:f HTTP/1.1\r\nHost: x\r\n", true},
		{"host with port", "GET / HTTP/1.1\r\nHost: example.com:8080\r\n", true},
		{"fields kept in order", get + "X-A: 1\r\nX-B: 2\r\nX-A: 3\r\n", true},
		{"value trimmed", get + "X-A: \t v \t\r\n", true},
		{"empty value", get + "X-Empty:\r\n", true},
		{"name canonicalized", get + "x-lower-case: v\r\n", true},
		{"connection close", get + "Connection: keep-alive, close\r\n", true},
		{"content-length zero", get + "Content-Length: 0\r\n", true},
		{"pragma adds cache-control", get + "Pragma: no-cache\r\n", true},
		{"other method", "PURGE /x HTTP/1.1\r\nHost: x\r\n", true},
		// Regressions (found by FuzzParseRequest): the plain-URL shortcut
		// lost the RawPath net/http keeps for bytes url.URL escapes, and
		// the ForceQuery of an empty query.
		{"path bytes url.URL escapes lost RawPath", "GET /a!b'c(d)e*f HTTP/1.1\r\nHost: x\r\n", true},
		{"empty query lost ForceQuery", "GET /x? HTTP/1.1\r\nHost: x\r\n", true},
		{"query of a question mark", "GET /x?? HTTP/1.1\r\nHost: x\r\n", true},

		// Malformed request lines.
		{"too short", "GET / HTTP/1.1\r\n", false},
		{"leading blank line", "\r\n" + get, false},
		{"no target", "GET HTTP/1.1\r\nHost: x\r\n", false},
		{"no version", "GET /only-a-target\r\nHost: x\r\n", false},
		{"space in target", "GET /a b HTTP/1.1\r\nHost: x\r\n", false},
		{"double space", "GET  / HTTP/1.1\r\nHost: x\r\n", false},
		{"lower-case version", "GET / http/1.1\r\nHost: x\r\n", false},
		{"HTTP/1.0", "GET / HTTP/1.0\r\nHost: x\r\n", false},
		{"HTTP/2.0", "GET / HTTP/2.0\r\nHost: x\r\n", false},
		{"bad method byte", "G(T / HTTP/1.1\r\nHost: x\r\n", false},
		{"absolute-form", "GET http://x/ HTTP/1.1\r\nHost: x\r\n", false},
		{"asterisk-form", "OPTIONS * HTTP/1.1\r\nHost: x\r\n", false},
		{"authority-form", "CONNECT x:443 HTTP/1.1\r\nHost: x\r\n", false},
		{"control byte in path", "GET /a\x01b HTTP/1.1\r\nHost: x\r\n", false},

		// Host.
		{"no host", "GET / HTTP/1.1\r\nX-A: 1\r\n", false},
		{"two hosts", get + "Host: y\r\n", false},
		{"invalid host", "GET / HTTP/1.1\r\nHost: a b\r\n", false},

		// Fields.
		{"space in name", get + "Bad Name: v\r\n", false},
		{"no colon", get + "NoColon\r\n", false},
		{"space before colon", get + "X-A : v\r\n", false},
		{"obs-fold", get + "X-A: a\r\n b\r\n", false},
		{"control byte in value", get + "X-A: a\x01b\r\n", false},

		// Bodies and protocol switches: net/http's.
		{"content-length", get + "Content-Length: 3\r\n", false},
		{"two zero lengths", get + "Content-Length: 0\r\nContent-Length: 0\r\n", false},
		{"chunked", get + "Transfer-Encoding: chunked\r\n", false},
		{"upgrade", get + "Connection: Upgrade\r\nUpgrade: websocket\r\n", false},
		{"expect", get + "Expect: 100-continue\r\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in + "\r\n"
			c := newParseConn()
			if got := c.parse([]byte(in)); got != tc.ok {
				t.Fatalf("parse(%q) = %v, want %v", in, got, tc.ok)
			}
			if tc.ok {
				checkLikeNetHTTP(t, c, in)
			}
		})
	}
}

// TestParseReusesRequest: a connection's second request leaves nothing
// of the first in the reused request.
func TestParseReusesRequest(t *testing.T) {
	c := newParseConn()
	first := "GET /one?q=1 HTTP/1.1\r\nHost: a\r\nX-First: 1\r\nConnection: close\r\nPragma: no-cache\r\n\r\n"
	if !c.parse([]byte(first)) {
		t.Fatal("first request not parsed")
	}
	second := "HEAD /two HTTP/1.1\r\nHost: b\r\nX-Second: 2\r\n\r\n"
	if !c.parse([]byte(second)) {
		t.Fatal("second request not parsed")
	}
	checkLikeNetHTTP(t, c, second)
}

// FuzzParseRequest: whatever parse accepts, net/http reads the same way.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a%2Fb?c=d#e HTTP/1.1\r\nHost: x:1\r\nX: 1\r\nX: 2\r\n\r\n",
		"DELETE /x HTTP/1.1\r\nHost: [::1]:80\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
		"GET /..//./a HTTP/1.1\r\nHost: x\r\nPragma: no-cache\r\n\r\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		end, _ := headerEnd([]byte(in))
		if end < 0 {
			return
		}
		in = in[:end]
		c := newParseConn()
		if c.parse([]byte(in)) {
			checkLikeNetHTTP(t, c, in)
		}
	})
}

func TestHeaderEnd(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		end  int
		bare bool
	}{
		{"whole", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27, false},
		{"followed by the next request", "GET / HTTP/1.1\r\n\r\nGET", 18, false},
		{"not all there", "GET / HTTP/1.1\r\nHost: x\r\n", -1, false},
		{"cut in a line end", "GET / HTTP/1.1\r\nHost: x\r\n\r", -1, false},
		{"empty", "", -1, false},
		{"bare LF line", "GET / HTTP/1.1\nHost: x\r\n\r\n", -1, true},
		{"bare LF blank line", "GET / HTTP/1.1\r\n\n", -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			end, bare := headerEnd([]byte(tc.in))
			if end != tc.end || bare != tc.bare {
				t.Errorf("headerEnd(%q) = %d, %v; want %d, %v", tc.in, end, bare, tc.end, tc.bare)
			}
		})
	}
}

func TestHopByHop(t *testing.T) {
	conn := []string{"keep-alive, X-Private", "x-other"}
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"Connection", true}, {"Keep-Alive", true}, {"Te", true}, {"Trailer", true},
		{"Transfer-Encoding", true}, {"Upgrade", true}, {"Proxy-Authorization", true},
		{"X-Private", true}, {"X-Other", true},
		{"X-Public", false}, {"Content-Length", false}, {"Host", false},
	} {
		if got := HopByHop(tc.name, conn); got != tc.want {
			t.Errorf("HopByHop(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
	if HopByHop("X-Private", nil) {
		t.Error("X-Private is hop-by-hop without a Connection field naming it")
	}
}

// TestParseResponse: which response headers the Conn parses itself
// (plain) and which it leaves to http.ReadResponse.
func TestParseResponse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		method string
		in     string // without the blank line
		plain  bool
	}{
		{"length", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", true},
		{"no reason phrase", "GET", "HTTP/1.1 404\r\nContent-Length: 0\r\n", true},
		{"leading zeros", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 007\r\n", true},
		{"chunked", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n", false},
		{"trailer announced", "GET", "HTTP/1.1 200 OK\r\nTrailer: X\r\nContent-Length: 1\r\n", false},
		{"no length", "GET", "HTTP/1.1 200 OK\r\nX-A: 1\r\n", false},
		{"two lengths", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n", false},
		{"negative length", "GET", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n", false},
		// Regression (found by FuzzParseResponse): ParseInt took the sign,
		// net/http rejects it.
		{"signed length", "GET", "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n", false},
		{"no content", "GET", "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n", false},
		{"not modified", "GET", "HTTP/1.1 304 Not Modified\r\nContent-Length: 0\r\n", false},
		{"informational", "GET", "HTTP/1.1 103 Early Hints\r\nContent-Length: 0\r\n", false},
		{"answer to HEAD", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", false},
		{"HTTP/1.0", "GET", "HTTP/1.0 200 OK\r\nContent-Length: 5\r\n", false},
		{"bad status", "GET", "HTTP/1.1 20x OK\r\nContent-Length: 5\r\n", false},
		{"status without space", "GET", "HTTP/1.1 2000\r\nContent-Length: 5\r\n", false},
		{"folded field", "GET", "HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\nContent-Length: 5\r\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Conn{br: bufio.NewReader(strings.NewReader(""))}
			in := tc.in + "\r\n"
			got := c.parseResponse([]byte(in), &http.Request{Method: tc.method}, false)
			if (got != nil) != tc.plain {
				t.Fatalf("parseResponse(%q) plain = %v, want %v", in, got != nil, tc.plain)
			}
		})
	}
}

// FuzzParseResponse: whatever the plain response parser accepts,
// http.ReadResponse reads the same way (status, fields, length, close).
func FuzzParseResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
		"HTTP/1.1 404\r\nX-A:  1 \r\nX-A: 2\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
		"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 10\r\nConnection: keep-alive, X-A\r\nX-A: 1\r\n\r\n",
	} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, in string, head bool) {
		end, _ := headerEnd([]byte(in))
		if end < 0 {
			return
		}
		in = in[:end]
		req := &http.Request{Method: http.MethodGet}
		if head {
			req.Method = http.MethodHead
		}
		c := &Conn{br: bufio.NewReader(strings.NewReader(""))}
		got := c.parseResponse([]byte(in), req, false)
		if got == nil {
			return
		}
		want, err := http.ReadResponse(bufio.NewReader(strings.NewReader(in)), req)
		if err != nil {
			t.Fatalf("parseResponse accepted %q, which net/http rejects: %v", in, err)
		}
		if got.StatusCode != want.StatusCode || got.ContentLength != want.ContentLength || got.Close != want.Close ||
			got.ProtoMajor != want.ProtoMajor || got.ProtoMinor != want.ProtoMinor {
			t.Errorf("%q: got %d length %d close %v, want %d length %d close %v", in,
				got.StatusCode, got.ContentLength, got.Close, want.StatusCode, want.ContentLength, want.Close)
		}
		// NB: net/http drops a Connection field that says close (Close
		// says it); the parser keeps it, and the proxy drops it as
		// hop-by-hop.
		got.Header.Del("Connection")
		want.Header.Del("Connection")
		if !reflect.DeepEqual(got.Header, want.Header) {
			t.Errorf("%q: header %v, want %v", in, got.Header, want.Header)
		}
	})
}
