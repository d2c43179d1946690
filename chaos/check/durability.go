package check

import (
	"fmt"
	"sort"
	"strings"

	"github.com/lodestone-kv/lodestone/chaos/history"
)

// Durability checks "Nothing acknowledged is ever lost" (docs/architecture.md)
// against
// the state read after the final heal:
//
//   - set workload (write-once keys): every acknowledged key is present
//     with its value; every present key was attempted; an info write may
//     be present or absent.
//   - register and counter workloads (keys only ever grow their
//     ModifyIndex, there are no deletes): for every acknowledged write at
//     index i, the final ModifyIndex of its key is >= i, and == i only
//     with the written value.
//   - replicas: once every node applied the final index, each node's stale
//     read of every workload key equals the linearizable final read.
func Durability(h *history.History) Result {
	const name = "durability"
	fin := h.Final
	if !fin.Complete {
		return Result{Checker: name, Status: Unknown, Summary: "final read did not complete: " + fin.Err}
	}
	var anomalies []Anomaly
	acked, checkedKeys := 0, map[string]bool{}
	attemptedSet := map[string]history.Op{}
	for _, o := range h.Ops {
		if !o.IsWrite() || o.Final {
			continue
		}
		if o.Workload == history.Set && o.Type != history.Fail {
			attemptedSet[o.Key] = o
		}
		if o.Type != history.OK {
			continue
		}
		acked++
		checkedKeys[o.Key] = true
		got, ok := fin.KVs[o.Key]
		switch {
		case !ok:
			anomalies = append(anomalies, Anomaly{Checker: name, Key: o.Key,
				What: fmt.Sprintf("acknowledged %s of %q at index %d, but the key is absent after heal", o.F, o.Value, o.Index), Seqs: []int64{o.Seq}})
		case o.Index == 0:
			// The response carried no index (cannot happen for an ok
			// write); compare values for write-once keys only.
			if o.Workload == history.Set && got.Value != o.Value {
				anomalies = append(anomalies, Anomaly{Checker: name, Key: o.Key,
					What: fmt.Sprintf("acknowledged write of %q, final value %q", o.Value, got.Value), Seqs: []int64{o.Seq}})
			}
		case got.Index < o.Index:
			anomalies = append(anomalies, Anomaly{Checker: name, Key: o.Key,
				What: fmt.Sprintf("acknowledged %s of %q at index %d, but after heal the key is %q at older index %d (write lost)", o.F, o.Value, o.Index, got.Value, got.Index), Seqs: []int64{o.Seq}})
		case got.Index == o.Index && got.Value != o.Value:
			anomalies = append(anomalies, Anomaly{Checker: name, Key: o.Key,
				What: fmt.Sprintf("acknowledged %s of %q at index %d, but after heal index %d holds %q", o.F, o.Value, o.Index, got.Index, got.Value), Seqs: []int64{o.Seq}})
		}
	}
	// Keys of the set workload that appear although nobody wrote them.
	var present []string
	for k := range fin.KVs {
		if strings.HasPrefix(k, SetPrefix) {
			present = append(present, k)
		}
	}
	sort.Strings(present)
	for _, k := range present {
		if _, ok := attemptedSet[k]; !ok {
			anomalies = append(anomalies, Anomaly{Checker: name, Key: k, What: fmt.Sprintf("key present after heal with value %q but never written (or its write failed)", fin.KVs[k].Value)})
		}
	}
	// Replica convergence.
	nodes := make([]string, 0, len(fin.Replicas))
	for n := range fin.Replicas {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	for _, n := range nodes {
		rep := fin.Replicas[n]
		var diffs []string
		for k, want := range fin.KVs {
			if got, ok := rep[k]; !ok || got != want {
				diffs = append(diffs, fmt.Sprintf("%s: %q@%d, linearizable %q@%d", k, got.Value, got.Index, want.Value, want.Index))
			}
		}
		for k, got := range rep {
			if _, ok := fin.KVs[k]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s: %q@%d, absent in the linearizable read", k, got.Value, got.Index))
			}
		}
		if len(diffs) > 0 {
			sort.Strings(diffs)
			anomalies = append(anomalies, Anomaly{Checker: name, What: fmt.Sprintf("replica %s diverged after applying index %d on %d keys, e.g. %s", n, fin.Index, len(diffs), strings.Join(firstN(diffs, 3), "; "))})
		}
	}
	summary := fmt.Sprintf("%d acknowledged writes on %d keys checked against the final read at index %d; %d replicas compared", acked, len(checkedKeys), fin.Index, len(nodes))
	return verdict(name, anomalies, false, summary)
}

// Key prefixes of the workloads; every workload key starts with Prefix.
const (
	Prefix         = "w/"
	RegisterPrefix = "w/reg/"
	CounterPrefix  = "w/ctr/"
	SetPrefix      = "w/set/"
)
