package consulapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store"
)

// serfHealthCheck is the check id Consul binds sessions to by default. We
// have no implicit serfHealth (store/doc.go): a default or explicit
// "serfHealth" binds only when a check of that id is registered on the
// session's node, and is dropped otherwise.
const serfHealthCheck = "serfHealth"

// lockDelayMinThreshold is Consul's rule for a numeric LockDelay: below it
// the number is seconds, from it on nanoseconds.
const lockDelayMinThreshold = 1000

// sessionIn is api.SessionEntry as /v1/session/create reads it.
type sessionIn struct {
	Name          string
	Node          string
	LockDelay     json.RawMessage
	Behavior      string
	TTL           string
	Checks        []string
	NodeChecks    []string
	ServiceChecks []serviceCheckJSON
}

type serviceCheckJSON struct {
	ID        string
	Namespace string
}

// sessionJSON is api.SessionEntry as Consul writes it: LockDelay in
// nanoseconds, TTL as a duration string.
type sessionJSON struct {
	ID            string
	Name          string
	Node          string
	LockDelay     time.Duration
	Behavior      string
	TTL           string
	Checks        []string
	NodeChecks    []string
	ServiceChecks []serviceCheckJSON
	CreateIndex   uint64
	ModifyIndex   uint64
}

func sessionOut(s *lodestonepb.SessionEntry) sessionJSON {
	out := sessionJSON{ID: s.Id, Name: s.Name, Node: s.Node, LockDelay: s.LockDelay.AsDuration(), Behavior: "release",
		Checks: nonNil(s.Checks), NodeChecks: nonNil(s.NodeChecks), ServiceChecks: []serviceCheckJSON{},
		CreateIndex: s.CreateIndex, ModifyIndex: s.ModifyIndex}
	if s.Behavior == lodestonepb.SessionBehavior_SESSION_DELETE {
		out.Behavior = "delete"
	}
	if d := s.Ttl.AsDuration(); d != 0 {
		out.TTL = d.String()
	}
	for _, c := range s.ServiceChecks {
		out.ServiceChecks = append(out.ServiceChecks, serviceCheckJSON{ID: c.Id, Namespace: c.Namespace})
	}
	return out
}

func sessionsOut(list []*lodestonepb.SessionEntry) []sessionJSON {
	out := make([]sessionJSON, len(list))
	for i, s := range list {
		out[i] = sessionOut(s)
	}
	return out
}

func parseLockDelay(raw json.RawMessage) (*durationpb.Duration, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil // the store's default (15s)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		d, err := time.ParseDuration(s)
		if err != nil {
			return nil, badRequest("Invalid LockDelay %q: use a duration such as 15s", s)
		}
		return durationpb.New(d), nil
	}
	var n float64
	if err := json.Unmarshal(raw, &n); err != nil || n < 0 {
		return nil, badRequest("Invalid LockDelay %s: use a duration string or a number", raw)
	}
	if n < lockDelayMinThreshold {
		return durationpb.New(time.Duration(n * float64(time.Second))), nil
	}
	return durationpb.New(time.Duration(n)), nil
}

func (a *API) sessionCreate(w http.ResponseWriter, r *http.Request) error {
	var in sessionIn
	if err := decodeBody(r, &in); err != nil {
		return err
	}
	se := &lodestonepb.SessionEntry{Name: in.Name, Node: in.Node, NodeChecks: in.NodeChecks}
	// NB: Consul refuses a bad Behavior or TTL in its RPC layer, so its
	// clients see a 500 with these words, not a 400.
	switch in.Behavior {
	case "", "release":
	case "delete":
		se.Behavior = lodestonepb.SessionBehavior_SESSION_DELETE
	default:
		return consulError("Invalid Behavior setting '%s'", in.Behavior)
	}
	if in.TTL != "" {
		d, err := time.ParseDuration(in.TTL)
		if err != nil {
			return consulError("Session TTL '%s' invalid: %v", in.TTL, err)
		}
		if d != 0 && (d < store.SessionTTLMin || d > store.SessionTTLMax) {
			// NB: '%d' of a duration, nanoseconds, as Consul writes it.
			return consulError("Invalid Session TTL '%d', must be between [%v=%v]", int64(d), store.SessionTTLMin, store.SessionTTLMax)
		}
		if d != 0 {
			se.Ttl = durationpb.New(d)
		}
	}
	var err error
	if se.LockDelay, err = parseLockDelay(in.LockDelay); err != nil {
		return err
	}
	for _, c := range in.ServiceChecks {
		se.ServiceChecks = append(se.ServiceChecks, &lodestonepb.ServiceCheckRef{Id: c.ID, Namespace: c.Namespace})
	}
	if se.Node == "" {
		if se.Node, err = a.ensureAgentNode(r); err != nil {
			return err
		}
	}
	checks := in.Checks
	if checks == nil && in.NodeChecks == nil && in.ServiceChecks == nil {
		checks = []string{serfHealthCheck}
	}
	if slices.Contains(checks, serfHealthCheck) && !a.hasCheck(se.Node, serfHealthCheck) {
		checks = slices.DeleteFunc(slices.Clone(checks), func(c string) bool { return c == serfHealthCheck })
	}
	se.Checks = checks
	res, _, err := a.apply(r, &lodestonepb.Command{Op: &lodestonepb.Command_SessionCreate{SessionCreate: &lodestonepb.CreateSessionRequest{Session: se}}})
	if rejected(err, store.RejectNodeMissing, store.RejectCheckMissing, store.RejectCheckCritical) {
		return a.sessionRefusal(se, err)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]string{"ID": res.GetSessionCreate().GetSession().GetId()})
	return nil
}

func (a *API) hasCheck(node, id string) bool {
	checks, _ := a.b.Store().NodeChecks(node)
	return slices.ContainsFunc(checks, func(c *lodestonepb.Check) bool { return c.CheckId == id })
}

func (a *API) sessionDestroy(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if _, _, err := a.apply(r, &lodestonepb.Command{Op: &lodestonepb.Command_SessionDestroy{SessionDestroy: &lodestonepb.DestroySessionRequest{Id: id}}}); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, true)
	return nil
}

func (a *API) sessionRenew(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	res, _, err := a.apply(r, &lodestonepb.Command{Op: &lodestonepb.Command_SessionRenew{SessionRenew: &lodestonepb.RenewSessionRequest{Id: id}}})
	if rejected(err, store.RejectSessionMissing) {
		// Consul's clients read 404 as "the session is gone".
		return &httpError{http.StatusNotFound, fmt.Sprintf("Session id '%s' not found", id)}
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, []sessionJSON{sessionOut(res.GetSessionRenew().GetSession())})
	return nil
}

func (a *API) sessionInfo(w http.ResponseWriter, r *http.Request) error {
	az, err := a.readDep(w, r, SessionsDep())
	if err != nil {
		return err
	}
	se, m := a.b.Store().Session(r.PathValue("id"))
	a.setMeta(w, m.Index)
	out := []sessionJSON{}
	if se != nil && az.Allowed(acl.ResourceSession, se.Node, acl.AccessRead) {
		out = append(out, sessionOut(se))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (a *API) sessionList(w http.ResponseWriter, r *http.Request) error {
	az, err := a.readDep(w, r, SessionsDep())
	if err != nil {
		return err
	}
	list, m := a.b.Store().Sessions()
	a.setMeta(w, m.Index)
	writeJSON(w, http.StatusOK, sessionsOut(acl.FilterSessions(az, list)))
	return nil
}

func (a *API) sessionNode(w http.ResponseWriter, r *http.Request) error {
	az, err := a.readDep(w, r, SessionsDep())
	if err != nil {
		return err
	}
	list, m := a.b.Store().NodeSessions(r.PathValue("node"))
	a.setMeta(w, m.Index)
	writeJSON(w, http.StatusOK, sessionsOut(acl.FilterSessions(az, list)))
	return nil
}

// sessionRefusal is Consul's 500 for a session its state refuses: a node
// or a bound check missing, or a bound check critical.
func (a *API) sessionRefusal(se *lodestonepb.SessionEntry, err error) error {
	if rejected(err, store.RejectNodeMissing) {
		return consulError("Missing node registration")
	}
	checks, _ := a.b.Store().NodeChecks(se.Node)
	status := map[string]lodestonepb.HealthStatus{}
	for _, c := range checks {
		status[c.CheckId] = c.Status
	}
	ids := append(append([]string(nil), se.Checks...), se.NodeChecks...)
	for _, sc := range se.ServiceChecks {
		ids = append(ids, sc.Id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		st, ok := status[id]
		switch {
		case !ok:
			return consulError("Missing check '%s' registration", id)
		case st == lodestonepb.HealthStatus_HEALTH_CRITICAL:
			return consulError("Check '%s' is in %s state", id, lodestonepb.HealthStatusWord(st))
		}
	}
	return err
}
