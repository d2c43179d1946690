//go:build linux && (amd64 || arm64)

package raftlog

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// diskWait makes a file's fdatasync a Linux AIO request (IOCB_CMD_FDSYNC,
// kernels 4.18 and later) whose completion the kernel signals on an
// eventfd that Go's poller watches. The goroutine waiting for the disk then
// parks as one waiting for the network does, instead of holding its P
// inside a blocking system call until the runtime hands the P on. On a
// server run with one P (a process pinned to one CPU, or a one-CPU quota)
// a plain fdatasync stopped every request goroutine for as long as the
// disk took; running two Ps hid that, at the price of a second thread
// contending for the one CPU on every other request (measured in the
// commit that brought this file).
//
// With more than one P the fdatasync is a plain system call: the other Ps
// run meanwhile, and the thread in it is woken by the disk's completion
// itself instead of by the poller, which hands the goroutine on to a
// thread of its own (the figures are in the commit that brought this
// rule).
//
// Where the kernel refuses the request (no AIO, a seccomp filter without
// it, a kernel before 4.18 or a file without fsync) the first Datasync
// finds out and every later one is a plain fdatasync.
type diskWait struct {
	mu    sync.Mutex
	aio   *aioContext // nil until the first Datasync, and after close
	plain bool        // AIO refused: plain fdatasync from now on
}

// datasync flushes fd's data, parked where the process runs one P.
func (d *diskWait) datasync(fd int) error {
	if runtime.GOMAXPROCS(0) > 1 {
		return datasync(fd)
	}
	return d.park(fd)
}

// park flushes fd's data through AIO where it can.
func (d *diskWait) park(fd int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.plain {
		return datasync(fd)
	}
	if d.aio == nil {
		a, err := newAIOContext()
		if err != nil {
			d.plain = true
			return datasync(fd)
		}
		d.aio = a
	}
	submitted, err := d.aio.fdatasync(fd)
	if !submitted {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
			d.plain = true
		}
		return datasync(fd)
	}
	return err
}

// usesAIO reports whether datasync goes through AIO: a context is open
// and the kernel has not refused it.
func (d *diskWait) usesAIO() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.aio != nil && !d.plain
}

// close releases the AIO context and its eventfd; a later datasync is
// plain.
func (d *diskWait) close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.plain = true
	if d.aio == nil {
		return nil
	}
	err := d.aio.close()
	d.aio = nil
	return err
}

// The kernel's AIO ABI (include/uapi/linux/aio_abi.h) on a little-endian
// machine.
const (
	iocbCmdFdsync = 3
	iocbFlagResfd = 1 << 0
)

// iocb is struct iocb: 64 bytes, aio_key before aio_rw_flags.
type iocb struct {
	data      uint64
	key       uint32
	rwFlags   uint32
	opcode    uint16
	reqprio   int16
	fildes    uint32
	buf       uint64
	nbytes    uint64
	offset    int64
	reserved2 uint64
	flags     uint32
	resfd     uint32
}

// ioEvent is struct io_event.
type ioEvent struct {
	data uint64
	obj  uint64
	res  int64
	res2 int64
}

// aioContext is one AIO context with room for one request, and the
// eventfd its completions are signalled on.
type aioContext struct {
	id    uintptr  // aio_context_t
	done  *os.File // the eventfd, non-blocking, so in Go's poller
	doneN int      // its descriptor, for the iocb
	count [8]byte
}

func newAIOContext() (*aioContext, error) {
	var id uintptr
	if _, _, e := unix.Syscall(unix.SYS_IO_SETUP, 1, uintptr(unsafe.Pointer(&id)), 0); e != 0 {
		return nil, fmt.Errorf("io_setup: %w", e)
	}
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		_, _, _ = unix.Syscall(unix.SYS_IO_DESTROY, id, 0, 0)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &aioContext{id: id, done: os.NewFile(uintptr(fd), "aio-completions"), doneN: fd}, nil
}

// fdatasync submits one IOCB_CMD_FDSYNC of fd and parks until it
// completes. submitted false means the kernel refused the request, with
// nothing done: err says why.
func (a *aioContext) fdatasync(fd int) (submitted bool, err error) {
	cb := iocb{opcode: iocbCmdFdsync, fildes: uint32(fd), flags: iocbFlagResfd, resfd: uint32(a.doneN)}
	cbs := [1]*iocb{&cb}
	// NB: io_submit copies the iocb; the kernel keeps no pointer into cbs.
	n, _, e := unix.Syscall(unix.SYS_IO_SUBMIT, a.id, 1, uintptr(unsafe.Pointer(&cbs[0])))
	if e != 0 {
		return false, e
	}
	if n != 1 {
		return false, fmt.Errorf("io_submit: %d of 1 requests submitted", n)
	}
	for {
		if _, err := a.done.Read(a.count[:]); err != nil {
			return true, fmt.Errorf("wait for fdatasync: %w", err)
		}
		var ev ioEvent
		var noWait unix.Timespec // the eventfd said it is there
		got, _, e := unix.Syscall6(unix.SYS_IO_GETEVENTS, a.id, 1, 1, uintptr(unsafe.Pointer(&ev)), uintptr(unsafe.Pointer(&noWait)), 0)
		if e != 0 {
			return true, fmt.Errorf("io_getevents: %w", e)
		}
		if got == 1 {
			if ev.res < 0 {
				return true, syscall.Errno(-ev.res)
			}
			return true, nil
		}
	}
}

func (a *aioContext) close() error {
	var err error
	if _, _, e := unix.Syscall(unix.SYS_IO_DESTROY, a.id, 0, 0); e != 0 {
		err = fmt.Errorf("io_destroy: %w", e)
	}
	return errors.Join(err, a.done.Close())
}
