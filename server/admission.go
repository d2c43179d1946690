package server

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/store"
)

// Admission control lets thousands of reconnecting clients back in
// gradually (the return to service in Roblox's public post-mortem of its
// October 2021 outage did this by hand with iptables and DNS steering).
// An operator sets a policy — requests per second per server for reads,
// writes and new watch streams, optionally ramping up by a percentage each
// minute — with `lodestone admission set`. The policy is a Raft command of
// its own, so every server enforces the same one; the store keeps it as
// replicated state beside the KV data (no client can overwrite it), so
// snapshots and restarts keep it.
//
// Over the limit a request is refused at once, before any work: gRPC
// RESOURCE_EXHAUSTED with a RetryInfo, HTTP 429 with Retry-After. The
// Admin, Cluster and Peer services, /metrics, /healthz, /readyz and
// /debug/ are never gated, so operators can always see and steer.
//
// A restarted server holds gated requests until it has applied what its
// log held committed when it started (replay). Until then its store may
// lack the policy in force (set after the snapshot it restored), and with
// no policy every request of the reconnecting fleet got in at once: the
// storm the ramp is for.
//
// New client gRPC connections are paced, not refused (acceptWait): when
// every server restarts at once, each of thousands of clients opens a
// connection in the same second, and their setup (TLS where used, then
// HTTP/2) took more than the servers' shared CPU for most of a second,
// delaying the commits that let the cluster serve again. A refused
// connection would come straight back; a paced one waits in the listen
// backlog, costing nothing until its turn. The HTTP listener is not paced:
// /metrics and the health endpoints share it.
//
// Both setup rates are ceilings: while the server is short of CPU, the
// load gate (loadgate.go) holds connections and watch creates the policy
// gates, whatever their rates would allow.

// Request classes.
const (
	classRead = iota
	classWrite
	classWatch
	numClasses
)

var classNames = [numClasses]string{"read", "write", "watch"}

// admissionRefresh bounds how stale a server's view of the policy is
// (it re-reads the store at most this often).
const admissionRefresh = 100 * time.Millisecond

type admission struct {
	store *store.Store
	now   func() time.Time
	// started is when this server started: a ramp restarts from it, so a
	// policy set before an outage ramps every restarted server up again.
	started time.Time

	cached atomic.Pointer[cachedPolicy]

	mu      sync.Mutex
	buckets [numClasses]bucket
	conns   bucket // new client gRPC connections (acceptWait)
	// load holds gated connections and watch creates while the server is
	// short of CPU (loadgate.go).
	load *loadGate

	// maxHint is the longest retry hint a refusal carries.
	maxHint time.Duration
	// setupBurst is how much of their rate the buckets of new connections
	// and watch creates hold (burstFor).
	setupBurst time.Duration

	// replayed closes once the server has applied what its log held
	// committed when it started (replay); replayDone is set just before, so
	// that requests after it read a flag instead of taking the closed
	// channel's lock.
	replayed   chan struct{}
	replayDone atomic.Bool
	replaying  prometheus.GaugeFunc

	rejected      *prometheus.CounterVec
	capped        *prometheus.CounterVec
	limit         *prometheus.GaugeVec
	acceptWaits   prometheus.Counter // accepts the connection rate delayed
	acceptWaitFor prometheus.Counter // seconds they waited, summed
}

type cachedPolicy struct {
	p     *lodestonepb.AdmissionPolicy // nil: none
	at    time.Time
	index uint64 // the store's admission index it was read at
}

// bucket is a token bucket refilled at the class's current rate, holding
// at most one second of it, or Config.AdmissionSetupBurst of it for the
// classes whose every admission sets something up (burstFor).
//
// booked is when the last refused request was told to come back: each
// refusal books the next free slot after it, one per token, so a burst
// of refused clients returns spread at the admitted rate rather than all
// at the next token (which refuses nearly all of them again, each time:
// a retry storm the servers pay for while they should be committing).
type bucket struct {
	tokens float64
	last   time.Time
	booked time.Time
}

// minRetryHint is the shortest retry hint a refusal carries. The longest
// is Config.AdmissionMaxRetryHint: a client told to wait longer than the
// ramp takes to grow is kept away for nothing, and the bound keeps a
// burst of refusals from booking slots far ahead.
const minRetryHint = 50 * time.Millisecond

// newAdmission gates requests by the replicated policy; a refusal's
// retry hint is at most maxHint, the buckets of new connections and
// watch creates hold setupBurst of their rate, and both are held while
// the server's scheduling latency p99 is over maxSchedDelay (0: never).
func newAdmission(st *store.Store, reg prometheus.Registerer, maxHint, setupBurst, maxSchedDelay time.Duration) *admission {
	a := &admission{
		store: st, now: time.Now, started: time.Now(), maxHint: max(maxHint, minRetryHint), setupBurst: setupBurst,
		load:     newLoadGate(maxSchedDelay, reg),
		replayed: make(chan struct{}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "admission_rejected_total",
			Help: "Client requests refused by admission control, by class (read, write, watch).",
		}, []string{"class"}),
		capped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "admission_retry_hints_capped_total",
			Help: "Refusals whose retry hint was cut to --admission-max-retry-hint (their booked slot lay further ahead), by class.",
		}, []string{"class"}),
		limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "lodestone", Name: "admission_limit_per_second",
			Help: "Requests (class connection: new client gRPC connections) per second this server admits now, by class, ramp applied; 0 when the class is not gated.",
		}, []string{"class"}),
		acceptWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "admission_accept_waits_total",
			Help: "Accepts of client gRPC connections the admission policy's connection rate delayed (new connections wait in the listen backlog meanwhile).",
		}),
		acceptWaitFor: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "admission_accept_wait_seconds_total",
			Help: "Time the client gRPC listener spent waiting for the admission policy's connection rate.",
		}),
	}
	for _, c := range classNames {
		a.rejected.WithLabelValues(c)
		a.capped.WithLabelValues(c)
		a.limit.WithLabelValues(c)
	}
	a.limit.WithLabelValues(connectionClass)
	a.replaying = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "lodestone", Name: "admission_replaying",
		Help: "1 while this server, just started, applies what its log held committed; gated requests wait meanwhile.",
	}, func() float64 {
		if a.replayDone.Load() {
			return 0
		}
		return 1
	})
	reg.MustRegister(a.rejected, a.capped, a.limit, a.acceptWaits, a.acceptWaitFor, a.replaying)
	return a
}

// replayLog is what replay needs of the Raft node.
type replayLog interface {
	CommittedAtStart() uint64
	WaitApplied(ctx context.Context, index uint64) error
}

// replay lets gated requests in once r has applied what its log held
// committed at start; it returns early, leaving them held, if ctx ends or
// the node stops.
func (a *admission) replay(ctx context.Context, r replayLog) {
	if err := r.WaitApplied(ctx, r.CommittedAtStart()); err != nil {
		return
	}
	a.replayDone.Store(true)
	close(a.replayed)
}

// waitReplay waits until replay is done (true) or done closes (false).
func (a *admission) waitReplay(done <-chan struct{}) bool {
	if a.replayDone.Load() {
		return true
	}
	select {
	case <-a.replayed:
		return true
	case <-done:
		return false
	}
}

// connectionClass labels the connection rate in admission_limit_per_second.
const connectionClass = "connection"

// policy returns the policy in force (nil: none), re-reading the store at
// most every admissionRefresh.
func (a *admission) policy(now time.Time) *lodestonepb.AdmissionPolicy {
	p, index := a.store.Admission()
	if c := a.cached.Load(); c != nil && c.index == index && now.Sub(c.at) < admissionRefresh {
		return c.p
	}
	if !p.GetEnabled() {
		p = nil
	}
	a.cached.Store(&cachedPolicy{p: p, at: now, index: index})
	for c := range numClasses {
		a.limit.WithLabelValues(classNames[c]).Set(a.classRate(p, c, now))
	}
	a.limit.WithLabelValues(connectionClass).Set(a.rampedRate(p, p.GetConnections(), now))
	return p
}

// rampFraction is the share of the limits in force at now: ramp percent
// at the start, plus ramp percent per minute since, up to 1. The start is
// when the policy was set or when this server started, whichever is later.
func rampFraction(p *lodestonepb.AdmissionPolicy, started, now time.Time) float64 {
	if p.GetRampPercentPerMin() <= 0 {
		return 1
	}
	from := time.Unix(0, p.GetSetUnixNano())
	if started.After(from) {
		from = started
	}
	mins := max(now.Sub(from).Minutes(), 0)
	return math.Min(p.GetRampPercentPerMin()*(1+mins)/100, 1)
}

// classRate is the admitted rate of class c now; 0 means not gated.
func (a *admission) classRate(p *lodestonepb.AdmissionPolicy, c int, now time.Time) float64 {
	return a.rampedRate(p, [numClasses]uint64{p.GetReads(), p.GetWrites(), p.GetWatches()}[c], now)
}

// rampedRate is limit with p's ramp applied now; 0 means not gated (a
// nil p reads every limit as 0).
func (a *admission) rampedRate(p *lodestonepb.AdmissionPolicy, limit uint64, now time.Time) float64 {
	if limit == 0 {
		return 0
	}
	return math.Max(float64(limit)*rampFraction(p, a.started, now), 1)
}

// admit takes cost tokens for class c, or says how long until one is due.
func (a *admission) admit(c, cost int) (bool, time.Duration) {
	now := a.now()
	rate := a.classRate(a.policy(now), c, now)
	if rate == 0 {
		return true, 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	b := &a.buckets[c]
	held := c == classWatch && a.load.hold(now, setupWatch)
	if !held && b.take(now, rate, a.burstFor(rate, c == classWatch), cost) {
		return true, 0
	}
	if held {
		a.load.holds.WithLabelValues(setupNames[setupWatch]).Inc()
	}
	a.rejected.WithLabelValues(classNames[c]).Inc()
	wait, capped := b.book(now, rate, a.maxHint)
	if capped {
		a.capped.WithLabelValues(classNames[c]).Inc()
	}
	return false, wait
}

// burstFor is the most tokens a bucket refilled at rate holds: a second's
// worth, or a.setupBurst's for the buckets of new connections and watch
// creates (never less than one token). NB: a second's worth at the start
// of the reconnect ramp let a server take a few hundred connections (or
// dozens of watch replays) at once, and their setup queued the Raft
// loop's goroutine behind it: the storm's first commits waited for it.
func (a *admission) burstFor(rate float64, setup bool) float64 {
	if !setup {
		return rate
	}
	return max(rate*a.setupBurst.Seconds(), 1)
}

// take refills b at rate up to now, holding at most burst tokens, and
// takes cost tokens if one is there. NB: the bucket may go into debt, so a
// request that costs more than a burst (a GetMany of many keys) is still
// admitted once, and the ones after it wait the debt out: the class's
// rate holds over time.
func (b *bucket) take(now time.Time, rate, burst float64, cost int) bool {
	if b.last.IsZero() {
		b.tokens = burst
	} else {
		b.tokens = math.Min(burst, b.tokens+now.Sub(b.last).Seconds()*rate)
	}
	b.last = now
	if b.tokens >= 1 {
		b.tokens -= float64(cost)
		return true
	}
	return false
}

// book gives a refused request the next free slot: the next token if
// nobody waits for it, else one token after the last one booked, within
// [minRetryHint, maxHint] from now. It returns the wait and whether
// maxHint cut it short.
func (b *bucket) book(now time.Time, rate float64, maxHint time.Duration) (time.Duration, bool) {
	perToken := time.Duration(float64(time.Second) / rate)
	slot := now.Add(time.Duration((1 - b.tokens) / rate * float64(time.Second)))
	if next := b.booked.Add(perToken); next.After(slot) {
		slot = next
	}
	wait := max(slot.Sub(now), minRetryHint)
	capped := wait > maxHint
	wait = min(wait, maxHint)
	b.booked = now.Add(wait)
	return wait, capped
}

// check refuses a request of class c and cost tokens over the limit with
// RESOURCE_EXHAUSTED and a RetryInfo.
func (a *admission) check(c, cost int) error {
	ok, wait := a.admit(c, cost)
	if ok {
		return nil
	}
	st := status.New(codes.ResourceExhausted, fmt.Sprintf("admission control: this server admits no more %ss right now; retry after %v", classNames[c], wait.Round(time.Millisecond)))
	if withHint, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}); err == nil {
		st = withHint
	}
	return st.Err()
}

// grpcClass maps a full gRPC method name to its class; -1: never gated.
func grpcClass(method string) int {
	svc, name, _ := strings.Cut(strings.TrimPrefix(method, "/lodestone.v1."), "/")
	switch svc {
	case "KV":
		switch name {
		case "Get", "GetMany", "GetStream", "Range":
			return classRead
		}
		return classWrite
	case "Watch":
		return classWatch
	case "Catalog":
		switch name {
		case "Register", "Deregister", "UpdateCheck":
			return classWrite
		}
		return classRead
	case "Session":
		switch name {
		case "Create", "Destroy", "Renew":
			return classWrite
		}
		return classRead
	}
	return -1 // Cluster, Admin, Peer, health: never gated
}

func (a *admission) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if c := grpcClass(info.FullMethod); c >= 0 {
		if err := a.checkRPC(ctx, c, rpcCost(req)); err != nil {
			return nil, err
		}
	}
	return handler(ctx, req)
}

func (a *admission) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	c := grpcClass(info.FullMethod)
	switch {
	case c < 0:
	case info.FullMethod == lodestonepb.KV_GetStream_FullMethodName:
		return handler(srv, &admittedStream{ServerStream: ss, a: a, class: c})
	default:
		if err := a.checkRPC(ss.Context(), c, 1); err != nil {
			return err
		}
	}
	return handler(srv, ss)
}

// admittedStream admits each request of a GetStream as the unary path
// admits a GetMany: rpcCost tokens of its class. Opening the stream costs
// nothing; a refused request ends it with RESOURCE_EXHAUSTED and its
// RetryInfo, as a refused GetMany.
type admittedStream struct {
	grpc.ServerStream
	a     *admission
	class int
}

func (s *admittedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if err := s.a.checkRPC(s.Context(), s.class, rpcCost(m)); err != nil {
		return streamRefusal{err}
	}
	return nil
}

// checkRPC is check after waitReplay.
func (a *admission) checkRPC(ctx context.Context, c, cost int) error {
	if !a.waitReplay(ctx.Done()) {
		return status.FromContextError(ctx.Err()).Err()
	}
	return a.check(c, cost)
}

// rpcCost is the tokens a unary request takes: a GetMany is a Get for
// each key, so coalescing does not let a client past the read rate.
func rpcCost(req any) int {
	if r, ok := req.(*lodestonepb.GetManyRequest); ok {
		return max(len(r.Keys), 1)
	}
	return 1
}

// httpClass maps a Consul-API request to its class; -1: never gated.
func httpClass(r *http.Request) int {
	p := r.URL.Path
	switch {
	case strings.HasPrefix(p, "/v1/kv/"), strings.HasPrefix(p, "/v1/catalog/"), strings.HasPrefix(p, "/v1/health/"),
		strings.HasPrefix(p, "/v1/session/"), p == "/v1/txn":
	default:
		return -1 // /metrics, /healthz, /readyz, /debug/, /ui, /v1/status, /v1/agent
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return classWrite
	}
	if consulapi.Query(r.URL).Has("index") {
		return classWatch // a blocking query
	}
	return classRead
}

// admitHTTP gates the Consul-compatible API: 429 with Retry-After.
func (a *admission) http(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c := httpClass(r); c >= 0 {
			if !a.waitReplay(r.Context().Done()) {
				http.Error(w, "server starting: "+r.Context().Err().Error(), http.StatusServiceUnavailable)
				return
			}
			if ok, wait := a.admit(c, 1); !ok {
				secs := int(math.Ceil(wait.Seconds()))
				w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
				w.Header().Set("X-Lodestone-Retry-After-Ms", strconv.FormatInt(wait.Milliseconds(), 10))
				http.Error(w, "admission control: too many "+classNames[c]+"s; retry after "+wait.Round(time.Millisecond).String(), http.StatusTooManyRequests)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// acceptWait is how long the client gRPC listener must wait before it
// accepts the next connection to keep to the policy's connection rate,
// or while the server is short of CPU (loaded: loadGate held it): 0
// takes a token (or the rate is not gated); otherwise wait that long and
// ask again.
func (a *admission) acceptWait() (wait time.Duration, loaded bool) {
	now := a.now()
	p := a.policy(now)
	rate := a.rampedRate(p, p.GetConnections(), now)
	if rate == 0 {
		return 0, false
	}
	if a.load.hold(now, setupConn) {
		return loadWindow, true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.conns.take(now, rate, a.burstFor(rate, true), 1) {
		return 0, false
	}
	// NB: at least 1ns: a bucket a rounding error short of a token read
	// as 0, which paceAccept took for a token.
	return max(time.Duration(math.Ceil((1-a.conns.tokens)/rate*float64(time.Second))), 1), false
}

// paceAccept waits until the policy's connection rate lets the listener
// accept one more connection; false if done closed first. The connections
// waiting meanwhile sit in the kernel's listen backlog.
//
// NB: it does not wait for replay. Accepts held until then went on all at
// once when it ended, with no policy to pace them: the connection setup
// that overlapped the election before moved onto the first commits.
func (a *admission) paceAccept(done <-chan struct{}) bool {
	var waited time.Duration
	var held bool // by the load gate, at least once
	defer func() {
		if waited > 0 {
			a.acceptWaits.Inc()
			a.acceptWaitFor.Add(waited.Seconds())
		}
		if held {
			a.load.holds.WithLabelValues(setupNames[setupConn]).Inc()
		}
	}()
	for {
		d, loaded := a.acceptWait()
		held = held || loaded
		if d <= 0 {
			return true
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
			waited += d
		case <-done:
			t.Stop()
			return false
		}
	}
}
