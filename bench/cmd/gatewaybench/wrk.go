package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// wrkResult is what one wrk run measured (its Lua done() hook prints exact
// numbers instead of wrk's rounded human output).
type wrkResult struct {
	requests  int64
	duration  time.Duration
	p50, p99  time.Duration
	p999      time.Duration
	errors    int64 // connect + read + write + timeout errors
	non2xx    int64 // responses with status > 399
	rps       float64
	rawOutput string
}

// The done() hook; the paced script adds a delay() before each request.
const wrkReport = `
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d p999_us=%d connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency:percentile(99.9),
    e.connect, e.read, e.write, e.status, e.timeout))
end
`

// runWrk runs wrk pinned to cpus against target.
func runWrk(ctx context.Context, cpus, target, script string, conns int, d time.Duration) (wrkResult, error) {
	args := []string{"-t1", fmt.Sprintf("-c%d", conns), fmt.Sprintf("-d%ds", int(d.Seconds())), "--timeout", "5s", "-s", script, target}
	bin := "wrk"
	if cpus != "" {
		args = append([]string{"-c", cpus, bin}, args...)
		bin = "taskset"
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return wrkResult{}, fmt.Errorf("wrk %s: %w\n%s", target, err, out.String())
	}
	return parseWrk(out.String())
}

func parseWrk(s string) (wrkResult, error) {
	r := wrkResult{rawOutput: s}
	sc := bufio.NewScanner(strings.NewReader(s))
	found := false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "RESULT ") {
			continue
		}
		found = true
		kv := map[string]int64{}
		for _, f := range strings.Fields(line)[1:] {
			k, v, _ := strings.Cut(f, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return r, fmt.Errorf("wrk result %q: %v", line, err)
			}
			kv[k] = n
		}
		r.requests = kv["requests"]
		r.duration = time.Duration(kv["duration_us"]) * time.Microsecond
		r.p50 = time.Duration(kv["p50_us"]) * time.Microsecond
		r.p99 = time.Duration(kv["p99_us"]) * time.Microsecond
		r.p999 = time.Duration(kv["p999_us"]) * time.Microsecond
		r.errors = kv["connect"] + kv["read"] + kv["write"] + kv["timeout"]
		r.non2xx = kv["status"]
	}
	if !found {
		return r, fmt.Errorf("no RESULT line in wrk output:\n%s", s)
	}
	if r.duration > 0 {
		r.rps = float64(r.requests) / r.duration.Seconds()
	}
	return r, nil
}
