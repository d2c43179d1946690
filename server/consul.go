package server

import (
	"context"
	"net"
	"time"

	"go.etcd.io/raft/v3"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/rpcstatus"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/server/localagent"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// consulBackend lets the Consul-compatible HTTP API reach this node.
type consulBackend struct {
	s          *core
	local      *localagent.Agent
	membership consulapi.Membership
}

var _ consulapi.Backend = consulBackend{}

func (b consulBackend) Authorize(ctx context.Context, secret string) (*acl.Authorizer, error) {
	var a *acl.Authorizer
	err := acl.Recheck(ctx, b.catchUp, func() (err error) {
		a, err = b.s.authz.resolver.Resolve(secret)
		return err
	})
	return a, err
}

func (b consulBackend) catchUp(ctx context.Context) error { return b.s.authz.catchUp(ctx) }

func (b consulBackend) Apply(ctx context.Context, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, uint64, error) {
	return b.s.write(ctx, cmd)
}

func (b consulBackend) Barrier(ctx context.Context) error {
	return rpcstatus.Of(b.s.readIndex(ctx))
}

func (b consulBackend) LeaderBarrier(ctx context.Context, began time.Time) error {
	return rpcstatus.Of(b.s.leaderRead(ctx, began))
}

func (b consulBackend) Store() *store.Store  { return b.s.store }
func (b consulBackend) Hub() *watch.Hub      { return b.s.hub }
func (b consulBackend) Limits() store.Limits { return b.s.live().Limits }

func (b consulBackend) BodyLimits() consulapi.BodyLimits {
	l := b.s.live()
	return consulapi.BodyLimits{MaxTxnBytes: l.MaxTxnRequestBytes, MaxRangeBytes: b.s.rangeBytes()}
}

func (b consulBackend) Leader() (string, bool, time.Duration) {
	lead := b.s.raft.Status().Lead
	if lead == raft.None {
		return "", false, 0
	}
	addr := b.s.store.PeerAddr(lead)
	if lead == b.s.raft.ID() {
		return addr, true, 0
	}
	at, ok := b.s.raft.LastHeard(lead)
	var last time.Duration
	if ok {
		last = time.Since(at)
	}
	return addr, true, last
}

func (b consulBackend) Peers() []string {
	var out []string
	for _, m := range b.s.store.Members() {
		if !m.Learner {
			out = append(out, m.PeerAddr)
		}
	}
	return out
}

func (b consulBackend) Agent() (string, string) { return b.s.agentNode() }

func (b consulBackend) LocalAgent() *localagent.Agent { return b.local }

func (b consulBackend) Membership() consulapi.Membership { return b.membership }

// agentNode returns the node name and address this server registers as
// the agent of.
func (s *core) agentNode() (name, addr string) {
	name, addr = s.cfg.Catalog.AgentNode, s.cfg.Catalog.AgentAddress
	if name == "" {
		name = s.cfg.Name
	}
	if addr == "" {
		host, _, err := net.SplitHostPort(s.advertiseHTTP)
		if ip := net.ParseIP(host); err != nil || ip == nil || ip.IsUnspecified() {
			host = "127.0.0.1"
		}
		addr = host
	}
	return name, addr
}
