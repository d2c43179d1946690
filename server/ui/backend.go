package ui

import (
	"context"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/store"
)

// Backend is what the UI needs from the server it runs in.
type Backend interface {
	// Self is this member's name and Raft id.
	Self() (name string, id uint64)
	// ACLEnabled reports whether pages need a login.
	ACLEnabled() bool
	// Authorize resolves a token's secret as the API does: "" is the
	// anonymous token, one nobody issued is acl.ErrNotFound; with ACLs off
	// every secret may do everything.
	Authorize(ctx context.Context, secret string) (*acl.Authorizer, error)

	// Raft is this member's Raft state as its loop last published it.
	Raft() RaftState
	// Members is the replicated membership.
	Members() []*lodestonepb.Member
	// LastHeard is when this member last heard from member id.
	LastHeard(id uint64) (time.Time, bool)
	// LeaderChanged returns a channel closed at the next leader change.
	LeaderChanged() <-chan struct{}
	// Metrics gathers this member's own registry.
	Metrics(ctx context.Context) ([]*dto.MetricFamily, error)
	// MemberMetrics reads another member's /metrics at its HTTP address.
	MemberMetrics(ctx context.Context, httpAddr string) ([]*dto.MetricFamily, error)
	// Admission is the admission policy in force (nil: none) and the
	// share of its limits this member admits now, its ramp applied.
	Admission() (*lodestonepb.AdmissionPolicy, float64)
	// DataDir is this member's --data-dir, for the runbook commands.
	DataDir() string

	// Fresh makes the reads that follow as fresh as the API's default
	// consistency mode; without a leader it fails and the page says it
	// shows this member's own state.
	Fresh(ctx context.Context) error
	// Store reads this member's applied state.
	Store() Reader
	// Wait returns once d's index passes after, wait elapses or ctx ends:
	// a blocking query's wait, on the watch hub.
	Wait(ctx context.Context, d consulapi.Dep, after uint64, wait time.Duration) error
	// Write checks cmd against az with the API's write rules
	// (acl.CheckCommand), then replicates it and returns its result once
	// applied here. A failed CAS is a result, not an error.
	Write(ctx context.Context, az *acl.Authorizer, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, uint64, error)
}

// RaftState is a member's Raft state.
type RaftState struct {
	State   string // leader, follower, candidate, pre-candidate
	Lead    uint64 // 0: no leader known
	Term    uint64
	Commit  uint64
	Applied uint64
}

// Reader is the part of the state machine the pages read; *store.Store
// is one.
type Reader interface {
	Index() uint64
	Get(key []byte) (*lodestonepb.KeyValue, uint64)
	Range(prefix, startAfter []byte, limit int, keysOnly bool) ([]*lodestonepb.KeyValue, bool, uint64)
	KVIndexFor(key []byte, prefix bool) uint64
	Services() ([]*lodestonepb.ServiceSummary, store.QueryMeta)
	HealthService(name string, tags []string, passingOnly bool) ([]*lodestonepb.ServiceHealth, store.QueryMeta)
	Nodes() ([]*lodestonepb.Node, store.QueryMeta)
	Node(name string) (*lodestonepb.NodeServices, store.QueryMeta)
	NodeChecks(node string) ([]*lodestonepb.Check, store.QueryMeta)
	Session(id string) (*lodestonepb.SessionEntry, store.QueryMeta)
	Sessions() ([]*lodestonepb.SessionEntry, store.QueryMeta)
	SessionLocks(id string) []string
	KVIndex() uint64
	ServicesIndex() uint64
	NodesIndex() uint64
	ChecksIndex() uint64
	SessionsIndex() uint64
}

var _ Reader = (*store.Store)(nil)
