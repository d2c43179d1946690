package h1

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
)

// IsUpgrade reports a protocol-upgrade request (WebSocket): an Upgrade
// header named in Connection. A Server never serves one itself (parse
// hands it to net/http), so its Handler never sees one.
func IsUpgrade(r *http.Request) bool {
	if len(r.Header["Upgrade"]) == 0 {
		return false
	}
	for _, v := range r.Header["Connection"] {
		if hasToken(v, "upgrade") {
			return true
		}
	}
	return false
}

// ErrNotHijackable means the client's connection cannot be taken over
// (its ResponseWriter does not hijack, or has written already): nothing
// was written to it, and the response is still the caller's to send.
var ErrNotHijackable = errors.New("h1: client connection cannot be hijacked")

// Tunnel is an upgraded client connection spliced to its origin's: after
// the origin's 101, bytes are copied both ways unchanged until either
// side closes. Close may run on any goroutine, at any time.
type Tunnel struct {
	client net.Conn
	brw    *bufio.ReadWriter // client's: its reader may hold bytes sent after the request
	origin io.ReadWriteCloser
	once   sync.Once
}

// Hijack takes over w's connection for a tunnel to origin, the upgraded
// origin connection (a 101 response's Body). On its error,
// ErrNotHijackable, neither connection is closed.
func Hijack(w http.ResponseWriter, origin io.ReadWriteCloser) (*Tunnel, error) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, ErrNotHijackable
	}
	return &Tunnel{client: conn, brw: brw, origin: origin}, nil
}

// Switch writes the origin's 101 response, resp, to the client: its
// status and end-to-end header fields, with Connection: Upgrade and the
// origin's Upgrade field. On an error the caller closes the tunnel.
func (t *Tunnel) Switch(resp *http.Response) error {
	h := make(http.Header, len(resp.Header)+2)
	conn := resp.Header["Connection"]
	for k, vv := range resp.Header {
		if !HopByHop(k, conn) {
			h[k] = vv
		}
	}
	h["Connection"] = []string{"Upgrade"}
	h["Upgrade"] = resp.Header["Upgrade"]
	out := &http.Response{StatusCode: http.StatusSwitchingProtocols, ProtoMajor: 1, ProtoMinor: 1, Header: h}
	if err := out.Write(t.brw); err != nil {
		return err
	}
	return t.brw.Flush()
}

// Splice copies both ways until either side closes or Close is called,
// then closes both; it returns once both copies ended. active runs after
// every read that got bytes, on either side (for an idle timer). The
// error is the origin-to-client copy's (nil at the origin's EOF).
func (t *Tunnel) Splice(active func()) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		// NB: brw.Reader may hold bytes the client sent after its request.
		io.Copy(t.origin, &activeReader{r: t.brw.Reader, active: active})
		t.Close()
	}()
	_, err := io.Copy(t.client, &activeReader{r: t.origin, active: active})
	t.Close()
	<-done
	return err
}

// Close closes both connections, once.
func (t *Tunnel) Close() {
	t.once.Do(func() {
		t.client.Close()
		t.origin.Close()
	})
}

// activeReader calls active after every read that got bytes.
type activeReader struct {
	r      io.Reader
	active func()
}

func (a *activeReader) Read(p []byte) (int, error) {
	n, err := a.r.Read(p)
	if n > 0 {
		a.active()
	}
	return n, err
}
