//go:build !linux || 386

package main

import (
	"context"
	"net"
)

// serveOrigin serves the origin on addr with a goroutine per connection
// (origin_epoll.go is the lean one for Linux).
func serveOrigin(ctx context.Context, addr string, size int) error {
	small, big := originResponses(max(size, 1)), originResponses(bigBody)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go serveOriginConn(c, &small, &big)
	}
}

// serveOriginConn answers each request on c, closing it after one that
// asked.
func serveOriginConn(c net.Conn, small, big *[2][]byte) {
	defer c.Close()
	buf := make([]byte, 16<<10)
	r, w, skip := 0, 0, 0
	for {
		if r == w {
			r, w = 0, 0
		} else if w == len(buf) {
			w = copy(buf, buf[r:w])
			r = 0
		}
		if w == len(buf) {
			return // a header longer than the buffer
		}
		n, err := c.Read(buf[w:])
		if err != nil {
			return
		}
		w += n
		var out []byte
		for {
			d := min(skip, w-r)
			r, skip = r+d, skip-d
			req, ok := parseOriginRequest(buf[r:w])
			if skip > 0 || !ok {
				break
			}
			r += req.size
			skip = req.body
			out = append(out, originResponse(req, small, big)...)
			if req.closing {
				c.Write(out)
				return
			}
		}
		if len(out) > 0 {
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	}
}
