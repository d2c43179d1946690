package h1_test

import (
	"bufio"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/lodestone-kv/lodestone/gateway/internal/h1"
	"github.com/lodestone-kv/lodestone/internal/testnet"
)

func TestIsUpgrade(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdr  http.Header
		want bool
	}{
		{"websocket", http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}}, true},
		{"token in a list, any case", http.Header{"Connection": {"keep-alive, UPGRADE"}, "Upgrade": {"h2c"}}, true},
		{"second Connection field", http.Header{"Connection": {"keep-alive", "upgrade"}, "Upgrade": {"x"}}, true},
		{"Upgrade not named in Connection", http.Header{"Connection": {"keep-alive"}, "Upgrade": {"websocket"}}, false},
		{"Connection without Upgrade", http.Header{"Connection": {"upgrade"}}, false},
		{"neither", http.Header{}, false},
	} {
		r := &http.Request{Header: tc.hdr}
		if got := h1.IsUpgrade(r); got != tc.want {
			t.Errorf("%s: IsUpgrade = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestHijackNotSupported: a ResponseWriter that cannot hijack leaves
// both connections open and the answer to the caller.
func TestHijackNotSupported(t *testing.T) {
	originEnd, tunnelEnd := testnet.Pair(t)
	if _, err := h1.Hijack(httptest.NewRecorder(), tunnelEnd); !errors.Is(err, h1.ErrNotHijackable) {
		t.Fatalf("Hijack on a recorder: %v, want ErrNotHijackable", err)
	}
	io.WriteString(tunnelEnd, "open")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(originEnd, buf); err != nil {
		t.Fatalf("the origin connection was closed: %v", err)
	}
}

// TestTunnel: after the origin's 101 the client gets its end-to-end
// fields with Connection: Upgrade, and bytes flow both ways, those sent
// with the request included, until one side closes (or Close).
func TestTunnel(t *testing.T) {
	for _, end := range []string{"origin closes", "Close"} {
		t.Run(end, func(t *testing.T) {
			originEnd, tunnelEnd := testnet.Pair(t)
			closeNow := make(chan struct{})
			var closeOnce sync.Once
			closeTunnel := func() { closeOnce.Do(func() { close(closeNow) }) }
			spliced := make(chan int64, 1)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			std := &http.Server{ErrorLog: log.New(io.Discard, "", 0), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tun, err := h1.Hijack(w, tunnelEnd)
				if err != nil {
					http.Error(w, err.Error(), 500)
					return
				}
				resp := &http.Response{StatusCode: 101, Header: http.Header{
					"Connection": {"Upgrade, X-Hop"}, "Upgrade": {"echo"}, "X-Hop": {"1"}, "Sec-Accept": {"k"}}}
				if err := tun.Switch(resp); err != nil {
					tun.Close()
					return
				}
				go func() {
					<-closeNow
					tun.Close()
				}()
				var reads atomic.Int64
				tun.Splice(func() { reads.Add(1) })
				spliced <- reads.Load()
			})}
			var wg sync.WaitGroup
			wg.Go(func() { std.Serve(ln) })
			defer func() {
				closeTunnel()
				std.Close()
				wg.Wait()
			}()

			c, br := dial(t, ln.Addr().String())
			io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nearly\n")
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 101 || resp.Header.Get("Sec-Accept") != "k" || resp.Header.Get("Upgrade") != "echo" ||
				resp.Header.Get("Connection") != "Upgrade" || resp.Header.Get("X-Hop") != "" {
				t.Fatalf("switch: %d %v, want 101 with Sec-Accept, Upgrade and Connection: Upgrade, without X-Hop", resp.StatusCode, resp.Header)
			}
			originBR := bufio.NewReader(originEnd)
			if line, err := originBR.ReadString('\n'); err != nil || line != "early\n" {
				t.Fatalf("origin read %q %v, want the bytes sent with the request", line, err)
			}
			io.WriteString(originEnd, "pong\n")
			if line, err := br.ReadString('\n'); err != nil || line != "pong\n" {
				t.Fatalf("client read %q %v", line, err)
			}
			io.WriteString(c, "ping\n")
			if line, err := originBR.ReadString('\n'); err != nil || line != "ping\n" {
				t.Fatalf("origin read %q %v", line, err)
			}
			if end == "origin closes" {
				originEnd.Close()
			} else {
				closeTunnel()
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("client read %v after the end, want EOF", err)
			}
			if reads := <-spliced; reads < 3 {
				t.Errorf("active ran %d times, want one per read with bytes (at least 3)", reads)
			}
		})
	}
}
