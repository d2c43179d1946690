package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
	"github.com/lodestone-kv/lodestone/internal/token"
)

// profile, with dir set and a system that serves profiles, waits out the
// warm-up and then takes a CPU profile of dur from every member, and heap
// profiles at its start and end, to dir/NAME-ROLE.pprof,
// .allocs-base.pprof and .allocs.pprof (roles as harness.Roles: leader,
// f1, f2; what the window allocated is go tool pprof
// -sample_index=alloc_space -base X.allocs-base.pprof X.allocs.pprof). It
// returns a func that waits for them.
// A secure member is asked over TLS with the bench's client certificate
// and the management token (the profiler needs operator:read).
func (c *cluster) profile(ctx context.Context, warmup, dur time.Duration, dir, name string) func() error {
	if dir == "" || !c.sys.profiles {
		return harness.WaitAll()
	}
	roles := harness.Roles(len(c.procs), slices.Index(c.clients, c.leader))
	secs := int(dur.Seconds())
	var waits []func() error
	for i, addr := range c.http {
		base := c.httpBase(addr) + "/debug/pprof/"
		stem := filepath.Join(dir, name+"-"+roles[i])
		// NB: the heap profiles force a GC first (gc=1): the runtime
		// publishes allocation samples only at a cycle's end, and a
		// server with a heap floor may run none in a window.
		for _, p := range []struct {
			after time.Duration
			query string
			file  string
		}{
			{warmup, fmt.Sprintf("profile?seconds=%d", secs), ".pprof"},
			{warmup, "heap?gc=1", ".allocs-base.pprof"},
			{warmup + dur, "heap?gc=1", ".allocs.pprof"},
		} {
			done := make(chan error, 1)
			go func() {
				select {
				case <-time.After(p.after):
				case <-ctx.Done():
					done <- ctx.Err()
					return
				}
				done <- c.fetchProfile(ctx, base+p.query, stem+p.file)
			}()
			waits = append(waits, func() error { return <-done })
		}
	}
	return harness.WaitAll(waits...)
}

func (c *cluster) fetchProfile(ctx context.Context, url, path string) error {
	resp, err := c.httpGet(ctx, url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return harness.SaveBody(resp.Body, url, path)
}

// httpBase is the scheme and address of a member's HTTP port: HTTPS on a
// secure variant.
func (c *cluster) httpBase(addr string) string {
	if c.sys.sec != nil {
		return "https://" + addr
	}
	return "http://" + addr
}

// httpGet asks a member's HTTP port for url, over TLS with the bench's
// client certificate and with the management token on a secure variant,
// and fails unless the answer is 200.
func (c *cluster) httpGet(ctx context.Context, url string) (*http.Response, error) {
	client := http.DefaultClient
	if c.sys.sec != nil {
		client = c.sys.sec.http
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if c.mgmtToken != "" {
		req.Header.Set(token.Header, c.mgmtToken)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return resp, nil
}
