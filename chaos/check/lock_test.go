package check

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/chaos/history"
)

// Lock-workload builders. Sessions are "A", "B", "C"; every operation is
// on one lock key; idx is the Raft index the server reported, li the
// LockIndex; times are milliseconds.

func (b *hb) lk(o history.Op, call, ret int) *hb {
	o.Workload = LockWorkload
	if o.Key == "" && o.F != SessionRenew && o.F != SessionDestroy && o.F != SessionCreate {
		o.Key = LockPrefix + "0"
	}
	return b.op(o, call, ret)
}

// acq is an acquire that took the lock (typ "") or whose outcome is
// unknown (history.Info: idx and li are ignored).
func (b *hb) acq(s string, idx, li uint64, typ string, call, ret int) *hb {
	o := history.Op{F: LockAcquire, Value: s, Type: typ}
	if typ != history.Info {
		o.Index, o.Prev, o.PrevIndex = idx, s, li
	}
	return b.lk(o, call, ret)
}

// refused is an acquire the server applied at idx and refused, returning
// the entry held by holder ("" free) at LockIndex li.
func (b *hb) refused(s string, idx uint64, holder string, li uint64, call, ret int) *hb {
	return b.lk(history.Op{F: LockAcquire, Value: s, Type: history.Fail, Mismatch: true, Index: idx, Prev: holder, PrevIndex: li}, call, ret)
}

func (b *hb) rel(s string, idx, li uint64, typ string, call, ret int) *hb {
	o := history.Op{F: LockRelease, Value: s, Type: typ}
	if typ != history.Info {
		o.Index, o.PrevIndex = idx, li
	}
	return b.lk(o, call, ret)
}

func (b *hb) lread(holder string, li, idx uint64, call, ret int) *hb {
	return b.lk(history.Op{F: history.Read, Index: idx, Prev: holder, PrevIndex: li, Found: li > 0}, call, ret)
}

func (b *hb) renew(s string, idx uint64, call, ret int) *hb {
	return b.lk(history.Op{F: SessionRenew, Value: s, Index: idx}, call, ret)
}

func (b *hb) destroy(s string, idx uint64, destroyed bool, call, ret int) *hb {
	return b.lk(history.Op{F: SessionDestroy, Value: s, Index: idx, Found: destroyed}, call, ret)
}

func (b *hb) create(s string, idx uint64, call, ret int) *hb {
	return b.lk(history.Op{F: SessionCreate, Value: s, Index: idx}, call, ret)
}

// store/doc.go "Sessions and locks": acquire succeeds only if no other
// session holds the key, increments LockIndex exactly once per new holder;
// release only by the holder; invalidation (destroy, TTL) releases. At no
// Raft index do two sessions hold the key.
func TestLock(t *testing.T) {
	cases := []struct {
		name string
		b    *hb
		want string
		// seq, if non-zero, must be among the anomalies' operations.
		seq int64
	}{
		{"handoff by release", newHB().create("A", 1, 0, 1).create("B", 2, 2, 3).
			acq("A", 10, 1, "", 4, 5).refused("B", 11, "A", 1, 6, 7).rel("A", 12, 1, "", 8, 9).
			acq("B", 13, 2, "", 10, 11).lread("B", 2, 13, 12, 13).rel("B", 14, 2, "", 14, 15).lread("", 2, 14, 16, 17), Valid, 0},
		{"handoff after an unseen expiry", newHB().acq("A", 10, 1, "", 0, 1).acq("B", 20, 2, "", 30, 31).lread("B", 2, 25, 40, 41), Valid, 0},
		{"unknown acquire took effect", newHB().renew("A", 5, 0, 1).acq("A", 0, 0, history.Info, 2, 3).lread("A", 1, 9, 10, 11), Valid, 0},
		{"unknown acquire never took effect", newHB().acq("A", 0, 0, history.Info, 0, 1).acq("B", 12, 1, "", 2, 3).rel("B", 13, 1, "", 4, 5).lread("", 1, 13, 6, 7), Valid, 0},
		{"unknown release", newHB().acq("A", 10, 1, "", 0, 1).rel("A", 0, 0, history.Info, 2, 3).acq("B", 15, 2, "", 4, 5), Valid, 0},
		{"destroy releases", newHB().acq("A", 10, 1, "", 0, 1).destroy("A", 11, true, 2, 3).acq("B", 12, 2, "", 4, 5), Valid, 0},
		{"destroy of an expired session", newHB().acq("A", 10, 1, "", 0, 1).acq("B", 12, 2, "", 2, 3).destroy("A", 13, false, 4, 5).lread("B", 2, 13, 6, 7), Valid, 0},
		{"re-acquire by the holder keeps LockIndex", newHB().acq("A", 10, 1, "", 0, 1).acq("A", 11, 1, "", 2, 3).rel("A", 12, 1, "", 4, 5), Valid, 0},
		{"refused while free (lock delay)", newHB().acq("A", 10, 1, "", 0, 1).destroy("A", 11, true, 2, 3).refused("B", 12, "", 1, 4, 5).acq("B", 14, 2, "", 6, 7), Valid, 0},
		{"concurrent commands may return in any order", newHB().acq("A", 11, 1, "", 0, 10).refused("B", 10, "", 0, 1, 9), Valid, 0},

		{"overlapping holders, witnessed by a release", newHB().acq("A", 10, 1, "", 0, 1).acq("B", 12, 2, "", 2, 3).rel("A", 14, 2, "", 4, 5), Invalid, 3},
		{"two sessions at one LockIndex", newHB().acq("A", 10, 1, "", 0, 1).acq("B", 12, 1, "", 2, 3), Invalid, 2},
		{"LockIndex skipped", newHB().acq("A", 10, 1, "", 0, 1).rel("A", 11, 1, "", 2, 3).acq("B", 12, 3, "", 4, 5), Invalid, 3},
		{"holder renews after another acquired", newHB().acq("A", 10, 1, "", 0, 1).acq("B", 12, 2, "", 2, 3).renew("A", 13, 4, 5), Invalid, 3},
		{"refusal names a released holder", newHB().acq("A", 10, 1, "", 0, 1).rel("A", 11, 1, "", 2, 3).refused("B", 12, "A", 1, 4, 5), Invalid, 3},
		{"read sees the old holder", newHB().acq("A", 10, 1, "", 0, 1).acq("B", 12, 2, "", 2, 3).lread("A", 1, 13, 4, 5), Invalid, 3},
		{"acquire by a destroyed session", newHB().acq("A", 10, 1, "", 0, 1).destroy("A", 11, true, 2, 3).acq("A", 12, 2, "", 4, 5), Invalid, 3},
		{"two commands at one index", newHB().acq("A", 10, 1, "", 0, 1).refused("B", 10, "A", 1, 2, 3), Invalid, 2},
		{"unknown acquire placed before its call", newHB().renew("A", 20, 0, 1).acq("A", 0, 0, history.Info, 2, 3).lread("A", 1, 15, 4, 5), Invalid, 3},
		{"index order against real time", newHB().acq("A", 20, 1, "", 0, 10).refused("B", 15, "", 0, 20, 30), Invalid, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := Lock(c.b.h, 10*time.Second)
			wantStatus(t, r, c.want)
			if c.seq == 0 {
				return
			}
			var seqs []int64
			for _, a := range r.Anomalies {
				seqs = append(seqs, a.Seqs...)
			}
			if !slices.Contains(seqs, c.seq) {
				t.Fatalf("anomalies %v do not name op %d", r.Anomalies, c.seq)
			}
		})
	}
}

// The report counts the handoffs the model explained by an unseen
// invalidation.
func TestLockCountsUnseenHandoffs(t *testing.T) {
	h := newHB().acq("A", 10, 1, "", 0, 1).acq("B", 20, 2, "", 30, 31).rel("B", 21, 2, "", 32, 33).
		acq("C", 22, 3, "", 34, 35).destroy("C", 23, true, 36, 37).acq("D", 24, 4, "", 38, 39).h
	r := Lock(h, time.Second)
	wantStatus(t, r, Valid)
	if got, want := r.Summary, "1 handoffs through an unseen"; !strings.Contains(got, want) {
		t.Fatalf("summary %q does not contain %q", got, want)
	}
}

// An empty history is skipped, not valid: the campaign must notice a
// lock workload that recorded nothing.
func TestLockSkippedWithoutOps(t *testing.T) {
	wantStatus(t, Lock(newHB().write(0, "a", 5, "", 0, 1).h, time.Second), Skipped)
}
