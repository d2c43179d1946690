package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/checks"
	"github.com/lodestone-kv/lodestone/gossip"
)

// routes is the local agent API: the subset of Consul's /v1/agent that
// service registration and TTL reporting use, so the official Consul
// client pointed at the agent works unchanged.
func (a *Agent) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/agent/service/register", a.handleRegister)
	// NB: {id...}: an id is the rest of the path, slashes included
	// ("db/pg1", "service:db/pg1"), percent-encoded or not, as Consul reads it.
	mux.HandleFunc("PUT /v1/agent/service/deregister/{id...}", a.handleDeregister)
	for verb, st := range map[string]lodestonepb.HealthStatus{
		"pass": lodestonepb.HealthStatus_HEALTH_PASSING,
		"warn": lodestonepb.HealthStatus_HEALTH_WARNING,
		"fail": lodestonepb.HealthStatus_HEALTH_CRITICAL,
	} {
		mux.HandleFunc("PUT /v1/agent/check/"+verb+"/{id...}", func(w http.ResponseWriter, r *http.Request) {
			a.ttlReport(w, r.PathValue("id"), st, r.URL.Query().Get("note"))
		})
	}
	mux.HandleFunc("PUT /v1/agent/check/update/{id...}", a.handleCheckUpdate)
	mux.HandleFunc("GET /v1/agent/services", a.handleServices)
	mux.HandleFunc("GET /v1/agent/checks", a.handleChecks)
	mux.HandleFunc("GET /v1/agent/members", a.handleMembers)
	mux.HandleFunc("GET /v1/agent/self", a.handleSelf)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.prom, promhttp.HandlerOpts{}))
	// For orchestrators' probes (lodestone healthcheck): 200 while the
	// agent serves.
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })
	return mux
}

// Consul answers agent API errors as plain text.
func httpError(w http.ResponseWriter, code int, format string, args ...any) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	fmt.Fprintf(w, format, args...)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func (a *Agent) handleRegister(w http.ResponseWriter, r *http.Request) {
	var def ServiceDefinition
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&def); err != nil {
		httpError(w, http.StatusBadRequest, "Request decode failed: %v", err)
		return
	}
	err := a.AddService(def)
	var scripts *checks.ScriptsDisabledError
	switch {
	case errors.As(err, &scripts):
		// Consul answers this one with 500.
		httpError(w, http.StatusInternalServerError, "%v", scripts)
	case err != nil:
		httpError(w, http.StatusBadRequest, "Invalid service: %v", err)
	}
}

func (a *Agent) handleDeregister(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !a.RemoveService(id) {
		httpError(w, http.StatusNotFound, "Unknown service ID %q. Ensure that the service ID is passed, not the service name.", id)
	}
}

func (a *Agent) ttlReport(w http.ResponseWriter, id string, st lodestonepb.HealthStatus, output string) {
	err := a.UpdateTTL(id, st, output)
	switch {
	case errors.Is(err, ErrUnknownCheck):
		httpError(w, http.StatusNotFound, "Unknown check ID %q", id)
	case errors.Is(err, ErrNotTTL):
		httpError(w, http.StatusInternalServerError, "CheckID %q does not have associated TTL", id)
	case err != nil:
		httpError(w, http.StatusInternalServerError, "%v", err)
	}
}

func (a *Agent) handleCheckUpdate(w http.ResponseWriter, r *http.Request) {
	var body struct{ Status, Output string }
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&body); err != nil {
		httpError(w, http.StatusBadRequest, "Request decode failed: %v", err)
		return
	}
	st, err := lodestonepb.ParseHealthStatus(body.Status)
	if err != nil || st == lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED {
		httpError(w, http.StatusBadRequest, "Invalid check status: %q", body.Status)
		return
	}
	a.ttlReport(w, r.PathValue("id"), st, body.Output)
}

// agentService and agentCheck are Consul's AgentService and AgentCheck.
type agentService struct {
	ID      string
	Service string
	Tags    []string
	Meta    map[string]string
	Port    int
	Address string
}

type agentCheck struct {
	Node        string
	CheckID     string
	Name        string
	Status      string
	Notes       string
	Output      string
	ServiceID   string
	ServiceName string
	Type        string
}

func (a *Agent) handleServices(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	out := map[string]agentService{}
	for id, ls := range a.local.services {
		s := ls.svc
		out[id] = agentService{ID: s.Id, Service: s.Name, Tags: s.Tags, Meta: s.Meta, Port: int(s.Port), Address: s.Address}
	}
	a.mu.Unlock()
	writeJSON(w, out)
}

func (a *Agent) handleChecks(w http.ResponseWriter, _ *http.Request) {
	a.mu.Lock()
	out := map[string]agentCheck{}
	for id, c := range a.local.checks {
		spec := c.Spec()
		name := ""
		if ls := a.local.services[spec.ServiceID()]; ls != nil {
			name = ls.svc.Name
		}
		st, output := c.Status()
		out[id] = agentCheck{Node: a.cfg.NodeName, CheckID: id, Name: spec.Name(), Status: lodestonepb.HealthStatusWord(st), Notes: spec.Record.Notes,
			Output: output, ServiceID: spec.ServiceID(), ServiceName: name, Type: spec.Kind}
	}
	a.mu.Unlock()
	writeJSON(w, out)
}

// memberStatus is Consul's serf member status code.
func memberStatus(s gossip.State) int {
	switch s {
	case gossip.StateAlive:
		return 1
	case gossip.StateLeft:
		return 3
	case gossip.StateFailed:
		return 4
	}
	return 0
}

type agentMember struct {
	Name   string
	Addr   string
	Tags   map[string]string
	Status int
}

func (a *Agent) handleMembers(w http.ResponseWriter, _ *http.Request) {
	var out []agentMember
	for _, m := range a.pool.Members() {
		out = append(out, agentMember{Name: m.Name, Addr: m.Addr, Tags: map[string]string{"role": string(m.Role)}, Status: memberStatus(m.State)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	writeJSON(w, out)
}

func (a *Agent) handleSelf(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, map[string]any{
		"Config": map[string]any{"NodeName": a.cfg.NodeName},
		"Member": agentMember{Name: a.cfg.NodeName, Addr: a.pool.Addr(), Tags: map[string]string{"role": string(gossip.RoleAgent)}, Status: 1},
	})
}
