package main

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/bench/internal/harness"
	"github.com/lodestone-kv/lodestone/client"
)

// churner changes the registry at a fixed rate while a slice runs: it
// registers instances of one service (all at the origin's address, so
// each is a real, serving origin the gateway must open connections to)
// and deregisters the oldest, keeping about -churn-live of them
// registered. A registration and a deregistration are one change each.
// Churning the benchmark's routed service, every request should still
// get a 200: a 5xx in a churn slice is one the churn caused.
type churner struct {
	c          *client.Client
	node, svc  string
	host       string
	port       uint32
	live       int
	next, gone int // instance numbers: registered [gone, next)
	mu         sync.Mutex
	done       atomic.Int64 // changes the registry acknowledged
	failed     atomic.Int64 // changes it refused or timed out
}

// newChurner returns a churner of service svc's instances on node node.
func newChurner(registry, origin, node, svc string, live int) (*churner, error) {
	c, err := client.New(client.Config{Endpoints: []string{registry}})
	if err != nil {
		return nil, err
	}
	host, port, err := net.SplitHostPort(origin)
	if err != nil {
		c.Close()
		return nil, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		c.Close()
		return nil, err
	}
	return &churner{c: c, node: node, svc: svc, host: host, port: uint32(p), live: max(live, 1)}, nil
}

func (ch *churner) Close() { ch.c.Close() }

// op returns the next change: a registration while fewer than live are
// registered, else a deregistration of the oldest, alternating once full.
func (ch *churner) op() (register bool, n int) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.next-ch.gone < ch.live || (ch.next+ch.gone)%2 == 0 {
		ch.next++
		return true, ch.next - 1
	}
	ch.gone++
	return false, ch.gone - 1
}

func (ch *churner) change(ctx context.Context) error {
	register, n := ch.op()
	id := ch.svc + "-" + strconv.Itoa(n)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if !register {
		_, err := ch.c.Deregister(ctx, ch.node, id, "")
		return err
	}
	_, err := ch.c.Register(ctx, &lodestonepb.CatalogRegisterRequest{
		Node:    &lodestonepb.Node{Name: ch.node, Address: ch.host},
		Service: &lodestonepb.Service{Id: id, Name: ch.svc, Address: ch.host, Port: ch.port},
		Checks: []*lodestonepb.Check{{CheckId: id, Name: "churn alive", ServiceId: id,
			Status: lodestonepb.HealthStatus_HEALTH_PASSING}},
	})
	return err
}

// fill registers the first live instances, workers at a time.
func (ch *churner) fill(ctx context.Context, workers int) error {
	sem := make(chan struct{}, max(workers, 1))
	var wg sync.WaitGroup
	var first atomic.Pointer[error]
	for range ch.live {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := ch.change(ctx); err != nil {
				first.CompareAndSwap(nil, &err)
			}
		})
	}
	wg.Wait()
	if err := first.Load(); err != nil {
		return *err
	}
	return nil
}

// run makes rate changes per second until ctx ends, with up to workers
// changes in flight (the registry commits concurrent writes together).
// Changes are released in ticks of 10 ms so the rate holds on a busy
// machine whose timers are late.
func (ch *churner) run(ctx context.Context, rate, workers int) {
	tokens := make(chan struct{}, rate)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range tokens {
				if ctx.Err() != nil {
					continue
				}
				if err := ch.change(ctx); err != nil {
					if ctx.Err() == nil {
						ch.failed.Add(1)
					}
					continue
				}
				ch.done.Add(1)
			}
		}()
	}
	const tick = 10 * time.Millisecond
	start := time.Now()
	released := 0
	t := time.NewTicker(tick)
	defer func() {
		t.Stop()
		close(tokens)
		wg.Wait()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			due := int(now.Sub(start).Seconds() * float64(rate))
			for ; released < due; released++ {
				select {
				case tokens <- struct{}{}:
				default: // the registry is behind: the shortfall shows in the rate
				}
			}
		}
	}
}

// during runs the churn while f runs and returns the changes per second
// it achieved.
func (ch *churner) during(ctx context.Context, rate, workers int, f func() error) (float64, error) {
	cctx, cancel := context.WithCancel(ctx)
	d0, f0 := ch.done.Load(), ch.failed.Load()
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		ch.run(cctx, rate, workers)
	}()
	err := f()
	cancel()
	<-done
	secs := time.Since(start).Seconds()
	if failed := ch.failed.Load() - f0; failed > 0 {
		logf("churn: %d registry changes failed", failed)
	}
	if err != nil {
		return 0, err
	}
	return float64(ch.done.Load()-d0) / secs, nil
}

func (ch *churner) String() string {
	return fmt.Sprintf("%d registered, %d deregistered", ch.next, ch.gone)
}

// The churn shape's phases: no registry changes; -churn-rate changes/s
// to a service no route names (the registry's and the watch's work on
// both cores, the routed service steady); and the same rate to the routed
// service itself.
var churnPhases = []string{"quiet", "steady", "churn"}

// runChurn measures the gateway alone under small keep-alive load, in
// slices of each phase taken in turn (the first rotating each
// repetition), and prints the churn lines. Both churners' instances are
// registered before the first slice, so every phase routes over tables
// of the same size. NB: the BENCH line compares churn with steady, not
// with quiet: on two cores the registry and the churning client share the
// load generator's core, and their work alone took most of wrk's
// requests/s in the first runs, whatever the proxy did; the steady phase
// puts the same work there and leaves the routed service unchanged.
func (e *env) runChurn(ctx context.Context) error {
	routed, err := newChurner(e.registry, e.origin, "bench-churn", "bench", *flagChurnLive)
	if err != nil {
		return err
	}
	defer routed.Close()
	control, err := newChurner(e.registry, e.origin, "bench-control", "bench-control", *flagChurnLive)
	if err != nil {
		return err
	}
	defer control.Close()
	if err := routed.fill(ctx, *flagChurnConc); err != nil {
		return fmt.Errorf("register the churned instances: %w", err)
	}
	if err := control.fill(ctx, *flagChurnConc); err != nil {
		return fmt.Errorf("register the control instances: %w", err)
	}
	churners := map[string]*churner{"steady": control, "churn": routed}
	ms := map[string][]measurement{}
	rates := map[string][]float64{}
	non2xx, responses := map[string]int64{}, map[string]int64{}
	slice := time.Duration(int(flagDuration.Seconds()) / *flagSlices) * time.Second
	for rep := range *flagReps {
		logf("shape churn rep %d/%d", rep+1, *flagReps)
		target, proc, err := e.startSystem(ctx, "lodestone")
		if err != nil {
			return err
		}
		runs := map[string]*sysRun{}
		for _, ph := range churnPhases {
			runs[ph] = &sysRun{sys: "lodestone-" + ph, target: target, proc: proc}
		}
		err = func() error {
			defer proc.Stop(10 * time.Second)
			if _, err := runWrk(ctx, *flagClientCPUs, target, e.sh.flat, *flagConns, max(*flagWarmup, time.Second)); err != nil {
				return err
			}
			for i := range *flagSlices * len(churnPhases) {
				ph := churnPhases[(i+rep)%len(churnPhases)]
				ch := churners[ph]
				if ch == nil {
					if err := e.satSlice(ctx, runs[ph], slice); err != nil {
						return err
					}
					continue
				}
				rate, err := ch.during(ctx, *flagChurnRate, *flagChurnConc, func() error { return e.satSlice(ctx, runs[ph], slice) })
				if err != nil {
					return err
				}
				rates[ph] = append(rates[ph], rate)
			}
			if exited, werr := procExited(proc); exited {
				return fmt.Errorf("gateway exited during the run: %v\n%s", werr, proc.LogTail(2000))
			}
			return nil
		}()
		if err != nil {
			return err
		}
		for _, ph := range churnPhases {
			r := runs[ph]
			m := r.measurement()
			ms[ph] = append(ms[ph], m)
			non2xx[ph] += r.non2
			responses[ph] += r.requests
			fmt.Printf("run shape=churn rep=%d/%d system=lodestone phase=%s rps=%.0f sat_p50=%.3fms sat_p99=%.3fms proxy_cpu=%s proxy_us_per_req=%s origin_us_per_req=%s client_cpu=%s dials_per_s=%s errors=%d non2xx=%d\n",
				rep+1, *flagReps, ph, m.rps, m.satP50, m.satP99, cpuString(m.proxyCPU), usString(m.cpuPerReq), usString(m.originPerReq), cpuString(m.clientCPU), rateString(m.opensPerSec), r.errs, r.non2)
		}
	}
	med := func(ph string, f func(measurement) float64) float64 {
		var xs []float64
		for _, m := range ms[ph] {
			xs = append(xs, f(m))
		}
		return harness.Median(xs)
	}
	rps := func(m measurement) float64 { return m.rps }
	cpu := func(m measurement) float64 { return m.cpuPerReq }
	for _, ph := range churnPhases {
		rate := "-"
		if len(rates[ph]) > 0 {
			rate = fmt.Sprintf("%.0f (min %.0f)", harness.Median(rates[ph]), slices.Min(rates[ph]))
		}
		fmt.Printf("median shape=churn system=lodestone phase=%s rps=%.0f proxy_us_per_req=%s client_cpu=%s changes_per_s=%s dials_per_s=%s non2xx=%d of %d\n",
			ph, med(ph, rps), usString(med(ph, cpu)), cpuString(med(ph, func(m measurement) float64 { return m.clientCPU })), rate,
			rateString(med(ph, func(m measurement) float64 { return m.opensPerSec })), non2xx[ph], responses[ph])
	}
	fmt.Printf("churn: routed service: %s; control service: %s; target %d changes/s\n", routed, control, *flagChurnRate)
	fmt.Println(harness.Line{Name: "gateway-churn-rps-vs-steady", Unit: "req/s", LodestoneName: "lodestone-churn", Lodestone: med("churn", rps),
		PeerName: "lodestone-steady", Peer: med("steady", rps), Op: ">=", Target: targetChurnRPS}.String())
	// NB: every response counts; a 4xx or 5xx in a churn slice is one the
	// churn caused (the other phases get none). The ratio prints two
	// decimals, so the median line above carries the exact count.
	fmt.Println(harness.Line{Name: "gateway-churn-responses-2xx", Unit: "responses", Lodestone: float64(responses["churn"] - non2xx["churn"]),
		PeerName: "due", Peer: float64(responses["churn"]), Op: ">=", Target: 1}.String())
	return nil
}
