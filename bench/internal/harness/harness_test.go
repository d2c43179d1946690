package harness

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// writerChildEnv makes the test binary TestWriterChild's writer child.
const writerChildEnv = "HARNESS_TEST_WRITER_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(mainChildEnv); mode != "" {
		runMainChild(mode)
		return
	}
	if os.Getenv(writerChildEnv) != "" {
		err := ServeWrites(context.Background(), os.Stdin, os.Stdout, func(_ context.Context, id byte, seq int) error {
			if seq%7 == 3 {
				return fmt.Errorf("write %d of phase %d refused", seq, id)
			}
			return nil
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func ms(xs ...int) []time.Duration {
	out := make([]time.Duration, len(xs))
	for i, x := range xs {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func TestPercentile(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond // 1ms..100ms
	}
	for _, tc := range []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 99, 0},
		{"single", ms(7), 99, 7 * time.Millisecond},
		{"p99 of 1..100", hundred, 99, 99 * time.Millisecond},
		{"p50 of 1..100", hundred, 50, 50 * time.Millisecond},
		{"p100 is max", hundred, 100, 100 * time.Millisecond},
		{"tiny p is min", hundred, 0.001, 1 * time.Millisecond},
		// Nearest rank: ceil(0.99*10) = 10, so with 10 samples p99 is the max.
		{"p99 of ten is max", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 50), 99, 50 * time.Millisecond},
		{"p50 of four", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, want := Percentile(tc.sorted, tc.p), tc.want; got != want {
				t.Errorf("Percentile(p=%v) = %v, want %v", tc.p, got, want)
			}
		})
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		name string
		xs   []float64
		want float64
	}{
		{"one", []float64{3}, 3},
		{"odd unsorted", []float64{9, 1, 5}, 5},
		{"even is mean of middle two", []float64{4, 1, 3, 2}, 2.5},
		{"outlier ignored", []float64{100, 101, 1e9}, 101},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.xs)
			if got, want := Median(in), tc.want; got != want {
				t.Errorf("Median(%v) = %v, want %v", tc.xs, got, want)
			}
			if !slices.Equal(in, tc.xs) {
				t.Errorf("Median modified its input: %v, was %v", in, tc.xs)
			}
		})
	}
	if got := Median(nil); !math.IsNaN(got) {
		t.Errorf("Median(nil) = %v, want NaN", got)
	}
}

func TestFormatValue(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want string
	}{
		{21400.4, "21400"},
		{13099.6, "13100"},
		{100, "100"},
		{12.34, "12.3"},
		{10, "10"},
		{4.1, "4.1"},
		{4.10001, "4.1"},
		{4.126, "4.13"},
		{1, "1"},
		{0.8534, "0.853"},
		{0.05, "0.05"},
		{0, "0"},
	} {
		if got, want := FormatValue(tc.v), tc.want; got != want {
			t.Errorf("FormatValue(%v) = %q, want %q", tc.v, got, want)
		}
	}
}

func TestLine(t *testing.T) {
	for _, tc := range []struct {
		name     string
		line     Line
		want     string
		wantPass bool
	}{
		{
			name: "design doc throughput example",
			line: Line{Name: "put-64clients-throughput", Unit: "ops/s", Lodestone: 21400, PeerName: "etcd", Peer: 13100, Op: ">=", Target: 1.5},
			want: "BENCH put-64clients-throughput lodestone=21400ops/s etcd=13100ops/s ratio=1.63 target=>=1.5", wantPass: true,
		},
		{
			name: "design doc p99 example",
			line: Line{Name: "put-64clients-p99", Unit: "ms", Lodestone: 4.1, PeerName: "etcd", Peer: 5.0, Op: "<=", Target: 1},
			want: "BENCH put-64clients-p99 lodestone=4.1ms etcd=5ms ratio=0.82 target=<=1.0", wantPass: true,
		},
		{
			name: "throughput below target fails",
			line: Line{Name: "put-1clients-throughput", Unit: "ops/s", Lodestone: 900, PeerName: "etcd", Peer: 1000, Op: ">=", Target: 1},
			want: "BENCH put-1clients-throughput lodestone=900ops/s etcd=1000ops/s ratio=0.90 target=>=1.0", wantPass: false,
		},
		{
			// The verdict is taken on the printed ratio so a reader who
			// compares the numbers by eye agrees with Pass.
			name: "pass judged on printed ratio",
			line: Line{Name: "x", Unit: "ms", Lodestone: 1.004, PeerName: "etcd", Peer: 1, Op: "<=", Target: 1},
			want: "BENCH x lodestone=1ms etcd=1ms ratio=1.00 target=<=1.0", wantPass: true,
		},
		{
			name: "self-comparison names both sides",
			line: Line{Name: "put-64clients-secure-vs-plain", Unit: "ops/s", LodestoneName: "lodestone-secure", Lodestone: 8600, PeerName: "lodestone-plain", Peer: 9000, Op: ">=", Target: 0.9},
			want: "BENCH put-64clients-secure-vs-plain lodestone-secure=8600ops/s lodestone-plain=9000ops/s ratio=0.96 target=>=0.9", wantPass: true,
		},
		{
			name: "zero peer",
			line: Line{Name: "x", Unit: "ops/s", Lodestone: 5, PeerName: "etcd", Peer: 0, Op: ">=", Target: 1},
			want: "BENCH x lodestone=5ops/s etcd=0ops/s ratio=+Inf target=>=1.0", wantPass: true,
		},
		{
			name: "both zero is NaN and fails",
			line: Line{Name: "x", Unit: "ops/s", PeerName: "etcd", Op: ">=", Target: 1},
			want: "BENCH x lodestone=0ops/s etcd=0ops/s ratio=NaN target=>=1.0", wantPass: false,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, want := tc.line.String(), tc.want; got != want {
				t.Errorf("String()\n got: %s\nwant: %s", got, want)
			}
			if got, want := tc.line.Pass(), tc.wantPass; got != want {
				t.Errorf("Pass() = %v, want %v", got, want)
			}
		})
	}
}

func TestDriveCountsOnlyTheWindow(t *testing.T) {
	errBoom := errors.New("boom")
	res, err := Drive(context.Background(), DriveConfig{Clients: 4, Warmup: 20 * time.Millisecond, Duration: 50 * time.Millisecond},
		func(ctx context.Context, client, seq int) error {
			if client == 3 {
				return errBoom
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops() == 0 {
		t.Fatal("no ops counted")
	}
	if res.Errors == 0 || !errors.Is(res.FirstErr, errBoom) {
		t.Errorf("Errors = %d, FirstErr = %v; want some errors and errBoom", res.Errors, res.FirstErr)
	}
	if got, want := res.Window, 50*time.Millisecond; got != want {
		t.Errorf("Window = %v, want %v", got, want)
	}
	if !slices.IsSorted(res.Latencies) {
		t.Error("Latencies not sorted")
	}
}

// With classes, every acknowledged op's latency lands in its class too,
// and only there.
func TestDriveSplitsClasses(t *testing.T) {
	const slow = 20 * time.Millisecond
	res, err := Drive(context.Background(), DriveConfig{Clients: 3, Duration: 150 * time.Millisecond,
		Classes: 2, Class: func(client, seq int) int { return seq % 2 }},
		func(ctx context.Context, client, seq int) error {
			if seq%2 == 1 {
				time.Sleep(slow) // every op of class 1 takes at least this
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.ByClass) != 2 || len(res.ByClass[0]) == 0 || len(res.ByClass[1]) == 0 {
		t.Fatalf("ByClass sizes: %d classes; want 2, both with ops", len(res.ByClass))
	}
	if n := len(res.ByClass[0]) + len(res.ByClass[1]); n != res.Ops() {
		t.Errorf("classes hold %d latencies, Latencies %d", n, res.Ops())
	}
	if p50, least := Percentile(res.ByClass[0], 50), res.ByClass[1][0]; p50 >= slow || least < slow {
		t.Errorf("class 0 p50 %v, class 1 fastest %v: the classes are mixed up", p50, least)
	}
	if !slices.IsSorted(res.ByClass[0]) || !slices.IsSorted(res.ByClass[1]) {
		t.Error("ByClass not sorted")
	}
}

func TestDriveStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{}, 1)
	go func() { <-started; cancel() }()
	_, err := Drive(ctx, DriveConfig{Clients: 2, Duration: time.Hour}, func(ctx context.Context, _, _ int) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Drive after cancel = %v, want context.Canceled", err)
	}
}

func TestFreePortsDistinct(t *testing.T) {
	ports, err := FreePorts(6)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("bad or repeated port %d in %v", p, ports)
		}
		seen[p] = true
	}
}

func TestStopEscalatesToKill(t *testing.T) {
	dir := t.TempDir()
	// One process exits on SIGTERM; the other ignores it and must be killed.
	polite, err := Start("polite", "sleep", []string{"60"}, filepath.Join(dir, "polite.log"), "")
	if err != nil {
		t.Fatal(err)
	}
	stubborn, err := Start("stubborn", "sh", []string{"-c", `trap "" TERM; echo ready; while :; do sleep 0.05; done`}, filepath.Join(dir, "stubborn.log"), "")
	if err != nil {
		t.Fatal(err)
	}
	// Wait until the trap is installed (the script says so) before signalling.
	for deadline := time.Now().Add(5 * time.Second); ; {
		if b, _ := os.ReadFile(stubborn.LogPath); len(b) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("stubborn never became ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := polite.Stop(5 * time.Second); err != nil {
		t.Errorf("polite.Stop = %v, want nil", err)
	}
	if err := stubborn.Stop(100 * time.Millisecond); err == nil {
		t.Error("stubborn.Stop = nil, want an error saying it was killed")
	}
	for _, p := range []*Proc{polite, stubborn} {
		if exited, _ := p.Exited(); !exited {
			t.Errorf("%s still running after Stop", p.Name)
		}
		if err := p.Stop(time.Second); err != nil {
			t.Errorf("second Stop of %s = %v, want nil", p.Name, err)
		}
	}
}

// A writer child runs phase after phase on its own schedule and reports
// every failed write and the latency of every timed one.
func TestWriterChild(t *testing.T) {
	t.Setenv(writerChildEnv, "1")
	w, err := StartWriter("writer", os.Args[0], nil, filepath.Join(t.TempDir(), "writer.log"), "")
	if err != nil {
		t.Fatal(err)
	}
	for id := byte(1); id <= 2; id++ {
		p := NewWritePhase(id, 1000, 20*time.Millisecond, 50*time.Millisecond)
		if p.TotalN != 70 || p.WarmN != 20 {
			t.Fatalf("phase: %d writes, %d warm-up; want 70, 20", p.TotalN, p.WarmN)
		}
		start := time.Now()
		r, err := w.Run(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		if end := p.Intended(p.TotalN - 1); time.Now().Before(end) || start.After(p.Base) {
			t.Errorf("phase %d ran %v-%v; its writes were due %v-%v", id, start, time.Now(), p.Base, end)
		}
		var failed []int
		timed := 0
		for seq := range p.TotalN {
			switch {
			case seq%7 == 3:
				failed = append(failed, seq)
			case seq >= p.WarmN:
				timed++
			}
			if r.Acked(seq) == (seq%7 == 3) {
				t.Errorf("phase %d: Acked(%d) = %v", id, seq, r.Acked(seq))
			}
		}
		if !slices.Equal(r.Failed, failed) {
			t.Errorf("phase %d: failed %v, want %v", id, r.Failed, failed)
		}
		if len(r.Latencies) != timed || !slices.IsSorted(r.Latencies) || r.Latencies[0] < 0 {
			t.Errorf("phase %d: %d latencies (sorted %v, first %v), want %d sorted, none negative",
				id, len(r.Latencies), slices.IsSorted(r.Latencies), r.Latencies[0], timed)
		}
		if r.Tail.Spans != 1 || r.Tail.Of != 1 {
			t.Errorf("phase %d: tail spread %v, want 1/1 (a 50 ms window is one span)", id, r.Tail)
		}
		if !strings.HasSuffix(r.FirstErr, fmt.Sprintf("of phase %d refused", id)) {
			t.Errorf("phase %d: first error %q, want a refused write of this phase", id, r.FirstErr)
		}
	}
	if err := w.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if exited, err := w.Proc().Exited(); !exited || err != nil {
		t.Errorf("after Stop: exited %v (%v), want a clean exit", exited, err)
	}
}

// A server that stalls ends a capped phase at its deadline: every write
// is cut, those sent and those never sent, none counts as an error, and
// each timed one is held to have taken at least the cap.
func TestRunWritesCapCutsAStall(t *testing.T) {
	p := NewWritePhase(1, 1000, 100*time.Millisecond, 500*time.Millisecond)
	p.Cap = 100 * time.Millisecond
	var sent atomic.Int64
	stalled := func(ctx context.Context, _ byte, _ int) error {
		sent.Add(1)
		<-ctx.Done()
		return ctx.Err()
	}
	r, err := RunWrites(context.Background(), p, stalled)
	if err != nil {
		t.Fatal(err)
	}
	if time.Now().Before(p.Deadline()) {
		t.Errorf("RunWrites returned before the phase's deadline %v", p.Deadline())
	}
	if got := sent.Load(); got != WriteWorkers {
		t.Errorf("%d writes sent, want one per worker (%d): the rest were due behind stalled ones", got, WriteWorkers)
	}
	if r.Cut != p.TotalN || len(r.Failed) != p.TotalN || len(r.Latencies) != 0 || r.FirstErr != "" {
		t.Errorf("cut %d, failed %d, acknowledged %d, first error %q; want all %d cut, none acknowledged, no error",
			r.Cut, len(r.Failed), len(r.Latencies), r.FirstErr, p.TotalN)
	}
	if len(r.CutWaited) != p.TotalN-p.WarmN || !slices.IsSorted(r.CutWaited) || r.CutWaited[0] < p.Cap {
		t.Errorf("%d cut waits (sorted %v, least %v), want %d sorted, none under the cap %v",
			len(r.CutWaited), slices.IsSorted(r.CutWaited), r.CutWaited[0], p.TotalN-p.WarmN, p.Cap)
	}
	if got := r.WithCut(); len(got) != len(r.CutWaited) {
		t.Errorf("WithCut has %d latencies, want the %d cut ones", len(got), len(r.CutWaited))
	}
}

// A phase that keeps to its schedule is not cut by its cap, and WithCut
// merges what was cut into the latencies in order.
func TestRunWritesCapLeavesAHealthyPhase(t *testing.T) {
	p := NewWritePhase(1, 1000, 10*time.Millisecond, 40*time.Millisecond)
	p.Cap = time.Minute
	r, err := RunWrites(context.Background(), p, func(context.Context, byte, int) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if r.Cut != 0 || len(r.Failed) != 0 || len(r.Latencies) != p.TotalN-p.WarmN {
		t.Errorf("cut %d, failed %d, timed %d; want 0, 0, %d", r.Cut, len(r.Failed), len(r.Latencies), p.TotalN-p.WarmN)
	}
	if (WritePhase{}).Deadline() != (time.Time{}) {
		t.Error("a phase without a cap has a deadline")
	}
	r = WriteResult{Latencies: ms(1, 5, 9), CutWaited: ms(4, 12)}
	if got := r.WithCut(); !slices.Equal(got, ms(1, 4, 5, 9, 12)) {
		t.Errorf("WithCut = %v", got)
	}
}

func TestRoles(t *testing.T) {
	if got, want := Roles(3, 1), []string{"f1", "leader", "f2"}; !slices.Equal(got, want) {
		t.Errorf("Roles(3, 1) = %v, want %v", got, want)
	}
	if got, want := Roles(1, 0), []string{"leader"}; !slices.Equal(got, want) {
		t.Errorf("Roles(1, 0) = %v, want %v", got, want)
	}
}

func TestBaseline(t *testing.T) {
	pooled, strict := Baseline([]float64{5, 4, 9}, []float64{6, 3, 7})
	// pooled: median of 3 4 5 6 7 9; strict: median of 5 3 7.
	if pooled != 5.5 || strict != 5 {
		t.Errorf("Baseline = %v, %v; want 5.5, 5", pooled, strict)
	}
}

// TestTailSpread: the slowest 2% of a phase's writes (so the p99 is
// theirs) in one stall fall in two spans; the same number spread out
// fall in every span.
func TestTailSpread(t *testing.T) {
	p := WritePhase{Period: time.Millisecond, WarmN: 10, TotalN: 1010} // 1 s timed: 10 spans
	for _, tc := range []struct {
		name string
		slow func(seq int) bool
		want TailSpread
	}{
		// seqs 500-519: 490-509 ms into the window, spans 4 and 5.
		{"one stall", func(seq int) bool { return seq >= 500 && seq < 520 }, TailSpread{Spans: 2, Of: 10,
			Stalls: []TailStall{{Offset: 400 * time.Millisecond, Length: 200 * time.Millisecond, Writes: 20}}}},
		// seqs 110-114 and 810-820: spans 1 and 8, the later one larger;
		// span 6's four are not a stall.
		{"two stalls", func(seq int) bool {
			return (seq >= 110 && seq < 115) || (seq >= 810 && seq < 821) || seq == 610 || seq == 620 || seq == 630 || seq == 640
		}, TailSpread{Spans: 3, Of: 10, Stalls: []TailStall{
			{Offset: 800 * time.Millisecond, Length: 100 * time.Millisecond, Writes: 11},
			{Offset: 100 * time.Millisecond, Length: 100 * time.Millisecond, Writes: 5}}}},
		{"spread", func(seq int) bool { return seq%50 == 25 }, TailSpread{Spans: 10, Of: 10}},
	} {
		var seqs []int
		var lats []time.Duration
		for seq := p.WarmN; seq < p.TotalN; seq++ {
			lat := time.Millisecond
			if tc.slow(seq) {
				lat = 50 * time.Millisecond
			}
			seqs, lats = append(seqs, seq), append(lats, lat)
		}
		// Reversed, as workers hand their writes back out of order.
		slices.Reverse(seqs)
		slices.Reverse(lats)
		got := tailSpread(p, seqs, lats)
		if got.Spans != tc.want.Spans || got.Of != tc.want.Of {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
		if !slices.Equal(got.Stalls, tc.want.Stalls) {
			t.Errorf("%s: stalls %s, want %s", tc.name, got.StallsString(), tc.want.StallsString())
		}
		if len(got.Slowest) != 20 {
			t.Fatalf("%s: %d slowest writes, want the 20 slow ones", tc.name, len(got.Slowest))
		}
		for i, w := range got.Slowest {
			if w.Latency != 50*time.Millisecond || (i > 0 && !w.At.After(got.Slowest[i-1].At)) {
				t.Fatalf("%s: slowest[%d] = %+v: want the slow writes, by intended start", tc.name, i, w)
			}
		}
	}
	if got := tailSpread(p, nil, nil); got.Spans != 0 || got.Of != 10 || got.Slowest != nil {
		t.Errorf("no writes: %v, want 0/10", got)
	}
}

func TestSaveSlowest(t *testing.T) {
	at := time.Date(2026, 11, 26, 16, 12, 8, 106_000_000, time.FixedZone("x", 3600))
	path := filepath.Join(t.TempDir(), "sub", "writes.txt")
	tail := TailSpread{Slowest: []TailWrite{{At: at, Latency: 28800 * time.Microsecond}, {At: at.Add(time.Millisecond), Latency: 9 * time.Millisecond}}}
	if err := SaveSlowest(path, tail); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := "2026-11-26T15:12:08.106000Z 28.8ms\n2026-11-26T15:12:08.107000Z 9ms\n"; string(b) != want {
		t.Fatalf("saved %q, want %q", b, want)
	}
}
