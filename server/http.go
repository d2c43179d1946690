package server

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/raftnode"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/store"
)

func (s *core) routeHTTP(mux *http.ServeMux) {
	if s.cfg.EnablePprof {
		// A profile shows keys, tokens and request bodies in flight.
		for path, h := range map[string]http.HandlerFunc{"/": pprof.Index, "/cmdline": pprof.Cmdline,
			"/profile": pprof.Profile, "/symbol": pprof.Symbol, "/trace": pprof.Trace} {
			mux.HandleFunc("GET /debug/pprof"+path, s.authz.guard(acl.ResourceOperator, acl.AccessRead, h))
		}
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		st, applied, err := s.readiness()
		body := map[string]any{"leader": st.Lead != 0, "term": st.Term, "commit_index": st.Commit, "applied_index": applied}
		code := http.StatusOK
		if err != nil {
			code, body["reason"] = http.StatusServiceUnavailable, err.Error()
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(body)
	})
}

// Why a member is not ready: Server.Ready's errors, and /readyz's reason.
var (
	ErrRaftStopped = errors.New("raft loop stopped")
	ErrNoLeader    = errors.New("no leader known")
	ErrApplying    = errors.New("applying committed entries")
	ErrUnlisted    = errors.New("own client addresses not yet in the membership")
)

// Ready is the one rule for whether this member takes client traffic,
// which /readyz and a service manager's readiness notice both follow: nil
// once its Raft loop runs, a leader is known and it has applied what was
// committed when it first saw a leader, and since then trails the commit
// index by at most Config.ReadyApplyLag entries (applyGate), and its
// client addresses are in the membership clients read (publishSelf);
// otherwise ErrRaftStopped, ErrNoLeader, ErrApplying or ErrUnlisted.
func (s *Server) Ready() error {
	_, _, err := s.readiness()
	return err
}

// Healthy is /healthz's rule: nil while the Raft loop runs. A member can
// be healthy and not ready (no leader yet), never ready and not healthy.
func (s *Server) Healthy() error { return s.healthy() }

func (s *core) healthy() error {
	if err := s.raft.Failed(); err != nil {
		return fmt.Errorf("%w: %v", ErrRaftStopped, err)
	}
	return nil
}

// readiness is Ready with the figures /readyz shows beside it.
func (s *core) readiness() (st raftnode.Status, applied uint64, err error) {
	st = s.raft.Status()
	applied = s.raft.Applied()
	switch {
	case s.raft.Failed() != nil:
		err = ErrRaftStopped
	case st.Lead == 0:
		err = ErrNoLeader
	case !s.applyGate.caughtUp(st.Commit, applied, s.cfg.ReadyApplyLag):
		err = ErrApplying
	case !s.published.Load():
		err = ErrUnlisted
	}
	return st, applied, err
}

// applyGate decides whether a member with a leader has applied enough to
// be ready. A member applies each entry just after it commits, so under
// writes applied trails commit by a few entries at any instant; asking
// for applied == commit made a busy member's readiness flap. The gate
// asks instead for the commit index known when a leader was first seen
// (so a restarted member serves only once it holds what was acknowledged
// before), and from then on for applied within lag of commit.
type applyGate struct {
	mu     sync.Mutex
	target uint64 // the first commit index seen with a leader
	set    bool   // target is set
	caught bool   // applied has reached target
}

func (g *applyGate) caughtUp(commit, applied, lag uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.caught {
		if !g.set {
			g.target, g.set = commit, true
		}
		if applied < g.target {
			return false
		}
		g.caught = true
	}
	return applied+lag >= commit
}

// routeFaults serves the fault hooks when Config.Faults is set:
// PUT /debug/faults/disk-delay?d=200ms.
func (s *core) routeFaults(mux *http.ServeMux) {
	f := s.cfg.Faults
	if f == nil {
		return
	}
	mux.HandleFunc("PUT /debug/faults/disk-delay", s.authz.guard(acl.ResourceOperator, acl.AccessWrite, func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("d"))
		if err != nil || d < 0 {
			http.Error(w, "d must be a non-negative duration such as 200ms", http.StatusBadRequest)
			return
		}
		f.SetDiskDelay(d)
		s.logger.Warn("fault injected: disk delay", "delay", d)
		fmt.Fprintf(w, "disk delay %v\n", d)
	}))
}

// limitBodies bounds every HTTP request body before it is read. A body
// longer than its route's cap by its Content-Length is refused with 413
// at once; any other reads through http.MaxBytesReader, so no handler
// can read past the cap (and the connection closes after a body cut
// short). The caps: /v1/txn --max-txn-request-bytes; /v1/kv/ the value
// limit; everything else (registrations, sessions, ACLs, fault hooks)
// the value limit too, since none carries more than a value's worth.
// The Consul handlers check the first two themselves, with Consul's
// words, so theirs are one byte over and their own check answers.
func (s *core) limitBodies(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r) // NB: every GET, and so every blocking query
			return
		}
		live := s.live()
		max, limit, own := int64(cmp.Or(live.Limits.MaxValueBytes, store.DefaultMaxValueBytes)), "max-value-bytes", false
		switch {
		case r.URL.Path == "/v1/txn":
			max, limit, own = int64(cmp.Or(live.MaxTxnRequestBytes, consulapi.DefaultMaxTxnBytes)), "max-txn-request-bytes", true
		case strings.HasPrefix(r.URL.Path, "/v1/kv/"):
			own = true
		case r.URL.Path == "/v1/snapshot":
			// NB: a restore's state, bounded by its handler.
			max, limit = consulapi.MaxRestoreBytes+1, "max-restore-bytes"
		}
		if !own && r.ContentLength > max {
			s.metrics.refused.WithLabelValues("http", limit).Inc()
			http.Error(w, fmt.Sprintf("Request body(%d bytes) too large, max size: %d bytes (limit %s)", r.ContentLength, max, limit),
				http.StatusRequestEntityTooLarge)
			return
		}
		if own {
			max++
		}
		r.Body = http.MaxBytesReader(w, r.Body, max)
		next.ServeHTTP(w, r)
	})
}
