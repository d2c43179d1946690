// Package consulapi serves the subset of Consul's HTTP API that Lodestone
// replaces (KV, transactions, catalog, health, sessions, status), so that
// Consul's own clients work unchanged against a Lodestone server.
//
// It knows nothing of Raft: it reads the store, waits on the watch hub and
// writes through a Backend, which the server implements. Status codes,
// headers (X-Consul-Index, X-Consul-KnownLeader, X-Consul-LastContact) and
// bodies follow Consul's, because clients branch on them.
//
// Blocking queries: a request with ?index=N waits until the data it reads
// changes after N or ?wait (default and cap 5m, plus up to 1/16 jitter)
// elapses, then answers with the data's current index. The wait is a hub
// watcher on exactly the keys read, so unrelated writes never wake it.
package consulapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// Backend is what the API needs from the node it runs on.
type Backend interface {
	// Apply validates and replicates cmd and returns its result once
	// applied on this node, with the entry's index. Errors are gRPC status
	// errors (InvalidArgument, Unavailable, ...); a failed CAS is a result,
	// not an error.
	Apply(ctx context.Context, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, uint64, error)
	// Barrier makes the reads that follow linearizable.
	Barrier(ctx context.Context) error
	// Store is the state machine, read-only.
	Store() *store.Store
	// Hub is the watch hub fed by the apply loop.
	Hub() *watch.Hub
	// Leader returns the leader's peer address, whether one is known, and
	// how long ago this node last heard from it (0 on the leader).
	Leader() (addr string, known bool, lastContact time.Duration)
	// Peers returns the voters' peer addresses.
	Peers() []string
	// Limits are the node's request limits.
	Limits() store.Limits
	// KVIndex is the index a blocking KV query on key (or on every key under
	// it, with prefix) reports: the last index that changed what it reads.
	KVIndex(key []byte, prefix bool) uint64
}

// Config tunes the API.
type Config struct {
	// MaxWait caps ?wait and is its default. Zero means 5m (Consul's).
	MaxWait time.Duration
	// Logger receives request errors; nil discards.
	Logger *slog.Logger
}

// API is the HTTP handler set.
type API struct {
	b      Backend
	cfg    Config
	logger *slog.Logger
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
	return &API{b: b, cfg: cfg, logger: logger}
}

// Register adds the API's routes to mux.
func (a *API) Register(mux *http.ServeMux) {
	mux.HandleFunc("/v1/kv/", a.kv)
	mux.HandleFunc("PUT /v1/txn", a.txn)
	mux.HandleFunc("GET /v1/status/leader", a.statusLeader)
	mux.HandleFunc("GET /v1/status/peers", a.statusPeers)
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

// writeError answers with Consul's plain-text error bodies and codes.
func (a *API) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code, msg := http.StatusInternalServerError, err.Error()
	var he *httpError
	var ie *store.InvalidError
	switch {
	case errors.As(err, &he):
		code = he.code
	case errors.As(err, &ie) && ie.Rule == store.RuleMaxValueBytes:
		code = http.StatusRequestEntityTooLarge
	case errors.Is(err, store.ErrInvalid):
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
			}
		}
	}
	if code >= 500 {
		a.logger.Warn("consul api request failed", "method", r.Method, "path", r.URL.Path, "code", code, "err", err)
	}
	http.Error(w, msg, code)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	// NB: the status line is out; an encode error can only be a broken
	// connection, which the client sees.
	_ = json.NewEncoder(w).Encode(v)
}

// query is the parsed form of Consul's read options.
type query struct {
	index      uint64
	wait       time.Duration
	stale      bool
	consistent bool
}

func (a *API) parseQuery(r *http.Request) (query, error) {
	var q query
	v := r.URL.Query()
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
	_, q.stale = v["stale"]
	_, q.consistent = v["consistent"]
	if q.stale && q.consistent {
		return q, badRequest("Cannot specify ?stale with ?consistent, conflicting semantics.")
	}
	return q, nil
}

// parseWait accepts Go durations and Consul's bare seconds.
func parseWait(s string) (time.Duration, error) {
	if n, err := strconv.ParseUint(s, 10, 64); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	return time.ParseDuration(s)
}

// block waits, for a blocking query, until the keys selected by req change
// after q.index or the wait elapses. Then the caller reads.
func (a *API) block(ctx context.Context, q query, req watch.Request, current uint64) error {
	if q.index == 0 || current > q.index {
		return nil
	}
	wait := q.wait + rand.N(q.wait/16+1)
	req.StartIndex = q.index
	_, err := a.b.Hub().Wait(ctx, req, wait)
	if errors.Is(err, watch.ErrBadRequest) {
		return badRequest("%v", err)
	}
	return err
}

// read makes the read that follows consistent unless ?stale.
func (a *API) read(ctx context.Context, q query) error {
	if q.stale {
		return nil
	}
	return a.b.Barrier(ctx)
}

// setMeta writes the headers Consul's clients read into QueryMeta.
func (a *API) setMeta(w http.ResponseWriter, index uint64) {
	_, known, last := a.b.Leader()
	// NB: Consul never answers index 0; clients treat 0 as "no blocking".
	w.Header().Set("X-Consul-Index", strconv.FormatUint(max(index, 1), 10))
	w.Header().Set("X-Consul-KnownLeader", strconv.FormatBool(known))
	w.Header().Set("X-Consul-LastContact", strconv.FormatInt(last.Milliseconds(), 10))
}

func (a *API) statusLeader(w http.ResponseWriter, r *http.Request) {
	addr, _, _ := a.b.Leader()
	writeJSON(w, http.StatusOK, addr)
}

func (a *API) statusPeers(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, a.b.Peers())
}
