package main

import (
	"fmt"
	"runtime"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

// Targets (issue 41): against the better of nginx and HAProxy in each
// shape.
const (
	targetSmallRPS   = 1.15 // small keep-alive responses: requests/s
	targetSmallP99   = 1.0  // and added p99
	targetBigRPS     = 1.0  // 64 KiB responses
	targetNewConnRPS = 1.0  // a new connection per request
	targetChurnRPS   = 0.95 // under registry churn, of steady
)

// printSetup prints what every shape shares: the load and the pinning.
func printSetup() {
	fmt.Printf("setup: one origin (a minimal HTTP/1.1 keep-alive responder: %d-byte body, %d bytes on /64k, closes after a request with Connection: close) on 127.0.0.1; wrk -t1: throughput run -c%d for %v in %d slices the systems take in turn, after a %v warm-up; small shape also a latency run -c%d paced with delay()=%dms for %v; %d repetitions, system order rotated; medians reported\n",
		*flagBody, bigBody, *flagConns, time.Duration(int(flagDuration.Seconds()) / *flagSlices * *flagSlices)*time.Second, *flagSlices, *flagWarmup, *flagLatConns, *flagPacing, *flagDuration, *flagReps)
	fmt.Printf("pinning: every proxy under `taskset -c %s`; wrk, the origin, the registry, the churn and gatewaybench under CPU list %s; machine has %d CPUs; lodestone = gateway.Run with DefaultConfig (what `lodestone gateway` runs), nginx 1 worker + upstream keepalive, haproxy nbthread 1 + http-reuse always, reverseproxy = httputil.ReverseProxy\n",
		*flagProxyCPUs, *flagClientCPUs, runtime.NumCPU())
	fmt.Printf("added latency = system's paced-run percentile minus direct's, per repetition, median over repetitions, at least %.3fms; proxy_us_per_req (origin_us_per_req) = the proxy's (the origin's) process CPU time (utime+stime) over the requests of its throughput slices\n", addedFloorMS)
}

// report prints a shape's medians and BENCH lines.
func report(sh shape, results map[string][]measurement, systems []string) {
	med := func(sys string, f func(measurement) float64) float64 {
		var xs []float64
		for _, m := range results[sys] {
			xs = append(xs, f(m))
		}
		return harness.Median(xs)
	}
	// Added latency: per repetition, the system's minus direct's in the
	// same repetition; then the median, floored at wrk's resolution (1µs):
	// within noise a proxy's percentile can come out below direct's, and a
	// negative peer figure would turn the ratio negative, which reads as
	// met whatever Lodestone added.
	added := func(sys string, f func(measurement) float64) float64 {
		var xs []float64
		for i, m := range results[sys] {
			if i < len(results["direct"]) {
				xs = append(xs, f(m)-f(results["direct"][i]))
			}
		}
		return max(harness.Median(xs), addedFloorMS)
	}
	rps := func(m measurement) float64 { return m.rps }
	p50 := func(m measurement) float64 { return m.p50 }
	p99 := func(m measurement) float64 { return m.p99 }
	for _, sys := range systems {
		fmt.Printf("median shape=%s system=%s rps=%.0f paced_p50=%.3fms paced_p99=%.3fms proxy_cpu=%s proxy_us_per_req=%s origin_us_per_req=%s client_cpu=%s\n", sh.name, sys,
			med(sys, rps), med(sys, p50), med(sys, p99),
			cpuString(med(sys, func(m measurement) float64 { return m.proxyCPU })),
			usString(med(sys, func(m measurement) float64 { return m.cpuPerReq })),
			usString(med(sys, func(m measurement) float64 { return m.originPerReq })),
			cpuString(med(sys, func(m measurement) float64 { return m.clientCPU })))
	}
	if len(results["lodestone"]) == 0 || len(results["direct"]) == 0 {
		logf("shape %s: no BENCH lines: they need the direct and lodestone systems", sh.name)
		return
	}
	// The better of nginx and HAProxy, per figure.
	best := func(f func(string) float64, higher bool) (string, float64) {
		name, v := "", 0.0
		for _, peer := range []string{"nginx", "haproxy"} {
			if len(results[peer]) == 0 {
				continue
			}
			x := f(peer)
			if name == "" || higher && x > v || !higher && x < v {
				name, v = peer, x
			}
		}
		return name, v
	}
	line := func(name, unit string, l float64, peer string, p float64, op string, target float64) {
		fmt.Println(harness.Line{Name: name, Unit: unit, Lodestone: l, PeerName: peer, Peer: p, Op: op, Target: target}.String())
	}
	switch sh.name {
	case "small":
		// The first wave's lines, per peer, as before.
		for _, peer := range []string{"nginx", "haproxy", "reverseproxy"} {
			if len(results[peer]) == 0 {
				continue
			}
			line("gateway-rps-vs-"+peer, "req/s", med("lodestone", rps), peer, med(peer, rps), ">=", 1.0)
			line("gateway-added-p50-vs-"+peer, "ms", added("lodestone", p50), peer, added(peer, p50), "<=", 1.0)
			line("gateway-added-p99-vs-"+peer, "ms", added("lodestone", p99), peer, added(peer, p99), "<=", 1.0)
		}
		if peer, v := best(func(s string) float64 { return med(s, rps) }, true); peer != "" {
			line("gateway-small-rps-vs-best", "req/s", med("lodestone", rps), peer, v, ">=", targetSmallRPS)
			// NB: with keep-alive, wrk and the origin spend at least
			// direct's CPU per request on their core whatever proxy sits
			// between, so direct's requests/s bound every proxy's: the
			// ratio a proxy could reach at most.
			d := med("direct", rps)
			fmt.Printf("ceiling shape=small direct=%.0freq/s %s=%.0freq/s most=%.2f target=%.2f reachable=%v\n", d, peer, v, d/v, targetSmallRPS, d/v >= targetSmallRPS)
		}
		if peer, v := best(func(s string) float64 { return added(s, p99) }, false); peer != "" {
			line("gateway-small-added-p99-vs-best", "ms", added("lodestone", p99), peer, v, "<=", targetSmallP99)
		}
	case "64k", "newconn":
		target := targetBigRPS
		if sh.newConn {
			target = targetNewConnRPS
		}
		if peer, v := best(func(s string) float64 { return med(s, rps) }, true); peer != "" {
			line("gateway-"+sh.name+"-rps-vs-best", "req/s", med("lodestone", rps), peer, v, ">=", target)
		}
	}
}
