//go:build linux && !386

package main

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// serveOrigin serves the origin on addr from one epoll loop on one
// thread, with raw non-blocking socket calls: per request one recvfrom,
// one sendto and a share of an epoll_wait, and no goroutine park, wake-up
// or scheduler pass, which a goroutine per connection costs twice per
// request on the core it shares with wrk.
func serveOrigin(ctx context.Context, addr string, size int) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return fmt.Errorf("origin listen address %q: want IPv4 host:port", addr)
	}
	lfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("origin socket: %w", err)
	}
	defer unix.Close(lfd)
	if err := unix.SetsockoptInt(lfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return fmt.Errorf("origin SO_REUSEADDR: %w", err)
	}
	if err := unix.Bind(lfd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		return fmt.Errorf("origin bind %s: %w", addr, err)
	}
	if err := unix.Listen(lfd, 4096); err != nil {
		return fmt.Errorf("origin listen %s: %w", addr, err)
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("origin epoll: %w", err)
	}
	defer unix.Close(ep)
	// The loop blocks in epoll_wait: a pipe in its set wakes it to stop.
	var stop [2]int
	if err := unix.Pipe2(stop[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("origin pipe: %w", err)
	}
	defer unix.Close(stop[0])
	defer unix.Close(stop[1])
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			unix.Write(stop[1], []byte{1})
		case <-done:
		}
	}()
	l := &originLoop{ep: ep, small: originResponses(max(size, 1)), big: originResponses(bigBody)}
	defer l.closeAll()
	for _, fd := range []int{lfd, stop[0]} {
		if err := l.ctl(unix.EPOLL_CTL_ADD, fd, unix.EPOLLIN); err != nil {
			return fmt.Errorf("origin epoll add: %w", err)
		}
	}
	events := make([]unix.EpollEvent, 256)
	for {
		n, err := l.wait(events)
		if err == unix.EINTR || n == 0 {
			runtime.Gosched() // the stop goroutine, the signal handler's
			continue
		}
		if err != nil {
			return fmt.Errorf("origin epoll_wait: %w", err)
		}
		for _, ev := range events[:n] {
			switch fd := int(ev.Fd); fd {
			case stop[0]:
				return nil
			case lfd:
				l.accept(lfd)
			default:
				l.event(fd)
			}
		}
	}
}

// originLoop is the epoll loop's state: its connections by descriptor.
type originLoop struct {
	ep         int
	small, big [2][]byte
	conns      []*originConn
	free       [][]byte // read buffers of closed connections, for new ones
}

// originConn is one client connection of the loop. Level-triggered: it
// waits for input (EPOLLIN) while it has nothing to send, and only for
// room (EPOLLOUT) while a response is not all sent.
type originConn struct {
	fd      int
	in      []byte
	stream  originStream // what of in is parsed
	out     [][]byte     // responses to send: out[head] from sent on, then the rest
	head    int
	sent    int
	writing bool // waiting for EPOLLOUT
	closing bool // close once out is sent
}

// waitTimeout bounds how long wait holds the loop's P without a look at
// the other goroutines.
const waitTimeout = 100 // ms

// wait is epoll_wait as a raw system call: the runtime takes the loop as
// running, not as in a system call. NB: with unix.EpollWait, each wait
// that blocked for one of sysmon's ticks had its P taken and handed to a
// spinning thread, and sysmon kept waking every 20 us while it found such
// waits: each time the origin slept, about two more threads woke on wrk's
// core. A signal (sysmon's preemption, SIGTERM) ends the wait with EINTR.
func (l *originLoop) wait(events []unix.EpollEvent) (int, error) {
	r, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(l.ep), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), waitTimeout, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func (l *originLoop) ctl(op, fd int, events uint32) error {
	return unix.EpollCtl(l.ep, op, fd, &unix.EpollEvent{Events: events, Fd: int32(fd)})
}

// accept takes every pending connection.
func (l *originLoop) accept(lfd int) {
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_ACCEPT4, uintptr(lfd), 0, 0, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
		switch e {
		case 0:
		case unix.EINTR, unix.ECONNABORTED:
			continue
		default:
			return // EAGAIN: none left (EMFILE and the like: the next event retries)
		}
		fd := int(r)
		// As Go's net package does for every TCP connection.
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		if err := l.ctl(unix.EPOLL_CTL_ADD, fd, unix.EPOLLIN); err != nil {
			unix.Close(fd)
			continue
		}
		for fd >= len(l.conns) {
			l.conns = append(l.conns, nil)
		}
		c := &originConn{fd: fd}
		if n := len(l.free); n > 0 {
			c.in, l.free = l.free[n-1], l.free[:n-1]
		} else {
			c.in = make([]byte, 16<<10)
		}
		l.conns[fd] = c
	}
}

// event serves fd's readiness: sends what is pending, or reads and
// answers what arrived.
func (l *originLoop) event(fd int) {
	if fd >= len(l.conns) || l.conns[fd] == nil {
		return
	}
	c := l.conns[fd]
	if c.writing {
		if !c.flush() {
			l.close(c)
			return
		}
		if c.pending() {
			return
		}
		c.writing = false
		if c.closing || l.ctl(unix.EPOLL_CTL_MOD, fd, unix.EPOLLIN) != nil {
			l.close(c)
			return
		}
		l.serve(c) // requests that came meanwhile
		return
	}
	if !c.stream.room(c.in) {
		l.close(c) // a header longer than the buffer
		return
	}
	p := c.in[c.stream.w:]
	n, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), 0, 0, 0)
	switch {
	case e == unix.EAGAIN || e == unix.EINTR:
		return // level-triggered: asked again
	case e != 0 || n == 0:
		l.close(c)
		return
	}
	c.stream.w += int(n)
	l.serve(c)
}

// serve answers the whole requests buffered on c, in order, and sends
// the answers; when they do not all fit in the socket, c waits for room.
func (l *originLoop) serve(c *originConn) {
	for !c.closing {
		resp, closing, ok := c.stream.next(c.in, &l.small, &l.big)
		if !ok {
			break
		}
		c.closing = closing
		c.out = append(c.out, resp)
	}
	if !c.flush() {
		l.close(c)
		return
	}
	switch {
	case c.pending():
		c.writing = true
		if l.ctl(unix.EPOLL_CTL_MOD, c.fd, unix.EPOLLOUT) != nil {
			l.close(c)
		}
	case c.closing:
		l.close(c)
	}
}

func (c *originConn) pending() bool { return c.head < len(c.out) }

// flush sends c.out until it is all sent or the socket is full; false on
// an error.
func (c *originConn) flush() bool {
	for c.pending() {
		p := c.out[c.head][c.sent:]
		n, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(c.fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)), unix.MSG_NOSIGNAL, 0, 0)
		switch e {
		case 0:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return true
		default:
			return false
		}
		if c.sent += int(n); c.sent == len(c.out[c.head]) {
			c.out[c.head] = nil
			c.head, c.sent = c.head+1, 0
		}
	}
	c.out, c.head = c.out[:0], 0
	return true
}

func (l *originLoop) close(c *originConn) {
	unix.Close(c.fd) // NB: also leaves the epoll set
	l.conns[c.fd] = nil
	// NB: a client opening a connection per request (the newconn shape
	// without a proxy) would otherwise cost a buffer's allocation and
	// collection per request on wrk's core.
	l.free = append(l.free, c.in)
}

func (l *originLoop) closeAll() {
	for _, c := range l.conns {
		if c != nil {
			l.close(c)
		}
	}
}
