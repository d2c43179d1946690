// Package prefixconn puts back bytes already read from a connection: a
// server that looked at what a client sent first (to route it, or to see
// whether it may serve it) hands the connection on with those bytes still
// to be read.
package prefixconn

import (
	"errors"
	"net"
)

// Conn reads Prefix first, then from the connection.
type Conn struct {
	net.Conn
	Prefix []byte
}

func (c *Conn) Read(b []byte) (int, error) {
	if len(c.Prefix) == 0 {
		return c.Conn.Read(b)
	}
	n := copy(b, c.Prefix)
	c.Prefix = c.Prefix[n:]
	return n, nil
}

// NetConn returns the connection underneath, for those that must look at
// the socket itself.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// CloseWrite half-closes the connection underneath (errors.ErrUnsupported
// if it cannot). NB: net/http half-closes a connection before closing it
// after an error response, so that the client reads that response before
// the close; without this method a connection handed on with a prefix
// would be closed outright where the same connection without one is not.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
