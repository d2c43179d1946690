// Package check holds the chaos campaign's checkers. Each is a pure
// function of a recorded history (chaos/history): no I/O except the
// linearizability checker's optional HTML visualization, no clocks, no
// goroutines of its own beyond porcupine's.
//
// The invariants they check are those of docs/architecture.md, "Invariants"
// (nothing acknowledged is ever lost, replicas converge, reads are
// linearizable by default, watches have no gaps, no duplicates and no
// reordering):
//
//   - Linearizable: the register workload's reads, writes and CASes form a
//     linearizable history per key (porcupine), with unknown-outcome writes
//     allowed to take effect at any time after their call or never.
//   - Counter: every read of the CAS counter lies between the increments
//     known to be done before it started and those begun before it ended;
//     the final value lies between the acknowledged and the attempted.
//   - Durability: every acknowledged write is still reflected after the
//     final heal (the key's ModifyIndex is at least the write's index, and
//     equal only with the written value); every replica converges to the
//     same state.
//   - Watch: per watcher and key, no gap, no duplicate, no reordering and
//     no wrong value against the committed history, across resumes.
//   - Availability (statistics, never an anomaly): share of operations
//     that succeeded per fault kind, time to a new leader.
package check

import (
	"fmt"
	"sort"
	"strings"

	"github.com/lodestone-kv/lodestone/chaos/history"
)

// Status of one checker's verdict.
const (
	Valid   = "valid"
	Invalid = "invalid"
	// Unknown: the checker could not decide (e.g. porcupine timed out on a
	// key); not an anomaly, but reported.
	Unknown = "unknown"
	// Skipped: the checker had nothing to check (e.g. Watch not served).
	Skipped = "skipped"
)

// Anomaly is one violated invariant, with the operations that show it.
type Anomaly struct {
	Checker string `json:"checker"`
	Key     string `json:"key,omitempty"`
	What    string `json:"what"`
	// Seqs are the history.Op sequence numbers involved, if any.
	Seqs []int64 `json:"seqs,omitempty"`
}

func (a Anomaly) String() string {
	var b strings.Builder
	b.WriteString(a.Checker)
	if a.Key != "" {
		fmt.Fprintf(&b, " key=%s", a.Key)
	}
	b.WriteString(": ")
	b.WriteString(a.What)
	if len(a.Seqs) > 0 {
		fmt.Fprintf(&b, " (ops %v)", a.Seqs)
	}
	return b.String()
}

// Result is one checker's verdict.
type Result struct {
	Checker string `json:"checker"`
	Status  string `json:"status"`
	// Count is the number of anomalies found; Anomalies lists at most
	// maxListed of them.
	Count     int       `json:"count"`
	Anomalies []Anomaly `json:"anomalies,omitempty"`
	// Summary is one line for humans: what was checked and how much.
	Summary string `json:"summary"`
	// Files the checker wrote (visualizations), relative to the run dir.
	Files []string `json:"files,omitempty"`
}

func verdict(checker string, anomalies []Anomaly, unknown bool, summary string) Result {
	r := Result{Checker: checker, Status: Valid, Count: len(anomalies), Anomalies: limitAnomalies(checker, anomalies, maxListed), Summary: summary}
	switch {
	case len(anomalies) > 0:
		r.Status = Invalid
	case unknown:
		r.Status = Unknown
	}
	return r
}

// Checker is one history checker. A workload that needs its own invariant
// (the lock workload, once sessions exist) adds a Checker here and lists
// it in All.
type Checker interface {
	Name() string
	Check(h *history.History) Result
}

// Func adapts a function to Checker.
type Func struct {
	N string
	F func(h *history.History) Result
}

func (f Func) Name() string                    { return f.N }
func (f Func) Check(h *history.History) Result { return f.F(h) }

// All returns the checkers of a campaign in report order. visualizeDir is
// where the linearizability checker writes HTML for failing keys ("": none).
func All(lin LinearOptions) []Checker {
	return []Checker{
		Func{"linearizable", func(h *history.History) Result { return Linearizable(h, lin) }},
		Func{"counter", Counter},
		Func{"durability", Durability},
		Func{"watch", Watch},
	}
}

// opsOf returns the operations of one workload, in invocation order.
func opsOf(h *history.History, workload string) []history.Op {
	var out []history.Op
	for _, o := range h.Ops {
		if o.Workload == workload {
			out = append(out, o)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out
}

// byKey groups operations by key, keys sorted.
func byKey(ops []history.Op) ([]string, map[string][]history.Op) {
	m := map[string][]history.Op{}
	for _, o := range ops {
		m[o.Key] = append(m[o.Key], o)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, m
}

// retOf is the return time the checkers use: Info operations may take
// effect until the end of time.
func retOf(o history.Op) int64 {
	if o.Type == history.Info {
		return history.Infinity
	}
	return o.Ret
}

const maxListed = 50

// limitAnomalies keeps reports readable when one fault breaks thousands
// of operations: the first n, plus a line counting the rest.
func limitAnomalies(checker string, as []Anomaly, n int) []Anomaly {
	if len(as) <= n {
		return as
	}
	rest := len(as) - n
	out := append([]Anomaly(nil), as[:n]...)
	return append(out, Anomaly{Checker: checker, What: fmt.Sprintf("... and %d more anomalies of this checker", rest)})
}
