package h1

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

const rawIO = true

func (x *connIO) read(p []byte) (int, error) {
	if x.rc == nil || len(p) == 0 {
		return x.c.Read(p)
	}
	x.rp, x.rn, x.rerr = p, 0, 0
	var err error
	if !x.ready || x.fd < 0 || !x.readRaw(uintptr(x.fd)) {
		if x.readFn == nil {
			x.readFn = x.readRaw
		}
		err = x.rc.Read(x.readFn)
	}
	x.ready = false
	n := x.rn
	x.rp = nil
	switch {
	case err != nil:
		return 0, err // a deadline or Close ended the wait
	case x.rerr != 0:
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: x.c.LocalAddr(), Addr: x.c.RemoteAddr(), Err: syscallError("read", x.rerr)}
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// readFD reads from the non-blocking socket fd into p (not empty).
func readFD(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall6(sysRecv, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), 0, 0, 0)
	return int(n), e
}

// readRaw is RawConn.Read's callback: false waits for readiness.
func (x *connIO) readRaw(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall6(sysRecv, fd, uintptr(unsafe.Pointer(&x.rp[0])), uintptr(len(x.rp)), 0, 0, 0)
		switch e {
		case 0:
			x.rn = int(n)
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		x.rerr = e
		return true
	}
}

// writeRaw is RawConn.Write's callback: it writes all of wp, waiting for
// room (false) when the socket's buffer is full.
func (x *connIO) writeRaw(fd uintptr) bool {
	flags := uintptr(sendFlags)
	if x.more {
		flags |= msgMore
	}
	for x.wn < len(x.wp) {
		n, _, e := syscall.RawSyscall6(sysSend, fd, uintptr(unsafe.Pointer(&x.wp[x.wn])), uintptr(len(x.wp)-x.wn), flags, 0, 0)
		switch e {
		case 0:
			x.wn += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			x.writeWaited = true
			return false
		default:
			x.werr = e
			return true
		}
	}
	return true
}

func syscallError(op string, e syscall.Errno) error { return os.NewSyscallError(op, e) }

// shutWrite shuts the write side of x's socket (x.fd), sending the FIN.
func (x *connIO) shutWrite() error {
	if err := syscall.Shutdown(x.fd, syscall.SHUT_WR); err != nil {
		return &net.OpError{Op: "shutdown", Net: "tcp", Source: x.c.LocalAddr(), Addr: x.c.RemoteAddr(), Err: os.NewSyscallError("shutdown", err)}
	}
	return nil
}

// sendv sends the buffers iov names with one writev. NB: writev has no
// MSG_NOSIGNAL; a closed peer raises SIGPIPE, which the runtime ignores
// for sockets, and the call fails with EPIPE.
func sendv(fd uintptr, iov []syscall.Iovec) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
	return int(n), e
}
