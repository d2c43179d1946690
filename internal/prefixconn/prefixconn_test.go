package prefixconn

import (
	"io"
	"net"
	"testing"
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
