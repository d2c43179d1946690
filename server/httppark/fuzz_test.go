package httppark

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// FuzzNextRequest: the parser of the requests that follow an answered
// one on a kept connection (serveConn). Whatever the client sends:
//   - nothing panics; a request is either read or handed back to the
//     http.Server with every byte still unread (the handBackError
//     contract), or the connection ends with an error;
//   - a request it reads is one net/http serves identically: a bodiless
//     GET (no Content-Length, Transfer-Encoding, Expect or Upgrade), and
//     reading it consumed exactly its head, so the next request on the
//     connection starts where the client's does (no smuggling);
//   - held while parked and rebuilt (keep, request), it keeps its method,
//     URI, Host, protocol, Close and the headers the Lot resumes with.
func FuzzNextRequest(f *testing.F) {
	for _, s := range []string{
		"GET /v1/kv/a?index=5&wait=1s HTTP/1.1\r\nHost: x\r\nX-Consul-Token: t\r\n\r\n",
		"GET /v1/kv/a?index=5 HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/kv/b HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /v1/health/service/web?index=9 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
		"GET / HTTP/1.1\r\nHost: x\r\ncontent-length : 3\r\n\r\nabc",
		"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n Transfer-Encoding: chunked\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
		"POST /v1/kv/a HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx",
		"GET / HTTP/1.0\r\n\r\n",
		"GET http://other/v1/kv/a HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET * HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET / HTTP/1.1\r\n" + strings.Repeat("X-Long: "+strings.Repeat("a", 100)+"\r\n", 40) + "\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\n",
		"",
	} {
		f.Add([]byte(s))
	}
	l := &Lot{stop: make(chan struct{}), cfg: Config{NextRequestWait: time.Minute, Context: context.Background(),
		ResumeHeaders: []string{"X-Consul-Token", "Authorization"}}}
	seed := "GET /v1/kv/a?index=5 HTTP/1.1\r\nHost: x\r\n\r\n"
	sc := &bytesConn{r: bytes.NewReader([]byte(seed))}
	if _, err := l.nextRequest(sc, bufio.NewReaderSize(sc, headBytes), ""); err != nil {
		f.Fatalf("a blocking query is not read: %v", err)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c := &bytesConn{r: bytes.NewReader(in)}
		br := bufio.NewReaderSize(c, headBytes)
		req, err := l.nextRequest(c, br, "192.0.2.1:1234")
		var back *handBackError
		switch {
		case errors.As(err, &back):
			if got := append(unread(br, c), c.rest()...); !bytes.Equal(got, in) {
				t.Fatalf("handed back (%v) having consumed %d bytes", err, len(in)-len(got))
			}
			return
		case err != nil:
			return
		}
		if req.Method != http.MethodGet || req.ProtoMajor != 1 || req.ProtoMinor != 1 {
			t.Fatalf("read a %s %s request", req.Method, req.Proto)
		}
		if req.ContentLength != 0 || len(req.TransferEncoding) != 0 || req.Body != http.NoBody {
			t.Fatalf("read a request with a body: length %d, encoding %v", req.ContentLength, req.TransferEncoding)
		}
		for _, h := range []string{"Content-Length", "Transfer-Encoding", "Expect", "Upgrade"} {
			if _, ok := req.Header[h]; ok {
				t.Fatalf("read a request with %s: %v", h, req.Header)
			}
		}
		head := bytes.Index(in, []byte("\r\n\r\n")) + 4
		if rest := append(unread(br, c), c.rest()...); !bytes.Equal(rest, in[head:]) {
			t.Fatalf("reading the request left %q, the client sent %q after its head", rest, in[head:])
		}
		k := l.keep(req)
		back2, err := k.request(context.Background(), req.RemoteAddr)
		if err != nil {
			t.Fatalf("a request read once cannot be rebuilt: %v", err)
		}
		if back2.Method != req.Method || back2.RequestURI != req.RequestURI || back2.Host != req.Host ||
			back2.Proto != req.Proto || back2.Close != req.Close || back2.URL.String() != req.URL.String() ||
			back2.RemoteAddr != req.RemoteAddr {
			t.Fatalf("rebuilt %+v, want %+v", back2, req)
		}
		for _, h := range l.cfg.ResumeHeaders {
			if got, want := back2.Header.Values(h), req.Header.Values(h); !reflect.DeepEqual(got, want) {
				t.Fatalf("header %s rebuilt as %q, want %q", h, got, want)
			}
		}
	})
}

// bytesConn is a net.Conn that reads in and discards writes.
type bytesConn struct{ r *bytes.Reader }

func (c *bytesConn) rest() []byte {
	b, _ := io.ReadAll(c.r)
	return b
}

func (c *bytesConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *bytesConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *bytesConn) Close() error                     { return nil }
func (c *bytesConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *bytesConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *bytesConn) SetDeadline(time.Time) error      { return nil }
func (c *bytesConn) SetReadDeadline(time.Time) error  { return nil }
func (c *bytesConn) SetWriteDeadline(time.Time) error { return nil }
