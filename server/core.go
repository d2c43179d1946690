package server

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/peer"
	"github.com/lodestone-kv/lodestone/raftlog"
	"github.com/lodestone-kv/lodestone/raftnode"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// core is what every service shares: the Raft node, the state machine, the
// watch hub and the settings. Services hold a *core, never the Server, so
// the files of this package depend one way: server.go builds the services,
// the services use core.
type core struct {
	ctx            context.Context // ends when the server closes
	cfg            Config          // as started; read live settings through live()
	liveCfg        atomic.Pointer[LiveConfig]
	logger         *slog.Logger
	metrics        *metrics
	sessionMetrics *sessionMetrics
	store          *store.Store
	hub            *watch.Hub
	log            *raftlog.Log
	raft           *raftnode.Node
	transport      *peer.Transport
	authz          *authz // authz.go
	holdMetrics    *holdMetrics
	stable         stableSince // consulops.go: members' health changes
	applyGate      applyGate   // http.go: the applied-index half of Ready
	published      atomic.Bool // server.go: this member's addresses are in the membership (Ready)

	peerAddr, grpcAddr, httpAddr string // as bound
	advertiseGRPC, advertiseHTTP string // as published for clients (advertise.go)
}

// header describes this member and the index a response reflects.
func (s *core) header(index uint64) *lodestonepb.ResponseHeader {
	st := s.raft.Status()
	return &lodestonepb.ResponseHeader{
		Index:       index,
		Term:        st.Term,
		LeaderId:    st.Lead,
		NodeId:      s.raft.ID(),
		KnownLeader: st.Lead != 0,
	}
}

// read makes a read linearizable when asked: it waits for a quorum-confirmed
// index to be applied here, holding while there is no leader (hold.go).
func (s *core) read(ctx context.Context, c lodestonepb.Consistency) error {
	if c == lodestonepb.Consistency_STALE || s.cfg.UnsafeStaleReads {
		return nil
	}
	return s.readIndex(ctx)
}

// readIndex is the read path's quorum round, held while there is no
// leader; read and the Consul API's ?consistent share it.
func (s *core) readIndex(ctx context.Context) error {
	return s.hold(ctx, holdRead, retryRead, func() error {
		_, err := s.raft.ReadIndex(ctx)
		return err
	})
}

// leaderRead is the read path of Consul's default mode
// (raftnode.LeaderRead), held while there is no leader.
func (s *core) leaderRead(ctx context.Context, began time.Time) error {
	return s.hold(ctx, holdRead, retryRead, func() error {
		return s.raft.LeaderRead(ctx, began)
	})
}

func (s *core) logStats() *lodestonepb.LogStats {
	st := s.log.Stats()
	return &lodestonepb.LogStats{
		FirstIndex: st.FirstIndex, LastIndex: st.LastIndex, FileBytes: uint64(st.FileBytes),
		FreePages: uint64(st.FreePages), PendingPages: uint64(st.PendingPages),
		FreeBytes: uint64(st.FreeBytes), FreelistBytes: uint64(st.FreelistBytes), SnapshotIndex: st.SnapshotIndex,
	}
}
