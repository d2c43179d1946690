package h1

import (
	"bufio"
	"net"
	"runtime"
	"syscall"
)

// connIO is a TCP connection as this package reads and writes it (the
// client side in server.go, the origin side in client.go). It differs
// from the net.Conn in two ways, both for the cost of syscalls, which on
// the virtual machines the gateway runs on is more than parsing a
// request:
//
//   - A read that follows a read that emptied the socket yields to the
//     other goroutines first. NB: both sides of a proxied request read
//     right after writing: the origin's response is never there yet
//     right after the request is written, nor the client's next request
//     right after the response. Reading at once costs a syscall that
//     fails with EAGAIN, a park and a wake-up by the poller, then a
//     second read. Under load, the other connections' work runs
//     meanwhile and the data is there when this goroutine runs again;
//     when nothing else is runnable the yield returns at once. (Waiting
//     for readiness before the first read is not possible on a net.Conn:
//     every read resets the poller's readiness before it starts. So a
//     request to an origin is written inside the wait for its answer,
//     see flushAwait, and on Linux a client connection is served from
//     inside one long wait, see conn.serveRaw; the yield is left to body
//     reads and to platforms without raw access.)
//   - On Linux the socket syscalls are raw (connio_linux.go): the
//     descriptor is non-blocking, so a syscall never blocks, and the
//     runtime's syscall bookkeeping only invited the scheduler's monitor
//     to hand the processor to another thread in the middle of a write
//     (a thread switch, then futex wake-ups to switch back).
//
// Deadlines, Close, the poller's waits and the errors' Timeout() are the
// net.Conn's (through its syscall.RawConn). Reads and writes may run
// concurrently, each by one goroutine at a time.
type connIO struct {
	c  net.Conn
	rc syscall.RawConn // nil: use c's Read and Write

	// drained reports that the last read found the socket empty after
	// it. Set false whenever something else may have read the socket.
	drained bool
	// writeWaited reports that a write since the user cleared it waited
	// for room in the socket's buffer (or may have: not raw).
	writeWaited bool

	// fd is the socket while its owner keeps it open (-1: unknown): reads
	// and writes then try the syscall before the RawConn, whose locking
	// and readiness reset cost more than the syscall's own overhead. The
	// RawConn still does every wait, so deadlines and Close end waits as
	// before. NB: without the RawConn's reference, a Close by another
	// goroutine could free the number for another socket meanwhile: fd
	// is set only where no other goroutine closes the connection (an
	// origin connection is closed by its one user; a client connection's
	// descriptor is held by the RawConn.Read its loop runs in).
	fd int
	// ready reports that the poller said the socket is readable since
	// the last read (flushAwait): the next read tries the syscall first.
	ready bool

	// Made once, as a method value per call would allocate; readFn and
	// sendFn on first use, since a client connection seldom or never
	// uses them and one that carries a single request pays for each.
	readFn, writeFn func(fd uintptr) bool
	sendFn          func(fd uintptr) bool
	more            bool          // writes go with MSG_MORE (flushLast)
	sendW           *bufio.Writer // what sendFn flushes, and how it went
	sent            bool
	sendErr         error
	rp              []byte
	rn              int
	rerr            syscall.Errno
	wp              []byte
	wn              int
	werr            syscall.Errno
}

// newConnIO returns the connIO of c; raw is the connection c wraps (c
// itself unless c is a wrapper, such as one that counts Close).
func newConnIO(c, raw net.Conn) *connIO {
	x := &connIO{c: c, fd: -1}
	if rawIO {
		if sc, ok := raw.(syscall.Conn); ok {
			if rc, err := sc.SyscallConn(); err == nil {
				x.rc = rc
				x.writeFn = x.writeRaw
			}
		}
	}
	return x
}

// own sets x.fd for a connection only its one user closes.
func (x *connIO) own() {
	if x.rc != nil {
		x.rc.Control(func(fd uintptr) { x.fd = int(fd) })
	}
}

func (x *connIO) Read(p []byte) (int, error) {
	if x.drained {
		runtime.Gosched()
	}
	n, err := x.read(p)
	x.drained = err == nil && n < len(p)
	return n, err
}

func (x *connIO) Write(p []byte) (int, error) {
	if x.rc == nil {
		x.writeWaited = true
		return x.c.Write(p)
	}
	x.wp, x.wn, x.werr = p, 0, 0
	var err error
	if x.fd < 0 || !x.writeRaw(uintptr(x.fd)) {
		err = x.rc.Write(x.writeFn) // NB: goes on from wn
	}
	n := x.wn
	x.wp = nil
	if err == nil && x.werr != 0 {
		err = &net.OpError{Op: "write", Net: "tcp", Source: x.c.LocalAddr(), Addr: x.c.RemoteAddr(), Err: syscallError("write", x.werr)}
	}
	return n, err
}

// tryRead reads into p what the socket holds, without waiting: 0 when it
// holds nothing, or on EOF or an error, which the next Read reports.
func (x *connIO) tryRead(p []byte) int {
	if x.rc == nil || x.fd < 0 || len(p) == 0 {
		return 0
	}
	n, e := readFD(uintptr(x.fd), p)
	if e != 0 || n <= 0 {
		return 0
	}
	x.drained = n < len(p)
	return n
}

// writeTwo writes a, then b: with one syscall when the socket takes
// both at once (a response's header and a large first piece of its body,
// which a buffered writer would send as two packets or more), else with
// Write for what is left.
func (x *connIO) writeTwo(a, b []byte) error {
	if x.rc != nil && x.fd >= 0 && len(a) > 0 && len(b) > 0 {
		iov := [2]syscall.Iovec{{Base: &a[0]}, {Base: &b[0]}}
		iov[0].SetLen(len(a))
		iov[1].SetLen(len(b))
		for {
			n, e := sendv(uintptr(x.fd), iov[:])
			switch e {
			case syscall.EINTR:
				continue
			case 0:
				if n >= len(a) {
					a, b = nil, b[n-len(a):]
				} else {
					a = a[n:]
				}
			case syscall.EAGAIN:
				// Write waits for room.
			default:
				return &net.OpError{Op: "write", Net: "tcp", Source: x.c.LocalAddr(), Addr: x.c.RemoteAddr(), Err: syscallError("writev", e)}
			}
			break
		}
	}
	if len(a) > 0 {
		if _, err := x.Write(a); err != nil {
			return err
		}
	}
	if len(b) > 0 {
		_, err := x.Write(b)
		return err
	}
	return nil
}

// flushLast flushes w, a writer onto x, for the last time, then shuts
// x's write side. NB: on Linux the bytes go with MSG_MORE, so the kernel
// holds their tail until the shutdown adds the FIN to it: a response that
// ends its connection leaves as one packet, response and FIN, where it
// took two, and the client acknowledges both at once. For clients that
// open a connection per request that is two packets fewer on each side.
// The shutdown, unlike a close, also sends what is held when the client
// sent more than it was answered (close would reset the connection).
func (x *connIO) flushLast(w *bufio.Writer) error {
	if x.rc == nil || x.fd < 0 {
		return w.Flush()
	}
	x.more = true
	err := w.Flush()
	x.more = false
	if err != nil {
		return err
	}
	return x.shutWrite()
}

// flushAwait flushes w, a writer onto x, and waits until x has something
// to read: for a request whose answer cannot come before it is sent.
// NB: a read right after the write costs a syscall that fails with EAGAIN
// (the peer has not answered yet) and a park; the yield before it
// (Read) only sometimes lets the answer arrive first. Here the write runs
// inside the wait: RawConn.Read forgets the poller's readiness before its
// first callback, and every readiness from then on, the answer's included,
// ends the wait, so nothing needs reading to find out. The read that
// follows finds the answer (or the error or EOF that ended the wait).
//
// It first yields to the other connections' goroutines. NB: sent the
// moment each was ready, the requests of a busy gateway reached an origin
// one at a time, a wake-up of the origin's poller each; after the yield
// they leave together, and an origin's wait returns several, as behind
// HAProxy's event loop: fewer wake-ups, less of the origin's CPU a
// request. With nothing else runnable the yield returns at once.
func (x *connIO) flushAwait(w *bufio.Writer) error {
	if x.rc == nil {
		return w.Flush()
	}
	runtime.Gosched()
	x.sendW, x.sent, x.sendErr = w, false, nil
	if x.sendFn == nil {
		x.sendFn = x.sendThenWait
	}
	err := x.rc.Read(x.sendFn)
	x.sendW = nil
	x.drained = false
	if x.sendErr != nil {
		return x.sendErr
	}
	x.ready = err == nil
	return err
}

// sendThenWait is flushAwait's RawConn.Read callback: the first call
// writes and asks to wait (false) unless the write failed; the next one,
// after readiness, ends the wait.
func (x *connIO) sendThenWait(uintptr) bool {
	if x.sent {
		return true
	}
	x.sent = true
	x.sendErr = x.sendW.Flush()
	return x.sendErr != nil
}
