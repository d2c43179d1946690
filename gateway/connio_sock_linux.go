//go:build linux && !386

package gateway

import "syscall"

// The fast path's socket syscalls: recvfrom and sendto without an
// address, not read and write. NB: read and write go through the VFS
// first (file position lock, access checks, the iterator wrappers), which
// cost ~1.5% of a proxy core per side on the benchmark's requests; the
// socket calls go straight to the socket, as nginx's recv does.
// MSG_NOSIGNAL: a closed peer is EPIPE, without a SIGPIPE for the runtime
// to field.
const (
	sysRecv   = syscall.SYS_RECVFROM
	sysSend   = syscall.SYS_SENDTO
	sendFlags = syscall.MSG_NOSIGNAL
)
