package handback_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"

	"go.uber.org/goleak"

	"github.com/lodestone-kv/lodestone/internal/handback"
	"github.com/lodestone-kv/lodestone/internal/testnet"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// accept runs l.Accept on a goroutine and returns what it yields.
func accept(l net.Listener) <-chan net.Conn {
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(ch)
			return
		}
		ch <- c
	}()
	return ch
}

// TestHandReadsBufferedFirst: the accepted connection yields the bytes
// handed with it, then what the client sends next.
func TestHandReadsBufferedFirst(t *testing.T) {
	client, server := testnet.Pair(t)
	l := handback.New(server.LocalAddr())
	defer l.Close()
	got := accept(l)
	if !l.Hand(server, []byte("GET / HT"), nil) {
		t.Fatal("Hand refused a connection on an open listener")
	}
	c := <-got
	if _, err := io.WriteString(client, "TP/1.1\r\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if got, want := line, "GET / HTTP/1.1\r\n"; err != nil || got != want {
		t.Fatalf("read %q, %v; want %q", got, err, want)
	}
	if got, want := l.Addr(), server.LocalAddr(); got != want {
		t.Errorf("Addr %v, want %v", got, want)
	}
}

// TestHandRefused: on a closed listener, or once cancel is closed, Hand
// returns false and leaves the connection open for its caller.
func TestHandRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(l *handback.Listener) <-chan struct{}
	}{
		{"closed listener", func(l *handback.Listener) <-chan struct{} { l.Close(); return nil }},
		{"canceled", func(l *handback.Listener) <-chan struct{} {
			ch := make(chan struct{})
			close(ch)
			return ch
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, server := testnet.Pair(t)
			l := handback.New(server.LocalAddr())
			defer l.Close()
			if l.Hand(server, nil, tc.setup(l)) {
				t.Fatal("Hand took a connection nobody could accept")
			}
			if _, err := io.WriteString(server, "still open"); err != nil {
				t.Fatalf("the refused connection was closed: %v", err)
			}
			buf := make([]byte, 10)
			if _, err := io.ReadFull(client, buf); err != nil || string(buf) != "still open" {
				t.Fatalf("client read %q, %v", buf, err)
			}
		})
	}
}

// TestWrapYieldsBoth: a wrapped listener's Accept yields the inner
// listener's connections and the handed ones; Close closes the inner
// listener and stops its accept goroutine (goleak checks that).
func TestWrapYieldsBoth(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := handback.Wrap(inner)
	dialed, err := net.Dial("tcp", inner.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer dialed.Close()
	c := <-accept(l)
	if c == nil {
		t.Fatal("Accept did not yield the inner listener's connection")
	}
	defer c.Close()
	if got, want := c.RemoteAddr().String(), dialed.LocalAddr().String(); got != want {
		t.Errorf("accepted a connection from %s, want %s", got, want)
	}

	_, server := testnet.Pair(t)
	got := accept(l)
	if !l.Hand(server, nil, nil) {
		t.Fatal("Hand refused a connection on an open listener")
	}
	if c := <-got; c != server {
		t.Errorf("Accept yielded %v, want the handed connection", c)
	}

	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v, want nil", err)
	}
	if _, err := l.Accept(); err != net.ErrClosed {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
	if c, err := net.Dial("tcp", inner.Addr().String()); err == nil {
		c.Close()
		t.Error("the inner listener still accepts after Close")
	}
}

// TestHTTPServerServesHanded: an http.Server on the listener answers a
// request whose first bytes were read before the hand-over, and its
// Shutdown closes the listener.
func TestHTTPServerServesHanded(t *testing.T) {
	client, server := testnet.Pair(t)
	l := handback.New(server.LocalAddr())
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Method+" "+r.URL.Path)
	})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	if !l.Hand(server, []byte("GET /handed HTTP/1.1\r\nHo"), nil) {
		t.Fatal("Hand refused")
	}
	io.WriteString(client, "st: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(client), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if got, want := string(body), "GET /handed"; got != want {
		t.Errorf("body %q, want %q", got, want)
	}
	client.Close()
	if err := srv.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != http.ErrServerClosed {
		t.Errorf("Serve: %v, want http.ErrServerClosed", err)
	}
	if l.Hand(server, nil, nil) {
		t.Error("Hand took a connection after Shutdown closed the listener")
	}
}
