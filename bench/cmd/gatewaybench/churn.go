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

// churner changes the registry at a fixed rate while a churn slice runs:
// it registers instances of the benchmark's service (all at the origin's
// address, so each is a real, serving origin the gateway must open
// connections to) and deregisters the oldest, keeping about -churn-live of
// them registered beside the origin's own instance. A registration and a
// deregistration are one change each. Every request should still get a
// 200: a 5xx in a churn slice is one the churn caused.
type churner struct {
	c          *client.Client
	host       string
	port       uint32
	live       int
	next, gone int // instance numbers: registered [gone, next)
	mu         sync.Mutex
	done       atomic.Int64 // changes the registry acknowledged
	failed     atomic.Int64 // changes it refused or timed out
}

const churnNode = "bench-churn"

func newChurner(registry, origin string, live int) (*churner, error) {
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
	return &churner{c: c, host: host, port: uint32(p), live: max(live, 1)}, nil
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
	id := "churn-" + strconv.Itoa(n)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if !register {
		_, err := ch.c.Deregister(ctx, churnNode, id, "")
		return err
	}
	_, err := ch.c.Register(ctx, &lodestonepb.CatalogRegisterRequest{
		Node:    &lodestonepb.Node{Name: churnNode, Address: ch.host},
		Service: &lodestonepb.Service{Id: id, Name: "bench", Address: ch.host, Port: ch.port},
		Checks: []*lodestonepb.Check{{CheckId: id, Name: "churn alive", ServiceId: id,
			Status: lodestonepb.HealthStatus_HEALTH_PASSING}},
	})
	return err
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

// runChurn measures the gateway alone under small keep-alive load, in
// slices taken in turn with and without -churn-rate registry changes
// per second (which goes first rotates each repetition), and prints the
// churn lines. The churned instances are registered before the first
// slice, so steady slices route over a table of the same size.
func (e *env) runChurn(ctx context.Context) error {
	ch, err := newChurner(e.registry, e.origin, *flagChurnLive)
	if err != nil {
		return err
	}
	defer ch.Close()
	for range *flagChurnLive {
		if err := ch.change(ctx); err != nil {
			return fmt.Errorf("register the churned instances: %w", err)
		}
	}
	var steadyMs, churnMs []measurement
	var rates []float64
	var steady5xx, churn5xx, churnResponses int64
	slice := time.Duration(int(flagDuration.Seconds()) / *flagSlices) * time.Second
	for rep := range *flagReps {
		logf("shape churn rep %d/%d", rep+1, *flagReps)
		target, proc, err := e.startSystem(ctx, "lodestone")
		if err != nil {
			return err
		}
		steady := &sysRun{sys: "lodestone", target: target, proc: proc}
		churn := &sysRun{sys: "lodestone-churn", target: target, proc: proc}
		err = func() error {
			defer proc.Stop(10 * time.Second)
			if _, err := runWrk(ctx, *flagClientCPUs, target, e.sh.flat, *flagConns, max(*flagWarmup, time.Second)); err != nil {
				return err
			}
			for i := range 2 * *flagSlices {
				if (i+rep)%2 == 0 {
					if err := e.satSlice(ctx, steady, slice); err != nil {
						return err
					}
					continue
				}
				rate, err := ch.during(ctx, *flagChurnRate, *flagChurnConc, func() error { return e.satSlice(ctx, churn, slice) })
				if err != nil {
					return err
				}
				rates = append(rates, rate)
			}
			if exited, werr := procExited(proc); exited {
				return fmt.Errorf("gateway exited during the run: %v\n%s", werr, proc.LogTail(2000))
			}
			return nil
		}()
		if err != nil {
			return err
		}
		s, c := steady.measurement(), churn.measurement()
		steadyMs, churnMs = append(steadyMs, s), append(churnMs, c)
		steady5xx += steady.non2
		churn5xx += churn.non2
		churnResponses += churn.requests
		for _, r := range []struct {
			name string
			m    measurement
			run  *sysRun
		}{{"steady", s, steady}, {"churn", c, churn}} {
			fmt.Printf("run shape=churn rep=%d/%d system=lodestone phase=%s rps=%.0f sat_p50=%.3fms sat_p99=%.3fms proxy_cpu=%s proxy_us_per_req=%s client_cpu=%s errors=%d non2xx=%d\n",
				rep+1, *flagReps, r.name, r.m.rps, r.m.satP50, r.m.satP99, cpuString(r.m.proxyCPU), usString(r.m.cpuPerReq), cpuString(r.m.clientCPU), r.run.errs, r.run.non2)
		}
	}
	med := func(ms []measurement, f func(measurement) float64) float64 {
		var xs []float64
		for _, m := range ms {
			xs = append(xs, f(m))
		}
		return harness.Median(xs)
	}
	rps := func(m measurement) float64 { return m.rps }
	cpu := func(m measurement) float64 { return m.cpuPerReq }
	fmt.Printf("churn: %s over the run; changes/s in churn slices median %.0f (min %.0f, target %d); non-2xx responses: steady slices %d, churn slices %d of %d; proxy_us_per_req steady %s churn %s\n",
		ch, harness.Median(rates), slices.Min(rates), *flagChurnRate, steady5xx, churn5xx, churnResponses,
		usString(med(steadyMs, cpu)), usString(med(churnMs, cpu)))
	fmt.Println(harness.Line{Name: "gateway-churn-rps-vs-steady", Unit: "req/s", LodestoneName: "lodestone-churn", Lodestone: med(churnMs, rps),
		PeerName: "lodestone-steady", Peer: med(steadyMs, rps), Op: ">=", Target: targetChurnRPS}.String())
	// NB: every response counts; a 4xx or 5xx in a churn slice is one the
	// churn caused (steady slices get none). The ratio prints two
	// decimals, so the run line above carries the exact count.
	fmt.Println(harness.Line{Name: "gateway-churn-responses-2xx", Unit: "responses", Lodestone: float64(churnResponses - churn5xx),
		PeerName: "due", Peer: float64(churnResponses), Op: ">=", Target: 1}.String())
	return nil
}
