package checks

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

const (
	passing = lodestonepb.HealthStatus_HEALTH_PASSING
	warning = lodestonepb.HealthStatus_HEALTH_WARNING
)

// prober runs one check's probes; it lives as long as the check's
// goroutine.
type prober struct {
	spec   *Spec
	logger *slog.Logger
	client *http.Client // HTTP checks
}

func newProber(s *Spec, logger *slog.Logger) *prober {
	p := &prober{spec: s, logger: logger}
	if s.Kind == KindHTTP {
		p.client = &http.Client{
			Transport: &http.Transport{
				// NB: no keep-alive: a probe must see a fresh connection's
				// fate.
				DisableKeepAlives: true,
				TLSClientConfig:   &tls.Config{InsecureSkipVerify: s.TLSSkipVerify, ServerName: s.TLSServerName},
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return p
}

func (p *prober) close() {
	if p.client != nil {
		p.client.CloseIdleConnections()
	}
}

// probe runs the check once, bounded by its timeout.
func (p *prober) probe(ctx context.Context) (lodestonepb.HealthStatus, string) {
	ctx, cancel := context.WithTimeout(ctx, p.spec.Timeout)
	defer cancel()
	switch p.spec.Kind {
	case KindHTTP:
		return p.http(ctx)
	case KindTCP:
		return p.tcp(ctx)
	case KindGRPC:
		return p.grpc(ctx)
	case KindScript:
		return p.script(ctx)
	}
	panic("checks: probe of a " + p.spec.Kind + " check") // TTL checks are never probed
}

// http: 2xx passing, 429 warning, anything else critical (Consul's rules).
func (p *prober) http(ctx context.Context) (lodestonepb.HealthStatus, string) {
	s := p.spec
	req, err := http.NewRequestWithContext(ctx, s.Method, s.HTTP, strings.NewReader(s.Body))
	if err != nil {
		return critical, fmt.Sprintf("HTTP %s %s: %v", s.Method, s.HTTP, err)
	}
	for k, vs := range s.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", "Lodestone Health Check")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return critical, fmt.Sprintf("HTTP %s %s: %v", s.Method, s.HTTP, err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, MaxOutput))
	resp.Body.Close()
	out := fmt.Sprintf("HTTP %s %s: %s Output: %s", s.Method, s.HTTP, resp.Status, body)
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return passing, out
	case resp.StatusCode == http.StatusTooManyRequests:
		return warning, out
	}
	return critical, out
}

func (p *prober) tcp(ctx context.Context) (lodestonepb.HealthStatus, string) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", p.spec.TCP)
	if err != nil {
		return critical, fmt.Sprintf("TCP connect %s: %v", p.spec.TCP, err)
	}
	conn.Close()
	return passing, fmt.Sprintf("TCP connect %s: Success", p.spec.TCP)
}

// grpc asks the target's standard health service; "host:port/service"
// asks about one service, "host:port" about the server as a whole.
func (p *prober) grpc(ctx context.Context) (lodestonepb.HealthStatus, string) {
	s := p.spec
	addr, service, _ := strings.Cut(s.GRPC, "/")
	creds := insecure.NewCredentials()
	if s.GRPCUseTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: s.TLSSkipVerify, ServerName: s.TLSServerName})
	}
	// NB: a connection per probe, as HTTP checks: a probe must see a fresh
	// connection's fate.
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return critical, fmt.Sprintf("gRPC check %s: %v", s.GRPC, err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return critical, fmt.Sprintf("gRPC check %s: %v", s.GRPC, err)
	}
	if st := resp.GetStatus(); st != healthpb.HealthCheckResponse_SERVING {
		return critical, fmt.Sprintf("gRPC %s serving status: %s", s.GRPC, st)
	}
	return passing, fmt.Sprintf("gRPC check %s: success", s.GRPC)
}

// script runs Args: exit 0 passing, 1 warning, anything else (a signal,
// the timeout) critical.
func (p *prober) script(ctx context.Context) (lodestonepb.HealthStatus, string) {
	s := p.spec
	cmd := exec.CommandContext(ctx, s.Args[0], s.Args[1:]...)
	var out cappedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// NB: a script that leaves a child holding its output open must not
	// hold the check past its timeout.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	output := out.String()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return critical, fmt.Sprintf("Timed out (%s) running check", s.Timeout)
	case err == nil:
		return passing, output
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		return warning, output
	case errors.As(err, &exit):
		return critical, output
	}
	p.logger.Warn("script check could not run", "check", s.ID(), "err", err)
	return critical, fmt.Sprintf("Failed to run check %v: %v", s.Args, err)
}

// cappedBuffer keeps the first bytes written and counts the rest, as
// Consul reports a long output ("Captured N of M bytes"); with that line
// the output fits MaxOutput.
type cappedBuffer struct {
	b     bytes.Buffer
	total int
}

const capturedBytes = MaxOutput - 64 // room for the "Captured" line

func (c *cappedBuffer) Write(p []byte) (int, error) {
	c.total += len(p)
	if room := capturedBytes - c.b.Len(); room > 0 {
		c.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (c *cappedBuffer) String() string {
	if c.total > c.b.Len() {
		return fmt.Sprintf("Captured %d of %d bytes\n...\n%s", c.b.Len(), c.total, c.b.String())
	}
	return c.b.String()
}
