package prefixconn

import (
	"errors"
	"io"
	"net"
	"testing"

	"github.com/lodestone-kv/lodestone/internal/testnet"
)

func TestReadsPrefixThenConnection(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		b.Write([]byte(" world"))
		b.Close()
	}()
	c := &Conn{Conn: a, Prefix: []byte("hello")}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "hello world" {
		t.Fatalf("got %q, want %q", got, "hello world")
	}
	if c.NetConn() != a {
		t.Fatal("NetConn is not the connection underneath")
	}
}

// TestCloseWriteHalfCloses: the peer reads EOF while the connection still
// reads what the peer sends afterwards, as on the bare TCP connection.
func TestCloseWriteHalfCloses(t *testing.T) {
	client, server := testnet.Pair(t)
	c := &Conn{Conn: server, Prefix: []byte("x")}
	if err := c.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite on TCP: %v", err)
	}
	if n, err := client.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("peer read after CloseWrite: %d, %v; want 0, EOF", n, err)
	}
	if _, err := client.Write([]byte("y")); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(io.LimitReader(c, 2))
	if err != nil || string(got) != "xy" {
		t.Fatalf("read after CloseWrite: %q, %v; want %q", got, err, "xy")
	}
}

func TestCloseWriteUnsupported(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := &Conn{Conn: a}
	if err := c.CloseWrite(); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("CloseWrite on a pipe: %v, want errors.ErrUnsupported", err)
	}
}
