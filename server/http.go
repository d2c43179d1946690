package server

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func (s *Server) routeHTTP() {
	if s.cfg.EnablePprof {
		s.Mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		s.Mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		s.Mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		s.Mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		s.Mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	s.Mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	s.Mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.node.fatal.Load(); err != nil {
			http.Error(w, "raft loop stopped: "+(*err).Error(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	s.Mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		st := s.node.publishedStatus()
		applied := s.node.applied.current()
		body := map[string]any{"leader": st.lead != 0, "term": st.term, "commit_index": st.commit, "applied_index": applied}
		code := http.StatusOK
		switch {
		case s.node.fatal.Load() != nil:
			code, body["reason"] = http.StatusServiceUnavailable, "raft loop stopped"
		case st.lead == 0:
			code, body["reason"] = http.StatusServiceUnavailable, "no leader known"
		case applied < st.commit:
			code, body["reason"] = http.StatusServiceUnavailable, "applying committed entries"
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(body)
	})
}
