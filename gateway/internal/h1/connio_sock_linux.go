//go:build linux && !386

package h1

import "syscall"

// The socket syscalls of connIO: recvfrom and sendto without an address,
// not read and write. NB: read and write go through the VFS first (file
// position lock, access checks, the iterator wrappers), which showed in
// the proxy's profile on both sides; the socket calls go straight to the
// socket, as nginx's recv does.
// MSG_NOSIGNAL: a closed peer is EPIPE, without a SIGPIPE for the runtime
// to field.
const (
	sysRecv   = syscall.SYS_RECVFROM
	sysSend   = syscall.SYS_SENDTO
	sendFlags = syscall.MSG_NOSIGNAL
	msgMore   = syscall.MSG_MORE
)
