package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

// The queries come from query processes of their own (this binary with
// -serve-queries), each holding at most -queries-per-process connections,
// because one process cannot hold 50,000: each query is a file descriptor
// and a machine's open-file hard limit may be below that (20,000 here),
// which not even root can raise in a container. A process also gets its
// own CPU account and its own garbage collector.

// planQueries splits n queries, query k on key k, over targets and then
// over query processes of at most perProcess queries each: target t
// gets the keys k with k mod len(targets) = t (so consecutive writes
// wake queries on every target in turn), and its c processes take every
// c-th of those. Every key in [0, n) is in exactly one spec. Past
// perSource queries in all, process i dials from 127.0.0.(2+i), so that no
// source address runs out of ephemeral ports (about 28,000 by default).
func planQueries(targets []string, n, perProcess int) []querySpec {
	var specs []querySpec
	nt := len(targets)
	for t, target := range targets {
		share := (n - t + nt - 1) / nt // keys t, t+nt, ... below n
		procs := (share + perProcess - 1) / perProcess
		for j := range procs {
			s := querySpec{Target: target, Offset: t + nt*j, Stride: nt * procs, Keys: n}
			s.Count = (n - s.Offset + s.Stride - 1) / s.Stride
			specs = append(specs, s)
		}
	}
	if n > perSource {
		for i := range specs {
			specs[i].Source = fmt.Sprintf("127.0.0.%d", 2+i)
		}
	}
	return specs
}

// perSource is the most query connections the kernel's choice of source
// address is left with: every connection to a server's one port needs a
// port of its own from the source address's ephemeral range.
const perSource = 20000

// maxShare is the most queries planQueries gives one target.
func maxShare(n, targets int) int { return (n + targets - 1) / targets }

// fileMargin is the descriptors a server or query process needs beside
// its queries' connections: its listeners, logs, Raft files and peers.
const fileMargin = 2000

// checkShares refuses a layout whose members would each hold more query
// connections than the open-file limit leaves room for.
func checkShares(system string, n, members int, limit uint64) error {
	if share := maxShare(n, members); uint64(share+fileMargin) > limit {
		return fmt.Errorf("%s: %d queries over %d members is %d connections each, over the open-file limit %d less %d for the rest: spread them over more members",
			system, n, members, share, limit, fileMargin)
	}
	return nil
}

// queryReady is what a query process answers once every query of its
// spec has its first blocking request out.
type queryReady struct {
	Err        string `json:"err,omitempty"`
	NotStarted int64  `json:"not_started,omitempty"` // queries still without a blocking request out
}

// queryFinish asks a query process to finish (queries.finish) after p,
// whose writes in Failed were not acknowledged.
type queryFinish struct {
	Phase  harness.WritePhase `json:"phase"`
	Failed []int              `json:"failed"`
}

// serveQueries is a query process's main: a querySpec on stdin, then
// queryReady on stdout once the queries are out, then a queryFinish on
// stdin, answered with the queryCounts.
func serveQueries(ctx context.Context) error {
	child := harness.Parent(os.Stdin, os.Stdout)
	var spec querySpec
	if err := child.Recv(&spec); err != nil {
		return err
	}
	q, err := openQueries(ctx, spec)
	if err != nil {
		return child.Send(queryReady{Err: err.Error()})
	}
	defer q.close()
	if err := child.Send(queryReady{NotStarted: q.notStarted}); err != nil {
		return err
	}
	var fin queryFinish
	if err := child.Recv(&fin); err != nil {
		return err
	}
	return child.Send(q.finish(ctx, fin.Phase, fin.Failed))
}

// fleet is the query processes of one phase.
type fleet struct {
	specs      []querySpec
	procs      []*harness.Child
	notStarted int64 // queries without a blocking request out when openFleet returned
}

// openFleet starts the query processes for n queries over targets (see
// planQueries), attributing values of write phase phaseID, and returns
// once every query has its first blocking request out.
func openFleet(ctx context.Context, workDir, label string, targets []string, n int, wait time.Duration, phaseID byte) (_ *fleet, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	f := &fleet{specs: planQueries(targets, n, *flagPerProcess)}
	defer func() {
		if err != nil {
			f.close(ctx)
		}
	}()
	// Every process's first reads are spread over the same wait, from a
	// start far enough ahead for each to be running.
	start := time.Now().Add(time.Second + time.Duration(len(f.specs))*200*time.Millisecond)
	for i := range f.specs {
		f.specs[i].Start, f.specs[i].Wait, f.specs[i].PhaseID = start, wait, phaseID
		name := fmt.Sprintf("%s-queries-%d", label, i+1)
		c, err := harness.StartChild(name, self, []string{"-serve-queries"}, filepath.Join(workDir, name+".log"), *flagClientCPUs)
		if err != nil {
			return nil, err
		}
		f.procs = append(f.procs, c)
		if err := c.Send(f.specs[i]); err != nil {
			return nil, err
		}
	}
	for _, c := range f.procs {
		var r queryReady
		if err := c.Recv(ctx, &r); err != nil {
			return nil, err
		}
		if r.Err != "" {
			return nil, fmt.Errorf("%s: %s", c.Proc().Name, r.Err)
		}
		f.notStarted += r.NotStarted
	}
	return f, nil
}

// cpu is the query processes' CPU time so far (nil: none).
func (f *fleet) cpu() time.Duration {
	if f == nil {
		return 0
	}
	var sum time.Duration
	for _, c := range f.procs {
		d, _ := harness.CPUTime(c.Proc().Pid())
		sum += d
	}
	return sum
}

// finish has every query process finish after p (queries.finish) and
// sums their counts.
func (f *fleet) finish(ctx context.Context, p harness.WritePhase, failed []int) (queryCounts, error) {
	for _, c := range f.procs {
		if err := c.Send(queryFinish{Phase: p, Failed: failed}); err != nil {
			return queryCounts{}, err
		}
	}
	var tot queryCounts
	for _, c := range f.procs {
		var qc queryCounts
		if err := c.Recv(ctx, &qc); err != nil {
			return tot, err
		}
		tot.add(qc)
	}
	slices.Sort(tot.Wake)
	return tot, f.close(ctx)
}

// close stops every query process, which closes its connections, all at
// once; once ctx has ended (an interrupted run) each is signalled now
// rather than left to finish its drain. It is idempotent.
func (f *fleet) close(ctx context.Context) error {
	errs := make([]error, len(f.procs))
	var wg sync.WaitGroup
	for i, c := range f.procs {
		wg.Go(func() {
			if ctx.Err() != nil {
				errs[i] = c.Interrupt()
			} else {
				errs[i] = c.Stop()
			}
		})
	}
	wg.Wait()
	return cmp.Or(errs...)
}

// describe says how the queries were spread, for the setup line:
// "3 processes: 12500 on http://...".
func (f *fleet) describe() string {
	per := map[string]int{}
	var order []string
	for _, s := range f.specs {
		if per[s.Target] == 0 {
			order = append(order, s.Target)
		}
		per[s.Target] += s.Count
	}
	out := strconv.Itoa(len(f.specs)) + " query processes;"
	for _, t := range order {
		out += fmt.Sprintf(" %d on %s", per[t], t)
	}
	return out
}

// perTarget is how many queries the fleet holds on each of bases (a
// cluster's members' HTTP addresses, in member order).
func (f *fleet) perTarget(bases []string) []int {
	per := make([]int, len(bases))
	for _, s := range f.specs {
		if i := slices.Index(bases, s.Target); i >= 0 {
			per[i] += s.Count
		}
	}
	return per
}

// memberRSSPerQuery says, for each member holding queries (per[i] > 0),
// its resident memory with them less without, per query, in KiB:
// "l1=10.2,l2=9.8".
func memberRSSPerQuery(roles []string, without, with []float64, per []int) string {
	var parts []string
	for i, n := range per {
		if n > 0 && i < len(roles) && i < len(without) && i < len(with) {
			parts = append(parts, fmt.Sprintf("%s=%.1f", roles[i], (with[i]-without[i])/float64(n)/1024))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}
