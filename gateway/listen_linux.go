package gateway

import (
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
