package gateway

import (
	"net"
	"syscall"
	"testing"
)

// An accepted client connection has the keep-alive the listener set,
// though net set none on it, and starts with quick ACKs off: the listener
// is plain TCP, so it took TCP_QUICKACK.
func TestListenProxyAcceptedConnOptions(t *testing.T) {
	ln, err := listenProxy("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct{ level, opt, v int }{
		"SO_KEEPALIVE":  {syscall.SOL_SOCKET, syscall.SO_KEEPALIVE, 1},
		"TCP_KEEPIDLE":  {syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE, int(clientKeepAlive.Idle.Seconds())},
		"TCP_KEEPINTVL": {syscall.IPPROTO_TCP, syscall.TCP_KEEPINTVL, int(clientKeepAlive.Interval.Seconds())},
		"TCP_KEEPCNT":   {syscall.IPPROTO_TCP, syscall.TCP_KEEPCNT, clientKeepAlive.Count},
		"TCP_QUICKACK":  {syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 0},
	}
	for name, o := range want {
		var got int
		var gerr error
		if err := rc.Control(func(fd uintptr) { got, gerr = syscall.GetsockoptInt(int(fd), o.level, o.opt) }); err != nil {
			t.Fatal(err)
		}
		if gerr != nil {
			t.Fatalf("%s: %v", name, gerr)
		}
		if got != o.v {
			t.Errorf("%s = %d on the accepted connection, want %d", name, got, o.v)
		}
	}
}
