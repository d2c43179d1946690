package store

import (
	"fmt"
	"math"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Session constants. They are part of the replicated semantics (Apply uses
// DefaultLockDelay and SessionTTLMultiplier), so changing one is a
// protocol change.
const (
	// DefaultLockDelay is a session's lock delay when the create command
	// leaves it unset (Consul's default).
	DefaultLockDelay = 15 * time.Second
	// MaxLockDelay is the largest lock delay ValidateCommand accepts.
	MaxLockDelay = 60 * time.Second
	// SessionTTLMin and SessionTTLMax bound a non-zero TTL
	// (ValidateCommand), as Consul's defaults.
	SessionTTLMin = 10 * time.Second
	SessionTTLMax = 24 * time.Hour
	// SessionTTLMultiplier: a TTL session expires when it has not been
	// renewed for TTL times this (Consul grants the same grace).
	SessionTTLMultiplier = 2
)

// lockDelayOf returns s's lock delay in nanoseconds (never negative).
func lockDelayOf(s *lodestonepb.SessionEntry) int64 {
	if s.LockDelay == nil {
		return int64(DefaultLockDelay)
	}
	return max(0, durationNanos(s.LockDelay.Seconds, s.LockDelay.Nanos))
}

// ttlOf returns s's TTL in nanoseconds, 0 when it has none.
func ttlOf(s *lodestonepb.SessionEntry) int64 {
	if s.Ttl == nil {
		return 0
	}
	return max(0, durationNanos(s.Ttl.Seconds, s.Ttl.Nanos))
}

// durationNanos converts a protobuf Duration to nanoseconds, saturating
// (Apply must not misbehave on an out-of-range duration that validation
// would have refused).
func durationNanos(sec int64, nanos int32) int64 {
	if sec > math.MaxInt64/int64(time.Second) {
		return math.MaxInt64
	}
	if sec < math.MinInt64/int64(time.Second) {
		return math.MinInt64
	}
	return satAdd(sec*int64(time.Second), int64(nanos))
}

// satAdd returns a+b clamped to the int64 range.
func satAdd(a, b int64) int64 {
	s := a + b
	switch {
	case b > 0 && s < a:
		return math.MaxInt64
	case b < 0 && s > a:
		return math.MinInt64
	}
	return s
}

// ttlDeadline returns when s expires (unix nano) if renewed last at
// renewed, or false when it has no TTL.
func ttlDeadline(s *lodestonepb.SessionEntry, renewed int64) (int64, bool) {
	ttl := ttlOf(s)
	if ttl == 0 {
		return 0, false
	}
	grace := ttl
	for i := 1; i < SessionTTLMultiplier; i++ {
		grace = satAdd(grace, ttl)
	}
	return satAdd(renewed, grace), true
}

func (a *applier) sessionCreate(r *lodestonepb.CreateSessionRequest) *lodestonepb.CommandResult {
	if checkSessionCreate(r) != nil {
		return &lodestonepb.CommandResult{}
	}
	resp := &lodestonepb.CreateSessionResponse{}
	res := &lodestonepb.CommandResult{Result: &lodestonepb.CommandResult_SessionCreate{SessionCreate: resp}}
	t := &a.s.tab
	s := proto.CloneOf(r.Session)
	if _, ok := t.nodes.get(s.Node); !ok {
		return a.reject(res, RejectNodeMissing, "node %q is not registered; a session needs a registered node", s.Node)
	}
	if _, ok := t.sessions.get(s.Id); ok {
		return a.reject(res, RejectSessionIDTaken, "session %q already exists; propose a fresh UUID", s.Id)
	}
	for _, c := range sessionCheckIDs(s) {
		ch, ok := t.checks.get(compositeKey(s.Node, c))
		if !ok {
			return a.reject(res, RejectCheckMissing, "check %q is not registered on node %q; a session can only bind registered checks", c, s.Node)
		}
		if ch.Status == lodestonepb.HealthStatus_HEALTH_CRITICAL {
			return a.reject(res, RejectCheckCritical, "check %q on node %q is critical; a session cannot bind a critical check", c, s.Node)
		}
	}
	if s.LockDelay == nil {
		s.LockDelay = durationpb.New(DefaultLockDelay)
	}
	s.CreateIndex, s.ModifyIndex, s.RenewedUnixNano = a.index, a.index, a.now
	a.markSession(s.Id)
	t.sessions.set(s.Id, s)
	a.s.der.bindSession(s)
	resp.Session = s
	return res
}

func (a *applier) sessionDestroy(d *lodestonepb.DestroySessionRequest) *lodestonepb.CommandResult {
	if checkSessionID(d.GetId()) != nil {
		return &lodestonepb.CommandResult{}
	}
	return &lodestonepb.CommandResult{Result: &lodestonepb.CommandResult_SessionDestroy{
		SessionDestroy: &lodestonepb.DestroySessionResponse{Destroyed: a.invalidateSession(d.Id)}}}
}

// sessionRenew records the renewal time. NB: it moves no index and emits
// no event, so frequent renewals wake no blocking query; the session's
// ModifyIndex stays (as in Consul, where a renewal is not a write at all).
func (a *applier) sessionRenew(r *lodestonepb.RenewSessionRequest) *lodestonepb.CommandResult {
	if checkSessionID(r.GetId()) != nil {
		return &lodestonepb.CommandResult{}
	}
	resp := &lodestonepb.RenewSessionResponse{}
	res := &lodestonepb.CommandResult{Result: &lodestonepb.CommandResult_SessionRenew{SessionRenew: resp}}
	cur, ok := a.s.tab.sessions.get(r.Id)
	if !ok {
		return a.reject(res, RejectSessionMissing, "session %q does not exist (it expired, was destroyed, or never existed); create a new one", r.Id)
	}
	if a.now > cur.RenewedUnixNano {
		n := proto.CloneOf(cur)
		n.RenewedUnixNano = a.now
		a.s.tab.sessions.set(n.Id, n)
		cur = n
	}
	resp.Session = cur
	return res
}

func (a *applier) sessionInvalidate(v *lodestonepb.SessionInvalidate) *lodestonepb.CommandResult {
	if checkSessionInvalidate(v) != nil {
		return &lodestonepb.CommandResult{}
	}
	ids := slices.Clone(v.Ids)
	if v.Node != "" {
		ids = append(ids, sortedSet(a.s.der.nodeSessions, v.Node)...)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	resp := &lodestonepb.SessionInvalidateResult{}
	for _, id := range ids {
		s, ok := a.s.tab.sessions.get(id)
		if !ok {
			continue
		}
		if v.TtlExpiredAtUnixNano != 0 {
			if dl, has := ttlDeadline(s, s.RenewedUnixNano); !has || dl > v.TtlExpiredAtUnixNano {
				continue // renewed since the leader looked, or no TTL
			}
		}
		if a.invalidateSession(id) {
			resp.Invalidated = append(resp.Invalidated, id)
		}
	}
	return &lodestonepb.CommandResult{Result: &lodestonepb.CommandResult_SessionInvalidate{SessionInvalidate: resp}}
}

// invalidateSession removes session id and applies its behavior to the
// keys it holds (release: clear Session, LockIndex kept; delete: delete
// the key), starting each key's lock delay at the command's time. It
// reports whether the session existed.
func (a *applier) invalidateSession(id string) bool {
	t := &a.s.tab
	s, ok := t.sessions.get(id)
	if !ok {
		return false
	}
	c := a.catalog()
	if !c.swept {
		c.swept = true
		a.sweepLockDelays()
	}
	delay := lockDelayOf(s)
	until := satAdd(a.now, delay)
	for _, k := range sortedSet(a.s.der.sessionKeys, id) {
		key := []byte(k)
		cur := a.get(key)
		if cur == nil || cur.session() != id {
			continue // NB: cannot happen while sessionKeys is exact
		}
		if delay > 0 {
			if prev, ok := t.lockDelays.get(k); !ok || prev < until {
				t.lockDelays.set(k, until)
			}
		}
		if s.Behavior == lodestonepb.SessionBehavior_SESSION_DELETE {
			a.del(key)
			continue
		}
		r := *cur // NB: the value stays where it is; only the lock goes
		r.lock, r.ModifyIndex = &lockState{index: cur.lockIndex()}, a.index
		a.replace(key, &r, change{})
	}
	a.markSession(id)
	t.sessions.del(id)
	a.s.der.unbindSession(s)
	if a.derUndo != nil {
		*a.derUndo = append(*a.derUndo, func() { a.s.der.bindSession(s) })
	}
	return true
}

// sweepLockDelays forgets lock delays that have ended at the command's
// time. It runs once per command that invalidates a session, so the table
// holds only delays started since the last invalidation or still running.
func (a *applier) sweepLockDelays() {
	var done []string
	a.s.tab.lockDelays.ascend(func(k string, until int64) bool {
		if until <= a.now {
			done = append(done, k)
		}
		return true
	})
	for _, k := range done {
		a.s.tab.lockDelays.del(k)
	}
}

// lockOutcome is why an acquire or release did not take effect.
type lockOutcome int

const (
	lockOK        lockOutcome = iota
	lockNoSession             // acquire: the session does not exist
	lockHeld                  // acquire: another session holds the key
	lockDelayed               // acquire: the key's lock delay is in force
	lockNotHolder             // release: the key is missing or not held by the session
)

// acquire takes key for session (Consul's kvsLockTxn): it writes value and
// flags, sets Session, and increments LockIndex unless the session already
// held the key. It returns the entry without its value: on failure the
// current one (nothing changes), else the new one.
func (a *applier) acquire(key, value []byte, flags uint64, session string) (*lodestonepb.KeyValue, lockOutcome, string) {
	cur := a.get(key)
	if _, ok := a.s.tab.sessions.get(session); !ok {
		return meta(key, cur), lockNoSession, fmt.Sprintf("session %q does not exist; create a session first (or it was invalidated)", session)
	}
	if cur != nil && cur.session() != "" && cur.session() != session {
		return meta(key, cur), lockHeld, fmt.Sprintf("key %q is already locked by session %q", key, cur.session())
	}
	if until, ok := a.s.tab.lockDelays.get(string(key)); ok && a.now < until {
		return meta(key, cur), lockDelayed, fmt.Sprintf("key %q is in its lock delay for another %v", key, time.Duration(until-a.now))
	}
	r := &row{Flags: flags, ModifyIndex: a.index}
	switch {
	case cur == nil:
		r.CreateIndex, r.lock = a.index, &lockState{index: 1, session: session}
	case cur.session() == session:
		r.CreateIndex, r.lock = cur.CreateIndex, cur.lock
	default:
		r.CreateIndex, r.lock = cur.CreateIndex, &lockState{index: cur.lockIndex() + 1, session: session}
	}
	a.write(key, r, value)
	return meta(key, r), lockOK, ""
}

// release gives key up for session (Consul's kvsUnlockTxn): if session
// holds it, it writes value and flags and clears Session; LockIndex stays.
func (a *applier) release(key, value []byte, flags uint64, session string) (*lodestonepb.KeyValue, lockOutcome, string) {
	cur := a.get(key)
	switch {
	case cur == nil:
		return nil, lockNotHolder, fmt.Sprintf("key %q does not exist, so session %q cannot release it", key, session)
	case cur.session() != session:
		return meta(key, cur), lockNotHolder, fmt.Sprintf("key %q is not locked by session %q (held by %q)", key, session, cur.session())
	}
	r := &row{Flags: flags, CreateIndex: cur.CreateIndex, ModifyIndex: a.index, lock: &lockState{index: cur.lockIndex()}}
	a.write(key, r, value)
	return meta(key, r), lockOK, ""
}

// lockPut runs a put with acquire or release.
func (a *applier) lockPut(p *lodestonepb.PutRequest) *lodestonepb.CommandResult {
	var (
		kv      *lodestonepb.KeyValue
		outcome lockOutcome
		why     string
	)
	if p.Acquire {
		kv, outcome, why = a.acquire(p.Key, p.Value, p.Flags, p.Session)
	} else {
		kv, outcome, why = a.release(p.Key, p.Value, p.Flags, p.Session)
	}
	res := &lodestonepb.CommandResult{Result: &lodestonepb.CommandResult_Put{Put: &lodestonepb.PutResponse{Kv: kv}}}
	switch outcome {
	case lockOK:
	case lockNoSession:
		return a.reject(res, RejectSessionMissing, "%s", why)
	default:
		res.LockFailed = true
	}
	return res
}
