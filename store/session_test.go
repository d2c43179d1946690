package store

import (
	"slices"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

func TestSessionCreate(t *testing.T) {
	c := newClock(t)
	c.ok(regNode("n1"), regCheck("n1", "ok", "", PASSING), regCheck("n1", "bad", "", CRITICAL))
	res, evs := c.do(sessCreate(sid(1), "n1", withChecks("ok")))
	s := res.GetSessionCreate().GetSession()
	if s == nil || s.CreateIndex != 4 || s.ModifyIndex != 4 || s.RenewedUnixNano != t0 || s.LockDelay.AsDuration() != DefaultLockDelay ||
		s.Behavior != lodestonepb.SessionBehavior_SESSION_RELEASE {
		t.Errorf("created %v; want indices 4, renewed at t0, lock delay 15s, release", s)
	}
	if got, want := evKeys(evs), []string{"put |session/" + sid(1)}; !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	if got, _ := c.s.Session(sid(1)); got != s {
		t.Errorf("Session() = %v", got)
	}
	if got, meta := c.s.NodeSessions("n1"); len(got) != 1 || meta.Index != 4 {
		t.Errorf("NodeSessions = %v %+v", got, meta)
	}

	for _, tt := range []struct {
		name     string
		cmd      *lodestonepb.Command
		wantRule string
	}{
		{"node not registered", sessCreate(sid(2), "n9"), RejectNodeMissing},
		{"id taken", sessCreate(sid(1), "n1"), RejectSessionIDTaken},
		{"missing check", sessCreate(sid(2), "n1", withChecks("ok", "nope")), RejectCheckMissing},
		{"critical check", sessCreate(sid(2), "n1", withChecks("bad")), RejectCheckCritical},
		{"service check ref", func() *lodestonepb.Command {
			cmd := sessCreate(sid(2), "n1")
			cmd.GetSessionCreate().Session.ServiceChecks = []*lodestonepb.ServiceCheckRef{{Id: "nope"}}
			return cmd
		}(), RejectCheckMissing},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := c.s.SessionsIndex()
			res, evs := c.do(tt.cmd)
			if re, _ := ResultError(res).(*RejectedError); re == nil || re.Rule != tt.wantRule {
				t.Errorf("result %v, want rejected %s", res, tt.wantRule)
			}
			if len(evs) != 0 || c.s.SessionsIndex() != before {
				t.Errorf("rejected create moved things: events %q", evKeys(evs))
			}
		})
	}
}

// TestLockContention: Consul's acquire/release semantics with two
// sessions.
func TestLockContention(t *testing.T) {
	c := newClock(t)
	a, b := sid(1), sid(2)
	c.ok(regNode("n1"), sessCreate(a, "n1"), sessCreate(b, "n1"))
	kv := func() string { got, _ := c.s.Get([]byte("lock")); return fmtKV(got) }
	steps := []struct {
		name       string
		cmd        *lodestonepb.Command
		wantFailed bool
		wantReject string
		wantKV     string
	}{
		{"a acquires a new key", acquireCmd("lock", "a1", a), false, "", `lock="a1" c=4 m=4 l=1 f=0 s="` + a + `"`},
		{"b cannot take it", acquireCmd("lock", "b1", b), true, "", `lock="a1" c=4 m=4 l=1 f=0 s="` + a + `"`},
		{"a re-acquires: value written, LockIndex kept", acquireCmd("lock", "a2", a), false, "", `lock="a2" c=4 m=6 l=1 f=0 s="` + a + `"`},
		{"a plain put keeps the lock", putCmd("lock", "p"), false, "", `lock="p" c=4 m=7 l=1 f=0 s="` + a + `"`},
		{"b cannot release a's lock", releaseCmd("lock", "b2", b), true, "", `lock="p" c=4 m=7 l=1 f=0 s="` + a + `"`},
		{"a releases: session cleared, LockIndex kept, value written", releaseCmd("lock", "free", a), false, "", `lock="free" c=4 m=9 l=1 f=0 s=""`},
		{"release of an unheld key fails", releaseCmd("lock", "", a), true, "", `lock="free" c=4 m=9 l=1 f=0 s=""`},
		{"b acquires: LockIndex increments", acquireCmd("lock", "b3", b), false, "", `lock="b3" c=4 m=11 l=2 f=0 s="` + b + `"`},
		{"unknown session is rejected", acquireCmd("lock", "x", sid(9)), false, RejectSessionMissing, `lock="b3" c=4 m=11 l=2 f=0 s="` + b + `"`},
		{"a delete ignores the lock", delCmd("lock"), false, "", `<nil>`},
		{"release of a missing key fails", releaseCmd("lock", "", b), true, "", `<nil>`},
	}
	for _, st := range steps {
		res, evs := c.do(st.cmd)
		if got := res.GetLockFailed(); got != st.wantFailed {
			t.Errorf("%s: lock_failed = %v, want %v", st.name, got, st.wantFailed)
		}
		if got := res.GetRejected().GetRule(); got != st.wantReject {
			t.Errorf("%s: rejected %q, want %q", st.name, got, st.wantReject)
		}
		if (st.wantFailed || st.wantReject != "") && len(evs) != 0 {
			t.Errorf("%s: events %q from a failed lock", st.name, evKeys(evs))
		}
		if got := kv(); got != st.wantKV {
			t.Errorf("%s: %s\nwant %s", st.name, got, st.wantKV)
		}
	}
}

func TestSessionBehaviorsAndLockDelay(t *testing.T) {
	t.Run("release: keys kept, session cleared, delay blocks re-acquire", func(t *testing.T) {
		c := newClock(t)
		a, b := sid(1), sid(2)
		c.ok(regNode("n1"), sessCreate(a, "n1"), sessCreate(b, "n1"),
			acquireCmd("k/1", "v1", a), acquireCmd("k/2", "v2", a), putCmd("k/3", "free"))
		c.advance(time.Second)
		res, evs := c.do(sessDestroy(a))
		if !res.GetSessionDestroy().GetDestroyed() {
			t.Errorf("destroy result %v", res)
		}
		if got, want := evKeys(evs), []string{"put k/1", "put k/2", "delete |session/" + a}; !slices.Equal(got, want) {
			t.Errorf("events %q, want %q", got, want)
		}
		got, _ := c.s.Get([]byte("k/1"))
		if got, want := fmtKV(got), `k/1="v1" c=4 m=7 l=1 f=0 s=""`; got != want {
			t.Errorf("after release: %s, want %s", got, want)
		}
		if until, ok := c.s.LockDelay([]byte("k/1")); !ok || until.UnixNano() != c.now+int64(DefaultLockDelay) {
			t.Errorf("LockDelay = %v %v, want invalidation time + 15s", until, ok)
		}
		if _, ok := c.s.LockDelay([]byte("k/3")); ok {
			t.Errorf("a key the session did not hold got a lock delay")
		}
		c.advance(DefaultLockDelay - time.Nanosecond)
		if res, _ := c.do(acquireCmd("k/1", "b", b)); !res.LockFailed {
			t.Errorf("acquire inside the lock delay succeeded")
		}
		if res, _ := c.do(acquireCmd("k/3", "b", b)); res.LockFailed {
			t.Errorf("acquire of a key without delay failed")
		}
		c.advance(time.Nanosecond)
		if res, _ := c.do(acquireCmd("k/1", "b", b)); res.LockFailed {
			t.Errorf("acquire at the end of the lock delay failed")
		}
		got, _ = c.s.Get([]byte("k/1"))
		if got.LockIndex != 2 {
			t.Errorf("LockIndex %d after the second holder, want 2", got.LockIndex)
		}
		if res, _ := c.do(sessDestroy(a)); res.GetSessionDestroy().GetDestroyed() {
			t.Errorf("destroying a destroyed session reports destroyed")
		}
	})

	t.Run("SessionLocks lists the keys a session holds", func(t *testing.T) {
		c := newClock(t)
		a, b := sid(1), sid(2)
		c.ok(regNode("n1"), sessCreate(a, "n1"), sessCreate(b, "n1"),
			acquireCmd("k/2", "v", a), acquireCmd("k/1", "v", a), acquireCmd("k/3", "v", b), putCmd("k/4", "free"))
		if got := c.s.SessionLocks(a); !slices.Equal(got, []string{"k/1", "k/2"}) {
			t.Errorf("SessionLocks(a) = %q, want k/1 and k/2 sorted", got)
		}
		c.ok(sessDestroy(a))
		if got := c.s.SessionLocks(a); len(got) != 0 {
			t.Errorf("SessionLocks after destroy = %q, want none", got)
		}
		if got := c.s.SessionLocks(b); !slices.Equal(got, []string{"k/3"}) {
			t.Errorf("SessionLocks(b) = %q", got)
		}
	})

	t.Run("delete: held keys are deleted", func(t *testing.T) {
		c := newClock(t)
		a := sid(1)
		c.ok(regNode("n1"), sessCreate(a, "n1", withDelete(), withLockDelay(0)), acquireCmd("k/1", "v", a), putCmd("k/2", "v"))
		_, evs := c.do(sessInvalidate("", 0, a))
		if got, want := evKeys(evs), []string{"delete k/1", "delete |session/" + a}; !slices.Equal(got, want) {
			t.Errorf("events %q, want %q", got, want)
		}
		if got, _ := c.s.Get([]byte("k/2")); got == nil {
			t.Errorf("a key the session did not hold was deleted")
		}
		if _, ok := c.s.LockDelay([]byte("k/1")); ok {
			t.Errorf("a zero lock delay was recorded")
		}
		c.ok(sessCreate(sid(2), "n1"), acquireCmd("k/1", "again", sid(2)))
	})

	t.Run("critical check invalidates its sessions and releases their locks", func(t *testing.T) {
		c := newClock(t)
		c.ok(regNode("n1"), regCheck("n1", "alive", "", PASSING), regCheck("n1", "other", "", PASSING),
			sessCreate(sid(1), "n1", withChecks("alive")), sessCreate(sid(2), "n1", withChecks("other")), sessCreate(sid(3), "n1"),
			acquireCmd("leader", "me", sid(1)))
		_, evs := c.do(checkUpd("n1", "alive", WARNING, ""))
		if s, _ := c.s.Session(sid(1)); s == nil || len(evs) != 2 {
			t.Fatalf("warning invalidated the session (events %q)", evKeys(evs))
		}
		_, evs = c.do(checkUpd("n1", "alive", CRITICAL, "dead"))
		if got, want := evKeys(evs), []string{"put leader", "put |catalog/check/n1|alive", "put |catalog/node/n1", "delete |session/" + sid(1)}; !slices.Equal(got, want) {
			t.Errorf("events %q, want %q", got, want)
		}
		left, _ := c.s.Sessions()
		if len(left) != 2 || left[0].Id != sid(2) {
			t.Errorf("sessions left %v, want 2 and 3", left)
		}
		// A registration that sets a check critical does the same.
		_, evs = c.do(regCheck("n1", "other", "", CRITICAL))
		if s, _ := c.s.Session(sid(2)); s != nil {
			t.Errorf("session bound to a check registered critical survived (events %q)", evKeys(evs))
		}
	})

	t.Run("invalidate by node", func(t *testing.T) {
		c := newClock(t)
		c.ok(regNode("n1"), regNode("n2"), sessCreate(sid(1), "n1"), sessCreate(sid(2), "n2"), sessCreate(sid(3), "n1"))
		res, _ := c.do(sessInvalidate("n1", 0, sid(2), sid(9)))
		if got, want := res.GetSessionInvalidate().GetInvalidated(), []string{sid(1), sid(2), sid(3)}; !slices.Equal(got, want) {
			t.Errorf("invalidated %v, want %v", got, want)
		}
	})
}

func TestTxnLocks(t *testing.T) {
	c := newClock(t)
	a, b := sid(1), sid(2)
	c.ok(regNode("n1"), sessCreate(a, "n1"), sessCreate(b, "n1"), acquireCmd("held", "b", b))

	res, _ := c.do(txnCmd(opLock(LOCK, "x", "1", a), opLock(LOCK, "y", "2", a), opLock(CHECK_SESSION, "x", "", a)))
	if tx := res.GetTxn(); !tx.GetSucceeded() || tx.Results[0].Kv.LockIndex != 1 || tx.Results[0].Kv.Session != a {
		t.Fatalf("txn lock: %v", res)
	}
	// A failing op rolls the locks back, lock bookkeeping included
	// (checkInvariants compares it with a rebuild after every command).
	res, evs := c.do(txnCmd(opLock(UNLOCK, "x", "u", a), opLock(LOCK, "z", "3", a), opLock(LOCK, "held", "", a)))
	if tx := res.GetTxn(); tx.GetSucceeded() || len(evs) != 0 || len(tx.Errors) != 1 ||
		tx.Errors[0].What != `key "held" is already locked by session "`+b+`"` {
		t.Errorf("txn with a held key: %v, events %q", res, evKeys(evs))
	}
	if got, _ := c.s.Get([]byte("x")); got.Session != a {
		t.Errorf("x after rollback: %s, want still held by a", fmtKV(got))
	}
	for _, tt := range []struct {
		op   *lodestonepb.TxnOp
		want string
	}{
		{opLock(UNLOCK, "held", "", a), `key "held" is not locked by session "` + a + `" (held by "` + b + `")`},
		{opLock(UNLOCK, "missing", "", a), `key "missing" does not exist, so session "` + a + `" cannot release it`},
		{opLock(CHECK_SESSION, "held", "", a), `key "held" is held by session "` + b + `", want "` + a + `"`},
		{opLock(CHECK_SESSION, "missing", "", a), `key "missing" does not exist, want it held by session "` + a + `"`},
		{opLock(LOCK, "x", "", sid(9)), `session "` + sid(9) + `" does not exist; create a session first (or it was invalidated)`},
	} {
		res, _ := c.do(txnCmd(tt.op))
		if tx := res.GetTxn(); tx.GetSucceeded() || len(tx.Errors) != 1 || tx.Errors[0].What != tt.want {
			t.Errorf("%v: %v\nwant error %s", tt.op, res, tt.want)
		}
	}
	res, _ = c.do(txnCmd(opLock(CHECK_SESSION, "free", "", ""), opSet("free", "v")))
	if res.GetTxn().GetSucceeded() {
		t.Errorf("CHECK_SESSION on a missing key succeeded")
	}
	c.ok(putCmd("free", "v"))
	if res, _ := c.do(txnCmd(opLock(CHECK_SESSION, "free", "", ""))); !res.GetTxn().GetSucceeded() {
		t.Errorf("CHECK_SESSION with no session on an unheld key failed: %v", res)
	}

	// Lock delay applies to LOCK too.
	c.ok(sessDestroy(b))
	res, _ = c.do(txnCmd(opLock(LOCK, "held", "", a)))
	if tx := res.GetTxn(); tx.GetSucceeded() || tx.Errors[0].What != `key "held" is in its lock delay for another 15s` {
		t.Errorf("LOCK in lock delay: %v", res)
	}
}

func TestSessionTTL(t *testing.T) {
	c := newClock(t)
	c.ok(regNode("n1"), sessCreate(sid(1), "n1", withTTL(10*time.Second)), sessCreate(sid(2), "n1", withTTL(30*time.Second)),
		sessCreate(sid(3), "n1"))
	start := time.Unix(0, t0)
	if next, ok := c.s.NextSessionExpiry(time.Time{}); !ok || !next.Equal(start.Add(20*time.Second)) {
		t.Errorf("NextSessionExpiry = %v %v, want t0+20s (TTL x %d)", next, ok, SessionTTLMultiplier)
	}
	if got := c.s.ExpiredSessions(start.Add(20*time.Second-1), time.Time{}); len(got) != 0 {
		t.Errorf("expired before the deadline: %v", got)
	}
	if got, want := c.s.ExpiredSessions(start.Add(20*time.Second), time.Time{}), []string{sid(1)}; !slices.Equal(got, want) {
		t.Errorf("ExpiredSessions = %v, want %v", got, want)
	}
	// A new leader since t0+15s gives every session a full TTL from then.
	if got := c.s.ExpiredSessions(start.Add(30*time.Second), start.Add(15*time.Second)); len(got) != 0 {
		t.Errorf("expired inside the new leader's grace: %v", got)
	}

	// Renewal records time only: no index, no event.
	idx := c.s.SessionsIndex()
	c.advance(15 * time.Second)
	res, evs := c.do(sessRenew(sid(1)))
	if s := res.GetSessionRenew().GetSession(); s.GetRenewedUnixNano() != c.now || s.ModifyIndex != 2 || len(evs) != 0 || c.s.SessionsIndex() != idx {
		t.Errorf("renew: %v, events %q, SessionsIndex %d->%d", s, evKeys(evs), idx, c.s.SessionsIndex())
	}
	c.now -= int64(time.Second) // a proposer with a slower clock
	if res, _ := c.do(sessRenew(sid(1))); res.GetSessionRenew().GetSession().GetRenewedUnixNano() != c.now+int64(time.Second) {
		t.Errorf("renewal moved the recorded time backwards")
	}
	if res, _ := c.do(sessRenew(sid(7))); res.GetRejected().GetRule() != RejectSessionMissing {
		t.Errorf("renew of an unknown session: %v", res)
	}

	// The leader saw session 1 expired at t0+20s; the renewal committed
	// first wins.
	res, _ = c.do(sessInvalidate("", t0+int64(20*time.Second), sid(1), sid(3)))
	if got := res.GetSessionInvalidate().GetInvalidated(); len(got) != 0 {
		t.Errorf("invalidated %v despite the renewal (and session 3 has no TTL)", got)
	}
	at := t0 + int64(15*time.Second) + int64(20*time.Second)
	if got, want := c.s.ExpiredSessions(time.Unix(0, at), time.Time{}), []string{sid(1)}; !slices.Equal(got, want) {
		t.Errorf("ExpiredSessions after renewal = %v, want %v", got, want)
	}
	res, _ = c.do(sessInvalidate("", at, sid(1)))
	if got, want := res.GetSessionInvalidate().GetInvalidated(), []string{sid(1)}; !slices.Equal(got, want) {
		t.Errorf("invalidated %v, want %v", got, want)
	}
}

func TestCatalogApplyDoesNotRetainCommand(t *testing.T) {
	c := newClock(t)
	c.ok(regNode("n1"), sessCreate(sid(1), "n1"))
	acq := acquireCmd("key", "value", sid(1))
	reg := regSvc("n1", "web-1", "web", "tag")
	reg.GetCatalogRegister().Node.Meta = map[string]string{"k": "v"}
	sess := sessCreate(sid(2), "n1", withChecks())
	c.ok(acq, reg, sess)
	reg.GetCatalogRegister().Service.Tags[0] = "changed"
	reg.GetCatalogRegister().Node.Meta["k"] = "changed"
	sess.GetSessionCreate().Session.Name = "changed"
	ns, _ := c.s.Node("n1")
	if ns.Node.Meta["k"] != "v" || ns.Services[0].Tags[0] != "tag" {
		t.Errorf("stored registration changed with the command: %v", ns)
	}
	if s, _ := c.s.Session(sid(2)); s.Name != "lock" {
		t.Errorf("stored session changed with the command: %v", s)
	}
}
