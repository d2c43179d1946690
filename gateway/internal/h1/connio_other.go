//go:build !linux

package h1

import (
	"os"
	"syscall"
)

// rawIO is false: connIO uses the net.Conn's Read and Write.
const rawIO = false

func (x *connIO) read(p []byte) (int, error) { return x.c.Read(p) }

func (x *connIO) readRaw(fd uintptr) bool  { return true }
func (x *connIO) writeRaw(fd uintptr) bool { return true }

// readFD is never called: without rawIO no connIO has a RawConn.
func readFD(fd uintptr, p []byte) (int, syscall.Errno) { return 0, syscall.EINVAL }

// sendv is never called: without rawIO no connIO has a RawConn.
func sendv(fd uintptr, iov []syscall.Iovec) (int, syscall.Errno) { return 0, syscall.EINVAL }

// shutWrite is never called: without rawIO no connIO has a RawConn.
func (x *connIO) shutWrite() error { return nil }

func syscallError(op string, e syscall.Errno) error { return os.NewSyscallError(op, e) }
