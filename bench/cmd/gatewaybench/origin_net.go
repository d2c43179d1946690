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
	var s originStream
	for {
		if !s.room(buf) {
			return // a header longer than the buffer
		}
		n, err := c.Read(buf[s.w:])
		if err != nil {
			return
		}
		s.w += n
		var out []byte
		for {
			resp, closing, ok := s.next(buf, small, big)
			if !ok {
				break
			}
			out = append(out, resp...)
			if closing {
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
