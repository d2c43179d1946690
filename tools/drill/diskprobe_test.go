package main

import (
	"os"
	"testing"
	"time"
)

func TestDiskProbeWorstIsTheWindows(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	p := &diskProbe{samples: []probeSample{
		{at: t0, took: 9 * time.Millisecond},
		{at: t0.Add(1 * time.Second), took: 2 * time.Millisecond},
		{at: t0.Add(2 * time.Second), took: 1600 * time.Millisecond},
		{at: t0.Add(3 * time.Second), took: 3 * time.Millisecond},
	}}
	for _, c := range []struct {
		from, to time.Duration
		want     time.Duration
	}{
		{0, 4 * time.Second, 1600 * time.Millisecond},
		{1 * time.Second, 2 * time.Second, 2 * time.Millisecond}, // the end is open
		{500 * time.Millisecond, 3*time.Second + 1, 1600 * time.Millisecond},
		{3 * time.Second, 4 * time.Second, 3 * time.Millisecond},
		{4 * time.Second, 5 * time.Second, 0},
	} {
		if got := p.worst(t0.Add(c.from), t0.Add(c.to)); got != c.want {
			t.Errorf("worst(+%s, +%s) = %s, want %s", c.from, c.to, got, c.want)
		}
	}
	var none *diskProbe
	if got := none.worst(t0, t0.Add(time.Hour)); got != 0 {
		t.Errorf("no probe: worst = %s, want 0", got)
	}
}

func TestDiskProbeSyncsAndCleansUp(t *testing.T) {
	dir := t.TempDir()
	start := time.Now()
	// NB: an hour between ticks: the test syncs by hand, so nothing it
	// reads depends on when the probe's own goroutine runs.
	p, err := startDiskProbe(dir, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.sync(make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	if got := p.worst(start, time.Now().Add(time.Second)); got <= 0 {
		t.Fatalf("worst after one fdatasync = %s, want it measured", got)
	}
	name := p.f.Name()
	p.close()
	if _, err := os.Stat(name); !os.IsNotExist(err) {
		t.Errorf("probe file after close: %v, want it removed", err)
	}
}
