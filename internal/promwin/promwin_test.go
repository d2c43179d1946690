package promwin

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// fakeClock is advanced by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newRegistry() (*prometheus.Registry, prometheus.Histogram, *prometheus.CounterVec, prometheus.Gauge) {
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "lat_seconds", Buckets: []float64{0.01, 0.1, 1}})
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cut_total"}, []string{"reason"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "size_bytes"})
	reg.MustRegister(h, c, g)
	return reg, h, c, g
}

func gatherer(reg prometheus.Gatherer) Source {
	return func(context.Context) ([]*dto.MetricFamily, error) { return reg.Gather() }
}

func TestQuantileIsOverTheWindowNotSinceStart(t *testing.T) {
	reg, h, _, _ := newRegistry()
	clk := &fakeClock{t: time.Unix(1000, 0)}
	s := New(gatherer(reg), Config{Now: clk.now})
	// A minute of slow observations, then a fast one.
	for range 100 {
		h.Observe(0.5)
	}
	ctx := context.Background()
	if _, err := s.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	w, _ := s.Window(time.Minute)
	if got := w.Quantile(0.99, "lat_seconds"); got < 0.1 || got > 1 {
		t.Fatalf("one sample: p99 %v, want the cumulative one in (0.1, 1]", got)
	}
	clk.t = clk.t.Add(90 * time.Second)
	for range 100 {
		h.Observe(0.005)
	}
	if _, err := s.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	w, _ = s.Window(time.Minute)
	if w.From == w.To {
		t.Fatal("window of two samples 90s apart collapsed")
	}
	// The window reaches back to the oldest sample: only the fast ones.
	w, _ = s.Window(2 * time.Minute)
	if got := w.Quantile(0.99, "lat_seconds"); got > 0.01 {
		t.Fatalf("p99 over the window %v, want within the first bucket (the slow ones are older)", got)
	}
}

func TestRateIncreaseAndReset(t *testing.T) {
	reg, _, c, g := newRegistry()
	clk := &fakeClock{t: time.Unix(1000, 0)}
	s := New(gatherer(reg), Config{Now: clk.now})
	c.WithLabelValues("overflow").Add(5)
	c.WithLabelValues("lag").Add(1)
	g.Set(42)
	ctx := context.Background()
	s.Refresh(ctx)
	clk.t = clk.t.Add(10 * time.Second)
	c.WithLabelValues("overflow").Add(20)
	s.Refresh(ctx)
	w, _ := s.Window(time.Minute)
	if got := w.Rate("cut_total", "reason", "overflow"); got != 2 {
		t.Fatalf("rate %v, want 2/s", got)
	}
	if got := w.Increase("cut_total"); got != 20 {
		t.Fatalf("increase over every label %v, want 20", got)
	}
	if got := w.To.Value("size_bytes"); got != 42 {
		t.Fatalf("gauge %v", got)
	}
	if got := w.To.Value("absent"); !math.IsNaN(got) {
		t.Fatalf("absent family %v, want NaN", got)
	}
	if got := (Window{From: w.To, To: w.From}).Increase("cut_total", "reason", "overflow"); got != 5 {
		t.Fatalf("a counter that went down (a restart) counts from zero: %v, want 5", got)
	}
}

func TestRefreshGathersAtMostOncePerInterval(t *testing.T) {
	var calls atomic.Int32
	clk := &fakeClock{t: time.Unix(1000, 0)}
	fail := errors.New("scrape refused")
	var failing atomic.Bool
	s := New(func(context.Context) ([]*dto.MetricFamily, error) {
		calls.Add(1)
		if failing.Load() {
			return nil, fail
		}
		return nil, nil
	}, Config{Now: clk.now, Keep: 3})
	ctx := context.Background()
	for range 5 {
		s.Refresh(ctx)
	}
	if calls.Load() != 1 {
		t.Fatalf("%d gathers within one interval, want 1", calls.Load())
	}
	for range 5 {
		clk.t = clk.t.Add(time.Second)
		s.Refresh(ctx)
	}
	if got := len(s.History(func(*Sample) float64 { return 0 })); got != 3 {
		t.Fatalf("kept %d samples, want Keep=3", got)
	}
	failing.Store(true)
	clk.t = clk.t.Add(time.Second)
	sm, err := s.Refresh(ctx)
	if !errors.Is(err, fail) || sm == nil {
		t.Fatalf("a failed try: sample %v err %v; want the old sample and the error", sm, err)
	}
}

func TestStepsAreAPercentilePerInterval(t *testing.T) {
	reg, h, _, _ := newRegistry()
	clk := &fakeClock{t: time.Unix(1000, 0)}
	s := New(gatherer(reg), Config{Now: clk.now})
	ctx := context.Background()
	s.Refresh(ctx)
	for _, v := range []float64{0.005, 0.5} {
		clk.t = clk.t.Add(time.Second)
		h.Observe(v)
		s.Refresh(ctx)
	}
	got := s.Steps(func(w Window) float64 { return w.Quantile(0.5, "lat_seconds") })
	if len(got) != 2 || got[0] > 0.01 || got[1] < 0.1 {
		t.Fatalf("steps %v, want one fast then one slow interval", got)
	}
}
