package server

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/raft/v3"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// consulBackend lets the Consul-compatible HTTP API reach this node.
type consulBackend struct{ s *Server }

var _ consulapi.Backend = consulBackend{}

func (b consulBackend) Apply(ctx context.Context, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, uint64, error) {
	return b.s.applyChecked(ctx, cmd)
}

func (b consulBackend) Barrier(ctx context.Context) error {
	if _, err := b.s.node.readIndex(ctx); err != nil {
		return toStatus(err)
	}
	return nil
}

func (b consulBackend) LeaderBarrier(ctx context.Context, began time.Time) error {
	if err := b.s.node.leaderRead(ctx, began); err != nil {
		return toStatus(err)
	}
	return nil
}

func (b consulBackend) Store() *store.Store  { return b.s.store }
func (b consulBackend) Hub() *watch.Hub      { return b.s.hub }
func (b consulBackend) Limits() store.Limits { return b.s.cfg.Limits }

func (b consulBackend) Leader() (string, bool, time.Duration) {
	lead := b.s.node.publishedStatus().lead
	if lead == raft.None {
		return "", false, 0
	}
	addr := b.s.store.PeerAddr(lead)
	if lead == b.s.node.id {
		return addr, true, 0
	}
	b.s.node.heardMu.Lock()
	at, ok := b.s.node.heard[lead]
	b.s.node.heardMu.Unlock()
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

// apply validates and replicates one command; a failed CAS is reported in
// the result, not as an error.
func (s *Server) apply(ctx context.Context, cmd *lodestonepb.Command) (*lodestonepb.CommandResult, uint64, error) {
	if err := s.cfg.Limits.ValidateCommand(cmd); err != nil {
		return nil, 0, toStatus(err)
	}
	r, err := s.node.proposeCommand(ctx, cmd)
	if err != nil {
		return nil, 0, toStatus(err)
	}
	res, ok := r.result.(*lodestonepb.CommandResult)
	if !ok || res == nil {
		return nil, 0, toStatus(fmt.Errorf("command at index %d produced no result", r.index))
	}
	return res, r.index, nil
}
