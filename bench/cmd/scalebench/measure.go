package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

// measured is what one loaded cluster yields.
type measured struct {
	load          time.Duration
	rss           []int64 // per member, after the settle
	writes        window  // per member, under writes after the settle (key loads only)
	snapshot      int64   // bytes of the operator snapshot
	data          []int64 // per member, bytes of its data directory
	restartOne    []time.Duration
	restartAll    []time.Duration // per rep, the slowest member's
	restartOneCPU []time.Duration // per rep, the restarted member's CPU time until it served
	restartAllCPU []time.Duration // per rep, the three members' CPU time until each served
}

// rssPerMember is the members' mean RSS under writes, or after the
// settle for a load without the write window (the catalog's).
func (m measured) rssPerMember() float64 {
	if m.writes.mean != nil {
		return float64(mean(m.writes.mean))
	}
	return float64(mean(m.rss))
}

// settle forces one GC cycle on every member through the same runtime
// call on both systems (GET /debug/pprof/heap?gc=1, which runs
// runtime.GC and answers the heap profile: saved under -pprof), then
// samples every member's RSS each settleEvery until no member's moved by
// more than 1% over settleSamples samples, or timeout passes; it returns
// the last samples.
func (c *cluster) settle(ctx context.Context, timeout time.Duration, profileStem string) ([]int64, error) {
	for i, base := range c.http {
		url := "http://" + base + "/debug/pprof/heap?gc=1"
		resp, err := harness.Get(ctx, url)
		if err != nil {
			return nil, fmt.Errorf("%s: force a GC: %w", memberName(i), err)
		}
		if profileStem != "" {
			err = harness.SaveBody(resp.Body, url, fmt.Sprintf("%s-%s.heap.pprof", profileStem, c.role(i)))
		} else {
			_, err = io.Copy(io.Discard, resp.Body)
		}
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	deadline := time.Now().Add(timeout)
	var history [][]int64
	for {
		cur, err := c.rss()
		if err != nil {
			return nil, err
		}
		history = append(history, cur)
		if steady(history, settleSamples) || time.Now().After(deadline) {
			return cur, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(settleEvery):
		}
	}
}

const (
	settleEvery   = time.Second
	settleSamples = 4
)

// steady reports whether the last n samples of every member stay within
// 1% of each other.
func steady(history [][]int64, n int) bool {
	if len(history) < n {
		return false
	}
	last := history[len(history)-n:]
	for m := range last[0] {
		lo, hi := last[0][m], last[0][m]
		for _, s := range last {
			lo, hi = min(lo, s[m]), max(hi, s[m])
		}
		if float64(hi-lo) > 0.01*float64(hi) {
			return false
		}
	}
	return true
}

// role names member i as the profiles do: leader, f1, f2.
func (c *cluster) role(i int) string { return harness.Roles(members, c.leader)[i] }

// measure loads, settles, reads the memory and snapshot size, then times
// -reps restarts of one follower and of all three members.
func measure(ctx context.Context, c *cluster, spec loadSpec, label string) (measured, error) {
	var m measured
	var err error
	if m.load, err = spec.run(ctx, c); err != nil {
		return m, err
	}
	logf("%s: loaded %s in %s", c.sys.name, spec, m.load.Round(time.Millisecond))
	stem := ""
	if *flagPprof != "" {
		stem = filepath.Join(*flagPprof, c.sys.name+"-"+label)
	}
	if m.rss, err = c.settle(ctx, *flagSettleTimeout, stem); err != nil {
		return m, err
	}
	logf("%s: RSS after settle %s", c.sys.name, mibs(m.rss))
	if spec.nodes == 0 && *flagRSSWindow > 0 {
		if m.writes, err = c.underWrites(ctx, spec, *flagRSSWindow, *flagRSSWriteRate); err != nil {
			return m, fmt.Errorf("write window: %w", err)
		}
		logf("%s: RSS under %d writes over %s: mean %s, peak %s", c.sys.name, m.writes.writes, *flagRSSWindow, mibs(m.writes.mean), mibs(m.writes.peak))
	}
	conn, err := dial(c.clients[c.leader])
	if err != nil {
		return m, err
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	m.snapshot, err = c.sys.ops(conn).snapshotBytes(sctx)
	cancel()
	conn.Close()
	if err != nil {
		return m, fmt.Errorf("snapshot: %w", err)
	}
	for i := range members {
		d, err := c.dataBytes(i)
		if err != nil {
			return m, err
		}
		m.data = append(m.data, d)
	}
	logf("%s: snapshot %.1f MiB, data dirs %s", c.sys.name, mib(m.snapshot), mibs(m.data))

	key, want := spec.check()
	for rep := range *flagReps {
		f := c.follower()
		r, err := c.restart(ctx, []int{f}, key, want, *flagRestartTimeout)
		if err != nil {
			return m, fmt.Errorf("restart %s: %w", memberName(f), err)
		}
		m.restartOne = append(m.restartOne, r.took[0])
		m.restartOneCPU = append(m.restartOneCPU, r.cpu[0])
		logf("%s: rep %d: restart of %s (follower) to a linearizable read: %s (CPU %s)", c.sys.name, rep+1, memberName(f),
			r.took[0].Round(time.Millisecond), r.cpu[0])
	}
	for rep := range *flagReps {
		r, err := c.restart(ctx, []int{0, 1, 2}, key, want, *flagRestartTimeout)
		if err != nil {
			return m, fmt.Errorf("restart all: %w", err)
		}
		m.restartAll = append(m.restartAll, slices.Max(r.took))
		var cpu time.Duration
		for _, d := range r.cpu {
			cpu += d
		}
		m.restartAllCPU = append(m.restartAllCPU, cpu)
		logf("%s: rep %d: restart of all three to a linearizable read on each: %s (CPU %s)", c.sys.name, rep+1, durations(r.took), durations(r.cpu))
	}
	return m, nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func mibs(bs []int64) string {
	s := ""
	for i, b := range bs {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%s=%.0fMiB", memberName(i), mib(b))
	}
	return s
}

func durations(ds []time.Duration) string {
	s := ""
	for i, d := range ds {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%s=%s", memberName(i), d.Round(time.Millisecond))
	}
	return s
}

func secondsOf(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = d.Seconds()
	}
	return out
}

// ensureDir makes the -pprof directory.
func ensureDir(dir string) error {
	if dir == "" {
		return nil
	}
	return os.MkdirAll(dir, 0o755)
}
