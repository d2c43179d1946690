//go:build unix

// Package peerclosed tells whether the peer of a connection nobody is
// reading has closed or reset it, without taking anything it sent.
// Servers that hold idle client connections without a reader (a
// gateway's held request, a parked blocking query) use it to free them.
package peerclosed

import (
	"net"
	"syscall"
)

// Closed reports whether c's peer closed or reset it. A pipelined request
// waiting in the socket is not a close, and stays for the connection's
// reads. It sees through wrappers that expose their connection with
// NetConn (tls.Conn's, a connection limit's); for anything that is not a
// socket it reports false. It may run while another goroutine reads c.
func Closed(c net.Conn) bool {
	for {
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = u.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	rc.Control(func(fd uintptr) {
		var b [1]byte
		for {
			// NB: the descriptor is non-blocking: nothing to read is EAGAIN.
			n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
			if err == syscall.EINTR {
				continue
			}
			closed = err == nil && n == 0 || err != nil && err != syscall.EAGAIN && err != syscall.EWOULDBLOCK
			return
		}
	})
	return closed
}
