package h1_test

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// rendered is what a client sees of a response, Date aside.
type rendered struct {
	Status  int
	Header  http.Header
	Length  int64
	Chunked bool
	Body    string
	Trailer http.Header
	Close   bool
}

func render(t *testing.T, addr, method, path string) rendered {
	t.Helper()
	c, br := dial(t, addr)
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\n\r\n", method, path)
	resp, body := readAnswer(t, br, method)
	resp.Header.Del("Date")
	return rendered{Status: resp.StatusCode, Header: resp.Header, Length: resp.ContentLength,
		Chunked: len(resp.TransferEncoding) > 0, Body: body, Trailer: resp.Trailer, Close: resp.Close}
}

// writerCases are handlers that exercise the ResponseWriter's framing.
var writerCases = map[string]func(w http.ResponseWriter){
	"/small": func(w http.ResponseWriter) { io.WriteString(w, "hello, world") },
	"/html":  func(w http.ResponseWriter) { io.WriteString(w, "<!DOCTYPE html><p>hi") },
	"/at-hold-limit": func(w http.ResponseWriter) {
		io.WriteString(w, strings.Repeat("a", 2048))
	},
	"/over-hold-limit": func(w http.ResponseWriter) {
		io.WriteString(w, strings.Repeat("a", 2049))
	},
	"/many-writes": func(w http.ResponseWriter) {
		for range 100 {
			io.WriteString(w, "0123456789abcdef0123456789abcdef")
		}
	},
	"/length-set": func(w http.ResponseWriter) {
		w.Header().Set("Content-Length", "3000")
		io.WriteString(w, strings.Repeat("b", 3000))
	},
	// The header and a first write too big for the buffer go out
	// together (writev); a client reading slowly leaves part of them to
	// plain writes that wait for room.
	"/length-set-large": func(w http.ResponseWriter) {
		w.Header().Set("Content-Length", "70000")
		io.WriteString(w, strings.Repeat("c", 70000))
	},
	"/length-set-large-pieces": func(w http.ResponseWriter) {
		w.Header().Set("Content-Length", "4000000")
		io.WriteString(w, strings.Repeat("d", 3000000))
		io.WriteString(w, strings.Repeat("e", 10))
		io.WriteString(w, strings.Repeat("f", 999990))
	},
	"/flushed": func(w http.ResponseWriter) {
		io.WriteString(w, "first;")
		w.(http.Flusher).Flush()
		io.WriteString(w, "second")
	},
	"/declared-trailer": func(w http.ResponseWriter) {
		w.Header().Set("Trailer", "X-Sum")
		io.WriteString(w, "part")
		w.Header().Set("X-Sum", "42")
	},
	"/prefixed-trailer": func(w http.ResponseWriter) {
		io.WriteString(w, "part")
		w.(http.Flusher).Flush()
		w.Header().Set(http.TrailerPrefix+"X-Late", "yes")
	},
	"/no-content": func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusNoContent)
		io.WriteString(w, "dropped")
	},
	"/not-modified": func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Etag", `"v1"`)
		w.WriteHeader(http.StatusNotModified)
	},
	"/encoded": func(w http.ResponseWriter) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Write([]byte{0x1f, 0x8b, 8, 0})
	},
	"/multi-value": func(w http.ResponseWriter) {
		w.Header().Add("X-Multi", "one")
		w.Header().Add("X-Multi", "two")
		w.Header().Set("X-Spaced", "  padded  ")
		w.WriteHeader(http.StatusTeapot)
	},
	"/close": func(w http.ResponseWriter) {
		w.Header().Set("Connection", "close")
		io.WriteString(w, "bye")
	},
	"/empty": func(w http.ResponseWriter) {},
	"/error": func(w http.ResponseWriter) {
		http.Error(w, "nope", http.StatusBadGateway)
	},
}

// TestWriterLikeNetHTTP: the Server's ResponseWriter frames each
// response as net/http's server does for the same handler (the same
// answer two ways: one handler behind both servers).
func TestWriterLikeNetHTTP(t *testing.T) {
	h := func(w http.ResponseWriter, r *http.Request) bool {
		writerCases[r.URL.Path](w)
		return false
	}
	fast := serve(t, h, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	std := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h(w, r) }),
		ErrorLog: log.New(io.Discard, "", 0)}
	var wg sync.WaitGroup
	wg.Go(func() { std.Serve(ln) })
	defer func() {
		std.Close()
		wg.Wait()
	}()
	for path := range writerCases {
		t.Run(path, func(t *testing.T) {
			got := render(t, fast.addr, "GET", path)
			want := render(t, ln.Addr().String(), "GET", path)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("GET %s:\n got %+v\nwant %+v", path, got, want)
			}
		})
	}
}

// TestWriterHead: a HEAD answer has the GET answer's status and fields
// and no body, and the connection goes on.
func TestWriterHead(t *testing.T) {
	s := serve(t, func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", "5")
		io.WriteString(w, "hello")
		return false
	}, nil)
	c, br := dial(t, s.addr)
	io.WriteString(c, "HEAD / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, body := readAnswer(t, br, "HEAD")
	if resp.StatusCode != 200 || resp.ContentLength != 5 || body != "" {
		t.Errorf("HEAD: %d, length %d, body %q; want 200, 5, none", resp.StatusCode, resp.ContentLength, body)
	}
	if _, body := readAnswer(t, br, "GET"); body != "hello" {
		t.Errorf("GET after HEAD: %q", body)
	}
}
