// Package nemesis decides which faults a campaign injects and when, and
// injects them into a chaos/cluster running on a chaos/netns network.
//
// The schedule is a pure function of the kinds, counts, duration and seed
// (Plan), so a run can be repeated; the Nemesis executes it one fault at a
// time: apply, hold, heal, settle.
package nemesis

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"
)

// Fault kinds.
const (
	// PartitionHalves cuts the nodes into two random groups.
	PartitionHalves = "partition-halves"
	// PartitionLeader isolates the leader from every other node.
	PartitionLeader = "partition-leader"
	// PartitionBridge splits the others into two groups that only one
	// bridge node reaches both of.
	PartitionBridge = "partition-bridge"
	// Kill sends SIGKILL to the leader or a random node and restarts it.
	Kill = "kill"
	// PauseLeader SIGSTOPs the leader, then SIGCONTs it.
	PauseLeader = "pause-leader"
	// Pause SIGSTOPs a random node, then SIGCONTs it.
	Pause = "pause"
	// Loss drops a share of peer packets on every node (iptables
	// statistic).
	Loss = "loss"
	// Delay relays peer traffic through a proxy that holds it.
	Delay = "delay"
	// SlowDiskKill makes the leader's log writes lag (each waits
	// 100-400 ms before it reaches the disk, the page cache included),
	// then SIGKILLs it and restarts it. A leader applies and answers
	// what its followers made durable before its own write of it is done
	// (server/earlyapply.go), so it dies without entries it acknowledged;
	// they must survive on the others.
	SlowDiskKill = "slow-disk-kill"
	// Member replaces a follower (remove, wipe, add under a new name,
	// join) while packet loss is in force.
	Member = "member"
)

// AllKinds lists every kind, in report order.
var AllKinds = []string{PartitionHalves, PartitionLeader, PartitionBridge, Kill, SlowDiskKill, PauseLeader, Pause, Loss, Delay, Member}

// ParseKinds parses a comma-separated list ("all" or "" for AllKinds).
func ParseKinds(s string) ([]string, error) {
	if s == "" || s == "all" {
		return AllKinds, nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		ok := false
		for _, known := range AllKinds {
			ok = ok || k == known
		}
		if !ok {
			return nil, fmt.Errorf("unknown fault kind %q; use %s", k, strings.Join(AllKinds, ","))
		}
		out = append(out, k)
	}
	return out, nil
}

// Step is one planned fault: in force for Hold, then healed and followed
// by Settle of calm.
type Step struct {
	Kind   string
	Hold   time.Duration
	Settle time.Duration
}

// Plan spreads perKind faults of each kind, shuffled, over about total:
// each step gets total/(steps) split 65/35 between hold and settle, each
// jittered by ±25%.
func Plan(kinds []string, perKind int, total time.Duration, seed uint64) []Step {
	rng := rand.New(rand.NewPCG(seed, 0x6e656d65))
	var steps []Step
	for _, k := range kinds {
		for i := 0; i < perKind; i++ {
			steps = append(steps, Step{Kind: k})
		}
	}
	if len(steps) == 0 {
		return nil
	}
	rng.Shuffle(len(steps), func(i, j int) { steps[i], steps[j] = steps[j], steps[i] })
	slot := total / time.Duration(len(steps))
	jitter := func(d time.Duration) time.Duration {
		return d*3/4 + time.Duration(rng.Int64N(int64(d)/2+1))
	}
	for i := range steps {
		steps[i].Hold = jitter(slot * 65 / 100)
		steps[i].Settle = jitter(slot * 35 / 100)
	}
	return steps
}

// Counts tallies steps by kind, sorted by kind.
func Counts(steps []Step) []string {
	m := map[string]int{}
	for _, s := range steps {
		m[s.Kind]++
	}
	var out []string
	for k, n := range m {
		out = append(out, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(out)
	return out
}
