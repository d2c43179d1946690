//go:build !linux

package gateway

import "syscall"

const inheritKeepAlive = false

func setListenerKeepAlive(string, string, syscall.RawConn) error { return nil }
