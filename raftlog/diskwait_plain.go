//go:build !(linux && (amd64 || arm64))

package raftlog

// diskWait is a plain fdatasync where Linux AIO is not used
// (diskwait_aio.go says why it is where it is).
type diskWait struct{}

func (*diskWait) datasync(fd int) error { return datasync(fd) }

func (*diskWait) park(fd int) error { return datasync(fd) }

func (*diskWait) usesAIO() bool { return false }

func (*diskWait) close() error { return nil }
