// Package consulapi serves the subset of Consul's HTTP API that Lodestone
// replaces (KV with locks, transactions, catalog, health, the agent
// endpoints, sessions, status), so that Consul's own clients work
// unchanged against a Lodestone server. The server acts as the agent of
// one catalog node (Backend.Agent): /v1/agent/* registers there, through
// the server's local agent, which runs the checks (agent.go, package
// localagent), and sessions created without a node belong to it.
//
// It knows nothing of Raft: it reads the store, waits on the watch hub and
// writes through a Backend, which the server implements. Status codes,
// headers (X-Consul-Index, X-Consul-KnownLeader, X-Consul-LastContact) and
// bodies follow Consul's, because clients branch on them.
//
// Blocking queries: a request with ?index=N waits until the data it reads
// changes after N or ?wait (default and cap 5m, plus up to 1/16 jitter)
// elapses, then answers with the data's current index. The wait is a hub
// watcher on exactly the keys read (Dep, Block), so unrelated writes never
// wake it; catalog events that touch what it reads but not its index
// (Consul's X-Consul-Index rules) put it back to sleep.
package consulapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/token"
	"github.com/lodestone-kv/lodestone/server/httppark"
	"github.com/lodestone-kv/lodestone/server/localagent"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// Backend is what the API needs from the node it runs on.
type Backend interface {
	// Apply stamps cmd with the node's clock (and a new session with a
	// fresh id), validates and replicates it, and returns its result once
	// applied on this node, with the entry's index. Errors are gRPC status
	// errors (InvalidArgument, Unavailable, ...) or, for a command the
	// state refused, a *store.RejectedError; a failed CAS or lock is a
	// result, not an error.
	Apply(ctx context.Context, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, uint64, error)
	// Barrier makes the reads that follow linearizable (?consistent).
	Barrier(ctx context.Context) error
	// LeaderBarrier makes the reads that follow as fresh as Consul's
	// default mode: on the leader, everything it has committed, with no
	// quorum round per read (stale only on a leader cut off from the
	// quorum that has not yet stepped down); on a follower, everything
	// the leader had committed at some moment after began, also with no
	// round. began is when the read began: a read reflects every write
	// acknowledged before it, and none later is owed.
	LeaderBarrier(ctx context.Context, began time.Time) error
	// Store is the state machine, read-only.
	Store() *store.Store
	// Hub is the watch hub fed by the apply loop.
	Hub() *watch.Hub
	// Leader returns the leader's peer address, whether one is known, and
	// how long ago this node last heard from it (0 on the leader).
	Leader() (addr string, known bool, lastContact time.Duration)
	// Peers returns the voters' peer addresses.
	Peers() []string
	// Limits are the node's request limits, and BodyLimits its body
	// sizes; both are asked per request, so they may change while serving.
	Limits() store.Limits
	BodyLimits() BodyLimits
	// Agent names the catalog node this server is the agent of (for
	// /v1/agent/* and sessions created without a node) and its address.
	Agent() (node, address string)
	// LocalAgent keeps and runs what /v1/agent/* registers (agent.go).
	LocalAgent() *localagent.Agent
	// Membership is this server in the gossip pool and the cluster.
	Membership() Membership
	// Authorize resolves a token's secret ("" is the anonymous token):
	// an error is acl.ErrNotFound, after catching up with the leader
	// (acl.Recheck); with ACLs off every secret resolves to an Authorizer
	// that allows everything.
	Authorize(ctx context.Context, secret string) (*acl.Authorizer, error)
}

// Config tunes the API.
type Config struct {
	// MaxWait caps ?wait and is its default. Zero means 5m (Consul's).
	MaxWait time.Duration
	// Logger receives request errors; nil discards.
	Logger *slog.Logger
	// InFlight, if set, counts blocking queries waiting right now.
	InFlight prometheus.Gauge
	// Park, if set, holds blocking queries while they wait instead of
	// their goroutines (package httppark).
	Park *httppark.Lot
	// Denied, if set, counts requests refused by ACLs, by api ("http")
	// and reason ("token": nobody issued it; "permission").
	Denied *prometheus.CounterVec
	// Refused, if set, counts requests refused by a size limit, by api
	// ("http") and limit (the flag's name).
	Refused *prometheus.CounterVec

	// Datacenter is this server's datacenter: a request whose ?dc names
	// another is answered as Consul answers one it has no route to (500,
	// "No path to datacenter"). Empty means dc1, Consul's default.
	Datacenter string
}

// BodyLimits bound request and answer bodies.
type BodyLimits struct {
	// MaxTxnBytes bounds a /v1/txn body (413 above). Zero means 512 KiB,
	// Consul's txn_max_req_len.
	MaxTxnBytes int
	// MaxRangeBytes bounds the key and value bytes of a recursive GET
	// (the keys' bytes for ?keys): Consul has no such limit, and answers
	// every key; over it this API answers 413 and asks for a narrower
	// prefix. Zero means no bound.
	MaxRangeBytes int
}

// API is the HTTP handler set.
type API struct {
	b        Backend
	cfg      Config
	logger   *slog.Logger
	inFlight prometheus.Gauge       // cfg.InFlight, or one nobody reads
	denied   *prometheus.CounterVec // cfg.Denied, or one nobody reads
	refused  *prometheus.CounterVec // cfg.Refused, or one nobody reads
	// parkDone is inFlight.Dec, made once: a method value made per parked
	// request is one more object per request for each GC cycle to mark.
	parkDone func()
	// kvResume is a.kv as a handler, made once (as parkDone): a parked KV
	// read resumes straight into it instead of through the server's mux,
	// which routed the same URL to it when it first came (httppark.Wait).
	kvResume http.Handler
}

// New returns the API over b.
func New(b Backend, cfg Config) *API {
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = 5 * time.Minute
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	inFlight := cfg.InFlight
	if inFlight == nil {
		inFlight = prometheus.NewGauge(prometheus.GaugeOpts{Name: "unregistered"})
	}
	denied := cfg.Denied
	if denied == nil {
		denied = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "unregistered"}, []string{"api", "reason"})
	}
	refused := cfg.Refused
	if refused == nil {
		refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "unregistered"}, []string{"api", "limit"})
	}
	if cfg.Datacenter == "" {
		cfg.Datacenter = defaultDatacenter
	}
	a := &API{b: b, cfg: cfg, logger: logger, inFlight: inFlight, parkDone: inFlight.Dec, denied: denied, refused: refused}
	a.kvResume = http.HandlerFunc(a.kv)
	return a
}

// DefaultMaxTxnBytes is BodyLimits.MaxTxnBytes's default: Consul's
// txn_max_req_len.
const DefaultMaxTxnBytes = 512 << 10

// Register adds the API's routes to mux. Every route answers a request
// for another datacenter first (inDC).
func (a *API) Register(mux *http.ServeMux) {
	route := func(pattern string, h http.HandlerFunc) { mux.Handle(pattern, a.inDC(h)) }
	route("/v1/kv/", a.kv)
	route("PUT /v1/txn", a.txn)
	route("GET /v1/status/leader", a.statusLeader)
	route("GET /v1/status/peers", a.statusPeers)

	handle := func(pattern string, h func(http.ResponseWriter, *http.Request) error) {
		route(pattern, func(w http.ResponseWriter, r *http.Request) {
			// NB: a token nobody issued is refused before anything else,
			// on every route, as Consul does.
			_, err := a.authorizer(r)
			if err == nil {
				err = h(w, r)
			}
			if err != nil {
				a.writeError(w, r, err)
			}
		})
	}
	handle("PUT /v1/catalog/register", a.catalogRegister)
	handle("PUT /v1/catalog/deregister", a.catalogDeregister)
	handle("GET /v1/catalog/services", a.catalogServices)
	handle("GET /v1/catalog/service/{service}", a.catalogService)
	handle("GET /v1/catalog/nodes", a.catalogNodes)
	handle("GET /v1/catalog/node/{node}", a.catalogNode)
	handle("GET /v1/health/service/{service}", a.healthService)
	handle("GET /v1/health/checks/{service}", a.healthChecks)
	handle("GET /v1/health/node/{node}", a.healthNode)
	handle("GET /v1/health/state/{state}", a.healthState)
	handle("GET /v1/agent/self", a.agentSelf)
	handle("PUT /v1/agent/service/register", a.agentServiceRegister)
	handle("PUT /v1/agent/service/deregister/{id...}", a.agentServiceDeregister)
	handle("PUT /v1/agent/check/pass/{id...}", a.agentCheckUpdate(lodestonepb.HealthStatus_HEALTH_PASSING))
	handle("PUT /v1/agent/check/warn/{id...}", a.agentCheckUpdate(lodestonepb.HealthStatus_HEALTH_WARNING))
	handle("PUT /v1/agent/check/fail/{id...}", a.agentCheckUpdate(lodestonepb.HealthStatus_HEALTH_CRITICAL))
	handle("PUT /v1/agent/check/update/{id...}", a.agentCheckUpdateBody)
	handle("PUT /v1/agent/check/register", a.agentCheckRegister)
	handle("PUT /v1/agent/check/deregister/{id...}", a.agentCheckDeregister)
	handle("GET /v1/agent/services", a.agentServices)
	handle("GET /v1/agent/checks", a.agentChecks)
	handle("GET /v1/agent/service/{id...}", a.agentService)
	handle("GET /v1/agent/members", a.agentMembers)
	handle("PUT /v1/agent/join/{address...}", a.agentJoin)
	handle("PUT /v1/agent/leave", a.agentLeave)
	handle("PUT /v1/agent/maintenance", a.agentMaintenance)
	handle("PUT /v1/agent/service/maintenance/{id...}", a.agentServiceMaintenance)
	handle("PUT /v1/session/create", a.sessionCreate)
	handle("PUT /v1/session/destroy/{id}", a.sessionDestroy)
	handle("PUT /v1/session/renew/{id}", a.sessionRenew)
	handle("GET /v1/session/info/{id}", a.sessionInfo)
	handle("GET /v1/session/list", a.sessionList)
	handle("GET /v1/session/node/{node}", a.sessionNode)
	a.registerACL(mux, handle)
	a.registerOps(handle) // ops.go
}

// KVReads returns next with GET /v1/kv/<key> served by this API ahead of
// next: the routes' pattern matching cost a quarter of a KV read's
// allocations, and KV reads are what a leader answers most. Every other
// request goes to next, which must route /v1/kv/ to this API (Register),
// as must a path next would redirect to its clean form.
func (a *API) KVReads(next http.Handler) http.Handler {
	kv := a.inDC(a.kv)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := r.URL.Path; r.Method == http.MethodGet && strings.HasPrefix(p, "/v1/kv/") && cleanPath(p) == p {
			kv(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// cleanPath is http.ServeMux's: path.Clean, keeping a trailing slash.
func cleanPath(p string) string {
	np := path.Clean(p)
	if p[len(p)-1] == '/' && np != "/" {
		if len(p) == len(np)+1 && strings.HasPrefix(p, np) {
			return p
		}
		np += "/"
	}
	return np
}

// inDC answers a request whose ?dc names a datacenter other than this
// server's as Consul answers one it has no path to: 500, "No path to
// datacenter", and no data. Lodestone serves one datacenter and does not
// forward.
func (a *API) inDC(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if dc := Query(r.URL).Get("dc"); dc != "" && dc != a.cfg.Datacenter {
			http.Error(w, "No path to datacenter", http.StatusInternalServerError)
			return
		}
		h(w, r)
	}
}

// tooLarge is a 413 for a request over limit, counted.
func (a *API) tooLarge(limit, format string, args ...any) error {
	a.refused.WithLabelValues("http", limit).Inc()
	return &httpError{http.StatusRequestEntityTooLarge, fmt.Sprintf(format, args...)}
}

// authorizer resolves the token r carries (package token says where).
func (a *API) authorizer(r *http.Request) (*acl.Authorizer, error) {
	return a.b.Authorize(r.Context(), token.FromRequest(r))
}

// apply is every write of the API: the caller's token must pass the
// write rules (acl.CheckCommand), then cmd is proposed. Nothing is
// proposed for a request that fails them.
func (a *API) apply(r *http.Request, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, uint64, error) {
	az, err := a.authorizer(r)
	if err != nil {
		return nil, 0, err
	}
	// NB: a refusal is checked again after catching up with the leader
	// (acl.Recheck): the session or service cmd names may be new.
	catchUp := func(ctx context.Context) error { return a.b.LeaderBarrier(ctx, time.Now()) }
	if err := acl.Recheck(r.Context(), catchUp, func() error { return acl.CheckCommand(az, a.b.Store(), cmd) }); err != nil {
		return nil, 0, err
	}
	return a.b.Apply(r.Context(), cmd)
}

// rejected reports whether err is a store rejection under one of rules.
func rejected(err error, rules ...string) bool {
	var re *store.RejectedError
	return errors.As(err, &re) && slices.Contains(rules, re.Rule)
}

// httpError carries a status code to the one place that writes errors.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &httpError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// consulError is a refusal Consul makes in its RPC layer: its clients get
// a 500 with the reason, and some match on the words.
func consulError(format string, args ...any) error {
	return &httpError{http.StatusInternalServerError, fmt.Sprintf(format, args...)}
}

// writeError answers with Consul's plain-text error bodies and codes.
func (a *API) writeError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, errParked) {
		return
	}
	code, msg := http.StatusInternalServerError, err.Error()
	var he *httpError
	var ie *store.InvalidError
	var re *store.RejectedError
	var de *acl.DeniedError
	switch {
	case errors.As(err, &he):
		code = he.code
	case errors.As(err, &de):
		code = http.StatusForbidden
		a.denied.WithLabelValues("http", "permission").Inc()
	case errors.Is(err, acl.ErrNotFound):
		code, msg = http.StatusForbidden, acl.ErrNotFound.Error()
		a.denied.WithLabelValues("http", "token").Inc()
	case errors.As(err, &re):
		// Consul answers a write its state refuses (missing node, unknown
		// session, ...) with 500 and the reason.
		code, msg = http.StatusInternalServerError, re.Detail
	case errors.As(err, &ie) && ie.Rule == store.RuleMaxValueBytes:
		code = http.StatusRequestEntityTooLarge
	case errors.Is(err, store.ErrInvalid), errors.Is(err, ErrBadWait):
		code = http.StatusBadRequest
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		code = http.StatusServiceUnavailable
	default:
		if st, ok := status.FromError(err); ok {
			msg = st.Message()
			switch st.Code() {
			case codes.InvalidArgument:
				code = http.StatusBadRequest
			case codes.NotFound:
				code = http.StatusNotFound
			case codes.FailedPrecondition:
				code = http.StatusConflict
			case codes.Unavailable:
				// Consul's clients recognise this text as "retry".
				code, msg = http.StatusInternalServerError, "No cluster leader: "+msg
			case codes.ResourceExhausted:
				code = http.StatusTooManyRequests
			case codes.Canceled, codes.DeadlineExceeded:
				// NB: a request cut short by a server shutting down: not
				// the request's fault, and another server may answer it.
				code = http.StatusServiceUnavailable
			}
		}
	}
	if code >= 500 {
		a.logger.Warn("consul api request failed", "method", r.Method, "path", r.URL.Path, "code", code, "err", err)
	}
	http.Error(w, msg, code)
}

// Header values every response shares, set as net/http sets its own
// constant headers: Header.Set allocates a one-element slice per call, and
// a leader writes thousands of these answers a second. Nobody modifies
// them (Header.Add appends to a copy, since their capacity is one).
var (
	jsonContentType = []string{"application/json"}
	leaderKnown     = []string{"true"}
	leaderUnknown   = []string{"false"}
	// NB: keys set directly must be canonical, as Set would make them.
	knownLeaderKey = http.CanonicalHeaderKey("X-Consul-KnownLeader")
	indexKey       = http.CanonicalHeaderKey("X-Consul-Index")
	lastContactKey = http.CanonicalHeaderKey("X-Consul-LastContact")
)

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(code)
	// NB: the status line is out; an encode error can only be a broken
	// connection, which the client sees.
	_ = json.NewEncoder(w).Encode(v)
}

// query is the parsed form of Consul's read options.
type query struct {
	// began is when the read began, for LeaderBarrier: when the request
	// was parsed, or for one resumed after its wait, when it was parked
	// (just after it arrived; a read owes no write acknowledged after
	// that).
	began      time.Time
	index      uint64
	wait       time.Duration
	stale      bool
	consistent bool
	params     Params // the whole query string
}

func (a *API) parseQuery(r *http.Request) (query, error) {
	v := Query(r.URL)
	q := query{params: v}
	if at, ok := httppark.ParkedAt(r.Context()); ok {
		q.began = at
	} else {
		q.began = time.Now()
	}
	if s := v.Get("index"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return q, badRequest("Invalid index %q: must be a non-negative integer", s)
		}
		q.index = n
	}
	q.wait = a.cfg.MaxWait
	if s := v.Get("wait"); s != "" {
		d, err := parseWait(s)
		if err != nil {
			return q, badRequest("Invalid wait time %q: use a duration such as 10s or 5m", s)
		}
		if d > 0 && d < q.wait {
			q.wait = d
		}
	}
	q.stale = v.Has("stale")
	q.consistent = v.Has("consistent")
	if q.stale && q.consistent {
		return q, badRequest("Cannot specify ?stale with ?consistent, conflicting semantics.")
	}
	return q, nil
}

// parseWait accepts Go durations and Consul's bare seconds.
func parseWait(s string) (time.Duration, error) {
	// NB: a failed ParseUint allocates its error; "10000ms" is the common case.
	if strings.Trim(s, "0123456789") == "" {
		if n, err := strconv.ParseUint(s, 10, 64); err == nil {
			return time.Duration(n) * time.Second, nil
		}
	}
	return time.ParseDuration(s)
}

// blockOn waits, for a blocking query, until what d selects changes after
// q.index or the wait elapses. Then the caller reads.
//
// A request the Park lot can take is parked instead (errParked): its
// handler returns, and the lot runs it again once the wait is over, with
// httppark.WaitOver true.
//
// resume, if set, is the handler the mux routes r to, for a parked r to
// resume in (httppark.Wait.Resume).
func (a *API) blockOn(w http.ResponseWriter, r *http.Request, q query, d Dep, resume http.Handler) error {
	if q.index == 0 || httppark.WaitOver(r.Context()) {
		return nil
	}
	if a.cfg.Park.Parkable(r) {
		if done, err := a.park(w, r, q, d, resume); done {
			return err
		}
	}
	a.inFlight.Inc()
	defer a.inFlight.Dec()
	return Block(r.Context(), a.b.Hub(), a.b.Store(), d, q.index, q.wait)
}

// park parks r until d changes after q.index. done is false when the lot
// could not take r: the caller then waits itself.
func (a *API) park(w http.ResponseWriter, r *http.Request, q query, d Dep, resume http.Handler) (done bool, err error) {
	req, changed := waitSpec(a.b.Store(), d, q.index)
	if changed() {
		return true, nil
	}
	a.inFlight.Inc()
	ok, err := a.cfg.Park.Park(w, r, httppark.Wait{Watch: req, Changed: changed,
		Deadline: time.Now().Add(jittered(q.wait)), Done: a.parkDone, Resume: resume})
	if ok {
		return true, errParked
	}
	a.inFlight.Dec()
	if errors.As(err, new(*watch.CompactedError)) {
		return true, nil // NB: what it waited for is older than the hub holds: answer now
	}
	return err != nil, badWait(err)
}

// errParked is blockOn's answer for a parked request: its handler returns
// without writing anything.
var errParked = errors.New("consulapi: request parked")

// read settles the read that follows by the request's consistency mode:
// ?stale reads this server's state as it is, ?consistent pays a quorum
// round, and the default mode is the leader's committed state, as in
// Consul. NB: a blocking query's every answer is a read, so the default
// mode's missing round is what keeps 10k of them off the write path: with
// a round each, 2,000 answers/s added as many heartbeat rounds to the
// peers the writes replicate through.
func (a *API) read(ctx context.Context, q query) error {
	switch {
	case q.stale:
		return nil
	case q.consistent:
		return a.b.Barrier(ctx)
	default:
		return a.b.LeaderBarrier(ctx, q.began)
	}
}

// setMeta writes the headers Consul's clients read into QueryMeta.
func (a *API) setMeta(w http.ResponseWriter, index uint64) {
	_, known, last := a.b.Leader()
	// NB: Consul never answers index 0; clients treat 0 as "no blocking".
	h := w.Header()
	// NB: both values in one allocation, each a slice of capacity one so
	// that Header.Add appends to a copy (as for jsonContentType).
	vals := make([]string, 2)
	vals[0] = strconv.FormatUint(max(index, 1), 10)
	vals[1] = strconv.FormatInt(last.Milliseconds(), 10)
	h[indexKey] = vals[0:1:1]
	h[knownLeaderKey] = leaderUnknown
	if known {
		h[knownLeaderKey] = leaderKnown
	}
	h[lastContactKey] = vals[1:2:2]
}

func (a *API) statusLeader(w http.ResponseWriter, r *http.Request) {
	addr, _, _ := a.b.Leader()
	writeJSON(w, http.StatusOK, addr)
}

func (a *API) statusPeers(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, a.b.Peers())
}
