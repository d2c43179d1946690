package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

// startCPU samples the CPU time of every server process, of the load
// generator (the watchers) and of the writer child; the returned func
// reports each one's share of one CPU since then, e.g.
// "leader=45%,f1=8%,f2=7%,loadgen=92%,writer=9%". A writer near 100% of
// its pinned CPUs times its own queueing, not the servers'.
func startCPU(d *deployment, writer *harness.Proc) func() string {
	t0 := time.Now()
	before := make([]time.Duration, len(d.procs))
	for i, p := range d.procs {
		before[i], _ = harness.CPUTime(p.Pid())
	}
	self0 := selfCPU()
	gc0 := selfGC()
	writer0, _ := harness.CPUTime(writer.Pid())
	writes0 := syscw(d.procs[d.leader].Pid())
	return func() string {
		wall := time.Since(t0)
		var parts []string
		for i, role := range d.roles() {
			if slices.Contains(d.watchers, i) && len(d.procs) > 1 {
				role += "(watches)"
			}
			now, err := harness.CPUTime(d.procs[i].Pid())
			if err != nil {
				parts = append(parts, role+"=?")
				continue
			}
			parts = append(parts, fmt.Sprintf("%s=%.0f%%", role, 100*float64(now-before[i])/float64(wall)))
		}
		parts = append(parts, fmt.Sprintf("loadgen=%.0f%%", 100*float64(selfCPU()-self0)/float64(wall)))
		// NB: the load generator reads every delivery; its own GC cycles
		// delay them as much as the server's would, on the watch member's core.
		gc := selfGC()
		parts = append(parts, fmt.Sprintf("loadgen-gc=%d/%.0fms", gc.cycles-gc0.cycles, 1000*(gc.cpu-gc0.cpu)))
		if now, err := harness.CPUTime(writer.Pid()); err == nil {
			parts = append(parts, fmt.Sprintf("writer=%.0f%%", 100*float64(now-writer0)/float64(wall)))
		}
		parts = append(parts, fmt.Sprintf("leader-writes/s=%.0f", float64(syscw(d.procs[d.leader].Pid())-writes0)/wall.Seconds()))
		return strings.Join(parts, ",")
	}
}

// roles names each server process: "leader", "f1", "f2".
func (d *deployment) roles() []string { return harness.Roles(len(d.procs), d.leader) }

// syscw returns the write system calls process pid has made (syscw in
// /proc/<pid>/io), or 0 if unknown.
func syscw(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// profileMembers starts a CPU profile of every server process (served with
// --enable-pprof) for dur, and returns a func that waits for them and writes
// them to dir/ROLE-NAME.pprof, ROLE as in the CPU line: leader, f1, f2.
func profileMembers(ctx context.Context, d *deployment, dur time.Duration, dir, name string) func() error {
	return harness.ProfileAll(ctx, d.memberBases(), d.roles(), dur, dir, name)
}

// memberBases are the servers' HTTP base URLs, under which they serve
// /debug/pprof.
func (d *deployment) memberBases() []string {
	bases := make([]string, len(d.memberMetrics))
	for i, m := range d.memberMetrics {
		bases[i] = strings.TrimSuffix(m, "/metrics")
	}
	return bases
}

// startDelays reads two of Lodestone's leader histograms now and returns
// a func that reports their 99th percentiles over the observations made
// since, e.g. "leader-poll-p99<=6.4ms,leader-sched-p99<=1.2ms": how late
// the leader noticed network input (lodestone_runtime_poll_delay_seconds)
// and how long its runnable goroutines waited for a processor
// (lodestone_runtime_sched_latency_seconds). "<=" because a bucket's
// upper bound is all a histogram tells. Other systems have neither: the
// func returns "".
func startDelays(ctx context.Context, d *deployment) func() string {
	names := []struct{ metric, label string }{
		{"lodestone_runtime_poll_delay_seconds", "leader-poll-p99"},
		{"lodestone_runtime_sched_latency_seconds", "leader-sched-p99"},
	}
	before := make([]map[float64]float64, len(names))
	for i, n := range names {
		b, err := scrapeHistogram(ctx, d.metrics, n.metric)
		if err != nil {
			return func() string { return "" }
		}
		before[i] = b
	}
	return func() string {
		var parts []string
		for i, n := range names {
			after, err := scrapeHistogram(ctx, d.metrics, n.metric)
			if err != nil {
				continue
			}
			if v, ok := quantileSince(before[i], after, 0.99); ok {
				parts = append(parts, fmt.Sprintf("%s<=%sms", n.label, harness.FormatValue(v*1000)))
			}
		}
		return strings.Join(parts, ",")
	}
}

// scrapeHistogram reads the cumulative buckets of the named histogram
// (upper bound → observations at or below it) from a metrics URL.
func scrapeHistogram(ctx context.Context, url, name string) (map[float64]float64, error) {
	out := map[float64]float64{}
	prefix := name + `_bucket{le="`
	err := harness.ScanMetrics(ctx, url, func(line string) error {
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			return nil
		}
		le, count, ok := strings.Cut(rest, `"} `)
		if !ok {
			return fmt.Errorf("%s: bad bucket line %q", url, line)
		}
		bound, err := strconv.ParseFloat(le, 64)
		if err != nil {
			return fmt.Errorf("%s: bucket bound %q: %w", url, le, err)
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(count), 64)
		if err != nil {
			return fmt.Errorf("%s: bucket count %q: %w", url, count, err)
		}
		out[bound] = n
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s has no histogram %s", url, name)
	}
	return out, nil
}

// quantileSince returns the upper bound of the bucket that holds quantile
// q of the observations counted in after but not in before (both
// cumulative, as scrapeHistogram returns them); false if there are none.
func quantileSince(before, after map[float64]float64, q float64) (float64, bool) {
	bounds := make([]float64, 0, len(after))
	for b := range after {
		bounds = append(bounds, b)
	}
	slices.Sort(bounds)
	total := after[math.Inf(1)] - before[math.Inf(1)]
	if total <= 0 {
		return 0, false
	}
	for _, b := range bounds {
		if after[b]-before[b] >= q*total {
			return b, true
		}
	}
	return math.Inf(1), true
}

// gcStats is this process's GC cycles and GC CPU seconds (the runtime's
// estimate).
type gcStats struct {
	cycles uint64
	cpu    float64
}

func selfGC() gcStats {
	ms := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(ms)
	var s gcStats
	if ms[0].Value.Kind() == metrics.KindUint64 {
		s.cycles = ms[0].Value.Uint64()
	}
	if ms[1].Value.Kind() == metrics.KindFloat64 {
		s.cpu = ms[1].Value.Float64()
	}
	return s
}

// watchMembersCPU returns the CPU time the members serving the watches
// have used so far, summed (a member it cannot read counts 0).
func (d *deployment) watchMembersCPU() time.Duration {
	var sum time.Duration
	for _, i := range d.watchers {
		t, _ := harness.CPUTime(d.procs[i].Pid())
		sum += t
	}
	return sum
}
