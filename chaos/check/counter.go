package check

import (
	"fmt"
	"sort"
	"strconv"

	"github.com/lodestone-kv/lodestone/chaos/history"
)

// Counter checks the CAS counter (Jepsen's counter checker). An Add is one
// increment by exactly 1 (a CAS on the ModifyIndex just read). Invariant
// (linearizable reads and writes, docs/architecture.md "Reads are
// linearizable by default"): every ok read r has
//
//	#(ok adds returned before r was called) <= value(r) <= #(ok or info adds called before r returned)
//
// and the final value lies between the acknowledged and the attempted adds.
// Reads are the workload's own Read ops on the counter key and its final
// read.
func Counter(h *history.History) Result {
	const name = "counter"
	ops := opsOf(h, history.Counter)
	if len(ops) == 0 {
		return Result{Checker: name, Status: Skipped, Summary: "no counter operations"}
	}
	var okRets, attemptCalls []int64 // times of acknowledged add returns, of attempted add calls
	var reads []history.Op
	acked, attempted := 0, 0
	for _, o := range ops {
		switch {
		case o.F == history.Add && o.Type == history.OK:
			okRets = append(okRets, o.Ret)
			attemptCalls = append(attemptCalls, o.Call)
			acked++
			attempted++
		case o.F == history.Add && o.Type == history.Info:
			attemptCalls = append(attemptCalls, o.Call)
			attempted++
		case o.F == history.Read && o.Type == history.OK:
			reads = append(reads, o)
		}
	}
	sort.Slice(okRets, func(i, j int) bool { return okRets[i] < okRets[j] })
	sort.Slice(attemptCalls, func(i, j int) bool { return attemptCalls[i] < attemptCalls[j] })
	// countBefore is the number of times strictly before t.
	countBefore := func(ts []int64, t int64) int { return sort.Search(len(ts), func(i int) bool { return ts[i] >= t }) }
	// countAtOrBefore is the number of times at or before t.
	countAtOrBefore := func(ts []int64, t int64) int { return sort.Search(len(ts), func(i int) bool { return ts[i] > t }) }

	var anomalies []Anomaly
	for _, r := range reads {
		v := 0
		if r.Found {
			n, err := strconv.Atoi(r.Value)
			if err != nil {
				anomalies = append(anomalies, Anomaly{Checker: name, Key: r.Key, What: fmt.Sprintf("read a non-number %q", r.Value), Seqs: []int64{r.Seq}})
				continue
			}
			v = n
		}
		lo, hi := countBefore(okRets, r.Call), countAtOrBefore(attemptCalls, r.Ret)
		if v < lo || v > hi {
			what := fmt.Sprintf("read %d, but %d increments were acknowledged before the read began and at most %d had begun before it ended", v, lo, hi)
			if r.Final {
				what = "final " + what
			}
			anomalies = append(anomalies, Anomaly{Checker: name, Key: r.Key, What: what, Seqs: []int64{r.Seq}})
		}
	}
	summary := fmt.Sprintf("%d reads against %d acknowledged and %d attempted increments", len(reads), acked, attempted)
	return verdict(name, anomalies, false, summary)
}
