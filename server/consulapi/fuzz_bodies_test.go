package consulapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/checks"
	"github.com/lodestone-kv/lodestone/gossip"
	"github.com/lodestone-kv/lodestone/internal/rpcstatus"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/server/localagent"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// bodyRoutes are the write endpoints whose JSON bodies FuzzWriteBodies
// sends, by the fuzzer's route number.
var bodyRoutes = []string{
	"/v1/txn",
	"/v1/catalog/register",
	"/v1/agent/service/register",
	"/v1/session/create",
	"/v1/acl/policy",
	"/v1/acl/token",
	"/v1/acl/role",
}

// FuzzWriteBodies sends arbitrary JSON bodies to the Consul write
// endpoints (transactions, catalog and agent registration, session
// create, ACL policy/token/role create) of a real API over a real store,
// through a backend that applies as the server's write path does
// (stamp, limits, apply, the same error mapping). Whatever the body:
//   - nothing panics;
//   - the answer is never a 5xx, except the ones Consul gives for a
//     write the state refuses (a *store.RejectedError: missing node,
//     unknown session, ...) and for a script check on an agent that runs
//     none;
//   - a 4xx changed nothing: every key, node, service, check, session,
//     policy, role and token reads as before.
func FuzzWriteBodies(f *testing.F) {
	add := func(route int, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(route), b)
	}
	add(0, consul.TxnOps{
		{KV: &consul.KVTxnOp{Verb: consul.KVSet, Key: "a", Value: []byte("1"), Flags: 3}},
		{KV: &consul.KVTxnOp{Verb: consul.KVCAS, Key: "a", Value: []byte("2"), Index: 1}},
		{KV: &consul.KVTxnOp{Verb: consul.KVGet, Key: "a"}},
		{KV: &consul.KVTxnOp{Verb: consul.KVDeleteTree, Key: "b/"}},
	})
	add(0, consul.TxnOps{{KV: &consul.KVTxnOp{Verb: consul.KVLock, Key: "l", Session: "no-such-session"}}})
	add(0, consul.TxnOps{{KV: &consul.KVTxnOp{Verb: "frobnicate", Key: "a"}}, {}})
	add(1, consul.CatalogRegistration{Node: "n2", Address: "10.0.0.2", NodeMeta: map[string]string{"rack": "r1"},
		Service: &consul.AgentService{ID: "web-1", Service: "web", Tags: []string{"v1"}, Port: 80},
		Check:   &consul.AgentCheck{CheckID: "c1", Name: "alive", Status: consul.HealthPassing, ServiceID: "web-1"}})
	add(1, consul.CatalogRegistration{Node: "", Address: "x"})
	add(2, consul.AgentServiceRegistration{ID: "web-2", Name: "web", Port: 8080, Address: "10.0.0.3",
		Meta: map[string]string{"v": "2"}, Check: &consul.AgentServiceCheck{TTL: "10s", Status: consul.HealthPassing}})
	add(2, consul.AgentServiceRegistration{Name: "db", Checks: consul.AgentServiceChecks{{TTL: "-1s"}, {HTTP: "http://x", Interval: "1s"}}})
	add(3, consul.SessionEntry{Name: "lock", Node: "n1", TTL: "15s", Behavior: consul.SessionBehaviorDelete, LockDelay: time.Second})
	add(3, consul.SessionEntry{Node: "nowhere", TTL: "bogus"})
	add(4, consul.ACLPolicy{Name: "kv-app", Description: "app keys", Rules: `key_prefix "app/" { policy = "write" }`})
	add(4, consul.ACLPolicy{Name: "bad name!", Rules: `key_prefix { policy = }`})
	add(5, consul.ACLToken{Description: "app", Policies: []*consul.ACLTokenPolicyLink{{Name: "p1"}}})
	add(5, consul.ACLToken{Policies: []*consul.ACLTokenPolicyLink{{ID: "nope"}}, Roles: []*consul.ACLTokenRoleLink{{Name: "r1"}}})
	add(6, consul.ACLRole{Name: "r2", Policies: []*consul.ACLRolePolicyLink{{ID: "p1"}}})
	add(6, consul.ACLRole{Name: ""})
	for r := range bodyRoutes {
		for _, s := range []string{"", "null", "{}", "[]", "[null]", `{"Name": 1}`, "{", `"\ud800"`, strings.Repeat("[", 10000)} {
			f.Add(uint8(r), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		b := newStoreBackend(t)
		mux := http.NewServeMux()
		consulapi.New(b, consulapi.Config{}).Register(mux)
		path := bodyRoutes[int(route)%len(bodyRoutes)]
		before := stateOf(b.st)
		b.refused = false
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(http.MethodPut, path, bytes.NewReader(body)))
		// NB: Consul refuses some input in its RPC layer (and a script
		// check), and its clients expect those refusals as 500s with its
		// words.
		consulRefusal := w.Code == http.StatusInternalServerError && slices.ContainsFunc(consulRefusals,
			func(p string) bool { return strings.HasPrefix(w.Body.String(), p) })
		switch code := w.Code; {
		case code >= 500 && !(code == http.StatusInternalServerError && (b.refused || consulRefusal)):
			t.Fatalf("PUT %s %q: %d %s", path, body, code, w.Body)
		case (code >= 400 && code < 500 || consulRefusal) && stateOf(b.st) != before:
			t.Fatalf("PUT %s %q: %d %s, yet the state changed:\n%s\nwas\n%s", path, body, code, w.Body, stateOf(b.st), before)
		}
	})
}

// consulRefusals begin the 500s Consul answers for input its RPC layer
// refuses.
var consulRefusals = []string{"Must provide node", "Must provide address", "Invalid Session TTL", "Session TTL '",
	"Invalid Behavior setting", "Scripts are disabled on this agent"}

// storeBackend is a consulapi.Backend over a real store, applying each
// command at the next index as the server's write path does, with a real
// local agent that is never started (its checks compile and register but
// do not run).
type storeBackend struct {
	st      *store.Store
	hub     *watch.Hub
	local   *localagent.Agent
	refused bool // the last Apply ended in a *store.RejectedError
}

func newStoreBackend(t *testing.T) *storeBackend {
	b := &storeBackend{st: store.New()}
	local, err := localagent.New(localagent.Config{Node: "n1", Address: "127.0.0.1", Catalog: b.st, Apply: b.Apply,
		Barrier: func(context.Context) error { return nil }, Checks: checks.DefaultOptions()})
	if err != nil {
		t.Fatal(err)
	}
	b.local = local
	// The agent's node with a check, so sessions and services have one.
	for _, c := range []*lodestonepb.Command{
		{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: &lodestonepb.CatalogRegisterRequest{
			Node: &lodestonepb.Node{Name: "n1", Address: "127.0.0.1"},
			Checks: []*lodestonepb.Check{{Node: "n1", CheckId: "serfHealth", Name: "Serf Health Status",
				Status: lodestonepb.HealthStatus_HEALTH_PASSING}}}}},
		{Op: &lodestonepb.Command_Acl{Acl: &lodestonepb.ACLCommand{Create: true, Op: &lodestonepb.ACLCommand_PolicySet{
			PolicySet: &lodestonepb.ACLPolicy{Id: "p1", Name: "p1", Rules: `key_prefix "" { policy = "read" }`}}}}},
	} {
		if _, _, err := b.Apply(context.Background(), c); err != nil {
			t.Fatalf("setup: %v", err)
		}
	}
	return b
}

func (b *storeBackend) Apply(_ context.Context, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, uint64, error) {
	if cmd.TimeUnixNano == 0 {
		cmd.TimeUnixNano = time.Now().UnixNano()
	}
	if c := cmd.GetSessionCreate(); c != nil && c.Session != nil && c.Session.Id == "" {
		c.Session.Id = "11111111-2222-4333-8444-555555555555"
	}
	if err := store.DefaultLimits().ValidateCommand(cmd); err != nil {
		return nil, 0, rpcstatus.Of(err)
	}
	index := b.st.Index() + 1
	res, _ := b.st.Apply(index, cmd)
	if res == nil {
		return nil, 0, errors.New("no result")
	}
	if res.Result == nil && !res.CasFailed && !res.LockFailed {
		if err := store.CheckCommand(cmd); err != nil {
			return nil, 0, rpcstatus.Of(err)
		}
	}
	if err := store.ResultError(res); err != nil {
		var re *store.RejectedError
		b.refused = errors.As(err, &re)
		return nil, index, err
	}
	return res, index, nil
}

func (b *storeBackend) Barrier(context.Context) error                  { return nil }
func (b *storeBackend) LeaderBarrier(context.Context, time.Time) error { return nil }
func (b *storeBackend) Store() *store.Store                            { return b.st }
func (b *storeBackend) Hub() *watch.Hub                                { return b.hub }
func (b *storeBackend) Leader() (string, bool, time.Duration)          { return "127.0.0.1:7401", true, 0 }
func (b *storeBackend) Peers() []string                                { return []string{"127.0.0.1:7401"} }
func (b *storeBackend) Limits() store.Limits                           { return store.DefaultLimits() }
func (b *storeBackend) BodyLimits() consulapi.BodyLimits               { return consulapi.BodyLimits{} }
func (b *storeBackend) Agent() (string, string)                        { return "n1", "127.0.0.1" }
func (b *storeBackend) LocalAgent() *localagent.Agent                  { return b.local }
func (b *storeBackend) Membership() consulapi.Membership               { return soloMembership{} }
func (b *storeBackend) Authorize(context.Context, string) (*acl.Authorizer, error) {
	return acl.AllowAll("fuzz"), nil
}

// soloMembership is a server without gossip that may not leave.
type soloMembership struct{}

func (soloMembership) Members() ([]gossip.Member, string, bool) { return nil, "", false }
func (soloMembership) Join([]string) (int, error)               { return 0, errors.New("gossip is off") }
func (soloMembership) Leave(context.Context) error              { return errors.New("refused to leave") }
func (soloMembership) NodeID() string                           { return "00000000-0000-0000-0000-000000000001" }
func (soloMembership) Stats() map[string]map[string]string      { return nil }

// stateOf renders what the Consul API can write: every key, node (with
// its services and checks), session and ACL policy, role and token, with
// their own indexes but not the state's (a refused command advances it).
func stateOf(st *store.Store) string {
	var b strings.Builder
	kvs, _, _ := st.Range(nil, nil, 0, false)
	for _, kv := range kvs {
		fmt.Fprintln(&b, kv)
	}
	nodes, _ := st.Nodes()
	for _, n := range nodes {
		ns, _ := st.Node(n.GetName())
		fmt.Fprintln(&b, ns)
	}
	sessions, _ := st.Sessions()
	for _, s := range sessions {
		fmt.Fprintln(&b, s)
	}
	ps, _ := st.ACLPolicies()
	for _, p := range ps {
		fmt.Fprintln(&b, p)
	}
	rs, _ := st.ACLRoles()
	for _, r := range rs {
		fmt.Fprintln(&b, r)
	}
	ts, _ := st.ACLTokens()
	for _, t := range ts {
		fmt.Fprintln(&b, t)
	}
	return b.String()
}
