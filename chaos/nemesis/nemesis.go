package nemesis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/chaos/cluster"
	"github.com/lodestone-kv/lodestone/chaos/history"
	"github.com/lodestone-kv/lodestone/chaos/netns"
	"github.com/lodestone-kv/lodestone/internal/ctxtime"
)

// Nemesis injects faults. It owns no goroutines: Run executes the plan in
// the caller's goroutine.
type Nemesis struct {
	C      *cluster.Cluster
	Net    *netns.Net
	H      *history.History
	Logger *slog.Logger
	Seed   uint64

	rng            *rand.Rand
	nextID         int
	repairFailures int
}

// Run executes steps in order until they are done, ctx ends or the
// deadline passes. A fault that fails to apply is recorded with its error
// and healed; the campaign goes on.
func (n *Nemesis) Run(ctx context.Context, steps []Step, deadline time.Time) error {
	if n.rng == nil {
		n.rng = rand.New(rand.NewPCG(n.Seed, 0x6661756c74))
	}
	for i, s := range steps {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			n.H.Note("nemesis: deadline reached after %d of %d faults", i, len(steps))
			return nil
		}
		n.one(ctx, s)
	}
	return nil
}

// one applies, holds, heals and settles one fault.
func (n *Nemesis) one(ctx context.Context, s Step) {
	n.repair(ctx)
	n.nextID++
	f := history.Fault{ID: n.nextID, Kind: s.Kind}
	if l, term := n.C.Leader(ctx); l != nil {
		f.OldLeader, f.OldTerm = l.ID(), term
	}
	f.Start = n.H.Now()
	heal, err := n.apply(ctx, s, &f)
	var skip *skipError
	if errors.As(err, &skip) {
		f.Skipped, f.Err, f.End = true, err.Error(), n.H.Now()
		n.H.RecordFault(f)
		n.Logger.Warn("fault skipped", "kind", s.Kind, "why", err)
		_ = ctxtime.Sleep(ctx, s.Settle)
		return
	}
	if err != nil {
		f.Err = err.Error()
		n.Logger.Warn("fault did not apply fully", "kind", s.Kind, "err", err)
	} else {
		n.Logger.Info("fault", "id", f.ID, "kind", f.Kind, "target", f.Target, "detail", f.Detail)
	}
	_ = ctxtime.Sleep(ctx, s.Hold)
	// NB: heal with a context of its own: an interrupted campaign must
	// still undo the fault (Cleanup is the last resort, not the plan).
	hctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	if heal != nil {
		if herr := heal(hctx); herr != nil {
			f.Err = strings.TrimPrefix(f.Err+"; heal: "+herr.Error(), "; ")
			n.Logger.Warn("heal failed", "kind", s.Kind, "err", herr)
		}
	}
	cancel()
	f.End = n.H.Now()
	n.H.RecordFault(f)
	_ = ctxtime.Sleep(ctx, s.Settle)
}

func (n *Nemesis) slots() []int {
	var out []int
	for _, nd := range n.C.Nodes {
		if nd.IsMember() {
			out = append(out, nd.Slot)
		}
	}
	return out
}

func (n *Nemesis) node(slot int) *cluster.Node { return n.C.Nodes[slot] }

func (n *Nemesis) names(slots []int) string {
	var s []string
	for _, k := range slots {
		s = append(s, n.node(k).Name())
	}
	return strings.Join(s, ",")
}

// leaderSlot returns the leader's slot, or a random member's when no
// leader is known (and false).
func (n *Nemesis) leaderSlot(f *history.Fault) (int, bool) {
	for _, nd := range n.C.Nodes {
		if f.OldLeader != 0 && nd.ID() == f.OldLeader {
			return nd.Slot, true
		}
	}
	s := n.slots()
	return s[n.rng.IntN(len(s))], false
}

func (n *Nemesis) cut(ctx context.Context, a, b []int) error {
	var errs []error
	for _, x := range a {
		errs = append(errs, n.Net.Partition(ctx, x, b))
	}
	for _, y := range b {
		errs = append(errs, n.Net.Partition(ctx, y, a))
	}
	return errors.Join(errs...)
}

func without(s []int, x int) []int {
	var out []int
	for _, v := range s {
		if v != x {
			out = append(out, v)
		}
	}
	return out
}

func contains(s []int, x int) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// apply injects the fault and returns how to heal it.
func (n *Nemesis) apply(ctx context.Context, s Step, f *history.Fault) (func(context.Context) error, error) {
	healNet := func(ctx context.Context) error { return n.Net.HealAll(ctx) }
	members := n.slots()
	if len(members) < 2 {
		return nil, &skipError{fmt.Sprintf("only %d member slots (repair failed)", len(members))}
	}
	switch s.Kind {
	case PartitionHalves:
		sh := append([]int(nil), members...)
		n.rng.Shuffle(len(sh), func(i, j int) { sh[i], sh[j] = sh[j], sh[i] })
		cut := 1 + n.rng.IntN(len(sh)-1)
		a, b := sh[:cut], sh[cut:]
		if len(a) > len(b) {
			a, b = b, a
		}
		f.Target = n.names(a) + " | " + n.names(b)
		if l, ok := n.leaderSlot(f); ok && contains(a, l) && len(a) < len(b) {
			f.LeaderFault = true
		}
		return healNet, n.cut(ctx, a, b)
	case PartitionLeader:
		l, ok := n.leaderSlot(f)
		f.Target, f.LeaderFault = n.node(l).Name(), ok
		return healNet, n.cut(ctx, []int{l}, without(members, l))
	case PartitionBridge:
		sh := append([]int(nil), members...)
		n.rng.Shuffle(len(sh), func(i, j int) { sh[i], sh[j] = sh[j], sh[i] })
		bridge, rest := sh[0], sh[1:]
		half := len(rest) / 2
		a, b := rest[:half], rest[half:]
		f.Target = fmt.Sprintf("%s | bridge %s | %s", n.names(a), n.node(bridge).Name(), n.names(b))
		return healNet, n.cut(ctx, a, b)
	case Kill:
		var k int
		if n.rng.IntN(2) == 0 {
			k, f.LeaderFault = n.leaderSlot(f)
		} else {
			k = members[n.rng.IntN(len(members))]
			l, ok := n.leaderSlot(f)
			f.LeaderFault = ok && l == k
		}
		nd := n.node(k)
		f.Target = nd.Name()
		return func(ctx context.Context) error { return n.restart(ctx, nd) }, n.C.Kill(nd)
	case SlowDiskKill:
		k, ok := n.leaderSlot(f)
		nd := n.node(k)
		d := time.Duration(100+n.rng.IntN(301)) * time.Millisecond
		f.Target, f.LeaderFault = nd.Name(), ok
		f.Detail = fmt.Sprintf("log writes +%v, then SIGKILL", d)
		heal := func(ctx context.Context) error {
			// NB: killed with its writes still waiting; a restart
			// starts without the delay. What it had applied goes in the
			// record, against the log's last index its restart logs.
			if st, err := n.C.Status(ctx, nd); err == nil {
				f.Detail += fmt.Sprintf("; applied %d when killed", st.AppliedIndex)
			}
			if err := n.C.Kill(nd); err != nil {
				return err
			}
			return n.restart(ctx, nd)
		}
		return heal, n.C.SetDiskDelay(ctx, nd, d)
	case PauseLeader, Pause:
		var k int
		if s.Kind == PauseLeader {
			k, f.LeaderFault = n.leaderSlot(f)
		} else {
			k = members[n.rng.IntN(len(members))]
			l, ok := n.leaderSlot(f)
			f.LeaderFault = ok && l == k
		}
		nd := n.node(k)
		f.Target = nd.Name()
		return func(context.Context) error { return n.C.Resume(nd) }, n.C.Pause(nd)
	case Loss:
		p := 0.2 + 0.3*n.rng.Float64()
		f.Target, f.Detail = "all peer links", fmt.Sprintf("p=%.2f", p)
		var errs []error
		for _, k := range members {
			errs = append(errs, n.Net.Loss(ctx, k, without(members, k), p))
		}
		return healNet, errors.Join(errs...)
	case Delay:
		d := time.Duration(50+n.rng.IntN(351)) * time.Millisecond
		f.Target, f.Detail = "all peer links", fmt.Sprintf("one-way %v", d)
		return healNet, n.Net.Delay(ctx, members, d)
	case Member:
		return n.member(ctx, f, members)
	}
	return nil, fmt.Errorf("unknown fault kind %q", s.Kind)
}

// restart starts a killed node again on its data and waits until it is
// ready.
func (n *Nemesis) restart(ctx context.Context, nd *cluster.Node) error {
	if err := n.C.Restart(ctx, nd); err != nil {
		return err
	}
	return n.C.WaitReady(ctx, nd, 15*time.Second)
}

// member replaces a follower while packet loss is in force: remove it
// (Raft conf change), kill it, wipe it, add a new member in its slot and
// start it with --join.
func (n *Nemesis) member(ctx context.Context, f *history.Fault, members []int) (func(context.Context) error, error) {
	l, _ := n.leaderSlot(f)
	cands := without(members, l)
	if len(cands) == 0 {
		return nil, errors.New("no follower to replace")
	}
	// NB: removing a member while another is still catching up can lose
	// quorum for good (e.g. a joiner that cannot install a snapshot); that
	// is a finding of the previous fault, not something to pile onto.
	if err := n.caughtUp(ctx, members, 10*time.Second); err != nil {
		return nil, &skipError{"membership change: " + err.Error()}
	}
	nd := n.node(cands[n.rng.IntN(len(cands))])
	old := nd.Name()
	var errs []error
	for _, k := range members {
		errs = append(errs, n.Net.Loss(ctx, k, without(members, k), 0.1))
	}
	heal := func(ctx context.Context) error {
		err := n.Net.HealAll(ctx)
		if !nd.IsMember() {
			err = errors.Join(err, n.C.Add(ctx, nd))
		}
		if nd.IsMember() {
			err = errors.Join(err, n.C.WaitReady(ctx, nd, 20*time.Second))
		}
		return err
	}
	if err := n.C.Remove(ctx, nd); err != nil {
		f.Target = old
		return heal, errors.Join(append(errs, err)...)
	}
	if err := n.C.Add(ctx, nd); err != nil {
		errs = append(errs, err)
	}
	f.Target, f.Detail = old, "replaced by "+nd.Name()+" (p=0.10 loss)"
	return heal, errors.Join(errs...)
}

// repair makes the cluster whole before the next fault when an earlier
// heal could not (a slot without a member, a process that did not come
// back), so faults do not pile up into a cluster that cannot recover.
func (n *Nemesis) repair(ctx context.Context) {
	whole := true
	for _, nd := range n.C.Nodes {
		whole = whole && nd.IsMember() && nd.Running()
	}
	if whole || ctx.Err() != nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := n.HealAll(rctx); err != nil {
		n.repairFailures++
		if n.repairFailures <= 3 {
			n.H.Note("nemesis: repair before fault %d: %v", n.nextID+1, err)
		} else if n.repairFailures == 4 {
			n.H.Note("nemesis: repairs keep failing; further failures are only logged")
		}
		n.Logger.Warn("repair failed", "err", err)
	}
}

// skipError means the fault was not injected at all.
type skipError struct{ why string }

func (e *skipError) Error() string { return "skipped: " + e.why }

// caughtUp waits until every member has applied what the leader has
// committed (within a small lag).
func (n *Nemesis) caughtUp(ctx context.Context, members []int, within time.Duration) error {
	const lag = 200
	deadline := time.Now().Add(within)
	var why string
	for time.Now().Before(deadline) && ctx.Err() == nil {
		why = ""
		var commit uint64
		applied := map[int]uint64{}
		for _, k := range members {
			st, err := n.C.Status(ctx, n.node(k))
			if err != nil {
				why = fmt.Sprintf("%s does not answer: %v", n.node(k).Name(), err)
				break
			}
			commit = max(commit, st.CommitIndex)
			applied[k] = st.AppliedIndex
			// NB: a member joins as a learner the leader promotes once it
			// has caught up; until then the cluster has a voter fewer.
			if self := st.GetSelf(); self.GetLearner() && self.GetAutoPromote() {
				why = fmt.Sprintf("%s is a learner not promoted yet", n.node(k).Name())
				break
			}
		}
		if why == "" {
			for _, k := range members {
				if applied[k]+lag < commit {
					why = fmt.Sprintf("%s applied %d of %d", n.node(k).Name(), applied[k], commit)
					break
				}
			}
		}
		if why == "" {
			return nil
		}
		_ = ctxtime.Sleep(ctx, 200*time.Millisecond)
	}
	return fmt.Errorf("members not caught up within %v: %s", within, why)
}

// HealAll undoes every fault: network rules and the delay proxy, paused
// and killed processes, and a slot left without a member.
func (n *Nemesis) HealAll(ctx context.Context) error {
	errs := []error{n.Net.HealAll(ctx)}
	for _, nd := range n.C.Nodes {
		errs = append(errs, n.C.Resume(nd))
		if !nd.IsMember() {
			errs = append(errs, n.C.Add(ctx, nd))
		}
		errs = append(errs, n.C.Restart(ctx, nd))
	}
	for _, nd := range n.C.Nodes {
		if nd.IsMember() {
			errs = append(errs, n.C.WaitReady(ctx, nd, 30*time.Second))
		}
	}
	return errors.Join(errs...)
}
