package main

import (
	"fmt"
	"math"
	"slices"
	"testing"
)

func TestValueRoundTrip(t *testing.T) {
	for _, seq := range []int{0, 1, 999, 1 << 40} {
		ph, got, ok := decodeValue(encodeValue(7, seq))
		if !ok || ph != 7 || got != seq {
			t.Errorf("decode(encode(7, %d)) = %d, %d, %v", seq, ph, got, ok)
		}
	}
	if _, _, ok := decodeValue([]byte("ok")); ok {
		t.Error("the probe value decoded as a phase write")
	}
}

// keyOf must write every key once per nkeys consecutive writes, so each
// exact watcher is due the same number of events.
func TestKeyOfIsAPermutation(t *testing.T) {
	const n = 10000
	seen := make([]bool, n)
	for seq := range n {
		k := keyOf(seq+3*n, n)
		if seen[k] {
			t.Fatalf("key %d written twice within %d writes", k, n)
		}
		seen[k] = true
	}
}

// quantileSince reads a quantile of the observations between two scrapes
// of a cumulative histogram, not of everything since the process started.
func TestQuantileSince(t *testing.T) {
	inf := math.Inf(1)
	before := map[float64]float64{0.001: 90, 0.01: 100, inf: 100}
	after := map[float64]float64{0.001: 91, 0.01: 140, inf: 200}
	// Since before, cumulative: 1 at ≤1ms, 40 at ≤10ms, 100 in all.
	for _, tc := range []struct {
		q    float64
		want float64
	}{{0.01, 0.001}, {0.4, 0.01}, {0.41, inf}, {0.99, inf}} {
		if got, ok := quantileSince(before, after, tc.q); !ok || got != tc.want {
			t.Errorf("q=%g: got %g, %v; want %g", tc.q, got, ok, tc.want)
		}
	}
	if _, ok := quantileSince(after, after, 0.99); ok {
		t.Error("a quantile of no observations")
	}
}

func TestPlaceWatches(t *testing.T) {
	defer func(v string) { *flagWatchMember = v }(*flagWatchMember)
	metrics := func(i int) string { return fmt.Sprintf("m%d", i) }
	for _, tc := range []struct {
		member  string
		clients int
		want    []int
	}{
		{"followers", 3, []int{0, 2}},
		{"follower", 3, []int{2}},
		{"leader", 3, []int{1}},
		{"followers", 1, []int{0}}, // one process: it serves everything
	} {
		*flagWatchMember = tc.member
		d := &deployment{leader: min(1, tc.clients-1)}
		for i := range tc.clients {
			d.clients = append(d.clients, fmt.Sprintf("c%d", i))
			d.procs = append(d.procs, nil)
		}
		d.placeWatches(metrics)
		if !slices.Equal(d.watchers, tc.want) {
			t.Errorf("%s over %d: watchers %v, want %v", tc.member, tc.clients, d.watchers, tc.want)
		}
		for j, i := range d.watchers {
			if d.watchTargets[j] != d.clients[i] || d.watchMetrics[j] != metrics(i) {
				t.Errorf("%s over %d: member %d has target %s, metrics %s", tc.member, tc.clients, i, d.watchTargets[j], d.watchMetrics[j])
			}
		}
	}
}

// BENCH line names carry the top watcher count: the 1M phase must not
// be named "1000k", nor 100k "0m".
func TestCountLabel(t *testing.T) {
	for n, want := range map[int]string{10000: "10k", 100000: "100k", 1000000: "1m", 2000000: "2m", 1500000: "1500k"} {
		if got := countLabel(n); got != want {
			t.Errorf("countLabel(%d) = %q, want %q", n, got, want)
		}
	}
}
