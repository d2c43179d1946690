package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/consulpeer"
	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

// TestWorkloadsOnConsul drives every workload briefly against three real
// Consul servers of the cached build, so each op's answer check is
// Consul's answer. Opt in with CONSULPEER_SMOKE=1 after a build (make
// bench-consul makes one); without the binary it fails.
func TestWorkloadsOnConsul(t *testing.T) {
	if os.Getenv("CONSULPEER_SMOKE") != "1" {
		t.Skip("opt-in: CONSULPEER_SMOKE=1 runs three Consul servers from the cache")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin, err := consulpeer.Cached(ctx)
	if err != nil || bin == "" {
		t.Fatalf("no cached consul %s (%v): run make bench-consul once", consulpeer.Version, err)
	}
	c, err := consulpeer.StartCluster(ctx, bin, t.TempDir(), consulpeer.Options{Members: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop(false)
	const clients, size, keys = 4, 256, 20
	base := c.HTTP[c.Leader]
	value := make([]byte, size)
	if err := preload(ctx, base, keys, value); err != nil {
		t.Fatal(err)
	}
	cs := newConns(clients, base)
	defer cs.close()
	values := [][]byte{value, value, value, value}
	for _, w := range workloads {
		res, err := harness.Drive(ctx, harness.DriveConfig{Clients: clients, Duration: 500 * time.Millisecond}, w.op(cs, values, size, keys))
		if err != nil || res.Ops() == 0 || res.Errors > 0 {
			t.Errorf("%s: %d ops, %d errors (first: %v), %v", w.name, res.Ops(), res.Errors, res.FirstErr, err)
		}
	}
	// A wrong size is a failed op, not a fast one.
	res, err := harness.Drive(ctx, harness.DriveConfig{Clients: 1, Duration: 200 * time.Millisecond}, getWorkload.op(cs, values, size+1, keys))
	if err != nil || res.Ops() != 0 || res.Errors == 0 {
		t.Errorf("gets expecting %d bytes: %d ops, %d errors, %v; want every one failed", size+1, res.Ops(), res.Errors, err)
	}
}
