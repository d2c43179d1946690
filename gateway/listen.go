package gateway

import (
	"context"
	"net"
	"time"
)

// clientKeepAlive is the TCP keep-alive of client connections: net's
// default for accepted connections (first probe after 15s idle, then
// every 15s, 9 probes).
var clientKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 15 * time.Second, Count: 9}

// listenProxy listens on addr for the proxy's client connections, with
// clientKeepAlive on every connection it accepts.
//
// NB: on Linux an accepted socket inherits the listening socket's
// keep-alive options, so they are set once on the listener
// (listen_linux.go) and net is told not to set them again on each
// accepted connection: four setsockopt calls per connection, a share of
// the accept path worth saving for clients that open a connection per
// request. Elsewhere net sets them per connection as usual. For the same
// clients the listener is plain TCP, not the Multipath TCP that net
// listens with by default: a Multipath TCP listener takes no TCP_QUICKACK
// (see delayFirstAck), and no proxied client speaks it.
func listenProxy(addr string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAliveConfig: clientKeepAlive}
	lc.SetMultipathTCP(false)
	if inheritKeepAlive {
		lc.KeepAlive = -1
		lc.KeepAliveConfig = net.KeepAliveConfig{}
		lc.Control = setListenerKeepAlive
	}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	delayFirstAck(ln.(*net.TCPListener))
	return ln, nil
}
