package workload

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/chaos/check"
	"github.com/lodestone-kv/lodestone/chaos/history"
	"github.com/lodestone-kv/lodestone/client"
)

// LockNode is the catalog node the lock workload's sessions are bound to
// (a session needs a registered node; store/doc.go "Sessions and locks").
const LockNode = "chaos-lock"

// Lock is the lock workload: each worker holds a session (TTL, renewed
// while in use, behavior release, a short lock delay) and repeatedly
// acquires one of a few lock keys with a put with acquire, holds it for a
// random short time and gives it up: mostly by release, sometimes by
// destroying its session, and sometimes by abandoning the session so the
// leader expires it (an invalidation at an index nobody sees). Workers
// also read the lock keys. The recorded fields follow check/lock.go.
type Lock struct {
	Workers int
	// ActiveKeys is how many lock keys are in use at once; a key is
	// retired after MaxOpsPerKey operations or MaxInfoPerKey unknown
	// outcomes (porcupine's search grows with unknown outcomes per key).
	ActiveKeys    int
	MaxOpsPerKey  int
	MaxInfoPerKey int
	// TTL of each session (the server's minimum is 10s; it expires after
	// twice that without renewal). Default 10s.
	TTL time.Duration
	// LockDelay of each session. Default 1s.
	LockDelay time.Duration
	// MaxHold bounds how long a worker holds a lock. Default 500ms.
	MaxHold time.Duration

	keys lockKeys
}

func (l *Lock) Name() string { return check.LockWorkload }

func (l *Lock) ttl() time.Duration {
	if l.TTL <= 0 {
		return 10 * time.Second
	}
	return l.TTL
}

func (l *Lock) lockDelay() time.Duration {
	if l.LockDelay <= 0 {
		return time.Second
	}
	return l.LockDelay
}

func (l *Lock) maxHold() time.Duration {
	if l.MaxHold <= 0 {
		return 500 * time.Millisecond
	}
	return l.MaxHold
}

// Run registers LockNode, then runs the workers until ctx ends.
func (l *Lock) Run(ctx context.Context, env *Env) error {
	l.keys = lockKeys{newKeyPool(max(l.ActiveKeys, 1), max(l.MaxOpsPerKey, 10), max(l.MaxInfoPerKey, 1))}
	if err := registerLockNode(ctx, env); err != nil {
		return err
	}
	runWorkers(ctx, max(l.Workers, 1), func(ctx context.Context, w int) {
		lw := &lockWorker{l: l, env: env, rng: env.rng(4000 + w), proc: env.NewProc()}
		lw.run(ctx)
	})
	return nil
}

// registerLockNode upserts LockNode, retrying on random nodes until it
// worked or ctx ended (the cluster may still be electing).
func registerLockNode(ctx context.Context, env *Env) error {
	rng := env.rng(3999)
	var err error
	for attempt := 0; attempt < 100 && ctx.Err() == nil; attempt++ {
		n := env.pick(rng)
		cctx, cancel := context.WithTimeout(ctx, env.opTimeout())
		_, err = lodestonepb.NewCatalogClient(n.Conn).Register(cctx, &lodestonepb.CatalogRegisterRequest{
			Node: &lodestonepb.Node{Name: LockNode, Address: "10.77.0.1"},
		})
		cancel()
		if err == nil {
			return nil
		}
		env.think(ctx)
	}
	if err == nil {
		err = ctx.Err()
	}
	return fmt.Errorf("register catalog node %s: %w", LockNode, err)
}

// Final reads every lock key the workload used, linearizably.
func (l *Lock) Final(ctx context.Context, env *Env) error {
	if l.keys.pool == nil {
		return nil
	}
	lw := &lockWorker{l: l, env: env, rng: env.rng(4999), proc: env.NewProc()}
	for _, k := range l.keys.all() {
		var last history.Op
		for attempt := 0; attempt < 10 && ctx.Err() == nil; attempt++ {
			if last = lw.read(ctx, k, true); last.Type == history.OK {
				break
			}
		}
		if last.Type != history.OK {
			return fmt.Errorf("final read of %s: %s", k, last.Err)
		}
	}
	return nil
}

// lockWorker is one client: its session and its process id. Only its own
// goroutine uses it.
type lockWorker struct {
	l       *Lock
	env     *Env
	rng     *rand.Rand
	proc    int
	session string
	renewed time.Time // last acknowledged create or renewal
}

func (w *lockWorker) run(ctx context.Context) {
	for i := 0; i < maxOpsPerWorker && ctx.Err() == nil; i++ {
		w.step(ctx)
		w.env.think(ctx)
	}
}

// step is one round: get a session if there is none, keep it renewed,
// then read or try a lock.
func (w *lockWorker) step(ctx context.Context) {
	if w.session == "" {
		w.create(ctx)
		return
	}
	if !w.keepAlive(ctx) {
		return
	}
	key := w.l.keys.pick(w.rng)
	if w.rng.IntN(5) == 0 {
		w.read(ctx, key, false)
		return
	}
	acq, err := w.lockOp(ctx, check.LockAcquire, key)
	w.l.keys.done(key, acq.Type == history.Info)
	switch {
	case acq.Type == history.Info:
		// We may or may not hold it: a release settles that.
		if rel, _ := w.lockOp(ctx, check.LockRelease, key); rel.Type != history.OK && !rel.Mismatch {
			w.session = "" // give up on a session in doubt; the TTL ends it
		}
	case acq.Type == history.OK:
		w.hold(ctx, key)
	case acq.Mismatch:
		// Held by another (or in its lock delay): wait a while, as a
		// lock waiter would, rather than fill the log with refusals.
		w.pause(ctx)
	case status.Code(err) == codes.FailedPrecondition:
		// Refused before it could say who holds the key: perhaps the
		// session is gone (TTL expiry during a fault).
		w.checkSession(ctx)
	}
}

// hold keeps key for a random time, then gives it up: release (most
// often), destroy the session (an invalidation at a known index), or
// abandon the session so that the leader expires it.
func (w *lockWorker) hold(ctx context.Context, key string) {
	w.pause(ctx)
	switch x := w.rng.IntN(100); {
	case x < 3:
		w.session = "" // abandoned, still holding key
	case x < 12:
		w.destroy(ctx)
	default:
		if !w.keepAlive(ctx) {
			return
		}
		if rel, _ := w.lockOp(ctx, check.LockRelease, key); rel.Type == history.Info {
			w.session = ""
		}
	}
}

// pause waits a random time up to MaxHold, or until ctx ends.
func (w *lockWorker) pause(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Duration(w.rng.Int64N(int64(w.l.maxHold()) + 1))):
	}
}

// keepAlive renews the session once a quarter of its TTL has passed since
// the last acknowledged renewal; it reports whether the session is still
// usable.
func (w *lockWorker) keepAlive(ctx context.Context) bool {
	if time.Since(w.renewed) < w.l.ttl()/4 {
		return true
	}
	op := history.Op{F: check.SessionRenew, Value: w.session}
	start := time.Now()
	err := w.do(ctx, &op, true, func(ctx context.Context, conn *grpc.ClientConn) error {
		resp, err := lodestonepb.NewSessionClient(conn).Renew(ctx, &lodestonepb.RenewSessionRequest{Id: w.session})
		if err == nil {
			op.Index = resp.GetHeader().GetIndex()
			w.renewed = start
		}
		return err
	})
	if status.Code(err) == codes.FailedPrecondition {
		w.checkSession(ctx)
	}
	return w.session != ""
}

// create opens a new session bound to LockNode.
func (w *lockWorker) create(ctx context.Context) {
	op := history.Op{F: check.SessionCreate}
	start := time.Now()
	w.do(ctx, &op, true, func(ctx context.Context, conn *grpc.ClientConn) error {
		resp, err := lodestonepb.NewSessionClient(conn).Create(ctx, &lodestonepb.CreateSessionRequest{Session: &lodestonepb.SessionEntry{
			Name: fmt.Sprintf("chaos-p%d", w.proc), Node: LockNode, Behavior: lodestonepb.SessionBehavior_SESSION_RELEASE,
			Ttl: durationpb.New(w.l.ttl()), LockDelay: durationpb.New(w.l.lockDelay()),
		}})
		if err == nil {
			op.Value, op.Index = resp.GetSession().GetId(), resp.GetHeader().GetIndex()
			w.session, w.renewed = op.Value, start
		}
		return err
	})
}

// destroy ends the session, releasing what it holds (with lock delay).
func (w *lockWorker) destroy(ctx context.Context) {
	op := history.Op{F: check.SessionDestroy, Value: w.session}
	w.do(ctx, &op, true, func(ctx context.Context, conn *grpc.ClientConn) error {
		resp, err := lodestonepb.NewSessionClient(conn).Destroy(ctx, &lodestonepb.DestroySessionRequest{Id: w.session})
		if err == nil {
			op.Index, op.Found = resp.GetHeader().GetIndex(), resp.GetDestroyed()
		}
		return err
	})
	// Destroyed, gone already, or in doubt: a fresh session either way
	// (one in doubt expires by TTL).
	if op.Type != history.Fail {
		w.session = ""
	}
}

// lockOp performs and records a put with acquire or release on key for
// the worker's session. The response's entry says whether it took effect:
// it was written by this command (ModifyIndex = the command's index) and
// its Session is ours (acquire) or empty (release); otherwise it is the
// entry as it stood when the server applied and refused the command.
func (w *lockWorker) lockOp(ctx context.Context, f, key string) (history.Op, error) {
	op := history.Op{F: f, Key: key, Value: w.session}
	req := &lodestonepb.PutRequest{Key: []byte(key), Session: w.session}
	want := ""
	if f == check.LockAcquire {
		req.Acquire, req.Value, want = true, []byte(w.session), w.session
	} else {
		req.Release = true
	}
	err := w.do(ctx, &op, true, func(ctx context.Context, conn *grpc.ClientConn) error {
		resp, err := lodestonepb.NewKVClient(conn).Put(ctx, req)
		if err != nil {
			return err
		}
		kv := resp.GetKv()
		op.Index, op.Prev, op.PrevIndex = resp.GetHeader().GetIndex(), kv.GetSession(), kv.GetLockIndex()
		op.Mismatch = kv == nil || kv.GetModifyIndex() != op.Index || kv.GetSession() != want
		return nil
	})
	return op, err
}

// read performs and records a Get of a lock key: its holder and LockIndex
// at the applied index the server read at.
func (w *lockWorker) read(ctx context.Context, key string, final bool) history.Op {
	op := history.Op{F: history.Read, Key: key, Final: final}
	w.do(ctx, &op, false, func(ctx context.Context, conn *grpc.ClientConn) error {
		resp, err := lodestonepb.NewKVClient(conn).Get(ctx, &lodestonepb.GetRequest{Key: []byte(key), Consistency: w.env.consistency()})
		if err == nil {
			kv := resp.GetKv()
			op.Index, op.Found, op.Prev, op.PrevIndex = resp.GetHeader().GetIndex(), kv != nil, kv.GetSession(), kv.GetLockIndex()
		}
		return err
	})
	return op
}

// checkSession asks, linearizably, whether the worker's session still
// exists, and drops it if the server says it does not. The lookup is
// recorded but not checked (its header index is the sessions table's,
// not a point in the log).
func (w *lockWorker) checkSession(ctx context.Context) {
	op := history.Op{F: check.SessionLookup, Value: w.session}
	w.do(ctx, &op, false, func(ctx context.Context, conn *grpc.ClientConn) error {
		resp, err := lodestonepb.NewSessionClient(conn).Info(ctx, &lodestonepb.SessionInfoRequest{Id: w.session})
		op.Found = err == nil && resp.GetSession() != nil
		return err
	})
	if op.Type == history.OK && !op.Found {
		w.session = ""
	}
}

// do performs one recorded operation on a random node: call runs the RPC
// with the operation timeout and fills op from the response. A write's
// outcome follows classifyWrite, except that one answered without effect
// (call set op.Mismatch) fails; a read is ok or fails. A process whose
// operation ended info is retired.
func (w *lockWorker) do(ctx context.Context, op *history.Op, write bool, call func(ctx context.Context, conn *grpc.ClientConn) error) error {
	n := w.env.pick(w.rng)
	op.Proc, op.Workload, op.Node = w.proc, check.LockWorkload, n.Name()
	w.env.H.Invoke(op)
	tctx, tr := client.WithRPCTrace(ctx)
	cctx, cancel := context.WithTimeout(tctx, w.env.opTimeout())
	err := call(cctx, n.Conn)
	cancel()
	op.Err = errText(err)
	switch {
	case !write && err != nil:
		op.Type = history.Fail
	case !write:
		op.Type = history.OK
	case err == nil && op.Mismatch:
		op.Type = history.Fail
	default:
		op.Type, _ = classifyWrite(err, tr)
	}
	w.env.H.Complete(*op)
	if op.Type == history.Info {
		w.proc = w.env.NewProc()
	}
	return err
}

// lockKeys is the register workload's key pool under the lock prefix: it
// retires a key after too many operations or unknown outcomes.
type lockKeys struct{ pool *keyPool }

func lockKey(poolKey string) string {
	return check.LockPrefix + strings.TrimPrefix(poolKey, check.RegisterPrefix)
}

func poolKey(lockKey string) string {
	return check.RegisterPrefix + strings.TrimPrefix(lockKey, check.LockPrefix)
}

func (k lockKeys) pick(r *rand.Rand) string   { return lockKey(k.pool.pick(r)) }
func (k lockKeys) done(key string, info bool) { k.pool.done(poolKey(key), info) }

func (k lockKeys) all() []string {
	var out []string
	for _, pk := range k.pool.all() {
		out = append(out, lockKey(pk))
	}
	return out
}
