//go:build unix

package httppark

import (
	"errors"
	"net"
	"syscall"
)

// gone reports whether c's peer closed or reset it, by a non-blocking
// peek at its socket. A connection that is not a socket is never gone.
func gone(c any) bool {
	// NB: see through wrappers (a connection limit's, tls.Conn) to the socket.
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
		return true
	}
	var closed bool
	var buf [1]byte
	err = rc.Read(func(fd uintptr) bool {
		n, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case rerr == nil:
			closed = n == 0 // an orderly shutdown reads as 0 bytes
		case errors.Is(rerr, syscall.EAGAIN), errors.Is(rerr, syscall.EINTR):
		default:
			closed = true
		}
		return true // NB: never wait for readiness: this is a poll
	})
	return closed || err != nil
}
