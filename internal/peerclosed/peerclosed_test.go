package peerclosed_test

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/peerclosed"
	"github.com/lodestone-kv/lodestone/internal/testnet"
)

type wrapped struct{ net.Conn }

func (w wrapped) NetConn() net.Conn { return w.Conn }

// eventually polls for up to 5s: a close travels through the kernel.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestClosed(t *testing.T) {
	client, server := testnet.Pair(t)
	if peerclosed.Closed(server) {
		t.Fatal("an open, quiet connection reads as closed")
	}
	// Data waiting is not a close, and the peek leaves it for the reader.
	if _, err := client.Write([]byte("next request")); err != nil {
		t.Fatal(err)
	}
	// NB: loopback TCP queues the bytes at the receiver during Write.
	if peerclosed.Closed(wrapped{server}) {
		t.Fatal("a connection with data waiting reads as closed")
	}
	client.Close()
	b := make([]byte, 12)
	if _, err := io.ReadFull(server, b); err != nil || string(b) != "next request" {
		t.Fatalf("after peeking: read %q, %v", b, err)
	}
	eventually(t, func() bool { return peerclosed.Closed(wrapped{server}) })
}

func TestClosedIsFalseForWhatIsNotASocket(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	b.Close()
	if peerclosed.Closed(a) {
		t.Fatal("a net.Pipe reads as closed: Closed must only answer for sockets")
	}
}
