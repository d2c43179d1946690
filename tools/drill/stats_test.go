package main

import (
	"math"
	"testing"
)

// cumulative turns per-bucket counts into a cumulative histogram as
// /metrics prints it.
func cumulative(bounds []float64, counts []float64) map[float64]float64 {
	h := map[float64]float64{}
	var run float64
	for i, b := range bounds {
		run += counts[i]
		h[b] = run
	}
	return h
}

// TestP99BetweenScrapes takes the p99 of the observations between two
// scrapes only, interpolated inside its bucket, and counts those above a
// bound.
func TestP99BetweenScrapes(t *testing.T) {
	bounds := []float64{0.001, 0.002, 0.004, math.Inf(1)}
	before := cumulative(bounds, []float64{500, 0, 0, 0})
	// Then 100 more: 98 under 1ms, 2 in (2ms, 4ms].
	after := cumulative(bounds, []float64{598, 0, 2, 0})
	if got := count(before, after); got != 100 {
		t.Fatalf("count = %v, want 100", got)
	}
	// Rank 99 of 100 falls halfway into the (2ms, 4ms] bucket's 2.
	if got := p99(before, after); math.Abs(got-0.003) > 1e-9 {
		t.Errorf("p99 = %v, want 0.003", got)
	}
	if got := above(0.002, before, after); got != 2 {
		t.Errorf("above 2ms = %v, want 2", got)
	}
	if got := p99(after, after); got != 0 {
		t.Errorf("p99 of nothing = %v, want 0", got)
	}
}

func TestSpreadOf(t *testing.T) {
	s := spreadOf([]float64{5, 1, 9})
	if s.median != 5 || s.min != 1 || s.max != 9 {
		t.Errorf("spreadOf(5,1,9) = %+v, want median 5 in 1..9", s)
	}
	if s := spreadOf([]float64{4, 2}); s.median != 3 {
		t.Errorf("median of 4,2 = %v, want 3", s.median)
	}
	if s := spreadOf(nil); !math.IsNaN(s.median) {
		t.Errorf("median of nothing = %v, want NaN", s.median)
	}
}

// TestPlacement: each server with its open watch streams, in the
// cluster's order, the leader starred; a server that did not answer
// its scrape reads 0.
func TestPlacement(t *testing.T) {
	c := &cluster{servers: []*server{{name: "n1"}, {name: "n2"}, {name: "n3"}}}
	ms := []metrics{
		{watchStreams: 3, isLeader: 0},
		{watchStreams: 12, isLeader: 1},
		{},
	}
	if got, want := placement(c, ms), "n1:3,n2*:12,n3:0"; got != want {
		t.Errorf("placement = %q, want %q", got, want)
	}
}
