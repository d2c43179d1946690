package main

import (
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
