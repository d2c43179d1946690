package dnsapi

import "net"

// singleConn reads and writes one datagram per call; zero allocations
// per datagram (netip addresses).
type singleConn struct{ c *net.UDPConn }

func newSingleConn(c *net.UDPConn) (batchConn, error) { return singleConn{c}, nil }

func (s singleConn) read(ds []datagram) (int, error) {
	n, addr, err := s.c.ReadFromUDPAddrPort(ds[0].b)
	if err != nil {
		return 0, err
	}
	ds[0].b, ds[0].addr = ds[0].b[:n], addr
	return 1, nil
}

func (s singleConn) write(ds []datagram) error {
	var first error
	for _, d := range ds {
		if _, err := s.c.WriteToUDPAddrPort(d.b, d.addr); err != nil && first == nil {
			first = err
		}
	}
	return first
}
