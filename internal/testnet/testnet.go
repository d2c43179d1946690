// Package testnet hands tests addresses to listen on that are free now and
// will not be taken by the kernel for an outgoing connection meanwhile, and
// connected loopback TCP pairs, and scripted loopback servers.
//
// NB: the usual trick (listen on :0, close, reuse the port) hands out a
// port from the ephemeral range, which the kernel may give to any outgoing
// connection of any process before the test binds it again; with a suite
// full of servers that showed up as "address already in use". Ports here
// come from below the ephemeral range (Linux's default starts at 32768),
// walked from a random start so parallel test binaries rarely meet.
package testnet

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
)

const lowPort, highPort = 20000, 32000

var (
	mu   sync.Mutex
	next int
)

// FreeAddr returns a 127.0.0.1 address whose TCP port is free now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return FreeAddrOn(t, "127.0.0.1", false)
}

// FreeAddrOn returns an address on ip whose TCP port (and, with udp, the
// same UDP port) is free now. Each call in a process returns a new port.
func FreeAddrOn(t testing.TB, ip string, udp bool) string {
	t.Helper()
	addr, err := Pick(ip, udp)
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// Pick is FreeAddrOn for a program that is not a test (the drill).
func Pick(ip string, udp bool) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if next == 0 {
		next = lowPort + rand.IntN(highPort-lowPort)
	}
	for range highPort - lowPort {
		port := next
		if next++; next >= highPort {
			next = lowPort
		}
		addr := net.JoinHostPort(ip, strconv.Itoa(port))
		if free(addr, udp) {
			return addr, nil
		}
	}
	return "", fmt.Errorf("no free port on %s in [%d, %d)", ip, lowPort, highPort)
}

func free(addr string, udp bool) bool {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	if !udp {
		return true
	}
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	return u.Close() == nil
}

// Pair returns both ends of a loopback TCP connection, closed when t ends.
func Pair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return client, server
}

// Serve accepts TCP connections on a loopback port and runs handle on each
// in a goroutine of its own, closing the connection when handle returns.
// When t ends it stops accepting, closes every connection and waits for
// the handlers. It returns the address.
func Serve(t testing.TB, handle func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				handle(c)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}
