// Package rawhttp is the benchmarks' HTTP/1.1 keep-alive client for load
// generators that share a core with what they measure: one connection,
// requests the caller builds, answers read for their status, framing,
// body and the headers asked for, nothing else.
package rawhttp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Conn is a minimal HTTP/1.1 keep-alive client on one connection: it
// writes a request the caller built and reads back the status, the body's
// framing (Content-Length or chunked), the headers New named and the
// body. NB: the net/http client cost consulbench's load generator about
// as much CPU per get as the leader it measured, so on its one core it,
// not the servers, bound the gets; and its Transport's two goroutines a
// connection took blockingbench's query processes as much of the
// learners' core as the learners. Every system a benchmark compares gets
// the same client.
//
// One goroutine does the ops; Close may come from any.
type Conn struct {
	// Dialer dials the connection (LocalAddr: the source address); the
	// zero value is net's default.
	Dialer net.Dialer

	addr string   // host:port
	want [][]byte // header names Header answers for
	got  []string // their values in the last answer
	mu   sync.Mutex
	conn net.Conn // NB: mu guards the pointer, for Close
	r    *bufio.Reader
	// deadline is the connection's current deadline, moved only when an
	// op's deadline passes it by more than a second, so most ops leave
	// the connection's timer alone.
	deadline time.Time
	body     []byte // the last answer's body, reused
	req      []byte // the last request Request built, reused
}

// errProtocol marks an answer that is not HTTP/1.1 as this client reads it.
var errProtocol = errors.New("malformed HTTP answer")

// maxBody bounds an answer's body: the workloads' answers are far smaller.
const maxBody = 1 << 20

// New returns a client of base ("http://host:port") that keeps the
// headers named in header from each answer, for Header.
func New(base string, header ...string) *Conn {
	c := &Conn{addr: strings.TrimPrefix(base, "http://"), got: make([]string, len(header))}
	for _, h := range header {
		c.want = append(c.want, []byte(h))
	}
	return c
}

// Addr is the server's host:port, for a request's Host.
func (c *Conn) Addr() string { return c.addr }

// Header is header's value in the last answer, "" if it had none; header
// must be one New named.
func (c *Conn) Header(header string) string {
	for i, h := range c.want {
		if bytes.EqualFold(h, []byte(header)) {
			return c.got[i]
		}
	}
	return ""
}

// Close closes the connection, ending an op in flight; the next Do dials
// a new one.
func (c *Conn) Close() {
	c.mu.Lock()
	conn := c.conn
	c.conn = nil
	c.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}

// Do sends req (a whole HTTP/1.1 request) and returns the answer's status
// code and body; the body is valid until the next Do. Any error closes
// the connection.
func (c *Conn) Do(ctx context.Context, req []byte) (code int, body []byte, err error) {
	c.mu.Lock()
	conn := c.conn
	c.mu.Unlock()
	if conn == nil {
		conn, err = c.Dialer.DialContext(ctx, "tcp", c.addr)
		if err != nil {
			return 0, nil, err
		}
		c.mu.Lock()
		c.conn = conn
		c.mu.Unlock()
		c.r, c.deadline = bufio.NewReaderSize(conn, 16<<10), time.Time{}
	}
	if dl, ok := ctx.Deadline(); ok && dl.Sub(c.deadline) > time.Second {
		c.deadline = dl
		conn.SetDeadline(dl)
	}
	code, body, keep, err := c.exchange(conn, req)
	if err != nil || !keep {
		c.drop(conn)
	}
	switch {
	case err == nil:
	case ctx.Err() != nil:
		err = ctx.Err()
	case errors.Is(err, os.ErrDeadlineExceeded):
		// NB: the only deadline on the connection is ctx's, and its read
		// can time out a moment before ctx's own timer marks it done.
		err = context.DeadlineExceeded
	}
	return code, body, err
}

// drop closes conn, and forgets it if it is still the client's.
func (c *Conn) drop(conn net.Conn) {
	c.mu.Lock()
	if c.conn == conn {
		c.conn = nil
	}
	c.mu.Unlock()
	conn.Close()
}

func (c *Conn) exchange(conn net.Conn, req []byte) (code int, body []byte, keep bool, err error) {
	clear(c.got)
	if _, err := conn.Write(req); err != nil {
		return 0, nil, false, err
	}
	code, length, chunked, keep, err := c.readHead()
	if err != nil {
		return 0, nil, false, err
	}
	switch {
	case chunked:
		body, err = c.readChunked()
	case length >= 0:
		if length > maxBody {
			return 0, nil, false, fmt.Errorf("%w: Content-Length %d over %d", errProtocol, length, maxBody)
		}
		body = grow(c.body, length)
		_, err = io.ReadFull(c.r, body)
	case code == 204 || code == 304 || code < 200:
		body = c.body[:0]
	default: // NB: no framing: the body runs to the connection's end
		keep = false
		body, err = io.ReadAll(io.LimitReader(c.r, maxBody))
	}
	c.body = body
	return code, body, keep, err
}

// readHead reads the status line and the headers. length is -1 without a
// Content-Length.
func (c *Conn) readHead() (code, length int, chunked, keep bool, err error) {
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return 0, 0, false, false, err
	}
	// "HTTP/1.1 200 OK\r\n"
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return 0, 0, false, false, fmt.Errorf("%w: status line %q", errProtocol, line)
	}
	code, err = strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, 0, false, false, fmt.Errorf("%w: status line %q", errProtocol, line)
	}
	keep, length = line[7] == '1', -1
	for {
		line, err = c.r.ReadSlice('\n')
		if err != nil {
			return 0, 0, false, false, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			return code, length, chunked, keep, nil
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, 0, false, false, fmt.Errorf("%w: header line %q", errProtocol, line)
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.Atoi(string(value)); err != nil || length < 0 {
				return 0, 0, false, false, fmt.Errorf("%w: Content-Length %q", errProtocol, value)
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
			if !chunked {
				return 0, 0, false, false, fmt.Errorf("%w: Transfer-Encoding %q", errProtocol, value)
			}
		case bytes.EqualFold(name, []byte("Connection")):
			if bytes.EqualFold(value, []byte("close")) {
				keep = false
			}
		}
		for i, h := range c.want {
			if bytes.EqualFold(name, h) {
				c.got[i] = string(value)
			}
		}
	}
}

// readChunked reads a chunked body and its trailer.
func (c *Conn) readChunked() ([]byte, error) {
	body := c.body[:0]
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		size, _, _ := bytes.Cut(bytes.TrimRight(line, "\r\n"), []byte(";"))
		n, err := strconv.ParseUint(string(size), 16, 32)
		if err != nil || len(body)+int(n) > maxBody {
			return nil, fmt.Errorf("%w: chunk size %q", errProtocol, line)
		}
		if n == 0 {
			break
		}
		start := len(body)
		body = grow(body, start+int(n))
		if _, err := io.ReadFull(c.r, body[start:]); err != nil {
			return nil, err
		}
		if err := c.readCRLF(); err != nil {
			return nil, err
		}
	}
	for { // the trailer, up to its empty line
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			return body, nil
		}
	}
}

func (c *Conn) readCRLF() error {
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return err
	}
	if len(bytes.TrimRight(line, "\r\n")) != 0 {
		return fmt.Errorf("%w: %q after a chunk", errProtocol, line)
	}
	return nil
}

// grow returns b resized to n bytes, its contents kept up to n.
func grow(b []byte, n int) []byte {
	if cap(b) < n {
		nb := make([]byte, n, max(n, 2*cap(b)))
		copy(nb, b)
		return nb
	}
	return b[:n]
}

// Request builds a request as AppendRequest does for this client's
// server, in a buffer the client reuses: valid until the next Request.
func (c *Conn) Request(method, path string, body []byte) []byte {
	c.req = AppendRequest(c.req[:0], method, c.addr, path, body)
	return c.req
}

// AppendRequest appends an HTTP/1.1 request for path on host, with body
// unless it is nil. It names the client and sends no Accept-Encoding, as
// the Go client with compression off.
func AppendRequest(b []byte, method, host, path string, body []byte) []byte {
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\nUser-Agent: lodestone-bench\r\n"...)
	if body != nil {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(len(body)), 10)
		b = append(b, "\r\n"...)
	}
	b = append(b, "\r\n"...)
	return append(b, body...)
}
