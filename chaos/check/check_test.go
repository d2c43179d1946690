package check

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lodestone-kv/lodestone/chaos/history"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hb builds synthetic histories: times are in milliseconds.
type hb struct {
	h   *history.History
	seq int64
}

func newHB() *hb { return &hb{h: &history.History{}} }

func ms(t int) int64 { return int64(t) * int64(time.Millisecond) }

func (b *hb) op(o history.Op, call, ret int) *hb {
	b.seq++
	o.Seq = b.seq
	o.Call, o.Ret = ms(call), ms(ret)
	if o.Workload == "" {
		o.Workload = history.Register
	}
	if o.Key == "" {
		o.Key = RegisterPrefix + "k"
	}
	if o.Type == "" {
		o.Type = history.OK
	}
	b.h.Ops = append(b.h.Ops, o)
	return b
}

func (b *hb) write(proc int, v string, idx uint64, typ string, call, ret int) *hb {
	return b.op(history.Op{Proc: proc, F: history.Write, Value: v, Index: idx, Type: typ}, call, ret)
}

func (b *hb) read(proc int, v string, call, ret int) *hb {
	return b.op(history.Op{Proc: proc, F: history.Read, Value: v, Found: v != ""}, call, ret)
}

func (b *hb) cas(proc int, prev, v string, typ string, mismatch bool, call, ret int) *hb {
	return b.op(history.Op{Proc: proc, F: history.CAS, Prev: prev, Value: v, Type: typ, Mismatch: mismatch}, call, ret)
}

func wantStatus(t *testing.T, r Result, want string) {
	t.Helper()
	if got := r.Status; got != want {
		t.Fatalf("%s: status %s, want %s; summary %q; anomalies %v", r.Checker, got, want, r.Summary, r.Anomalies)
	}
}

// docs/architecture.md, "Reads are linearizable by default" (ReadIndex,
// then wait for apply). Each case is a register history on one key that is
// or is not linearizable; unknown-outcome writes may take effect late or
// never.
func TestLinearizable(t *testing.T) {
	cases := []struct {
		name string
		b    *hb
		want string
	}{
		{"sequential write then read", newHB().write(0, "a", 5, "", 0, 10).read(1, "a", 20, 30), Valid},
		{"concurrent read sees old or new", newHB().write(0, "a", 5, "", 0, 10).write(0, "b", 6, "", 20, 40).read(1, "a", 25, 30).read(2, "b", 26, 35), Valid},
		{"info write observed long after", newHB().write(0, "a", 0, history.Info, 0, 10).read(1, "", 20, 30).read(1, "a", 100, 110), Valid},
		{"info write never observed", newHB().write(0, "a", 5, "", 0, 10).write(1, "b", 0, history.Info, 20, 30).read(2, "a", 40, 50), Valid},
		{"failed write is dropped", newHB().write(0, "a", 5, "", 0, 10).write(1, "b", 0, history.Fail, 20, 30).read(2, "a", 40, 50), Valid},
		{"cas ok and mismatch", newHB().write(0, "a", 5, "", 0, 10).cas(1, "a", "b", "", false, 20, 30).cas(2, "a", "c", history.Fail, true, 40, 50).read(3, "b", 60, 70), Valid},
		{"info cas applied", newHB().write(0, "a", 5, "", 0, 10).cas(1, "a", "b", history.Info, false, 20, 30).read(2, "b", 40, 50), Valid},

		{"stale read after acknowledged write", newHB().write(0, "a", 5, "", 0, 10).write(0, "b", 6, "", 20, 30).read(1, "a", 40, 50), Invalid},
		{"read of a value never written", newHB().write(0, "a", 5, "", 0, 10).read(1, "z", 20, 30), Invalid},
		{"read goes back in time", newHB().write(0, "a", 5, "", 0, 10).write(0, "b", 6, "", 20, 100).read(1, "b", 30, 40).read(2, "a", 50, 60), Invalid},
		{"cas succeeded with the wrong prev", newHB().write(0, "a", 5, "", 0, 10).cas(1, "x", "b", "", false, 20, 30), Invalid},
		{"cas mismatch although prev held", newHB().write(0, "a", 5, "", 0, 10).cas(1, "a", "b", history.Fail, true, 20, 30).read(2, "a", 40, 50), Invalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			r := Linearizable(c.b.h, LinearOptions{Timeout: 10 * time.Second, VisualizeDir: dir})
			wantStatus(t, r, c.want)
			if c.want == Invalid {
				if len(r.Files) != 1 {
					t.Fatalf("visualizations %v, want one", r.Files)
				}
				b, err := os.ReadFile(filepath.Join(dir, r.Files[0]))
				if err != nil || !strings.Contains(string(b), "<html") {
					t.Fatalf("visualization %s unreadable or not HTML: %v", r.Files[0], err)
				}
			}
		})
	}
}

func (b *hb) ctr(f string, v string, typ string, call, ret int) *hb {
	return b.op(history.Op{Workload: history.Counter, Key: CounterPrefix + "0", F: f, Value: v, Found: v != "", Type: typ}, call, ret)
}

// Jepsen counter bounds: a read lies between the increments acknowledged
// before it began and those begun before it ended.
func TestCounter(t *testing.T) {
	cases := []struct {
		name string
		b    *hb
		want string
	}{
		{"reads within bounds", newHB().ctr(history.Read, "", "", 0, 5).ctr(history.Add, "", "", 10, 20).ctr(history.Read, "1", "", 30, 40).ctr(history.Add, "", history.Info, 50, 60).ctr(history.Read, "2", "", 70, 80), Valid},
		{"concurrent read may miss an add", newHB().ctr(history.Add, "", "", 10, 50).ctr(history.Read, "", "", 20, 30), Valid},
		{"stale read below acknowledged", newHB().ctr(history.Add, "", "", 10, 20).ctr(history.Add, "", "", 30, 40).ctr(history.Read, "1", "", 50, 60), Invalid},
		{"read above attempted", newHB().ctr(history.Add, "", "", 10, 20).ctr(history.Read, "3", "", 50, 60), Invalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { wantStatus(t, Counter(c.b.h), c.want) })
	}
}

func kv(v string, idx uint64) history.FinalKV { return history.FinalKV{Value: v, Index: idx} }

func final(kvs map[string]history.FinalKV, replicas map[string]map[string]history.FinalKV) history.FinalState {
	return history.FinalState{Index: 100, KVs: kvs, Replicas: replicas, Complete: true}
}

// docs/architecture.md: "Nothing acknowledged is ever lost"; "Replicas
// converge".
func TestDurability(t *testing.T) {
	setKey := SetPrefix + "0/1"
	reg := RegisterPrefix + "k"
	base := func() *hb {
		b := newHB()
		b.op(history.Op{Workload: history.Set, Key: setKey, F: history.Write, Value: "s1", Index: 7}, 0, 10)
		b.write(0, "a", 8, "", 20, 30)
		b.write(0, "b", 9, "", 40, 50)
		return b
	}
	good := map[string]history.FinalKV{setKey: kv("s1", 7), reg: kv("b", 9)}
	cases := []struct {
		name string
		h    *history.History
		want string
	}{
		{"all present", func() *history.History {
			h := base().h
			h.Final = final(good, map[string]map[string]history.FinalKV{"n1": good})
			return h
		}(), Valid},
		{"overwritten by a later unknown write", func() *history.History {
			h := base().write(1, "c", 0, history.Info, 60, 70).h
			h.Final = final(map[string]history.FinalKV{setKey: kv("s1", 7), reg: kv("c", 11)}, nil)
			return h
		}(), Valid},
		{"incomplete final read", func() *history.History { h := base().h; h.Final = history.FinalState{Err: "no leader"}; return h }(), Unknown},
		{"set key lost", func() *history.History {
			h := base().h
			h.Final = final(map[string]history.FinalKV{reg: kv("b", 9)}, nil)
			return h
		}(), Invalid},
		{"register rolled back", func() *history.History {
			h := base().h
			h.Final = final(map[string]history.FinalKV{setKey: kv("s1", 7), reg: kv("a", 8)}, nil)
			return h
		}(), Invalid},
		{"phantom set key", func() *history.History {
			h := base().h
			h.Final = final(map[string]history.FinalKV{setKey: kv("s1", 7), reg: kv("b", 9), SetPrefix + "9/9": kv("x", 12)}, nil)
			return h
		}(), Invalid},
		{"replica diverged", func() *history.History {
			h := base().h
			h.Final = final(good, map[string]map[string]history.FinalKV{"n1": good, "n2": {setKey: kv("s1", 7), reg: kv("a", 8)}})
			return h
		}(), Invalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { wantStatus(t, Durability(c.h), c.want) })
	}
}

// watchHistory: writes at indices 10..14 on two keys, and watcher 0 with
// the given sessions and events.
func watchHistory(sessions []history.WatchSession, events []history.WatchEvent) *history.History {
	b := newHB()
	ka, kb := RegisterPrefix+"a", RegisterPrefix+"b"
	b.op(history.Op{Key: ka, F: history.Write, Value: "a1", Index: 10}, 0, 1)
	b.op(history.Op{Key: kb, F: history.Write, Value: "b1", Index: 11}, 2, 3)
	b.op(history.Op{Key: ka, F: history.Write, Value: "a2", Index: 12}, 4, 5)
	b.op(history.Op{Key: kb, F: history.Write, Value: "b2", Index: 13}, 6, 7)
	b.op(history.Op{Key: ka, F: history.Write, Value: "a3", Index: 14}, 8, 9)
	b.h.Session = sessions
	b.h.Events = events
	return b.h
}

func ev(session int, key string, idx uint64, v string) history.WatchEvent {
	return history.WatchEvent{Session: session, Key: RegisterPrefix + key, Index: idx, Value: v, T: int64(idx)}
}

// docs/architecture.md, "Watches have no gaps, no duplicates and no
// reordering", resume continuity included; watch.proto: events in index
// order, everything > start.
func TestWatch(t *testing.T) {
	one := []history.WatchSession{{Session: 0, Start: 9, End: 14}}
	two := []history.WatchSession{{Session: 0, Start: 9, End: 11}, {Session: 1, Start: 11, End: 14}}
	all := []history.WatchEvent{ev(0, "a", 10, "a1"), ev(0, "b", 11, "b1"), ev(0, "a", 12, "a2"), ev(0, "b", 13, "b2"), ev(0, "a", 14, "a3")}
	resumed := []history.WatchEvent{ev(0, "a", 10, "a1"), ev(0, "b", 11, "b1"), ev(1, "a", 12, "a2"), ev(1, "b", 13, "b2"), ev(1, "a", 14, "a3")}
	cases := []struct {
		name     string
		sessions []history.WatchSession
		events   []history.WatchEvent
		want     string
	}{
		{"complete stream", one, all, Valid},
		{"complete across a resume", two, resumed, Valid},
		{"partial coverage needs only its range", []history.WatchSession{{Session: 0, Start: 11, End: 13}}, []history.WatchEvent{ev(0, "a", 12, "a2"), ev(0, "b", 13, "b2")}, Valid},
		{"gap", one, []history.WatchEvent{ev(0, "a", 10, "a1"), ev(0, "b", 11, "b1"), ev(0, "b", 13, "b2"), ev(0, "a", 14, "a3")}, Invalid},
		{"gap at a resume", two, []history.WatchEvent{ev(0, "a", 10, "a1"), ev(0, "b", 11, "b1"), ev(1, "b", 13, "b2"), ev(1, "a", 14, "a3")}, Invalid},
		{"duplicate after resume", two, append(append([]history.WatchEvent{}, resumed...), ev(1, "b", 11, "b1")), Invalid},
		{"reordered", one, []history.WatchEvent{ev(0, "a", 10, "a1"), ev(0, "a", 12, "a2"), ev(0, "b", 11, "b1"), ev(0, "b", 13, "b2"), ev(0, "a", 14, "a3")}, Invalid},
		{"wrong value", one, []history.WatchEvent{ev(0, "a", 10, "a1"), ev(0, "b", 11, "b1"), ev(0, "a", 12, "zz"), ev(0, "b", 13, "b2"), ev(0, "a", 14, "a3")}, Invalid},
		{"resume skipped ahead", []history.WatchSession{{Session: 0, Start: 9, End: 11}, {Session: 1, Start: 12, End: 14}}, []history.WatchEvent{ev(0, "a", 10, "a1"), ev(0, "b", 11, "b1"), ev(1, "b", 13, "b2"), ev(1, "a", 14, "a3")}, Invalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { wantStatus(t, Watch(watchHistory(c.sessions, c.events)), c.want) })
	}
	t.Run("no sessions", func(t *testing.T) { wantStatus(t, Watch(watchHistory(nil, nil)), Skipped) })
}

// Availability only reports: ops inside a fault window count for its kind,
// and time to a new leader is measured from the fault's start.
func TestAvailability(t *testing.T) {
	b := newHB()
	b.write(0, "a", 1, "", 0, 10)
	b.write(0, "b", 0, history.Fail, 1000, 1010)
	b.write(0, "c", 0, history.Info, 1100, 1200)
	b.write(0, "d", 2, "", 3000, 3010)
	b.h.Faults = []history.Fault{{Kind: "kill", Start: ms(900), End: ms(2000), OldLeader: 1, OldTerm: 3, LeaderFault: true}}
	b.h.Leaders = []history.LeaderObs{{T: ms(950), Leader: 1, Term: 3}, {T: ms(1200), Leader: 0, Term: 4}, {T: ms(1500), Leader: 2, Term: 4}}
	got := map[string]KindStats{}
	for _, s := range Availability(b.h) {
		got[s.Kind] = s
	}
	if g, w := got["kill"].Ops, 2; g != w {
		t.Errorf("kill ops = %d, want %d", g, w)
	}
	if g, w := got[NoFault].OKShare, 1.0; g != w {
		t.Errorf("no-fault ok share = %v, want %v", g, w)
	}
	if g, w := got["kill"].LeaderMedian, 600*time.Millisecond; g != w {
		t.Errorf("time to new leader = %v, want %v", g, w)
	}
}
