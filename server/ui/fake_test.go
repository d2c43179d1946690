package ui

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// fake is a Backend without Raft: a real store and watch hub that it
// applies commands to itself, and a registry the test sets metrics on.
// The real path, through a server, is what the browser tests drive.
type fake struct {
	st  *store.Store
	hub *watch.Hub
	reg *prometheus.Registry

	mu     sync.Mutex
	index  uint64
	writes int

	aclOn  bool
	tokens map[string]*acl.Authorizer // by secret
	remote map[string][]*dto.MetricFamily
}

func newFake(t *testing.T) *fake {
	hub, err := watch.New(watch.Config{Shards: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hub.Close() })
	f := &fake{st: store.New(), hub: hub, reg: prometheus.NewRegistry(), tokens: map[string]*acl.Authorizer{}}
	f.member(1, "n1", "127.0.0.1:1")
	return f
}

// token makes a token whose secret is secret and whose rules are text.
func (f *fake) token(t *testing.T, secret, text string) {
	rules, err := acl.ParseRules(text)
	if err != nil {
		t.Fatal(err)
	}
	f.tokens[secret] = acl.Compile("acc-"+secret, [][]acl.Rule{rules}, acl.AccessDeny)
}

func (f *fake) apply(cmd *lodestonepb.Command) (*lodestonepb.CommandResult, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	if cmd.TimeUnixNano == 0 {
		cmd.TimeUnixNano = time.Now().UnixNano()
	}
	res, evs := f.st.Apply(f.index, cmd)
	out := make([]watch.Event, len(evs))
	for i, e := range evs {
		out[i] = watch.Event{Type: watch.Put, KV: watch.KeyValue{Key: string(e.KV.Key), ModifyIndex: f.index}}
		if e.Type == store.EventDelete {
			out[i].Type = watch.Delete
		}
	}
	f.hub.Publish(f.index, out)
	return res, f.index
}

// member adds a member to the membership, as a conf change would.
func (f *fake) member(id uint64, name, httpAddr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.index++
	f.st.SetMember(f.index, &lodestonepb.Member{Id: id, Name: name, HttpAddr: httpAddr})
	f.hub.Publish(f.index, nil)
}

func (f *fake) put(key, value string) uint64 {
	_, idx := f.apply(&lodestonepb.Command{Op: &lodestonepb.Command_Put{Put: &lodestonepb.PutRequest{Key: []byte(key), Value: []byte(value)}}})
	return idx
}

func (f *fake) Self() (string, uint64) { return "n1", 1 }
func (f *fake) ACLEnabled() bool       { return f.aclOn }
func (f *fake) Authorize(_ context.Context, secret string) (*acl.Authorizer, error) {
	if !f.aclOn {
		return acl.AllowAll(""), nil
	}
	if a, ok := f.tokens[secret]; ok {
		return a, nil
	}
	return nil, acl.ErrNotFound
}
func (f *fake) Raft() RaftState {
	return RaftState{State: "leader", Lead: 1, Term: 3, Commit: f.st.Index(), Applied: f.st.Index()}
}
func (f *fake) Members() []*lodestonepb.Member                       { return f.st.Members() }
func (f *fake) LastHeard(uint64) (time.Time, bool)                   { return time.Time{}, false }
func (f *fake) LeaderChanged() <-chan struct{}                       { return make(chan struct{}) }
func (f *fake) Metrics(context.Context) ([]*dto.MetricFamily, error) { return f.reg.Gather() }
func (f *fake) MemberMetrics(_ context.Context, addr string) ([]*dto.MetricFamily, error) {
	if fams, ok := f.remote[addr]; ok {
		return fams, nil
	}
	return nil, errors.New("dial tcp " + addr + ": connect: connection refused")
}
func (f *fake) Admission() (*lodestonepb.AdmissionPolicy, float64) { return nil, 1 }
func (f *fake) DataDir() string                                    { return "/var/lib/lodestone" }
func (f *fake) Fresh(context.Context) error                        { return nil }
func (f *fake) Store() Reader                                      { return f.st }
func (f *fake) Wait(ctx context.Context, d consulapi.Dep, after uint64, wait time.Duration) error {
	return consulapi.Block(ctx, f.hub, f.st, d, after, wait)
}
func (f *fake) Write(_ context.Context, az *acl.Authorizer, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, uint64, error) {
	if err := acl.CheckCommand(az, f.st, cmd); err != nil {
		return nil, 0, err
	}
	f.mu.Lock()
	f.writes++
	f.mu.Unlock()
	res, idx := f.apply(cmd)
	return res, idx, nil
}
