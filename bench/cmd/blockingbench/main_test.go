package main

import (
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestValueRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		ph  byte
		seq int
	}{{0, 0}, {2, 11999}, {255, 1 << 40}} {
		v := encodeValue(tc.ph, tc.seq)
		ph, seq, ok := decodeValue(v)
		if !ok || ph != tc.ph || seq != tc.seq {
			t.Errorf("decode(encode(%d, %d)) = %d, %d, %v", tc.ph, tc.seq, ph, seq, ok)
		}
		if tc.seq < 1<<40 && len(v) != valueSize {
			t.Errorf("len(encode(%d, %d)) = %d, want %d", tc.ph, tc.seq, len(v), valueSize)
		}
	}
	for _, bad := range []string{"ok", "", "1:", "x:1:", "1:-2:", "300:1:"} {
		if _, _, ok := decodeValue([]byte(bad)); ok {
			t.Errorf("decodeValue(%q) succeeded", bad)
		}
	}
}

// TestNextIndex follows consul-template's watch/view.go fetch.
func TestNextIndex(t *testing.T) {
	for _, tc := range []struct {
		name        string
		last, got   uint64
		next        uint64
		wantChanged bool
	}{
		{"first read takes the index", 0, 7, 7, true},
		{"timeout keeps the index", 7, 7, 7, false},
		{"change takes the new index", 7, 12, 12, true},
		{"lower index resets to 0", 12, 5, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next, changed := nextIndex(tc.last, tc.got)
			if got, want := next, tc.next; got != want {
				t.Errorf("next = %d, want %d", got, want)
			}
			if got, want := changed, tc.wantChanged; got != want {
				t.Errorf("changed = %v, want %v", got, want)
			}
		})
	}
}

func TestCountLabel(t *testing.T) {
	for n, want := range map[int]string{10000: "10k", 1000: "1k", 500: "500", 1500: "1500"} {
		if got := countLabel(n); got != want {
			t.Errorf("countLabel(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestQueryMembers(t *testing.T) {
	for _, tc := range []struct {
		on       string
		learners int
		want     []int
	}{
		{"leader", 0, []int{1}},
		{"follower", 0, []int{2}},
		{"followers", 0, []int{0, 2}},
		{"all", 2, []int{0, 1, 2}},
		{"learner", 1, []int{3}},
		{"learner", 4, []int{3, 4, 5, 6}},
	} {
		if got := queryMembers(3, tc.learners, 1, tc.on); !slices.Equal(got, tc.want) {
			t.Errorf("queryMembers(3, %d, 1, %q) = %v, want %v", tc.learners, tc.on, got, tc.want)
		}
	}
}

// TestEachWindowMeetsOneSnapshot: with the default flags, the log index
// at which the servers snapshot falls once in every phase's timed window
// (after the keys' first writes and the phase's warm-up), not only in one.
func TestEachWindowMeetsOneSnapshot(t *testing.T) {
	every := snapshotEntries()
	phase := int(float64(*flagRate) * (*flagWarmup + *flagDuration).Seconds())
	warm := int(float64(*flagRate) * flagWarmup.Seconds())
	for p := range 3 {
		first := *flagQueries + p*phase + warm + 1 // the window's first write's index, roughly
		last := *flagQueries + (p+1)*phase
		if n := last/every - (first-1)/every; n != 1 {
			t.Errorf("phase %d window, entries %d..%d: %d snapshots at every %d entries, want 1", p+1, first, last, n, every)
		}
	}
}

// TestConsulLines pins the two lines against Consul: medians of each
// system's reps, memory per query in KiB (issue 41, "Done when").
func TestConsulLines(t *testing.T) {
	lode := []peerSample{{with: 9, rssPerQuery: 10 << 10}, {with: 11, rssPerQuery: 12 << 10}, {with: 10, rssPerQuery: 8 << 10}}
	peer := []peerSample{{with: 150, rssPerQuery: 20 << 10}, {with: 170, rssPerQuery: 18 << 10}, {with: 169, rssPerQuery: 19 << 10}}
	var got []string
	for _, l := range consulLines(lode, peer, 10000) {
		got = append(got, l.String())
	}
	want := []string{
		"BENCH blocking-write-p99-10k-vs-consul lodestone=10ms consul=169ms ratio=0.06 target=<=0.25",
		"BENCH blocking-rss-per-query-10k-vs-consul lodestone=10KiB consul=19KiB ratio=0.53 target=<=1.0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("consulLines:\n got: %q\nwant: %q", got, want)
	}
	if got := perQuery(100<<20, 300<<20, 10000); got != 20971.52 {
		t.Errorf("perQuery = %v, want 20971.52 bytes", got)
	}
	// 50,000 over three servers: 16,667 each, under Consul's check of its
	// cap against a 20,000 open-file limit (cap + 20 <= limit).
	if got := consulLimits(50000, 3); !slices.Equal(got, []string{"-hcl", "limits { http_max_conns_per_client = 17667 }"}) {
		t.Errorf("consulLimits(50000, 3) = %q", got)
	}
}

func TestRaiseFileLimit(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if got, err := raiseFileLimit(lim.Cur); err != nil || got != lim.Cur {
		t.Errorf("a limit already met: %d, %v; want %d", got, err, lim.Cur)
	}
	// Above any kernel's fs.nr_open: refused, with the limit unchanged.
	if _, err := raiseFileLimit(1 << 40); err == nil {
		t.Error("raising the open-file limit to 2^40 succeeded")
	}
	var after syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &after); err != nil || after != lim {
		t.Errorf("limit after a refused raise: %+v, %v; want %+v", after, err, lim)
	}
}

// A phase its cap cut says so, naming the system and what was cut; one
// that finished says nothing.
func TestCutNote(t *testing.T) {
	p := newPhase(2, time.Second, 2*time.Second)
	if p.Cap != *flagPhaseCap || p.Cap <= 0 {
		t.Fatalf("phase cap %v, want -phase-cap (%v)", p.Cap, *flagPhaseCap)
	}
	if got := cutNote("consul", 0, "50k", writeResult{}, p); got != "" {
		t.Errorf("a finished phase's note: %q, want none", got)
	}
	got := cutNote("consul", 0, "50k", writeResult{cut: 1234}, p)
	for _, want := range []string{"unfinished: system=consul rep=1/", "phase=50k", "consul did not finish the phase", "1234 of 3000 writes", "a lower bound\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("note %q lacks %q", got, want)
		}
	}
}
