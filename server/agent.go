package server

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/checks"
	"github.com/lodestone-kv/lodestone/gossip"
	"github.com/lodestone-kv/lodestone/internal/rpcstatus"
	"github.com/lodestone-kv/lodestone/raftnode"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/server/localagent"
)

// The server as a Consul agent: its local agent (package localagent: the
// services and checks registered through its /v1/agent API, run here)
// and its membership for /v1/agent/self, members, join and leave.

// agentDir is where the local agent keeps its registrations.
const agentDir = "agent"

// openLocalAgent loads the local agent's registrations from the data dir.
func (s *Server) openLocalAgent() (*localagent.Agent, error) {
	node, addr := s.agentNode()
	c := s.cfg.Catalog
	return localagent.New(localagent.Config{
		Node: node, Address: addr, Dir: filepath.Join(s.cfg.DataDir, agentDir), Catalog: s.store,
		Apply: s.write,
		// NB: not the held read path: the local agent retries by itself,
		// and its reads must not count as clients' held requests.
		Barrier: func(ctx context.Context) error { return s.raft.LeaderRead(ctx, time.Now()) },
		Checks: checks.Options{EnableScriptChecks: c.EnableScriptChecks, MinInterval: c.CheckMinInterval,
			MinDeregisterAfter: c.MinDeregisterCriticalServiceAfter},
		ReapInterval: c.CheckReapInterval, AntiEntropyInterval: c.AgentAntiEntropyInterval,
		Logger: s.logger.With("component", "localagent"), Registerer: s.metrics.reg,
	})
}

// membership is the Server as consulapi.Membership.
type membership struct{ s *Server }

var _ consulapi.Membership = membership{}

func (m membership) Members() ([]gossip.Member, string, bool) {
	if m.s.gossip == nil {
		return nil, "", false
	}
	return m.s.gossip.pool.Members(), m.s.gossip.pool.Name(), true
}

func (m membership) Join(addrs []string) (int, error) {
	if m.s.gossip == nil {
		return 0, errors.New("gossip is off on this server: start it with --gossip-listen to join a pool")
	}
	return m.s.gossip.pool.Join(addrs)
}

func (m membership) Leave(ctx context.Context) error { return m.s.leave(ctx) }

// NodeID is the member id in a UUID's form: zeros, then its 16 hex
// digits.
func (m membership) NodeID() string {
	h := fmt.Sprintf("%016x", m.s.raft.ID())
	return "00000000-0000-0000-" + h[:4] + "-" + h[4:]
}

// Stats are the sections of Consul's /v1/agent/self Stats that describe
// a server: its agent, Raft and runtime.
func (m membership) Stats() map[string]map[string]string {
	s := m.s
	st := s.raft.Status()
	voters := 0
	for _, mem := range s.store.Members() {
		if !mem.Learner {
			voters++
		}
	}
	itoa := func(n uint64) string { return strconv.FormatUint(n, 10) }
	node, _ := s.agentNode()
	ns, _ := s.store.Node(node)
	cs, _ := s.store.NodeChecks(node)
	return map[string]map[string]string{
		"agent": {"services": strconv.Itoa(len(ns.GetServices())), "checks": strconv.Itoa(len(cs))},
		"consul": {"server": "true", "leader": strconv.FormatBool(st.State == raftnode.StateLeader),
			"known_datacenters": "1", "leader_addr": s.store.PeerAddr(st.Lead)},
		"raft": {"state": st.State.String(), "term": itoa(st.Term), "commit_index": itoa(st.Commit),
			"applied_index": itoa(s.raft.Applied()), "num_peers": strconv.Itoa(max(voters-1, 0))},
		"runtime": {"goroutines": strconv.Itoa(runtime.NumGoroutine()), "version": runtime.Version(),
			"os": runtime.GOOS, "arch": runtime.GOARCH, "cpu_count": strconv.Itoa(runtime.NumCPU())},
	}
}

// leave is Consul's agent leave on a server: it leaves the Raft
// configuration (after handing leadership over when it leads; refused, as
// `lodestone members remove` without --force, when fewer than two voters
// would remain) and then stops: Done yields nil. Closing announces the
// departure in the gossip pool, so the leader marks its node's serfHealth
// "left".
func (s *Server) leave(ctx context.Context) error {
	id := s.raft.ID()
	var self *lodestonepb.Member
	others := 0 // voters but this one
	for _, m := range s.store.Members() {
		switch {
		case m.Id == id:
			self = m
		case !m.Learner:
			others++
		}
	}
	if self == nil {
		return status.Error(codes.FailedPrecondition, "refused to leave: this server is not a member of the cluster")
	}
	if !self.Learner && others < 2 {
		return status.Errorf(codes.FailedPrecondition,
			"refused to leave: %d voter(s) would remain, and the cluster would stop at the first failure; add a member first, or remove this one with lodestone members remove --force", others)
	}
	if s.raft.Status().State == raftnode.StateLeader {
		if _, err := s.transferLeader(ctx, 0); err != nil {
			return rpcstatus.Of(fmt.Errorf("hand leadership over before leaving: %w", err))
		}
	}
	// NB: set first: this member may apply its removal before the call
	// returns, and Done must see it asked for it.
	s.left.Store(true)
	if err := s.removeSelf(ctx, self); err != nil {
		s.left.Store(false)
		return rpcstatus.Of(fmt.Errorf("leave the cluster: %w", err))
	}
	s.logger.Info("left the cluster on request; stopping")
	select {
	case s.errC <- nil:
	default:
	}
	return nil
}

// removeSelf proposes this member's removal. Unlike changeConf it does not
// wait for this member to apply it: it may never see it committed
// (raftnode.MarkRemoved). A leader just elected (after the hand-over in
// leave) has not heard from every voter yet, and the strict
// reconfiguration check refuses until it has: that refusal is retried
// for two election timeouts.
func (s *Server) removeSelf(ctx context.Context, self *lodestonepb.Member) error {
	cc := raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeRemoveNode, NodeID: self.Id}}}
	deadline := time.Now().Add(2 * s.raft.ElectionTimeout())
	for {
		var err error
		if s.raft.Status().State == raftnode.StateLeader {
			_, err = s.raft.ChangeConf(ctx, cc, self)
		} else {
			_, err = s.forwardConfChange(ctx, cc, self)
		}
		quorum := errors.Is(err, raftnode.ErrQuorum) || strings.Contains(status.Convert(err).Message(), raftnode.ErrQuorum.Error())
		if err == nil || !quorum || time.Now().After(deadline) {
			return err
		}
		select {
		case <-time.After(s.cfg.TickInterval):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
