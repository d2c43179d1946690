//go:build unix

package gateway

import (
	"net"
	"syscall"
)

// clientGone reports whether the client closed or reset c, without taking
// anything it sent (a pipelined request stays for the connection's
// reads). It may run while another goroutine reads c.
func clientGone(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	rc.Control(func(fd uintptr) {
		var b [1]byte
		for {
			// NB: the descriptor is non-blocking: nothing to read is EAGAIN.
			n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
			if err == syscall.EINTR {
				continue
			}
			gone = err == nil && n == 0 || err != nil && err != syscall.EAGAIN && err != syscall.EWOULDBLOCK
			return
		}
	})
	return gone
}
