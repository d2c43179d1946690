//go:build !linux

package gateway

import (
	"net"
	"syscall"
)

const inheritKeepAlive = false

func setListenerKeepAlive(string, string, syscall.RawConn) error { return nil }

func delayFirstAck(*net.TCPListener) {}
