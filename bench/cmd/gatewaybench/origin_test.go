package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// startTestOrigin serves the origin on a free loopback port until the test
// ends, and checks that it stops when asked.
func startTestOrigin(t *testing.T, body int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveOrigin(ctx, addr, body) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("origin stopped with %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("origin still serving 10s after its context ended")
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("origin not listening on %s: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOriginAnswers(t *testing.T) {
	addr := startTestOrigin(t, 64)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	// Pipelined, in one write: a GET, a POST whose body must be skipped,
	// a stray CRLF, a /64k GET, then one that asks to close.
	reqs := "GET / HTTP/1.1\r\nHost: a\r\n\r\n" +
		"POST /x HTTP/1.1\r\nHost: a\r\ncontent-length: 11\r\n\r\nhello=world" +
		"\r\nGET /64k HTTP/1.1\r\nHost: a\r\n\r\n" +
		"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
	if _, err := io.WriteString(c, reqs); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	for i, want := range []struct {
		size    int
		closing bool
	}{{64, false}, {64, false}, {bigBody, false}, {64, true}} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || len(b) != want.size || resp.Close != want.closing {
			t.Fatalf("response %d: status %d, %d body bytes, close %v, err %v; want 200, %d, %v", i, resp.StatusCode, len(b), resp.Close, err, want.size, want.closing)
		}
	}
	if n, err := br.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the closing response: read %d bytes, err %v; want EOF", n, err)
	}
}

// TestOriginManyConnections: connections that come and go (the newconn
// shape) are all served, and so are 4 MiB of pipelined 64 KiB answers,
// more than the socket buffers take before the client reads (the origin
// waits for room).
func TestOriginManyConnections(t *testing.T) {
	addr := startTestOrigin(t, 10)
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	for i := range 200 {
		resp, err := hc.Get(fmt.Sprintf("http://%s/n/%d", addr, i))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != strings.Repeat("x", 10) {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, b)
		}
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	const n = 64
	io.WriteString(c, strings.Repeat("GET /64k HTTP/1.1\r\nHost: a\r\n\r\n", n))
	br := bufio.NewReader(c)
	for i := range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != bigBody {
			t.Fatalf("response %d: %d body bytes, err %v; want %d", i, n, err, bigBody)
		}
	}
}
