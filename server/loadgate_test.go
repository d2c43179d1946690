package server

import (
	"math"
	"runtime"
	rtmetrics "runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// fakeLatencies is a cumulative scheduler latency histogram a test adds
// waits to: buckets [-inf,0) [0,1ms) [1ms,5ms) [5ms,10ms) [10ms,20ms)
// [20ms,+inf).
type fakeLatencies struct {
	h     rtmetrics.Float64Histogram
	reads int
}

func newFakeLatencies() *fakeLatencies {
	return &fakeLatencies{h: rtmetrics.Float64Histogram{
		Buckets: []float64{math.Inf(-1), 0, 0.001, 0.005, 0.010, 0.020, math.Inf(1)},
		Counts:  make([]uint64, 6),
	}}
}

// add records n waits of d.
func (f *fakeLatencies) add(n uint64, d time.Duration) {
	for i := range f.h.Counts {
		if d.Seconds() >= f.h.Buckets[i] && d.Seconds() < f.h.Buckets[i+1] {
			f.h.Counts[i] += n
			return
		}
	}
}

func (f *fakeLatencies) read() *rtmetrics.Float64Histogram {
	f.reads++
	return &f.h
}

func fakeLoadGate(max time.Duration) (*loadGate, *fakeLatencies) {
	g := newLoadGate(max, prometheus.NewRegistry())
	f := newFakeLatencies()
	g.read = f.read
	return g, f
}

// TestLoadGateVerdict: a window is overloaded when over 1% of the waits
// since the last look reached the mark, a wait in the bucket starting at
// it included; the verdict holds for loadWindow without a new read.
func TestLoadGateVerdict(t *testing.T) {
	g, lat := fakeLoadGate(10 * time.Millisecond)
	now := time.Unix(1000, 0)
	lat.add(1000, 15*time.Millisecond) // before the first look: not in any window
	if g.hold(now, setupConn) {
		t.Fatal("the first look held a setup: it has no window to judge")
	}
	steps := []struct {
		name       string
		fast, slow uint64
		slowAt     time.Duration
		over       bool
	}{
		{"1% slow, not over it", 990, 10, 12 * time.Millisecond, false},
		{"2% slow", 980, 20, 12 * time.Millisecond, true},
		{"no waits at all", 0, 0, 0, false},
		{"2% just under the mark", 980, 20, 9 * time.Millisecond, false},
		{"2% at the mark's bucket", 980, 20, 10 * time.Millisecond, true},
		{"one wait, slow", 0, 1, 30 * time.Millisecond, true},
	}
	for _, s := range steps {
		now = now.Add(loadWindow)
		lat.add(s.fast, 100*time.Microsecond)
		lat.add(s.slow, s.slowAt)
		g.mu.Lock()
		got := g.overloadedAt(now)
		g.mu.Unlock()
		if got != s.over {
			t.Errorf("%s: overloaded %v, want %v", s.name, got, s.over)
		}
		if v := testutil.ToFloat64(g.overloaded); v != b2f(s.over) {
			t.Errorf("%s: lodestone_admission_overloaded %v, want %v", s.name, v, b2f(s.over))
		}
	}
	reads := lat.reads
	lat.add(1000, 100*time.Microsecond)
	g.mu.Lock()
	over := g.overloadedAt(now.Add(loadWindow - time.Millisecond))
	g.mu.Unlock()
	if !over || lat.reads != reads {
		t.Errorf("within the window: overloaded %v after %d more reads, want the last verdict (true) and no read", over, lat.reads-reads)
	}

	off, offLat := fakeLoadGate(0)
	offLat.add(1000, time.Second)
	for i := range 3 {
		if off.hold(now.Add(time.Duration(i)*loadWindow), setupWatch) || offLat.reads != 0 {
			t.Fatalf("a gate turned off (0) held a setup or read the scheduler (%d reads)", offLat.reads)
		}
	}
}

// TestLoadGateFloor: while overloaded, one setup of each kind is let
// through every loadFloor.
func TestLoadGateFloor(t *testing.T) {
	g, lat := fakeLoadGate(10 * time.Millisecond)
	start := time.Unix(1000, 0)
	g.hold(start, setupConn) // the first look
	at := func(d time.Duration) time.Time {
		lat.add(1, time.Second) // every window overloaded
		return start.Add(d)
	}
	for _, s := range []struct {
		at   time.Duration
		kind int
		held bool
	}{
		{loadWindow, setupConn, false}, // the first since the overload: let through
		{loadWindow, setupWatch, false},
		{loadWindow + time.Millisecond, setupConn, true},
		{2 * loadWindow, setupConn, true},
		{2 * loadWindow, setupWatch, true},
		{loadWindow + loadFloor - time.Millisecond, setupConn, true},
		{loadWindow + loadFloor, setupConn, false},
		{loadWindow + loadFloor, setupWatch, false},
		{loadWindow + loadFloor + time.Millisecond, setupWatch, true},
	} {
		if got := g.hold(at(s.at), s.kind); got != s.held {
			t.Errorf("%s at +%v: held %v, want %v", setupNames[s.kind], s.at, got, s.held)
		}
	}
	lat.add(1000, 100*time.Microsecond)
	if g.hold(start.Add(loadWindow+loadFloor+loadWindow+time.Millisecond), setupWatch) {
		t.Error("a watch was held in a window no longer overloaded")
	}
}

// TestAdmissionHoldsSetupUnderLoad: an overloaded server holds the
// connections and watch creates the policy gates (accepts wait, creates
// are refused with a retry hint) and leaves reads, and anything the
// policy does not gate, alone.
func TestAdmissionHoldsSetupUnderLoad(t *testing.T) {
	st, a, clock := fakeClockAdmission(DefaultConfig().AdmissionMaxRetryHint)
	var lat *fakeLatencies
	a.load, lat = fakeLoadGate(10 * time.Millisecond)
	overload := func() {
		*clock = clock.Add(loadWindow)
		lat.add(1, time.Second)
	}
	a.load.hold(*clock, setupConn) // the first look
	overload()
	for range 3 {
		if err := a.check(classWatch, 1); err != nil {
			t.Fatalf("no policy: a watch create was refused while overloaded: %v", err)
		}
		if d, _ := a.acceptWait(); d != 0 {
			t.Fatalf("no policy: an accept waited %v while overloaded", d)
		}
	}

	storePolicy(t, st, 1, &lodestonepb.AdmissionPolicy{Enabled: true, Reads: 1000, Watches: 1000, Connections: 1000, SetUnixNano: clock.UnixNano()})
	overload()
	if err := a.check(classWatch, 1); err != nil {
		t.Fatalf("the first watch create while overloaded was refused (%v): one a loadFloor gets through", err)
	}
	err := a.check(classWatch, 1)
	refusal := status.Convert(err)
	var hint time.Duration
	for _, d := range refusal.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			hint = ri.GetRetryDelay().AsDuration()
		}
	}
	if refusal.Code() != codes.ResourceExhausted || hint < minRetryHint {
		t.Fatalf("the next watch create: %v with hint %v; want RESOURCE_EXHAUSTED with a hint of at least %v", err, hint, minRetryHint)
	}
	for _, c := range []prometheus.Counter{a.rejected.WithLabelValues("watch"), a.load.holds.WithLabelValues("watch")} {
		if got := testutil.ToFloat64(c); got != 1 {
			t.Errorf("%s = %v, want 1", c.Desc(), got)
		}
	}
	if err := a.check(classRead, 1); err != nil {
		t.Errorf("a read while overloaded: %v, want admitted (reads are not setup)", err)
	}
	if d, loaded := a.acceptWait(); d != 0 || loaded {
		t.Fatalf("the first accept while overloaded waited %v (held %v): one a loadFloor gets through", d, loaded)
	}
	if d, loaded := a.acceptWait(); d != loadWindow || !loaded {
		t.Fatalf("the next accept while overloaded waits %v (held %v), want a window (%v) held, then asks again", d, loaded, loadWindow)
	}
	*clock = clock.Add(loadWindow)
	lat.add(1000, 100*time.Microsecond)
	if d, _ := a.acceptWait(); d != 0 {
		t.Errorf("an accept once the load fell waited %v, want 0 (tokens were left)", d)
	}
	if err := a.check(classWatch, 1); err != nil {
		t.Errorf("a watch create once the load fell: %v", err)
	}
}

// TestLoadGateReadsTheScheduler runs the gate on the real runtime: with
// four goroutines spinning on every processor, each waits for the other
// three's time slices, so a window soon reads overloaded at 1ms.
func TestLoadGateReadsTheScheduler(t *testing.T) {
	g := newLoadGate(time.Millisecond, prometheus.NewRegistry())
	h := g.read()
	if h == nil || len(h.Buckets) != len(h.Counts)+1 || len(h.Counts) == 0 {
		t.Fatalf("the scheduler's latency histogram: %+v", h)
	}
	look := func(now time.Time) bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.overloadedAt(now)
	}
	look(time.Now())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(stop)
		wg.Wait()
	}()
	for range 4 * runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
			}
		})
	}
	tick := time.NewTicker(loadWindow)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-deadline:
			t.Fatal("no window read overloaded in 10s of four spinning goroutines a processor")
		case now := <-tick.C:
			if look(now) {
				return
			}
		}
	}
}
