package harness

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// ScanMetrics calls fn with each line of the metrics text at url, and
// stops at fn's first error.
func ScanMetrics(ctx context.Context, url string, fn func(line string) error) error {
	resp, err := Get(ctx, url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return scanLines(resp.Body, fn)
}

func scanLines(r io.Reader, fn func(line string) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if err := fn(sc.Text()); err != nil {
			return err
		}
	}
	return sc.Err()
}

// Scrape reads the named metrics (first sample of each; a name
// includes its labels, as in the text format) from a metrics URL.
func Scrape(ctx context.Context, url string, names ...string) (map[string]float64, error) {
	resp, err := Get(ctx, url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out, err := ReadMetrics(resp.Body, names...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", url, err)
	}
	return out, nil
}

// ReadMetrics is Scrape over metrics text fetched by the caller.
func ReadMetrics(r io.Reader, names ...string) (map[string]float64, error) {
	out := map[string]float64{}
	err := scanLines(r, func(line string) error {
		for _, n := range names {
			if v, ok := strings.CutPrefix(line, n+" "); ok {
				if _, dup := out[n]; !dup {
					f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
					if err != nil {
						return fmt.Errorf("%s: %w", line, err)
					}
					out[n] = f
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("no %s", n)
		}
	}
	return out, nil
}

// gcCyclesMetric is the Go collector's count of finished GC cycles.
const gcCyclesMetric = "go_gc_duration_seconds_count"

// StartGCCount reads how many GC cycles each server at urls (their
// /metrics) has finished, and returns a func that reports the cycles each
// finished since, e.g. "leader=1,f1=0,f2=0" (roles[i] names urls[i]). One
// cycle of a server with tens of MB live takes about 100 ms of a busy
// core, enough to set the p99 of a 10 s window of writes, so a phase's
// line says whether one fell in it. A server that does not export the
// count makes it report "".
func StartGCCount(ctx context.Context, urls, roles []string) func() string {
	return startCount(ctx, urls, roles, func(m map[string]float64) float64 { return m[gcCyclesMetric] }, gcCyclesMetric)
}

// gcCPUMetric is the CPU a server's GC used (the runtime's estimate,
// /cpu/classes/gc/total:cpu-seconds), which Lodestone exports.
const gcCPUMetric = "go_cpu_classes_gc_total_cpu_seconds_total"

// StartGCCPU is StartGCCount for the milliseconds of CPU each server's GC
// used (marking, assists and pauses; not sweeping): how big the cycles that
// fell in a phase were, which their count does not say. A server that does
// not export it (etcd) makes it report "".
func StartGCCPU(ctx context.Context, urls, roles []string) func() string {
	return startCount(ctx, urls, roles, func(m map[string]float64) float64 { return m[gcCPUMetric] * 1000 }, gcCPUMetric)
}

// Lodestone's log write latency histogram: its count, and its bucket up to
// 12.8 ms (one of its bounds, 100 µs doubled seven times).
const (
	logWritesMetric     = "lodestone_log_write_latency_seconds_count"
	logWritesFastBucket = `lodestone_log_write_latency_seconds_bucket{le="0.0128"}`
)

// StartSlowLogWrites is StartGCCount for the log writes (a write and its
// fdatasync) over 12.8 ms of each Lodestone server. All three
// members of a cluster on one disk share its flushes: when a phase's
// slowest writes come with the same count on every member, the disk
// stalled them all at once, whatever the phase was doing.
func StartSlowLogWrites(ctx context.Context, urls, roles []string) func() string {
	return startCount(ctx, urls, roles, func(m map[string]float64) float64 {
		return m[logWritesMetric] - m[logWritesFastBucket]
	}, logWritesMetric, logWritesFastBucket)
}

// StartCounter is StartGCCount for any one counter, named as in the text
// format (labels included).
func StartCounter(ctx context.Context, urls, roles []string, metric string) func() string {
	return startCount(ctx, urls, roles, func(m map[string]float64) float64 { return m[metric] }, metric)
}

// startCount reads count(the named metrics) of each server at urls and
// returns a func that reports how much each one's rose since, as
// "ROLE=N,..." (roles[i] names urls[i]); "" if a server lacks a metric.
func startCount(ctx context.Context, urls, roles []string, count func(map[string]float64) float64, names ...string) func() string {
	read := func() []float64 {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		out := make([]float64, len(urls))
		for i, u := range urls {
			m, err := Scrape(ctx, u, names...)
			if err != nil {
				return nil
			}
			out[i] = count(m)
		}
		return out
	}
	before := read()
	return func() string {
		after := read()
		if before == nil || after == nil {
			return ""
		}
		parts := make([]string, len(urls))
		for i := range urls {
			parts[i] = fmt.Sprintf("%s=%.0f", roles[i], after[i]-before[i])
		}
		return strings.Join(parts, ",")
	}
}

// MetricsURLs returns each server's /metrics URL, from its base URL
// (http://host:port), in the same order.
func MetricsURLs(bases []string) []string {
	urls := make([]string, len(bases))
	for i, base := range bases {
		urls[i] = base + "/metrics"
	}
	return urls
}
