package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// queryConn is one query's keep-alive HTTP/1.1 connection to its server,
// written and read by the query's own goroutine.
//
// NB: not http.Client, whose Transport keeps two goroutines per
// connection (its read and write loops) and hands every response across
// channels: three goroutines a query and their wake-ups per answer. The
// query processes share a core with the learners they query (README,
// "Layout"), and at 50,000 queries that client took about as much of the
// core as the four learners together; what it spent, the learners under
// test did not get. The request is a GET as Consul's Go client sends it,
// uncompressed; the response is read by net/http's own parser.
type queryConn struct {
	dialer *net.Dialer
	addr   string // host:port
	head   []byte // reused request buffer

	mu     sync.Mutex
	c      net.Conn
	br     *bufio.Reader
	closed bool
}

func newQueryConn(dialer *net.Dialer, addr string) *queryConn {
	return &queryConn{dialer: dialer, addr: addr}
}

// get sends GET target on the connection (dialling one if it has none)
// and reads the answer by deadline. It returns the status, the
// X-Consul-Index header and the body. On any error the connection is
// closed, and the next get dials again.
func (qc *queryConn) get(ctx context.Context, target string, deadline time.Time) (status int, index string, body []byte, err error) {
	c, br, err := qc.conn(ctx)
	if err != nil {
		return 0, "", nil, err
	}
	defer func() {
		if err != nil {
			qc.drop(c)
		}
	}()
	if err := c.SetDeadline(deadline); err != nil {
		return 0, "", nil, err
	}
	qc.head = append(append(append(append(qc.head[:0], "GET "...), target...), " HTTP/1.1\r\nHost: "...), qc.addr...)
	qc.head = append(qc.head, "\r\nUser-Agent: blockingbench\r\n\r\n"...)
	if _, err := c.Write(qc.head); err != nil {
		return 0, "", nil, err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return 0, "", nil, err
	}
	body, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, "", nil, fmt.Errorf("read body: %w", err)
	}
	if resp.Close {
		qc.drop(c)
	}
	return resp.StatusCode, resp.Header.Get("X-Consul-Index"), body, nil
}

// conn returns the open connection, dialling one if there is none.
func (qc *queryConn) conn(ctx context.Context) (net.Conn, *bufio.Reader, error) {
	qc.mu.Lock()
	c, br, closed := qc.c, qc.br, qc.closed
	qc.mu.Unlock()
	if closed {
		return nil, nil, net.ErrClosed
	}
	if c != nil {
		return c, br, nil
	}
	c, err := qc.dialer.DialContext(ctx, "tcp", qc.addr)
	if err != nil {
		return nil, nil, err
	}
	qc.mu.Lock()
	defer qc.mu.Unlock()
	if qc.closed {
		c.Close()
		return nil, nil, net.ErrClosed
	}
	if qc.br == nil {
		qc.br = bufio.NewReaderSize(c, 4096)
	} else {
		qc.br.Reset(c)
	}
	qc.c = c
	return c, qc.br, nil
}

// drop closes c if it is still the open connection.
func (qc *queryConn) drop(c net.Conn) {
	qc.mu.Lock()
	if qc.c == c {
		qc.c = nil
	}
	qc.mu.Unlock()
	c.Close()
}

// close closes the connection, cutting off a request in flight, and
// refuses every later get.
func (qc *queryConn) close() {
	qc.mu.Lock()
	qc.closed = true
	c := qc.c
	qc.c = nil
	qc.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// blockingTarget is the request target of a read of path: ?wait always,
// ?index when waiting on one, as Consul's client sends them.
func blockingTarget(path string, wait time.Duration, index uint64) string {
	t := path + "?wait=" + strconv.FormatInt(wait.Milliseconds(), 10) + "ms"
	if index > 0 {
		t += "&index=" + strconv.FormatUint(index, 10)
	}
	return t
}
