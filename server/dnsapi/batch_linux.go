//go:build linux

package dnsapi

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// newBatchConn reads with recvmmsg and writes with sendmmsg: under load
// a reader finds several questions waiting, and one call for all of them
// costs less than one each. Written here rather than taken from
// golang.org/x/net/ipv4's ReadBatch, which allocates an address per
// datagram, as the fast path must not.
var newBatchConn = newMmsgConn

// mmsghdr is struct mmsghdr: Go's alignment pads it as C's does.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

// mmsgConn holds one reader's headers; it is not safe for concurrent use.
type mmsgConn struct {
	rc    syscall.RawConn
	hs    [batchSize]mmsghdr
	iovs  [batchSize]unix.Iovec
	names [batchSize]unix.RawSockaddrInet6 // large enough for IPv4 too

	// The current call's arguments and results, so that the functions
	// handed to rc are made once (a closure per call would allocate).
	off, vlen int
	done      int
	errno     syscall.Errno
	readFn    func(uintptr) bool
	writeFn   func(uintptr) bool
}

func newMmsgConn(c *net.UDPConn) (batchConn, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("DNS UDP socket: %w", err)
	}
	m := &mmsgConn{rc: rc}
	m.readFn, m.writeFn = m.recv, m.send
	return m, nil
}

// prepare points header i at buffer b and name i.
func (m *mmsgConn) prepare(i int, b []byte, namelen uint32) {
	m.iovs[i].Base = unsafe.SliceData(b)
	m.iovs[i].SetLen(len(b))
	h := &m.hs[i].hdr
	h.Name = (*byte)(unsafe.Pointer(&m.names[i]))
	h.Namelen = namelen
	h.Iov = &m.iovs[i]
	h.SetIovlen(1)
	h.Control = nil
	h.SetControllen(0)
	h.Flags = 0
	m.hs[i].n = 0
}

func (m *mmsgConn) read(ds []datagram) (int, error) {
	n := min(len(ds), batchSize)
	for i := range n {
		m.prepare(i, ds[i].b, unix.SizeofSockaddrInet6)
	}
	m.off, m.vlen = 0, n
	if err := m.rc.Read(m.readFn); err != nil {
		return 0, err
	}
	if m.errno != 0 {
		return 0, os.NewSyscallError("recvmmsg", m.errno)
	}
	for i := range m.done {
		ds[i].b = ds[i].b[:m.hs[i].n]
		ds[i].addr = addrPortOf(&m.names[i])
	}
	return m.done, nil
}

func (m *mmsgConn) recv(fd uintptr) bool { return m.mmsg(unix.SYS_RECVMMSG, fd) }

func (m *mmsgConn) send(fd uintptr) bool { return m.mmsg(unix.SYS_SENDMMSG, fd) }

// mmsg makes one recvmmsg or sendmmsg call (trap) over hs[off:off+vlen]
// for RawConn.Read or Write: false asks it to wait until fd is ready.
func (m *mmsgConn) mmsg(trap, fd uintptr) bool {
	for {
		r, _, e := unix.Syscall6(trap, fd, uintptr(unsafe.Pointer(&m.hs[m.off])), uintptr(m.vlen), 0, 0, 0)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		m.done, m.errno = int(r), e
		return true
	}
}

func (m *mmsgConn) write(ds []datagram) error {
	n := min(len(ds), batchSize)
	for i := range n {
		m.prepare(i, ds[i].b, putSockaddr(&m.names[i], ds[i].addr))
	}
	var first error
	for sent := 0; sent < n; {
		m.off, m.vlen = sent, n-sent
		if err := m.rc.Write(m.writeFn); err != nil {
			return err
		}
		if m.errno != 0 {
			// NB: the datagram at sent was refused; the rest may go.
			if first == nil {
				first = os.NewSyscallError("sendmmsg", m.errno)
			}
			sent++
			continue
		}
		sent += m.done
	}
	return first
}

// addrPortOf reads a sockaddr the kernel wrote.
func addrPortOf(sa *unix.RawSockaddrInet6) netip.AddrPort {
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), port(&sa4.Port))
	case unix.AF_INET6:
		a := netip.AddrFrom16(sa.Addr)
		if sa.Scope_id != 0 {
			a = a.WithZone(strconv.FormatUint(uint64(sa.Scope_id), 10))
		}
		return netip.AddrPortFrom(a, port(&sa.Port))
	}
	return netip.AddrPort{}
}

// port reads a port in network byte order.
func port(p *uint16) uint16 { return binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(p))[:]) }

func setPort(p *uint16, v uint16) { binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(p))[:], v) }

// putSockaddr writes a as a sockaddr into sa and returns its length.
func putSockaddr(sa *unix.RawSockaddrInet6, a netip.AddrPort) uint32 {
	ip := a.Addr()
	if ip.Is4() {
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		*sa4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ip.As4()}
		setPort(&sa4.Port, a.Port())
		return unix.SizeofSockaddrInet4
	}
	*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: ip.As16()}
	if z := ip.Zone(); z != "" {
		if id, err := strconv.ParseUint(z, 10, 32); err == nil {
			sa.Scope_id = uint32(id)
		} else if ifi, err := net.InterfaceByName(z); err == nil {
			sa.Scope_id = uint32(ifi.Index)
		}
	}
	setPort(&sa.Port, a.Port())
	return unix.SizeofSockaddrInet6
}
