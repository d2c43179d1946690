package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lodestone-kv/lodestone/gateway"
)

// The benchmark re-executes itself in these roles, so every process it
// measures is a plain binary started and pinned by harness.Start.

// runRole runs one role until SIGTERM; it is main for a child process.
func runRole(role string, args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	kv := map[string]string{}
	for _, a := range args {
		k, v, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		kv[k] = v
	}
	switch role {
	case "origin":
		size, _ := strconv.Atoi(kv["body"])
		return serveOrigin(ctx, kv["listen"], size)
	case "gateway":
		return runLodestoneGateway(ctx, kv["registry"], kv["listen"], kv["admin"])
	case "reverseproxy":
		return serveReverseProxy(ctx, kv["listen"], kv["origin"])
	}
	return fmt.Errorf("unknown role %q", role)
}

// serveOrigin is the one origin every system proxies to: a minimal
// HTTP/1.1 keep-alive responder answering every request with a fixed
// body, of bigBody bytes on /64k and of size bytes on any other path, and
// closing the connection after a request that says "Connection: close".
// NB: not net/http: wrk and the origin share one core, and a lean origin
// leaves that core's capacity to wrk so the proxy core is the one that
// saturates.
func serveOrigin(ctx context.Context, addr string, size int) error {
	small, big := originResponses(max(size, 1)), originResponses(bigBody)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go serveOriginConn(c, small, big)
	}
}

// originResponses returns the keep-alive and the closing response with a
// body of size bytes.
func originResponses(size int) [2][]byte {
	body := strings.Repeat("x", size)
	return [2][]byte{
		[]byte(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", size, body)),
		[]byte(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", size, body)),
	}
}

// serveOriginConn answers each request on c (GET or HEAD without a body,
// or a body with Content-Length, which it skips) with small's or big's
// response, the closing one (then closes) when the request asked.
func serveOriginConn(c net.Conn, small, big [2][]byte) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 16<<10)
	bw := bufio.NewWriterSize(c, 16<<10)
	for {
		clen, resp, closing := 0, small, 0
		for first, n := true, 0; ; first, n = false, n+1 {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(line) <= 2 {
				if first {
					n = -1
					continue // stray CRLF between requests
				}
				break
			}
			switch {
			case n == 0:
				if _, target, ok := strings.Cut(string(line), " "); ok && strings.HasPrefix(target, "/64k") {
					resp = big
				}
			case len(line) > 16 && (line[0] == 'C' || line[0] == 'c') && strings.EqualFold(string(line[:15]), "content-length:"):
				clen, _ = strconv.Atoi(strings.TrimSpace(string(line[15:])))
			case len(line) >= 17 && (line[0] == 'C' || line[0] == 'c') && strings.EqualFold(string(line[:11]), "connection:") &&
				strings.EqualFold(strings.TrimSpace(string(line[11:])), "close"):
				closing = 1
			}
		}
		if clen > 0 {
			if _, err := br.Discard(clen); err != nil {
				return
			}
		}
		bw.Write(resp[closing])
		// Answer pipelined requests together, flush when none is waiting.
		if br.Buffered() == 0 || closing == 1 {
			if err := bw.Flush(); err != nil || closing == 1 {
				return
			}
		}
	}
}

// runLodestoneGateway runs the gateway exactly as `lodestone gateway
// --registry R --listen L --admin A` does: DefaultConfig plus those three,
// through gateway.Run.
func runLodestoneGateway(ctx context.Context, registry, listen, admin string) error {
	cfg := gateway.DefaultConfig()
	cfg.Registry = []string{registry}
	cfg.Listen, cfg.AdminListen = listen, admin
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if path := os.Getenv("GATEWAYBENCH_CPUPROFILE"); path != "" {
		// For digging into the gateway's per-request cost.
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	return gateway.Run(ctx, cfg)
}

// serveReverseProxy is the plain standard-library peer: one
// httputil.ReverseProxy with keep-alive to the origin.
func serveReverseProxy(ctx context.Context, listen, origin string) error {
	u, err := url.Parse("http://" + origin)
	if err != nil {
		return err
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
	}
	rp.ErrorLog = nil
	return serveUntil(ctx, &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}, listen)
}

func serveUntil(ctx context.Context, srv *http.Server, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		return nil
	case err := <-errc:
		return err
	}
}

// waitServing polls url until it answers 200 with the origin's body size,
// or ctx ends.
func waitServing(ctx context.Context, target string, bodySize int) error {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Second}
	var last error
	for {
		resp, err := c.Get(target)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && len(b) == max(bodySize, 1) {
				return nil
			}
			err = fmt.Errorf("status %d, %d bytes", resp.StatusCode, len(b))
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not serving: %v", target, last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
