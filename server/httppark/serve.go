package httppark

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/lodestone-kv/lodestone/internal/prefixconn"
)

// headBytes bounds the request head serveConn reads itself; a longer one
// goes to the http.Server, which has its own limit.
const headBytes = 4096

// serveConn serves the requests that follow an answered one on its
// connection, as net/http would, with two differences: it reads only
// blocking-query shaped requests (a bodiless HTTP/1.1 GET) and hands the
// connection back to the http.Server for anything else, or when the
// client says nothing for NextRequestWait; and it keeps no state of its
// own while the request it runs is parked. Handing every answered
// connection straight back instead cost a new net/http connection (8 KB
// of buffers) per answer: at 2,000 answers a second that doubled the
// server's allocation rate and so its GC cycles.
//
// remote is c.RemoteAddr() as a string, made once for every request it
// serves.
func (l *Lot) serveConn(c net.Conn, leftover []byte, remote string) {
	var src net.Conn = c
	if len(leftover) > 0 {
		src = &prefixconn.Conn{Conn: c, Prefix: leftover}
	}
	if !l.track(c) {
		c.Close()
		return
	}
	defer l.untrack(c)
	br := l.readers.Get().(*bufio.Reader)
	br.Reset(src)
	defer func() {
		br.Reset(nil)
		l.readers.Put(br)
	}()
	for {
		req, err := l.nextRequest(c, br, remote)
		var back *handBackError
		switch {
		case errors.As(err, &back):
			if !l.handBack(c, unread(br, src)) {
				c.Close()
				return
			}
			l.handedBack.Add(1)
			return
		case err != nil:
			c.Close()
			return
		}
		l.served.Add(1)
		keep, parked := l.answer(src, br, l.cfg.Handler, req)
		if parked {
			return // NB: Park copied what br holds
		}
		if !keep {
			c.Close()
			return
		}
	}
}

// handBackError: the next request is for the http.Server; nothing of it
// was consumed.
type handBackError struct{ why string }

func (e *handBackError) Error() string { return "hand back: " + e.why }

// nextRequest reads the client's next request if serveConn may serve it.
func (l *Lot) nextRequest(c net.Conn, br *bufio.Reader, remote string) (*http.Request, error) {
	select {
	case <-l.stop:
		return nil, &handBackError{"closing"}
	default:
	}
	if err := c.SetReadDeadline(time.Now().Add(l.cfg.NextRequestWait)); err != nil {
		return nil, err
	}
	head, err := peekHead(br)
	if derr := c.SetReadDeadline(time.Time{}); derr != nil {
		return nil, derr
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return nil, &handBackError{"quiet client"}
	case errors.Is(err, bufio.ErrBufferFull):
		return nil, &handBackError{"long head"}
	case err != nil:
		return nil, err
	case !bodilessGET(head):
		return nil, &handBackError{"not a bodiless GET"}
	}
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, err
	}
	req.RemoteAddr = remote
	return req.WithContext(l.cfg.Context), nil
}

// peekHead returns the request head, through its blank line, without
// consuming it.
func peekHead(br *bufio.Reader) ([]byte, error) {
	for {
		b, _ := br.Peek(br.Buffered()) // NB: Peek of what is buffered cannot fail
		if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
			return b[:i+4], nil
		}
		if len(b) == br.Size() {
			return nil, bufio.ErrBufferFull
		}
		// Wait for more.
		if _, err := br.Peek(len(b) + 1); err != nil {
			return nil, err
		}
	}
}

// bodilessGET reports whether head is an HTTP/1.1 GET with nothing that
// would make net/http treat it differently from how serveConn does: no
// body, no Expect, no Upgrade.
func bodilessGET(head []byte) bool {
	// NB: net/http also ends a line at a bare LF, so a field after one
	// ("X: a\nContent-Length: 5") is a field to it and not to the loop
	// below, and its head may end before ours: leave those to it.
	if bytes.Count(head, []byte("\n")) != bytes.Count(head, []byte("\r\n")) {
		return false
	}
	line, rest, _ := bytes.Cut(head, []byte("\r\n"))
	if !bytes.HasPrefix(line, []byte("GET ")) || !bytes.HasSuffix(line, []byte(" HTTP/1.1")) {
		return false
	}
	for len(rest) > 0 {
		line, rest, _ = bytes.Cut(rest, []byte("\r\n"))
		name, _, _ := bytes.Cut(line, []byte(":"))
		for _, h := range notBodiless {
			if bytes.EqualFold(name, h) {
				return false
			}
		}
	}
	return true
}

// notBodiless are the headers that keep a GET from serveConn.
var notBodiless = [][]byte{[]byte("Content-Length"), []byte("Transfer-Encoding"), []byte("Expect"), []byte("Upgrade")}

// unread is what the client sent that nobody consumed yet.
func unread(br *bufio.Reader, src net.Conn) []byte {
	b, _ := br.Peek(br.Buffered()) // NB: Peek of what is buffered cannot fail
	out := bytes.Clone(b)
	if lc, ok := src.(*prefixconn.Conn); ok {
		out = append(out, lc.Prefix...)
	}
	return out
}

func (l *Lot) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.serving[c] = struct{}{}
	return true
}

func (l *Lot) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.serving, c)
	l.mu.Unlock()
}
