package gateway

import (
	"net"
	"syscall"
)

// inheritKeepAlive: accepted sockets inherit SO_KEEPALIVE, TCP_KEEPIDLE,
// TCP_KEEPINTVL and TCP_KEEPCNT from the listening socket.
const inheritKeepAlive = true

// setListenerKeepAlive sets clientKeepAlive on the listening socket
// (a net.ListenConfig.Control).
func setListenerKeepAlive(network, address string, c syscall.RawConn) error {
	var err error
	cerr := c.Control(func(fd uintptr) {
		for _, o := range []struct{ level, opt, v int }{
			{syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
			{syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, int(clientKeepAlive.Idle.Seconds())},
			{syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, int(clientKeepAlive.Interval.Seconds())},
			{syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, clientKeepAlive.Count},
		} {
			if err = syscall.SetsockoptInt(int(fd), o.level, o.opt, o.v); err != nil {
				return
			}
		}
	})
	if cerr != nil {
		return cerr
	}
	return err
}

// delayFirstAck turns quick ACKs off on the listening socket, and accepted
// sockets inherit it: the ACK of a new connection's first request then
// leaves with the response instead of in a packet of its own, as behind
// HAProxy's HTTP listeners. A client that opens a connection per request
// otherwise costs a packet more each time, sent and received on the
// client's side too. The price, as HAProxy's: a client that sends a body
// in small writes without TCP_NODELAY may wait for one delayed ACK
// (40 ms) on a connection, after which the kernel leaves that mode.
// Best effort: a kernel that refuses it costs only that packet
// (listen_linux_test.go checks this one does not).
// NB: after listen(2), which resets the ACK state set before it.
func delayFirstAck(ln *net.TCPListener) {
	if rc, err := ln.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 0)
		})
	}
}
