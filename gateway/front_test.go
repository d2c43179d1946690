package gateway_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestFrontConnection drives raw client connections through the proxy
// listener to an origin: requests the h1.Server serves and those it hands
// to net/http are proxied alike, and every request on the connection gets
// its own, whole answer. (How the wire itself is read and written, and
// what is handed off, is tested in internal/h1.)
func TestFrontConnection(t *testing.T) {
	o := startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/trailer":
			w.Header().Set("Trailer", "X-Sum")
			w.WriteHeader(200)
			io.WriteString(w, "part1")
			w.(http.Flusher).Flush()
			io.WriteString(w, "part2")
			w.Header().Set("X-Sum", "42")
		case "/empty":
			w.WriteHeader(http.StatusNoContent)
		default:
			w.Header().Set("Content-Type", "text/plain")
			fmt.Fprintf(w, "%s %s body=%q x=%q", r.Method, r.URL.RequestURI(), body, r.Header.Get("X-Big"))
		}
	}), false)
	g, _ := gatewayTo(t, o, "o")

	get := func(path string) string { return "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n" }
	big := strings.Repeat("b", 6<<10) // NB: longer than the h1.Server's buffer
	type answer struct {
		status  int
		body    string
		trailer string // X-Sum
		close   bool
	}
	ok := func(method, uri string) answer {
		return answer{status: 200, body: fmt.Sprintf("%s %s body=%q x=%q", method, uri, "", "")}
	}
	for _, tc := range []struct {
		name   string
		send   []string // each written on its own
		head   []bool   // per answer: the request was HEAD
		want   []answer
		wantEO bool // the gateway closes the connection after the answers
	}{
		{name: "pipelined plain GETs", send: []string{get("/a") + get("/b?q=1") + get("/c%2Fd")},
			want: []answer{ok("GET", "/a"), ok("GET", "/b?q=1"), ok("GET", "/c%2Fd")}},
		{name: "HEAD then GET", send: []string{"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n", get("/g")},
			head: []bool{true, false}, want: []answer{{status: 200}, ok("GET", "/g")}},
		{name: "body after plain GET is handed to net/http", send: []string{
			get("/1"), "POST /2 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", get("/3")},
			want: []answer{ok("GET", "/1"), {status: 200, body: `POST /2 body="abc" x=""`}, ok("GET", "/3")}},
		{name: "header longer than the buffer", send: []string{"GET /big HTTP/1.1\r\nHost: x\r\nX-Big: " + big + "\r\n\r\n", get("/after")},
			want: []answer{{status: 200, body: fmt.Sprintf("GET /big body=%q x=%q", "", big)}, ok("GET", "/after")}},
		{name: "HTTP/1.0", send: []string{"GET /old HTTP/1.0\r\nHost: x\r\n\r\n"},
			want: []answer{{status: 200, body: ok("GET", "/old").body, close: true}}, wantEO: true},
		{name: "chunked origin answer with a trailer", send: []string{get("/trailer"), get("/next")},
			want: []answer{{status: 200, body: "part1part2", trailer: "42"}, ok("GET", "/next")}},
		{name: "204", send: []string{get("/empty"), get("/next")}, want: []answer{{status: 204}, ok("GET", "/next")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", g.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			for _, s := range tc.send {
				if _, err := io.WriteString(c, s); err != nil {
					t.Fatal(err)
				}
			}
			br := bufio.NewReader(c)
			for i, want := range tc.want {
				method := "GET"
				if tc.head != nil && tc.head[i] {
					method = "HEAD"
				}
				resp, err := http.ReadResponse(br, &http.Request{Method: method})
				if err != nil {
					t.Fatalf("answer %d: %v", i, err)
				}
				b, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatalf("answer %d body: %v", i, err)
				}
				got := answer{status: resp.StatusCode, body: string(b), trailer: resp.Trailer.Get("X-Sum"), close: resp.Close}
				if got != want {
					t.Errorf("answer %d: got %+v, want %+v", i, got, want)
				}
				if method == "HEAD" && resp.ContentLength <= 0 {
					t.Errorf("HEAD answer: Content-Length %d, want the origin's", resp.ContentLength)
				}
				if resp.Header.Get("Date") == "" {
					t.Errorf("answer %d: no Date header", i)
				}
			}
			if tc.wantEO {
				if n, err := br.ReadByte(); err != io.EOF {
					t.Errorf("after the last answer: %v %v, want EOF (connection closed)", n, err)
				}
			}
		})
	}
}

// TestFrontClientGoneAbortsAttempt: a client that closes its connection
// while the origin has not answered ends the attempt (the origin sees its
// connection go), as net/http's per-request context did.
func TestFrontClientGoneAbortsAttempt(t *testing.T) {
	arrived := make(chan struct{}, 1)
	aborted := make(chan struct{}, 1)
	o := startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done() // never answers; ends when the gateway hangs up
		aborted <- struct{}{}
	}), false)
	src := fakeWithRoute("svc")
	idx := src.PutInstance(o.instance("svc", "o", nil))
	cfg := testConfig(t, src)
	cfg.ResponseHeaderTimeout = time.Minute // NB: not what ends it
	g := startGateway(t, cfg)
	g.WaitIndex(testCtx(t, 10*time.Second), idx)
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 10*time.Second)
	select {
	case <-arrived:
	case <-ctx.Done():
		t.Fatal("request never reached the origin")
	}
	c.Close()
	select {
	case <-aborted:
	case <-ctx.Done():
		t.Fatal("origin request still open 10s after the client went away")
	}
}

// TestFrontClientGoneAbortsLaterAttempt: the client-gone watch also
// covers a slow request that follows quick ones on the same connection,
// where the connection's watch timer is already running from the quick
// ones (it is re-armed lazily, not per request).
func TestFrontClientGoneAbortsLaterAttempt(t *testing.T) {
	arrived := make(chan struct{}, 1)
	aborted := make(chan struct{}, 1)
	o := startOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/slow" {
			io.WriteString(w, "quick")
			return
		}
		arrived <- struct{}{}
		<-r.Context().Done()
		aborted <- struct{}{}
	}), false)
	src := fakeWithRoute("svc")
	idx := src.PutInstance(o.instance("svc", "o", nil))
	cfg := testConfig(t, src)
	cfg.ResponseHeaderTimeout = time.Minute // NB: not what ends it
	g := startGateway(t, cfg)
	g.WaitIndex(testCtx(t, 10*time.Second), idx)
	c, err := net.Dial("tcp", g.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for i := range 20 {
		if _, err := io.WriteString(c, "GET /quick HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("quick request %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != "quick" {
			t.Fatalf("quick request %d: %d %q, want 200 quick", i, resp.StatusCode, b)
		}
	}
	if _, err := io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 10*time.Second)
	select {
	case <-arrived:
	case <-ctx.Done():
		t.Fatal("slow request never reached the origin")
	}
	c.Close()
	select {
	case <-aborted:
	case <-ctx.Done():
		t.Fatal("origin request still open 10s after the client went away")
	}
}
