package check

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/lodestone-kv/lodestone/chaos/history"
)

// The lock workload's names. Its keys live under LockPrefix, outside
// Prefix on purpose: invalidating a session releases every key it holds at
// one Raft index, which the watch checker would read as one index
// belonging to two keys, and the final range of Prefix must not depend on
// which sessions the server expired.
const (
	LockWorkload = "lock"
	LockPrefix   = "lk/"

	// Operation functions of the lock workload.
	LockAcquire    = "acquire"
	LockRelease    = "release"
	SessionCreate  = "create"
	SessionRenew   = "renew"
	SessionDestroy = "destroy"
	// SessionLookup is a linearizable Session.Info the workload makes to
	// learn whether a refused session still exists; not checked.
	SessionLookup = "session-info"
)

// How the lock workload fills history.Op (the fields are shared with the
// register workload; their meaning for lock operations):
//
//   - Value: the session the operation acts for (create: the new id).
//   - Index: the Raft index of the command (acquire, release, create,
//     renew, destroy), from the response header; for a read, the applied
//     index the read was served at.
//   - Prev, PrevIndex: the key's Session (holder, "" when free) and
//     LockIndex as the server returned them (acquire, release, read).
//   - Type: acquire ok = the lock was taken (the returned entry carries the
//     session and was written by this command); acquire fail with Mismatch
//     and an Index = the server applied the command and refused (lock held,
//     lock delay, or no such session), Prev/PrevIndex being the entry as it
//     stood at Index. Release likewise. Other failures carry no index and
//     no observation.
//   - Found: read: the key exists; destroy: the session existed.

// Lock checks the lock workload (store/doc.go "Sessions and locks"): at no
// Raft index do two sessions hold one key. Time is the Raft log, not the
// wall clock: every acknowledged command names its index, so the history's
// known facts are totally ordered and the check is a replay, with porcupine
// searching only where outcomes are unknown. It checks, per key:
//
//   - Index uniqueness: no two applied commands report the same index
//     (one log entry is one command).
//   - Real time: a command acknowledged before another was invoked has a
//     smaller index (Raft appends new proposals after everything
//     committed).
//   - LockIndex: ok acquires in index order have non-decreasing LockIndex,
//     and two different sessions never acquire at the same LockIndex (each
//     new holder increments it exactly once).
//   - Porcupine, with the Raft index as time, over a model whose state is
//     (holder, LockIndex, invalidated sessions): acquire ok only if free or
//     already ours, incrementing LockIndex when it was free; release ok
//     only by the holder; refusals and reads must match the entry the
//     server returned; renew ok and destroy only for live sessions. Before
//     any step the holder's session may have been invalidated (TTL expiry
//     at an index nobody saw), which frees the key and kills the session
//     for good. Info operations take effect at any index after everything
//     acknowledged before their call, or never.
//
// What it cannot see: lock delays (they are wall-clock rules on the
// proposers' clocks) and overlaps without a later witness: an invalidation
// is always possible, so a second holder is an anomaly only when the first
// session shows it was alive and holding afterwards (a release, renewal,
// read or refusal at a later index).
func Lock(h *history.History, timeout time.Duration) Result {
	const name = "lock"
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	ops := opsOf(h, LockWorkload)
	if len(ops) == 0 {
		return Result{Checker: name, Status: Skipped, Summary: "no lock operations"}
	}
	var anomalies []Anomaly
	add := func(key string, seqs []int64, format string, args ...any) {
		anomalies = append(anomalies, Anomaly{Checker: name, Key: key, What: fmt.Sprintf(format, args...), Seqs: seqs})
	}

	entries := lockEntries(ops)
	checkEntryIndices(entries, add)
	bound := newIndexBound(entries)

	keys, per := byKey(ops)
	var sessionOps []history.Op
	var unknownKeys []string
	checked, acquired, infos, lockKeys, unseen := 0, 0, 0, 0, 0
	for _, o := range ops {
		if o.F == SessionRenew || o.F == SessionDestroy {
			sessionOps = append(sessionOps, o)
		}
	}
	for _, k := range keys {
		if !strings.HasPrefix(k, LockPrefix) {
			continue
		}
		lockKeys++
		kops := per[k]
		checkLockIndices(kops, add)
		unseen += unseenHandoffs(kops, sessionOps)
		pops := lockOps(kops, sessionOps, bound)
		checked += len(pops)
		for _, o := range kops {
			switch {
			case o.F == LockAcquire && o.Type == history.OK:
				acquired++
			case o.Type == history.Info:
				infos++
			}
		}
		switch porcupine.CheckOperationsTimeout(lockModel, pops, timeout) {
		case porcupine.Ok:
		case porcupine.Unknown:
			unknownKeys = append(unknownKeys, k)
		default:
			what := fmt.Sprintf("%d operations on this key have no order consistent with their Raft indices in which one session at a time holds the lock", len(pops))
			var seqs []int64
			// Again, verbose (slower): where does the history stop making sense?
			_, info := porcupine.CheckOperationsVerbose(lockModel, pops, timeout)
			if o, ok := firstUnplaced(pops, info); ok {
				what += "; the longest consistent prefix ends before " + lockModel.DescribeOperation(o.Input, o.Output)
				seqs = []int64{o.Metadata.(int64)}
			}
			add(k, seqs, "%s", what)
		}
	}
	summary := fmt.Sprintf("%d lock operations on %d keys (%d acquires ok, %d unknown outcomes, %d indexed commands, %d handoffs through an unseen release or invalidation) replayed in Raft-index order with porcupine",
		checked, lockKeys, acquired, infos, len(entries), unseen)
	if len(unknownKeys) > 0 {
		summary += fmt.Sprintf("; %d keys timed out (unknown): %s", len(unknownKeys), strings.Join(firstN(unknownKeys, 5), ","))
	}
	return verdict(name, anomalies, len(unknownKeys) > 0, summary)
}

// lockEntries returns the operations that name the Raft entry of their own
// command: applied writes, and refusals the server answered with an index.
func lockEntries(ops []history.Op) []history.Op {
	var out []history.Op
	for _, o := range ops {
		if o.Index == 0 || o.F == history.Read || o.F == SessionLookup {
			continue
		}
		if o.Type == history.OK || (o.Type == history.Fail && o.Mismatch) {
			out = append(out, o)
		}
	}
	return out
}

// checkEntryIndices reports two commands at one index, and a command
// acknowledged before another began that has the later index.
func checkEntryIndices(entries []history.Op, add func(key string, seqs []int64, format string, args ...any)) {
	byIndex := map[uint64]history.Op{}
	for _, o := range entries {
		if prev, ok := byIndex[o.Index]; ok {
			add(o.Key, []int64{prev.Seq, o.Seq}, "%s by %s and %s by %s both report Raft index %d", prev.F, short(prev.Value), o.F, short(o.Value), o.Index)
			continue
		}
		byIndex[o.Index] = o
	}
	byRet := slices.Clone(entries)
	sort.SliceStable(byRet, func(i, j int) bool { return byRet[i].Ret < byRet[j].Ret })
	byCall := slices.Clone(entries)
	sort.SliceStable(byCall, func(i, j int) bool { return byCall[i].Call < byCall[j].Call })
	var top history.Op // the returned op with the highest index so far
	next := 0
	for _, o := range byCall {
		for next < len(byRet) && byRet[next].Ret < o.Call {
			if byRet[next].Index > top.Index {
				top = byRet[next]
			}
			next++
		}
		if top.Index > o.Index { // equal indices: reported above
			add(o.Key, []int64{top.Seq, o.Seq}, "%s at index %d was acknowledged before %s was invoked, which reports the earlier index %d", top.F, top.Index, o.F, o.Index)
		}
	}
}

// checkLockIndices compares the ok acquires of one key in index order: the
// LockIndex never goes back, and one LockIndex belongs to one session.
func checkLockIndices(ops []history.Op, add func(key string, seqs []int64, format string, args ...any)) {
	var acq []history.Op
	for _, o := range ops {
		if o.F == LockAcquire && o.Type == history.OK && o.Index != 0 {
			acq = append(acq, o)
		}
	}
	sort.SliceStable(acq, func(i, j int) bool { return acq[i].Index < acq[j].Index })
	for i := 1; i < len(acq); i++ {
		a, b := acq[i-1], acq[i]
		switch {
		case b.PrevIndex < a.PrevIndex:
			add(b.Key, []int64{a.Seq, b.Seq}, "LockIndex went back from %d (index %d) to %d (index %d)", a.PrevIndex, a.Index, b.PrevIndex, b.Index)
		case b.PrevIndex == a.PrevIndex && b.Value != a.Value:
			add(b.Key, []int64{a.Seq, b.Seq}, "sessions %s (index %d) and %s (index %d) both acquired at LockIndex %d: overlapping holders", short(a.Value), a.Index, short(b.Value), b.Index, b.PrevIndex)
		}
	}
}

// unseenHandoffs counts, for the report, the ok acquires of one key whose
// previous holder (in index order) neither released it nor destroyed its
// session in an acknowledged command: the model had to assume an unknown
// release or an invalidation (TTL expiry) there.
func unseenHandoffs(ops, sessionOps []history.Op) int {
	var seq []history.Op
	for _, o := range append(slices.Clone(ops), sessionOps...) {
		if o.Type == history.OK && o.Index != 0 && (o.F == LockAcquire || o.F == LockRelease || o.F == SessionDestroy) {
			seq = append(seq, o)
		}
	}
	sort.SliceStable(seq, func(i, j int) bool { return seq[i].Index < seq[j].Index })
	n, holder := 0, ""
	for _, o := range seq {
		switch {
		case o.F == LockAcquire:
			if holder != "" && holder != o.Value {
				n++
			}
			holder = o.Value
		case o.Value == holder:
			holder = ""
		}
	}
	return n
}

// indexBound answers: what is the highest index acknowledged before time t?
// An operation invoked at t is proposed after those, so its entry lies
// above it.
type indexBound struct {
	rets []int64  // entry return times, ascending
	top  []uint64 // top[i]: highest index among rets[:i+1]
}

func newIndexBound(entries []history.Op) indexBound {
	byRet := slices.Clone(entries)
	sort.SliceStable(byRet, func(i, j int) bool { return byRet[i].Ret < byRet[j].Ret })
	b := indexBound{}
	var top uint64
	for _, o := range byRet {
		top = max(top, o.Index)
		b.rets = append(b.rets, o.Ret)
		b.top = append(b.top, top)
	}
	return b
}

func (b indexBound) before(t int64) uint64 {
	n := sort.Search(len(b.rets), func(i int) bool { return b.rets[i] >= t })
	if n == 0 {
		return 0
	}
	return b.top[n-1]
}

// Porcupine's clock for the lock model: entry index i is the instant 2i; a
// read at applied index i observes the state after entry i, at 2i+1; an
// info operation invoked after index L was acknowledged may take effect
// from 2L+1 on, or never (its return is infinite).
func entryTime(i uint64) int64 { return int64(2 * i) }
func readTime(i uint64) int64  { return int64(2*i + 1) }

// lockIn is one lock-model operation.
type lockIn struct {
	f       string
	session string
}

// lockOut is what it returned: ok (took effect), refused (applied and
// refused, with the entry as it stood), or unknown.
type lockOut struct {
	ok, unknown bool
	holder      string
	lockIndex   uint64
	destroyed   bool
}

// lockState is one key: its holder ("" free), its LockIndex, and the
// sessions known invalidated, sorted and joined by "," (comparable, so
// porcupine's default equality works).
type lockState struct {
	holder    string
	lockIndex uint64
	dead      string
}

func (s lockState) isDead(session string) bool {
	return slices.Contains(strings.Split(s.dead, ","), session)
}

// kill invalidates session: it frees the key if it held it (LockIndex
// stays, as with behavior release) and can never act again.
func (s lockState) kill(session string) lockState {
	if s.holder == session {
		s.holder = ""
	}
	if s.isDead(session) {
		return s
	}
	d := []string{session}
	if s.dead != "" {
		d = append(d, strings.Split(s.dead, ",")...)
	}
	slices.Sort(d)
	s.dead = strings.Join(d, ",")
	return s
}

// lockStep is one operation on one key, without invalidations; it returns
// every state the operation may leave (none: impossible here).
func lockStep(s lockState, in lockIn, out lockOut) []lockState {
	alive := !s.isDead(in.session)
	observed := s.holder == out.holder && s.lockIndex == out.lockIndex
	switch in.f {
	case history.Read:
		if observed {
			return []lockState{s}
		}
	case LockAcquire:
		took := s
		if s.holder != in.session {
			took.holder, took.lockIndex = in.session, s.lockIndex+1
		}
		free := s.holder == "" || s.holder == in.session
		switch {
		case out.unknown && alive && free:
			// NB: a free key may still refuse (lock delay), so an
			// unknown acquire may leave it free even here.
			return []lockState{took, s}
		case out.unknown:
			return []lockState{s}
		case out.ok:
			if alive && free && took.lockIndex == out.lockIndex {
				return []lockState{took}
			}
		default:
			if observed && s.holder != in.session {
				return []lockState{s}
			}
		}
	case LockRelease:
		freed := s
		freed.holder = ""
		switch {
		case out.unknown && s.holder == in.session:
			return []lockState{freed}
		case out.unknown:
			return []lockState{s}
		case out.ok:
			if alive && s.holder == in.session && s.lockIndex == out.lockIndex {
				return []lockState{freed}
			}
		default:
			if observed && s.holder != in.session {
				return []lockState{s}
			}
		}
	case SessionRenew:
		if alive {
			return []lockState{s}
		}
	case SessionDestroy:
		if alive || !out.destroyed {
			return []lockState{s.kill(in.session)}
		}
	}
	return nil
}

// lockModel: before each operation the holder may have been invalidated.
var lockModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{lockState{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(lockState), input.(lockIn), output.(lockOut)
		next := lockStep(s, in, out)
		if s.holder != "" {
			next = append(next, lockStep(s.kill(s.holder), in, out)...)
		}
		res := make([]any, 0, len(next))
		for _, n := range next {
			if !slices.Contains(res, any(n)) {
				res = append(res, n)
			}
		}
		return res
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(lockIn), output.(lockOut)
		held := fmt.Sprintf("held by %s, lock index %d", show(short(out.holder)), out.lockIndex)
		switch {
		case in.f == history.Read:
			return "read -> " + held
		case out.unknown:
			return fmt.Sprintf("%s %s -> ?", in.f, short(in.session))
		case in.f == SessionDestroy:
			return fmt.Sprintf("destroy %s -> existed %v", short(in.session), out.destroyed)
		case in.f == SessionRenew:
			return fmt.Sprintf("renew %s -> ok", short(in.session))
		case out.ok:
			return fmt.Sprintf("%s %s -> ok (lock index %d)", in.f, short(in.session), out.lockIndex)
		}
		return fmt.Sprintf("%s %s -> refused (%s)", in.f, short(in.session), held)
	},
	DescribeState: func(state any) string {
		s := state.(lockState)
		return fmt.Sprintf("holder %s, lock index %d", show(short(s.holder)), s.lockIndex)
	},
}).ToModel()

// lockOps turns one key's operations, and the renewals and destroys of the
// sessions that used it, into porcupine operations on the Raft-index clock.
func lockOps(ops, sessionOps []history.Op, bound indexBound) []porcupine.Operation {
	used := map[string]bool{}
	for _, o := range ops {
		used[o.Value] = true
	}
	all := slices.Clone(ops)
	for _, o := range sessionOps {
		if used[o.Value] {
			all = append(all, o)
		}
	}
	var out []porcupine.Operation
	clients := map[int]int{}
	for _, o := range all {
		in := lockIn{f: o.F, session: o.Value}
		res := lockOut{ok: o.Type == history.OK, unknown: o.Type == history.Info, holder: o.Prev, lockIndex: o.PrevIndex, destroyed: o.Found}
		call, ret := entryTime(o.Index), entryTime(o.Index)
		switch {
		case o.F == history.Read:
			if o.Type != history.OK || o.Index == 0 {
				continue
			}
			call, ret = readTime(o.Index), readTime(o.Index)
		case o.F != LockAcquire && o.F != LockRelease && o.F != SessionRenew && o.F != SessionDestroy:
			continue
		case o.Type == history.Info && (o.F == LockAcquire || o.F == LockRelease):
			call, ret = readTime(bound.before(o.Call)), history.Infinity
		case o.Type == history.Info, o.Index == 0, o.Type == history.Fail && !o.Mismatch:
			// No index, no effect we could place (an info renewal or
			// destroy changes nothing the model could not do anyway).
			continue
		}
		if _, ok := clients[o.Proc]; !ok {
			clients[o.Proc] = len(clients)
		}
		out = append(out, porcupine.Operation{ClientId: clients[o.Proc], Input: in, Output: res, Call: call, Return: ret, Metadata: o.Seq})
	}
	return out
}

// firstUnplaced returns the earliest operation (in Raft-index time) that
// porcupine's longest partial linearization does not contain: where the
// history stops making sense.
func firstUnplaced(ops []porcupine.Operation, info porcupine.LinearizationInfo) (porcupine.Operation, bool) {
	placed := map[int64]bool{}
	var longest []porcupine.Operation
	for _, part := range info.PartialLinearizationsOperations() {
		for _, lin := range part {
			if len(lin) > len(longest) {
				longest = lin
			}
		}
	}
	for _, o := range longest {
		placed[o.Metadata.(int64)] = true
	}
	sorted := slices.Clone(ops)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Return < sorted[j].Return })
	for _, o := range sorted {
		if !placed[o.Metadata.(int64)] {
			return o, true
		}
	}
	return porcupine.Operation{}, false
}

// short abbreviates a session id for reports.
func short(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
