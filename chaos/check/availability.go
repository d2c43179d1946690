package check

import (
	"fmt"
	"sort"
	"time"

	"github.com/lodestone-kv/lodestone/chaos/history"
)

// NoFault names the time outside every fault window.
const NoFault = "none"

// KindStats is availability under one kind of fault (or none).
type KindStats struct {
	Kind   string `json:"kind"`
	Faults int    `json:"faults"`
	// Ops invoked inside the kind's windows, by outcome (final reads
	// excluded).
	Ops  int `json:"ops"`
	OK   int `json:"ok"`
	Fail int `json:"fail"`
	Info int `json:"info"`
	// OKShare is OK/Ops (1 when there were no ops).
	OKShare float64 `json:"ok_share"`
	// P99 is the 99th percentile latency of the ok operations.
	P99 time.Duration `json:"p99"`
	// Leader faults of this kind: how many saw a new leader, and how
	// fast; NoNewLeader counts those that saw none within LeaderWait.
	LeaderFaults int           `json:"leader_faults"`
	NewLeader    int           `json:"new_leader"`
	NoNewLeader  int           `json:"no_new_leader"`
	LeaderMedian time.Duration `json:"leader_median"`
	LeaderMax    time.Duration `json:"leader_max"`
}

// LeaderWait bounds the search for a new leader after a leader fault.
const LeaderWait = 30 * time.Second

// Availability computes, per fault kind, the share of operations invoked
// inside its windows that succeeded, and the time from each leader fault to
// the first Status answer naming a leader in a later term. It reports,
// never judges: losing availability under a fault is expected.
func Availability(h *history.History) []KindStats {
	stats := map[string]*KindStats{}
	get := func(kind string) *KindStats {
		if s, ok := stats[kind]; ok {
			return s
		}
		s := &KindStats{Kind: kind}
		stats[kind] = s
		return s
	}
	get(NoFault)
	var faults []history.Fault
	for _, f := range h.Faults {
		if !f.Skipped {
			faults = append(faults, f)
		}
	}
	sort.Slice(faults, func(i, j int) bool { return faults[i].Start < faults[j].Start })
	lat := map[string][]time.Duration{}
	for _, o := range h.Ops {
		if o.Final {
			continue
		}
		kind := NoFault
		// The newest window that contains the call wins.
		i := sort.Search(len(faults), func(i int) bool { return faults[i].Start > o.Call })
		for j := i - 1; j >= 0; j-- {
			if o.Call < faults[j].End {
				kind = faults[j].Kind
				break
			}
			if faults[j].Start < o.Call-int64(5*time.Minute) {
				break
			}
		}
		s := get(kind)
		s.Ops++
		switch o.Type {
		case history.OK:
			s.OK++
			lat[kind] = append(lat[kind], o.Latency())
		case history.Fail:
			s.Fail++
		default:
			s.Info++
		}
	}
	leaders := h.Leaders
	for _, f := range faults {
		s := get(f.Kind)
		s.Faults++
		if !f.LeaderFault || f.OldLeader == 0 {
			continue
		}
		s.LeaderFaults++
		i := sort.Search(len(leaders), func(i int) bool { return leaders[i].T >= f.Start })
		found := false
		for ; i < len(leaders) && leaders[i].T < f.Start+int64(LeaderWait); i++ {
			l := leaders[i]
			// A leader in a later term, whoever it is: the old leader
			// may win again once healed.
			if l.Leader != 0 && l.Term > f.OldTerm {
				found = true
				lat["leader:"+f.Kind] = append(lat["leader:"+f.Kind], time.Duration(l.T-f.Start))
				break
			}
		}
		if found {
			s.NewLeader++
		} else {
			s.NoNewLeader++
		}
	}
	out := make([]KindStats, 0, len(stats))
	for kind, s := range stats {
		s.OKShare = 1
		if s.Ops > 0 {
			s.OKShare = float64(s.OK) / float64(s.Ops)
		}
		s.P99 = percentile(lat[kind], 0.99)
		if d := lat["leader:"+kind]; len(d) > 0 {
			s.LeaderMedian = percentile(d, 0.5)
			s.LeaderMax = percentile(d, 1)
		}
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool {
		if (out[i].Kind == NoFault) != (out[j].Kind == NoFault) {
			return out[i].Kind == NoFault
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}

func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p*float64(len(s)-1) + 0.5)
	return s[min(i, len(s)-1)]
}

// String formats one line of the availability table.
func (s KindStats) String() string {
	line := fmt.Sprintf("%-18s faults=%-3d ops=%-6d ok=%5.1f%% fail=%-5d info=%-4d p99=%v", s.Kind, s.Faults, s.Ops, 100*s.OKShare, s.Fail, s.Info, s.P99.Round(time.Millisecond))
	if s.LeaderFaults > 0 {
		line += fmt.Sprintf(" new-leader=%d/%d median=%v max=%v", s.NewLeader, s.LeaderFaults, s.LeaderMedian.Round(time.Millisecond), s.LeaderMax.Round(time.Millisecond))
	}
	return line
}
