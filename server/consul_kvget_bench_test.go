package server

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// BenchmarkConsulKVGetRaw is BenchmarkConsulKVGet with a client that
// costs next to nothing: one keep-alive connection, a request written
// once, the answer read by its Content-Length. Its allocs/op are the
// server's, and its ns/op mostly the server's and the kernel's.
func BenchmarkConsulKVGetRaw(b *testing.B) {
	c := newTestCluster(b, 1)
	lead := c.waitLeader()
	value := bytes.Repeat([]byte("v"), 256)
	if _, err := c.kv(lead).Put(context.Background(), &lodestonepb.PutRequest{Key: []byte("bench/key"), Value: value}); err != nil {
		b.Fatal(err)
	}
	addr := c.servers[lead].HTTPAddr()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	req := []byte("GET /v1/kv/bench/key HTTP/1.1\r\nHost: " + addr + "\r\nUser-Agent: bench\r\n\r\n")
	r := bufio.NewReader(conn)
	body := make([]byte, 4096)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := conn.Write(req); err != nil {
			b.Fatal(err)
		}
		n, index := readAnswer(b, r)
		if _, err := io.ReadFull(r, body[:n]); err != nil {
			b.Fatal(err)
		}
		if !index || !bytes.Contains(body[:n], []byte(`"Key":"bench/key"`)) {
			b.Fatalf("answer %q (X-Consul-Index %v)", body[:n], index)
		}
	}
}

// readAnswer reads a 200's head and returns its Content-Length and whether
// it has an X-Consul-Index.
func readAnswer(b *testing.B, r *bufio.Reader) (length int, index bool) {
	line, err := r.ReadSlice('\n')
	if err != nil || !bytes.HasPrefix(line, []byte("HTTP/1.1 200 ")) {
		b.Fatalf("status %q: %v", line, err)
	}
	length = -1
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			b.Fatal(err)
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, v, _ := bytes.Cut(line, []byte(": "))
		switch string(name) {
		case "Content-Length":
			length, _ = strconv.Atoi(string(v))
		case "X-Consul-Index":
			index = true
		}
	}
	if length < 0 {
		b.Fatal("an answer without Content-Length")
	}
	return length, index
}
