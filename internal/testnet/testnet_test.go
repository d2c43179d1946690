package testnet

import (
	"net"
	"strconv"
	"testing"
)

func TestFreeAddrIsBindableAndNew(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		addr := FreeAddr(t)
		if seen[addr] {
			t.Fatalf("FreeAddr returned %s twice", addr)
		}
		seen[addr] = true
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		if port, _ := strconv.Atoi(p); port < lowPort || port >= highPort {
			t.Fatalf("port %d outside [%d, %d)", port, lowPort, highPort)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("bind %s: %v", addr, err)
		}
		l.Close()
	}
}

func TestFreeAddrSkipsTakenPort(t *testing.T) {
	addr := FreeAddr(t)
	mu.Lock()
	_, p, _ := net.SplitHostPort(addr)
	next, _ = strconv.Atoi(p) // the next call starts at a port we now hold
	mu.Unlock()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := FreeAddrOn(t, "127.0.0.1", true); got == addr {
		t.Fatalf("FreeAddrOn returned %s, which is held", got)
	}
}
