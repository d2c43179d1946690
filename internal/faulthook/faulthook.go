// Package faulthook drives the fault-injection hooks a Lodestone server
// serves when it runs with --fault-hooks (raftnode.Faults), for the chaos
// harness and the benchmarks.
package faulthook

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/internal/token"
)

// SetDiskDelay makes every log write of the server at httpAddr (host:port
// of its HTTP listener) wait d before it reaches the disk; 0 removes the
// delay. It speaks plain HTTP without a token; a server with TLS or ACLs
// needs a Client.
func SetDiskDelay(ctx context.Context, httpAddr string, d time.Duration) error {
	return Client{}.SetDiskDelay(ctx, httpAddr, d)
}

// Client reaches the hooks of servers that run with TLS or ACLs: the
// hooks need operator write (server/authz.go).
type Client struct {
	// HTTP makes the requests; nil is a plain client with a 2 s timeout.
	// A server with --tls-verify-incoming-http needs one that presents a
	// client certificate.
	HTTP *http.Client
	// HTTPS selects the https scheme.
	HTTPS bool
	// Token is the ACL secret sent in X-Consul-Token ("" sends none).
	Token string
}

// SetDiskDelay is the package's SetDiskDelay through c.
func (c Client) SetDiskDelay(ctx context.Context, httpAddr string, d time.Duration) error {
	scheme := "http"
	if c.HTTPS {
		scheme = "https"
	}
	u := scheme + "://" + httpAddr + "/debug/faults/disk-delay?d=" + d.String()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, nil)
	if err != nil {
		return err
	}
	if c.Token != "" {
		req.Header.Set(token.Header, c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 2 * time.Second}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("set disk delay on %s: %w", httpAddr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("set disk delay on %s: %s: %s (does it run with --fault-hooks?)", httpAddr, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
