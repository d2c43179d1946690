package server

import (
	"context"
	"encoding/binary"
	"math"
	"net"
	"runtime"
	rtmetrics "runtime/metrics"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func histogramOf(t *testing.T, h prometheus.Histogram) *dto.Histogram {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram()
}

// The probe records delays no longer than the run itself, and stops (its
// reader too: the package's goroutine check) when its context is done.
func TestPollProbeRecordsDelays(t *testing.T) {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "d", Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16)})
	p, err := newPollProbe(h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	began := time.Now()
	go func() { done <- p.run(ctx, time.Millisecond) }()
	waitFor(t, 10*time.Second, func() bool { return histogramOf(t, h).GetSampleCount() >= 20 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	got := histogramOf(t, h)
	if mean := got.GetSampleSum() / float64(got.GetSampleCount()); mean < 0 || mean > time.Since(began).Seconds() {
		t.Fatalf("mean delay %gs over %d samples: want between 0 and the run's %v", mean, got.GetSampleCount(), time.Since(began))
	}
}

// A datagram from another socket is not taken for a probe: it would
// record whatever delay its sender chose.
func TestPollProbeIgnoresOthers(t *testing.T) {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "d", Buckets: []float64{1}})
	p, err := newPollProbe(h)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.run(ctx, time.Hour) }()
	other, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(p.self))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	// Sent "before the probe started": a delay of years if taken.
	forged := make([]byte, 8)
	binary.LittleEndian.PutUint64(forged, 1<<63)
	for range 3 {
		if _, err := other.Write(forged); err != nil {
			t.Fatal(err)
		}
	}
	// The probe's own datagram, sent the way run sends them, is read after
	// the forged ones: once it is counted, they have been seen.
	binary.LittleEndian.PutUint64(forged, uint64(time.Since(p.start)))
	if _, err := p.conn.WriteToUDPAddrPort(forged, p.self); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() bool { return histogramOf(t, h).GetSampleCount() >= 1 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if got := histogramOf(t, h); got.GetSampleCount() != 1 || got.GetBucket()[0].GetCumulativeCount() != 1 {
		t.Fatalf("recorded %d samples (%d under 1s), want only the probe's own", got.GetSampleCount(), got.GetBucket()[0].GetCumulativeCount())
	}
}

// A server exports its poll delay and the scheduler's run-queue latency.
func TestServerExportsPollDelay(t *testing.T) {
	c := newTestCluster(t, 1, func(cfg *Config) { cfg.PollProbeInterval = 2 * time.Millisecond })
	s := c.servers[c.waitLeader()]
	waitFor(t, 10*time.Second, func() bool { return gauge(t, s, "lodestone_runtime_poll_delay_seconds") >= 5 })
	if n := gauge(t, s, "lodestone_runtime_sched_latency_seconds"); n <= 0 {
		t.Fatalf("lodestone_runtime_sched_latency_seconds has %g observations, want some", n)
	}
}

// A server exports the CPU its garbage collector used: after a cycle,
// the total is above zero and covers the marking.
func TestServerExportsGCCPU(t *testing.T) {
	c := newTestCluster(t, 1)
	s := c.servers[c.waitLeader()]
	runtime.GC()
	total, mark := gauge(t, s, "go_cpu_classes_gc_total_cpu_seconds_total"), gauge(t, s, "go_cpu_classes_gc_mark_dedicated_cpu_seconds_total")
	if total <= 0 || mark > total {
		t.Fatalf("GC CPU total %gs, dedicated marking %gs: want a positive total covering the marking", total, mark)
	}
}

func TestConfigPollProbeInterval(t *testing.T) {
	checkDurationField(t, "poll-probe-interval", func(c *Config, d time.Duration) { c.PollProbeInterval = d },
		[]time.Duration{0, time.Millisecond, time.Minute}, []time.Duration{-time.Millisecond, time.Minute + time.Second})
}

// Folding a runtime histogram: a bucket counts at a bound only when all of
// it lies at or below the bound; open-ended buckets add their finite edge
// to the sum.
func TestFoldHistogram(t *testing.T) {
	h := &rtmetrics.Float64Histogram{
		Buckets: []float64{math.Inf(-1), 0.0001, 0.0003, 0.002, math.Inf(1)},
		Counts:  []uint64{1, 2, 3, 4},
	}
	count, sum, buckets := foldHistogram(h, []float64{0.0001, 0.001, 0.01})
	if count != 10 {
		t.Errorf("count %d, want 10", count)
	}
	want := map[float64]uint64{0.0001: 1, 0.001: 3, 0.01: 6}
	for b, n := range want {
		if buckets[b] != n {
			t.Errorf("at %g: %d, want %d (all %v)", b, buckets[b], n, buckets)
		}
	}
	if wantSum := 1*0.0001 + 2*0.0002 + 3*0.00115 + 4*0.002; math.Abs(sum-wantSum) > 1e-12 {
		t.Errorf("sum %g, want %g", sum, wantSum)
	}
}
