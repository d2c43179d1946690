package h1_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/gateway/internal/h1"
)

// handlerFunc is a Server's Handler.
type handlerFunc = func(http.ResponseWriter, *http.Request) bool

// via names who served a request: the Server itself or net/http after a
// hand-off.
func via(w http.ResponseWriter) string {
	if _, ok := w.(*h1.ResponseWriter); ok {
		return "h1"
	}
	return "net/http"
}

// echo answers with what it was asked and who served it.
func echo(w http.ResponseWriter, r *http.Request) bool {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintf(w, "%s %s via=%s body=%q big=%d", r.Method, r.RequestURI, via(w), body, len(r.Header.Get("X-Big")))
	return false
}

// served is a Server with a net/http server on its HandedOff, both with
// handler h; both stop when the test ends.
type served struct {
	addr string
	srv  *h1.Server
	std  *http.Server
	log  *lockedBuffer
}

func serve(t *testing.T, h handlerFunc, edit func(*h1.ServerConfig)) *served {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	cfg := h1.ServerConfig{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       10 * time.Second,
		Logger:            slog.New(slog.NewTextHandler(logs, nil)),
	}
	if edit != nil {
		edit(&cfg)
	}
	s := &served{addr: ln.Addr().String(), srv: h1.NewServer(ln, cfg), log: logs}
	s.std = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if h(w, r) {
				panic(http.ErrAbortHandler)
			}
		}),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := s.srv.Serve(); err != http.ErrServerClosed {
			t.Errorf("Serve: %v, want http.ErrServerClosed", err)
		}
	})
	wg.Go(func() { s.std.Serve(s.srv.HandedOff()) })
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
			s.srv.Close()
		}
		if err := s.std.Shutdown(ctx); err != nil {
			s.std.Close()
		}
		wg.Wait()
	})
	return s
}

// lockedBuffer collects a Server's log.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// dial opens a client connection that gives up after 10s.
func dial(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

// readAnswer reads one final response and its whole body.
func readAnswer(t *testing.T, br *bufio.Reader, method string) (*http.Response, string) {
	t.Helper()
	var resp *http.Response
	for resp == nil || resp.StatusCode < 200 {
		var err error
		if resp, err = http.ReadResponse(br, &http.Request{Method: method}); err != nil {
			t.Fatalf("read response: %v", err)
		}
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp, string(b)
}

func expectClosed(t *testing.T, br *bufio.Reader) {
	t.Helper()
	if b, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after the last answer: %q %v, want EOF (connection closed)", b, err)
	}
}

// TestServerConnection drives raw client connections: plain requests
// are served by the Server, anything else is handed with its buffered
// bytes to net/http for good, and either way every request on the
// connection gets its own, whole answer, in order.
func TestServerConnection(t *testing.T) {
	s := serve(t, echo, nil)
	get := func(path string) string { return "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n" }
	ans := func(method, uri, via string) string {
		return fmt.Sprintf("%s %s via=%s body=%q big=0", method, uri, via, "")
	}
	big := strings.Repeat("b", h1.BufSize)
	type answer struct {
		status int
		body   string
		close  bool
	}
	for _, tc := range []struct {
		name   string
		send   []string // each written on its own
		head   []bool   // per answer: the request was HEAD
		want   []answer
		wantEO bool // the server closes the connection after the answers
	}{
		{name: "pipelined plain GETs", send: []string{get("/a") + get("/b?q=1") + get("/c%2Fd")},
			want: []answer{{200, ans("GET", "/a", "h1"), false}, {200, ans("GET", "/b?q=1", "h1"), false}, {200, ans("GET", "/c%2Fd", "h1"), false}}},
		{name: "HEAD then GET", send: []string{"HEAD /h HTTP/1.1\r\nHost: x\r\n\r\n", get("/g")},
			head: []bool{true, false}, want: []answer{{200, "", false}, {200, ans("GET", "/g", "h1"), false}}},
		{name: "connection close", send: []string{"GET /z HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"},
			want: []answer{{200, ans("GET", "/z", "h1"), true}}, wantEO: true},
		{name: "header split across writes", send: []string{"GET /sp", "lit HTTP/1.1\r\nHo", "st: x\r\n", "\r\n"},
			want: []answer{{200, ans("GET", "/split", "h1"), false}}},
		{name: "body hands the connection to net/http for good", send: []string{
			get("/1"), "POST /2 HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", get("/3")},
			want: []answer{{200, ans("GET", "/1", "h1"), false}, {200, `POST /2 via=net/http body="abc" big=0`, false}, {200, ans("GET", "/3", "net/http"), false}}},
		{name: "pipelined body behind a plain GET", send: []string{get("/1") + "PUT /2 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok" + get("/3")},
			want: []answer{{200, ans("GET", "/1", "h1"), false}, {200, `PUT /2 via=net/http body="ok" big=0`, false}, {200, ans("GET", "/3", "net/http"), false}}},
		{name: "chunked body", send: []string{"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"},
			want: []answer{{200, `POST /c via=net/http body="abcde" big=0`, false}}},
		{name: "expect continue", send: []string{"POST /e HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n", "z"},
			want: []answer{{200, `POST /e via=net/http body="z" big=0`, false}}},
		{name: "header longer than the buffer", send: []string{"GET /big HTTP/1.1\r\nHost: x\r\nX-Big: " + big + "\r\n\r\n", get("/after")},
			want: []answer{{200, fmt.Sprintf("GET /big via=net/http body=%q big=%d", "", len(big)), false}, {200, ans("GET", "/after", "net/http"), false}}},
		{name: "bare LF line ends", send: []string{"GET /lf HTTP/1.1\nHost: x\n\n"}, want: []answer{{200, ans("GET", "/lf", "net/http"), false}}},
		{name: "HTTP/1.0", send: []string{"GET /old HTTP/1.0\r\nHost: x\r\n\r\n"},
			want: []answer{{200, ans("GET", "/old", "net/http"), true}}, wantEO: true},
		{name: "malformed request line gets net/http's 400", send: []string{"GET /only-a-target\r\nHost: x\r\n\r\n"},
			want: []answer{{400, "", true}}, wantEO: true},
		{name: "invalid header name gets net/http's 400", send: []string{"GET / HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n"},
			want: []answer{{400, "", true}}, wantEO: true},
		{name: "no host gets net/http's 400", send: []string{"GET / HTTP/1.1\r\nX: y\r\n\r\n"},
			want: []answer{{400, "", true}}, wantEO: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br := dial(t, s.addr)
			for _, m := range tc.send {
				if _, err := io.WriteString(c, m); err != nil {
					t.Fatal(err)
				}
			}
			for i, want := range tc.want {
				method := "GET"
				if tc.head != nil && tc.head[i] {
					method = "HEAD"
				}
				resp, body := readAnswer(t, br, method)
				got := answer{status: resp.StatusCode, body: body, close: resp.Close}
				if want.status == 400 {
					got.body = "" // net/http's wording
				}
				if got != want {
					t.Errorf("answer %d: got %+v, want %+v", i, got, want)
				}
				if resp.Header.Get("Date") == "" && want.status != 400 {
					t.Errorf("answer %d: no Date header", i)
				}
			}
			if tc.wantEO {
				expectClosed(t, br)
			}
		})
	}
}

// TestServerHeaderAtBufferSize: a header that just fits the read buffer
// is served by the Server; one byte more goes to net/http.
func TestServerHeaderAtBufferSize(t *testing.T) {
	s := serve(t, echo, nil)
	for _, tc := range []struct {
		size int
		via  string
	}{{h1.BufSize, "h1"}, {h1.BufSize + 1, "net/http"}} {
		const head = "GET /fit HTTP/1.1\r\nHost: x\r\nX-Big: "
		pad := tc.size - len(head) - len("\r\n\r\n")
		req := head + strings.Repeat("p", pad) + "\r\n\r\n"
		if len(req) != tc.size {
			t.Fatalf("built a %d-byte header, want %d", len(req), tc.size)
		}
		c, br := dial(t, s.addr)
		io.WriteString(c, req)
		_, body := readAnswer(t, br, "GET")
		if want := fmt.Sprintf("GET /fit via=%s body=%q big=%d", tc.via, "", pad); body != want {
			t.Errorf("%d-byte header: %q, want %q", tc.size, body, want)
		}
	}
}

// TestServerUpgradeGoesToNetHTTP: an upgrade request reaches the handler
// through net/http, whose ResponseWriter hijacks; the Server's never
// sees one.
func TestServerUpgradeGoesToNetHTTP(t *testing.T) {
	s := serve(t, func(w http.ResponseWriter, r *http.Request) bool {
		if !h1.IsUpgrade(r) {
			return echo(w, r)
		}
		if via(w) != "net/http" {
			http.Error(w, "upgrade on the Server", 500)
			return false
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), 500)
			return false
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		line, _ := brw.ReadString('\n')
		brw.WriteString(strings.ToUpper(line))
		brw.Flush()
		return false
	}, nil)
	c, br := dial(t, s.addr)
	io.WriteString(c, "GET /first HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, body := readAnswer(t, br, "GET"); !strings.Contains(body, "via=h1") {
		t.Fatalf("plain request before the upgrade: %q, want it served by the Server", body)
	}
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nhello\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade answered %d, want 101", resp.StatusCode)
	}
	// NB: "hello" came in the same write as the request: it was read with
	// the header and handed over with it.
	if line, err := br.ReadString('\n'); err != nil || line != "HELLO\n" {
		t.Fatalf("echo over the upgraded connection: %q %v", line, err)
	}
}

// TestServerTimeouts: a header that stalls is cut after
// ReadHeaderTimeout, an idle connection after IdleTimeout.
func TestServerTimeouts(t *testing.T) {
	s := serve(t, echo, func(cfg *h1.ServerConfig) {
		cfg.ReadHeaderTimeout = 50 * time.Millisecond
		cfg.IdleTimeout = 50 * time.Millisecond
	})
	t.Run("stalled header", func(t *testing.T) {
		c, br := dial(t, s.addr)
		io.WriteString(c, "GET /stall HTTP/1.1\r\nHo")
		start := time.Now()
		expectClosed(t, br)
		if d := time.Since(start); d < 50*time.Millisecond {
			t.Errorf("closed after %v, before ReadHeaderTimeout", d)
		}
	})
	t.Run("idle", func(t *testing.T) {
		c, br := dial(t, s.addr)
		io.WriteString(c, "GET /once HTTP/1.1\r\nHost: x\r\n\r\n")
		readAnswer(t, br, "GET")
		expectClosed(t, br)
	})
}

// TestServerAbort: a handler that reports its response cut short closes
// the connection, so the client cannot take the part for a whole.
func TestServerAbort(t *testing.T) {
	s := serve(t, func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Length", "10")
		io.WriteString(w, "part")
		w.(http.Flusher).Flush()
		return true
	}, nil)
	c, br := dial(t, s.addr)
	io.WriteString(c, "GET /cut HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if string(b) != "part" || err != io.ErrUnexpectedEOF {
		t.Errorf("cut response: %q %v, want %q and io.ErrUnexpectedEOF", b, err, "part")
	}
}

// TestServerPanic: a panicking handler costs its connection and a log
// line, not the server.
func TestServerPanic(t *testing.T) {
	s := serve(t, func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path == "/panic" {
			panic("boom")
		}
		return echo(w, r)
	}, nil)
	c, br := dial(t, s.addr)
	io.WriteString(c, "GET /panic HTTP/1.1\r\nHost: x\r\n\r\n")
	expectClosed(t, br)
	c2, br2 := dial(t, s.addr)
	io.WriteString(c2, "GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, body := readAnswer(t, br2, "GET"); !strings.Contains(body, "/after via=h1") {
		t.Errorf("after a panic: %q", body)
	}
	// NB: the log line is written before the connection closes.
	if got := s.log.String(); !strings.Contains(got, "boom") {
		t.Errorf("the panic was not logged: %q", got)
	}
}

// TestServerClientGone: a request still running when its client closes
// the connection gets its context canceled (within two watch periods),
// also after quick requests kept the connection's watch timer running.
func TestServerClientGone(t *testing.T) {
	arrived := make(chan struct{}, 1)
	ended := make(chan error, 1)
	s := serve(t, func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/slow" {
			return echo(w, r)
		}
		arrived <- struct{}{}
		<-r.Context().Done()
		ended <- r.Context().Err()
		return false
	}, nil)
	for _, quick := range []int{0, 20} {
		t.Run(fmt.Sprintf("after %d quick requests", quick), func(t *testing.T) {
			c, br := dial(t, s.addr)
			for range quick {
				io.WriteString(c, "GET /quick HTTP/1.1\r\nHost: x\r\n\r\n")
				readAnswer(t, br, "GET")
			}
			io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			select {
			case <-arrived:
			case <-ctx.Done():
				t.Fatal("the slow request never reached the handler")
			}
			start := time.Now()
			c.Close()
			select {
			case err := <-ended:
				if err != context.Canceled {
					t.Errorf("context ended with %v, want context.Canceled", err)
				}
				if d := time.Since(start); d > 10*h1.WatchDelay {
					t.Errorf("noticed after %v, want within a few watch periods (%v)", d, h1.WatchDelay)
				}
			case <-ctx.Done():
				t.Fatal("request context still open 10s after the client went away")
			}
		})
	}
}

// TestServerCloseEndsRequests: Close ends the context of every request
// still running, as it closes their connections.
func TestServerCloseEndsRequests(t *testing.T) {
	arrived := make(chan struct{}, 2)
	ended := make(chan error, 2)
	release := make(chan struct{}) // a failed test's handlers end too
	s := serve(t, func(w http.ResponseWriter, r *http.Request) bool {
		arrived <- struct{}{}
		select {
		case <-r.Context().Done():
			ended <- r.Context().Err()
		case <-release:
		}
		return false
	}, nil)
	t.Cleanup(func() { close(release) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 2 {
		c, _ := dial(t, s.addr)
		fmt.Fprintf(c, "GET /slow/%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
		select {
		case <-arrived:
		case <-ctx.Done():
			t.Fatal("a request never reached the handler")
		}
	}
	closed := make(chan struct{})
	go func() { // NB: Close waits for the handlers
		s.srv.Close()
		close(closed)
	}()
	for range 2 {
		select {
		case err := <-ended:
			if err != context.Canceled {
				t.Errorf("context ended with %v, want context.Canceled", err)
			}
		case <-ctx.Done():
			t.Fatal("a request's context still open 10s after Close")
		}
	}
	<-closed
}

// TestServerShutdown: Shutdown closes idle connections at once, lets a
// running request finish and write its whole answer, then closes its
// connection; Close aborts a request that does not end by itself.
func TestServerShutdown(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	h := func(w http.ResponseWriter, r *http.Request) bool {
		switch r.URL.Path {
		case "/wait":
			arrived <- struct{}{}
			<-release
			io.WriteString(w, "finished")
		case "/stuck":
			arrived <- struct{}{}
			<-r.Context().Done()
		default:
			return echo(w, r)
		}
		return false
	}
	t.Run("graceful", func(t *testing.T) {
		s := serve(t, h, nil)
		idle, idleBR := dial(t, s.addr)
		io.WriteString(idle, "GET /idle HTTP/1.1\r\nHost: x\r\n\r\n")
		readAnswer(t, idleBR, "GET")
		busy, busyBR := dial(t, s.addr)
		io.WriteString(busy, "GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
		<-arrived
		done := make(chan error, 1)
		go func() { done <- s.srv.Shutdown(context.Background()) }()
		expectClosed(t, idleBR)
		close(release)
		if _, body := readAnswer(t, busyBR, "GET"); body != "finished" {
			t.Errorf("running request's answer %q, want %q", body, "finished")
		}
		expectClosed(t, busyBR)
		if err := <-done; err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if c, err := net.Dial("tcp", s.addr); err == nil {
			c.Close()
			t.Error("the listener still accepts after Shutdown")
		}
	})
	t.Run("close aborts", func(t *testing.T) {
		s := serve(t, h, nil)
		c, br := dial(t, s.addr)
		io.WriteString(c, "GET /stuck HTTP/1.1\r\nHost: x\r\n\r\n")
		<-arrived
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := s.srv.Shutdown(ctx); err != context.Canceled {
			t.Errorf("Shutdown with a done context: %v, want context.Canceled", err)
		}
		s.srv.Close() // returns once the stuck request has ended
		expectClosed(t, br)
	})
}

// TestServerWorkers: a connection accepted while a worker waits idle is
// served by that worker; an idle worker ends after WorkerIdle, and at once
// when the Server shuts down.
func TestServerWorkers(t *testing.T) {
	served := make(chan string, 1)
	h := func(w http.ResponseWriter, r *http.Request) bool {
		served <- goroutineID()
		return echo(w, r)
	}
	once := func(t *testing.T, addr string) string {
		t.Helper()
		c, br := dial(t, addr)
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		readAnswer(t, br, "GET")
		expectClosed(t, br)
		return <-served
	}
	t.Run("reused", func(t *testing.T) {
		s := serve(t, h, func(c *h1.ServerConfig) { c.WorkerIdle = time.Hour })
		first := once(t, s.addr)
		waitIdleWorker(t)
		if second := once(t, s.addr); second != first {
			t.Errorf("the second connection was served by goroutine %s, want the idle worker %s", second, first)
		}
		waitWorkers(t, 1)
	})
	t.Run("idle ends", func(t *testing.T) {
		s := serve(t, h, func(c *h1.ServerConfig) { c.WorkerIdle = 20 * time.Millisecond })
		once(t, s.addr)
		waitWorkers(t, 0)
	})
	t.Run("shutdown ends idle", func(t *testing.T) {
		s := serve(t, h, func(c *h1.ServerConfig) { c.WorkerIdle = time.Hour })
		once(t, s.addr)
		waitWorkers(t, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.srv.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown with an idle worker: %v", err)
		}
		waitWorkers(t, 0)
	})
}

// goroutineID is the calling goroutine's number, from its stack header.
func goroutineID() string {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return ""
	}
	return f[1]
}

// workerStacks returns the stacks of the goroutines in a Server's worker
// loop, each with its header line ("goroutine N [state]:").
func workerStacks() []string {
	b := make([]byte, 1<<20)
	b = b[:runtime.Stack(b, true)]
	var ws []string
	for _, g := range strings.Split(string(b), "\n\n") {
		if strings.Contains(g, "h1.(*Server).work(") {
			ws = append(ws, g)
		}
	}
	return ws
}

// waitWorkers waits up to 10 s until exactly n goroutines are in a
// Server's worker loop, and fails the test if they never are.
func waitWorkers(t *testing.T, n int) {
	t.Helper()
	waitFor(t, func() (bool, string) {
		got := len(workerStacks())
		return got == n, fmt.Sprintf("%d goroutines in a worker loop, want %d", got, n)
	})
}

// waitIdleWorker waits until a worker waits for a connection in work's
// select: one still finishing its last connection is in the loop too, but
// Serve would start a goroutine beside it.
func waitIdleWorker(t *testing.T) {
	t.Helper()
	waitFor(t, func() (bool, string) {
		for _, g := range workerStacks() {
			if head, _, _ := strings.Cut(g, "\n"); strings.Contains(head, "[select") {
				return true, ""
			}
		}
		return false, "no worker waits idle for a connection"
	})
}

// waitFor polls cond until it holds, and fails the test with what cond
// last said if it does not within 10 s.
func waitFor(t *testing.T, cond func() (ok bool, why string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(why)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestServerClosingResponseBeforeUnreadBytes: a response that ends its
// connection reaches the client whole though the client sent more bytes,
// which the server never reads, while the request ran (closing a socket
// with unread bytes resets the connection, and a reset drops what the
// kernel still holds unsent).
func TestServerClosingResponseBeforeUnreadBytes(t *testing.T) {
	arrived, sent := make(chan struct{}), make(chan struct{})
	h := func(w http.ResponseWriter, r *http.Request) bool {
		close(arrived)
		<-sent
		return echo(w, r)
	}
	s := serve(t, h, nil)
	c, br := dial(t, s.addr)
	io.WriteString(c, "GET /last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	// NB: the handler runs once the request was read, so these bytes
	// stay in the server's socket.
	<-arrived
	io.WriteString(c, "GET /unread HTTP/1.1\r\nHost: x\r\n\r\n")
	close(sent)
	resp, body := readAnswer(t, br, "GET")
	if !resp.Close || !strings.HasPrefix(body, "GET /last via=h1") {
		t.Fatalf("answer %q (close %v), want the whole answer to GET /last and Connection: close", body, resp.Close)
	}
}

// addrConn is a net.Conn that reports a given remote address.
type addrConn struct {
	net.Conn
	ra net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.ra }

// TestRemoteAddrSpelledAsNet: r.RemoteAddr (which X-Forwarded-For takes
// its host from) reads as net.TCPAddr.String writes it, for IPv4, IPv4
// mapped into IPv6, IPv6 with and without a zone, and non-TCP addresses.
func TestRemoteAddrSpelledAsNet(t *testing.T) {
	for _, a := range []net.Addr{
		&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 80},
		&net.TCPAddr{IP: net.IPv4(10, 0, 0, 1).To4(), Port: 80},
		&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 65535},
		&net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 443},
		&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 8080, Zone: "eth0"},
		&net.UnixAddr{Name: "/run/gw.sock", Net: "unix"},
	} {
		if got, want := h1.RemoteAddr(addrConn{ra: a}), a.String(); got != want {
			t.Errorf("remote address %#v: got %q, want %q", a, got, want)
		}
	}
}

// TestDateAndRemoteAddrPerConnection: connections that each carry one
// request (the server shares one Date value among them) get a Date that is
// the current second in HTTP's format, and the handler sees each one's own
// address.
func TestDateAndRemoteAddrPerConnection(t *testing.T) {
	s := serve(t, func(w http.ResponseWriter, r *http.Request) bool {
		io.WriteString(w, r.RemoteAddr)
		return false
	}, nil)
	for i := range 5 {
		c, br := dial(t, s.addr)
		before := time.Now().Truncate(time.Second)
		fmt.Fprintf(c, "GET /%d HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", i)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		after := time.Now()
		if got, want := string(body), c.LocalAddr().String(); got != want {
			t.Errorf("connection %d: RemoteAddr %q, want the client's %q", i, got, want)
		}
		d, err := http.ParseTime(resp.Header.Get("Date"))
		if err != nil || d.Before(before) || d.After(after) {
			t.Errorf("connection %d: Date %q (%v), want a second in [%v, %v]", i, resp.Header.Get("Date"), err, before, after)
		}
		c.Close()
	}
	// Given clock readings a second apart (SetNow), each connection's Date
	// names its own second, not the one the shared value was made for.
	s2 := serve(t, func(w http.ResponseWriter, r *http.Request) bool {
		sec, _ := strconv.ParseInt(r.URL.Query().Get("at"), 10, 64)
		w.(*h1.ResponseWriter).SetNow(time.Unix(sec, 0))
		return false
	}, nil)
	for i := range int64(3) {
		c, br := dial(t, s2.addr)
		at := 1_000_000_000 + i
		fmt.Fprintf(c, "GET /?at=%d HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", at)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got, want := resp.Header.Get("Date"), time.Unix(at, 0).UTC().Format(http.TimeFormat); got != want {
			t.Errorf("clock at %d: Date %q, want %q", at, got, want)
		}
		c.Close()
	}
}
