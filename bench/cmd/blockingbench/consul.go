package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/consulpeer"
	"github.com/lodestone-kv/lodestone/bench/internal/harness"
	"github.com/lodestone-kv/lodestone/internal/cpuset"
)

// Consul itself as the peer (issue 41): the same keys, writes, queries and
// layout against a three-server Consul (consulpeer.Version), so the write
// p99 with the queries parked and the memory they hold can be set beside
// Lodestone's.

// Targets against Consul (issue 41, "Done when").
const (
	targetWriteVsConsul = 0.25
	targetRSSVsConsul   = 1.0
)

// peerSample is what one rep of either system measured for the lines
// against Consul.
type peerSample struct {
	with        float64 // write p99 with the queries parked, ms
	none        float64 // write p99 without, ms (Consul's own control)
	rssPerQuery float64 // bytes: the servers' resident memory with the queries parked, less without, per query
	rssWith     float64 // bytes: the servers' resident memory with the queries parked, summed
	cut         int     // writes the phases' cap cut (cutNote)
	q           queryCounts
}

// rssEach is the resident memory of each of procs, in bytes.
func rssEach(procs []*harness.Proc) ([]float64, error) {
	out := make([]float64, len(procs))
	for i, p := range procs {
		rss, err := harness.RSS(p.Pid())
		if err != nil {
			return nil, fmt.Errorf("resident memory of %s: %w", p.Name, err)
		}
		out[i] = float64(rss)
	}
	return out, nil
}

func sum(xs []float64) float64 {
	var t float64
	for _, x := range xs {
		t += x
	}
	return t
}

// perQuery is the resident memory the queries added, per query.
func perQuery(without, with float64, n int) float64 { return (with - without) / float64(n) }

// consulQueryMembers are the Consul servers -consul-queries-on names for
// n queries ("leader", "follower", "followers" or "all", as -queries-on,
// or "auto": consulQueriesOn; Consul has no learner in its open-source
// release).
func consulQueryMembers(leader, n int) []int {
	return queryMembers(voters, 0, leader, consulQueriesOn(n))
}

// consulBinary is -consul-bin, checked, or the cached build (built now
// when missing).
func consulBinary(ctx context.Context) (string, error) {
	if *flagConsulBin == "" {
		return consulpeer.Binary(ctx, logf)
	}
	if err := consulpeer.CheckVersion(ctx, *flagConsulBin); err != nil {
		return "", fmt.Errorf("-consul-bin: %w", err)
	}
	return *flagConsulBin, nil
}

// consulLimits lifts Consul's per-client HTTP connection cap (200 by
// default) above the most queries one server gets from one address (its
// share of n over members), as blockingbench does for Lodestone's. Consul
// refuses to start with a cap above its open-file limit less 20, so the
// cap is no higher than the share needs.
func consulLimits(n, members int) []string {
	return []string{"-hcl", fmt.Sprintf("limits { http_max_conns_per_client = %d }", consulConnCap(n, members))}
}

func consulConnCap(n, members int) int { return maxShare(n, members) + 1000 }

// runConsulRep runs one rep against a fresh Consul cluster: the keys
// written once, a phase of writes alone, then the same writes with the
// queries parked on -consul-queries-on, which are then drained and
// counted as Lodestone's are.
func runConsulRep(ctx context.Context, bin, workDir string, rep int) (_ peerSample, err error) {
	n := *flagQueries
	logf("consul rep %d: starting a fresh cluster", rep+1)
	c, err := consulpeer.StartCluster(ctx, bin, workDir, consulpeer.Options{Members: voters, CPUs: *flagServerCPUs, Extra: consulLimits(n, len(consulQueryMembers(0, n)))})
	if err != nil {
		return peerSample{}, err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("consul: %w%s", err, c.LogTails())
		}
		if serr := c.Stop(*flagKeep); serr != nil && err == nil {
			err = fmt.Errorf("stop consul: %w", serr)
		}
	}()
	members := consulQueryMembers(c.Leader, n)
	if *flagQueryCPUs != "" {
		for _, i := range members {
			if err := cpuset.Pin(c.Procs[i].Pid(), *flagQueryCPUs); err != nil {
				return peerSample{}, err
			}
		}
	}
	w := newWriter(c.HTTP[c.Leader])
	defer w.close()
	logf("consul: writing each of %d keys once", n)
	if err := w.populate(ctx, n); err != nil {
		return peerSample{}, err
	}
	wr, err := startWriterChild(workDir, fmt.Sprintf("consul-writer-rep%d.log", rep+1), c.HTTP[c.Leader], n)
	if err != nil {
		return peerSample{}, err
	}
	defer func() {
		if werr := wr.Stop(); werr != nil && err == nil {
			err = fmt.Errorf("writer: %w", werr)
		}
	}()
	return consulPhases(ctx, c, wr, workDir, members, rep)
}

// consulPhases runs the two phases on a started cluster.
func consulPhases(ctx context.Context, c *consulpeer.Cluster, wr *harness.Writer, workDir string, members []int, rep int) (peerSample, error) {
	var s peerSample
	n := *flagQueries
	logf("consul phase 1: writes, no queries")
	r, _, err := consulPhase(ctx, c, wr, "none", 1, nil, rep)
	if err != nil {
		return s, err
	}
	s.none = harness.Millis(harness.Percentile(r.lat, 99))
	s.cut += r.cut
	withoutEach, err := rssEach(c.Procs)
	if err != nil {
		return s, err
	}
	without := sum(withoutEach)
	var targets []string
	for _, i := range members {
		targets = append(targets, c.HTTP[i])
	}
	logf("consul: opening %d blocking queries over %v", n, *flagWait)
	q, err := openFleet(ctx, workDir, fmt.Sprintf("consul-rep%d", rep+1), targets, n, *flagWait, 2)
	if err != nil {
		return s, err
	}
	defer q.close(ctx)
	logf("consul phase 2: writes with %d queries (%d not started; %s)", n, q.notStarted, q.describe())
	r, p, err := consulPhase(ctx, c, wr, countLabel(n), 2, q, rep)
	if err != nil {
		return s, err
	}
	s.with = harness.Millis(harness.Percentile(r.lat, 99))
	s.cut += r.cut
	withEach, err := rssEach(c.Procs)
	if err != nil {
		return s, err
	}
	s.rssWith = sum(withEach)
	s.rssPerQuery = perQuery(without, s.rssWith, n)
	logf("consul: draining")
	if s.q, err = q.finish(ctx, p, r.failed); err != nil {
		return s, err
	}
	fmt.Printf("queries system=consul rep=%d/%d not-started=%d due=%d answered=%d changed=%d timed-out=%d early=%d errors=%d resets=%d wakes-due=%d wakes-seen=%d wake-p50=%sms wake-p99=%sms rss-without-mib=%.0f rss-with-mib=%.0f rss-per-query-kib=%.1f member-rss-per-query-kib=%s%s\n",
		rep+1, *flagReps, s.q.NotStarted, s.q.Due, s.q.Answered, s.q.Changed, s.q.TimedOut, s.q.Early, s.q.Errors, s.q.Resets, s.q.WakesDue, s.q.WakesSeen,
		ms(harness.Percentile(s.q.Wake, 50)), ms(harness.Percentile(s.q.Wake, 99)), without/(1<<20), s.rssWith/(1<<20), s.rssPerQuery/1024,
		memberRSSPerQuery(harness.Roles(len(c.Procs), c.Leader), withoutEach, withEach, q.perTarget(c.HTTP)), errNote(s.q.FirstErr))
	return s, ctx.Err()
}

// consulPhase is one write window against Consul, its run line printed.
func consulPhase(ctx context.Context, c *consulpeer.Cluster, wr *harness.Writer, label string, id byte, q *fleet, rep int) (writeResult, harness.WritePhase, error) {
	p := newPhase(id, *flagWarmup, *flagDuration)
	cpu0 := procCPU(c.Procs)
	t0 := time.Now()
	r, err := runWrites(ctx, wr, p, q)
	// NB: a phase its cap cut is measured as it is (cutNote), even with
	// no write acknowledged: Consul stalled, and that is the finding.
	if err == nil && r.acked == 0 && r.cut == 0 {
		err = fmt.Errorf("phase %s: no write was acknowledged (first error: %v)", label, r.firstErr)
	}
	if err == nil {
		err = c.CheckAlive()
	}
	if err != nil {
		return r, p, err
	}
	note := ""
	if r.firstErr != nil {
		note = fmt.Sprintf(" first-error=%q", r.firstErr.Error())
	}
	var members []string
	cpu1 := procCPU(c.Procs)
	for i, role := range harness.Roles(len(c.Procs), c.Leader) {
		rss, _ := harness.RSS(c.Procs[i].Pid())
		members = append(members, fmt.Sprintf("%s=%.0f%%/%.0fMiB", role, 100*(cpu1[i]-cpu0[i]).Seconds()/time.Since(t0).Seconds(), float64(rss)/(1<<20)))
	}
	fmt.Printf("run system=consul rep=%d/%d queries=%s writes=%d errors=%d write-p50=%sms write-p99=%sms write-p99.9=%sms p99-spans=%s server-cpu/rss=%s%s\n",
		rep+1, *flagReps, label, r.acked, r.errors, ms(harness.Percentile(r.lat, 50)), ms(harness.Percentile(r.lat, 99)), ms(harness.Percentile(r.lat, 99.9)),
		r.tail, strings.Join(members, ","), note)
	fmt.Print(cutNote("consul", rep, label, r, p))
	return r, p, nil
}

func procCPU(procs []*harness.Proc) []time.Duration {
	t := make([]time.Duration, len(procs))
	for i, p := range procs {
		t[i], _ = harness.CPUTime(p.Pid())
	}
	return t
}

// startWriterChild starts this binary as the writer child, writing to
// target's keys, on -writer-cpus.
func startWriterChild(workDir, logName, target string, nkeys int) (*harness.Writer, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	wbin, wargs := self, []string{"-serve-writer", "-target", target, "-queries", strconv.Itoa(nkeys)}
	if *flagWriterFIFO {
		wbin, wargs = "chrt", append([]string{"-f", writerPriority, self}, wargs...)
	}
	return harness.StartWriter("writer", wbin, wargs, filepath.Join(workDir, logName), cmp.Or(*flagWriterCPUs, *flagClientCPUs))
}

// consulLines are the verdicts against Consul: medians over each
// system's reps.
func consulLines(lode, peer []peerSample, n int) []harness.Line {
	med := func(ss []peerSample, f func(peerSample) float64) float64 {
		xs := make([]float64, len(ss))
		for i, s := range ss {
			xs[i] = f(s)
		}
		return harness.Median(xs)
	}
	with := func(s peerSample) float64 { return s.with }
	rss := func(s peerSample) float64 { return s.rssPerQuery / 1024 }
	k := countLabel(n)
	return []harness.Line{
		{Name: "blocking-write-p99-" + k + "-vs-consul", Unit: "ms", Lodestone: med(lode, with), PeerName: "consul", Peer: med(peer, with), Op: "<=", Target: targetWriteVsConsul},
		{Name: "blocking-rss-per-query-" + k + "-vs-consul", Unit: "KiB", Lodestone: med(lode, rss), PeerName: "consul", Peer: med(peer, rss), Op: "<=", Target: targetRSSVsConsul},
	}
}
