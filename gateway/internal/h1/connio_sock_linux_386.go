package h1

import "syscall"

// linux/386 reaches recvfrom and sendto through socketcall: read and
// write are the direct calls here (the extra arguments are ignored).
const (
	sysRecv   = syscall.SYS_READ
	sysSend   = syscall.SYS_WRITE
	sendFlags = 0
	msgMore   = 0 // write takes no flags: the shutdown sends the FIN alone
)
