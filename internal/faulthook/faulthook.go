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
)

// SetDiskDelay makes every log write of the server at httpAddr (host:port
// of its HTTP listener) wait d before it reaches the disk; 0 removes the
// delay.
func SetDiskDelay(ctx context.Context, httpAddr string, d time.Duration) error {
	u := "http://" + httpAddr + "/debug/faults/disk-delay?d=" + d.String()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Do(req)
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
