package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Get fetches url and returns the response if its status is 200 OK; the
// caller closes its body. Any other status is an error naming it.
func Get(ctx context.Context, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return resp, nil
}

// Profile starts a CPU profile of dur of the server whose HTTP base URL
// (with /debug/pprof) is base, and allocation profiles at its start and
// end, and returns a func that waits for them and writes them to path,
// and to path with ".pprof" replaced by ".allocs-base.pprof" (start) and
// ".allocs.pprof" (end). What the phase allocated is the difference:
//
//	go tool pprof -sample_index=alloc_space -base X.allocs-base.pprof X.allocs.pprof
//
// Both allocation profiles force a GC cycle first (heap?gc=1): the runtime
// publishes allocation samples only at the end of a cycle, and a server
// with a heap floor may run none in a phase, which left the delta profile
// (allocs?seconds=N) empty. The forced cycles make a profiled run's
// latency figures not the benchmark's.
func Profile(ctx context.Context, base string, dur time.Duration, path string) func() error {
	stem := strings.TrimSuffix(path, ".pprof")
	heap := base + collectedHeap
	cpu := fetch(ctx, base+fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(dur.Seconds())), path)
	start := fetch(ctx, heap, stem+".allocs-base.pprof")
	end := make(chan error, 1)
	go func() {
		select {
		case <-ctx.Done():
			end <- ctx.Err()
		case <-time.After(dur):
			end <- fetch(ctx, heap, stem+".allocs.pprof")()
		}
	}()
	return WaitAll(cpu, start, func() error { return <-end })
}

// collectedHeap is a server's heap profile taken after a forced GC cycle
// (with --enable-pprof).
const collectedHeap = "/debug/pprof/heap?gc=1"

// CollectAll forces a GC cycle on every server (bases are their HTTP base
// URLs; they run with --enable-pprof), one after the other, each
// finished, sweep included, when its request returns.
func CollectAll(ctx context.Context, bases []string) error {
	for _, base := range bases {
		resp, err := Get(ctx, base+collectedHeap)
		if err != nil {
			return fmt.Errorf("force a GC: %w", err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return fmt.Errorf("force a GC at %s: %w", base, err)
		}
	}
	return nil
}

// CollectedNote says, for a setup line, whether the servers were made to
// collect (CollectAll) before every phase.
func CollectedNote(before bool) string {
	if before {
		return "each collected before every phase's warm-up"
	}
	return "not collected between phases"
}

// fetch starts copying the body of url to path and returns a func that
// waits for it.
func fetch(ctx context.Context, url, path string) func() error {
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			resp, err := Get(ctx, url)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			return SaveBody(resp.Body, url, path)
		}()
	}()
	return func() error { return <-done }
}

// ProfileAll starts Profile for every server, bases[i] named roles[i], to
// dir/ROLE-NAME.pprof, and returns a func that waits for them all. With
// dir empty it profiles nothing.
func ProfileAll(ctx context.Context, bases, roles []string, dur time.Duration, dir, name string) func() error {
	return eachServer(bases, roles, dir, name+".pprof", func(base, path string) func() error {
		return Profile(ctx, base, dur, path)
	})
}

// TraceAll starts an execution trace of dur of every server, bases[i]
// named roles[i], to dir/ROLE-NAME.trace (read with go tool trace; its
// -d=parsed mode prints every event with wall-clock sync points), and
// returns a func that waits for them all. With dir empty it traces
// nothing. Tracing slows a server by a few percent: a traced run's figures
// are not the benchmark's.
func TraceAll(ctx context.Context, bases, roles []string, dur time.Duration, dir, name string) func() error {
	return eachServer(bases, roles, dir, name+".trace", func(base, path string) func() error {
		return fetch(ctx, base+fmt.Sprintf("/debug/pprof/trace?seconds=%d", int(dur.Seconds())), path)
	})
}

// eachServer runs start for every server, bases[i], with the path
// dir/ROLES[i]-file, and returns a func that waits for them all; with dir
// empty it starts nothing.
func eachServer(bases, roles []string, dir, file string, start func(base, path string) func() error) func() error {
	if dir == "" {
		return WaitAll()
	}
	waits := make([]func() error, len(bases))
	for i, base := range bases {
		waits[i] = start(base, filepath.Join(dir, roles[i]+"-"+file))
	}
	return WaitAll(waits...)
}

// WaitAll returns a func that waits for every one of waits and joins
// their errors.
func WaitAll(waits ...func() error) func() error {
	return func() error {
		var errs []error
		for _, wait := range waits {
			errs = append(errs, wait())
		}
		return errors.Join(errs...)
	}
}

// Roles names n server processes, the leader at index leader: "leader",
// and "f1", "f2", ... for the others in process order.
func Roles(n, leader int) []string {
	roles := make([]string, n)
	f := 0
	for i := range roles {
		roles[i] = "leader"
		if i != leader {
			f++
			roles[i] = fmt.Sprintf("f%d", f)
		}
	}
	return roles
}

// SaveBody writes body (read from url, named in errors) to path, making
// its directory.
func SaveBody(body io.Reader, url, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, body); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", url, err)
	}
	return f.Close()
}
