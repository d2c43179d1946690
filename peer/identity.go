package peer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/clusterid"
)

// Cluster identity on the peer port (doc.go has the design). Every peer
// gRPC call carries the sender's cluster id in the metadata key
// clusterMD, every Raft stream in its preamble, every snapshot stream in
// its first chunk too; whatever carries none, or another cluster's, is
// refused before it reaches Raft or the leader.

// clusterMD is the gRPC metadata key of the sender's cluster id (32 hex).
const clusterMD = "lodestone-cluster-id"

// Why the peer port refused something: the reason label of
// lodestone_peer_refused_total.
const (
	refusedNoCluster     = "no_cluster_id"    // the sender named no cluster (or an unreadable one)
	refusedCluster       = "cluster_mismatch" // the sender is in another cluster
	refusedNotLearned    = "not_learned"      // this joining member has no id yet
	refusedMemberCluster = "member_cluster"   // a conf change announced a member of another cluster
	refusedSnapOversize  = "snapshot_oversize"
	refusedSnapChunks    = "snapshot_chunks"
	refusedSnapTruncated = "snapshot_truncated"
	refusedSnapChecksum  = "snapshot_checksum"
	refusedSnapCorrupt   = "snapshot_corrupt"
	refusedSnapForeign   = "snapshot_foreign" // decodes, but as another cluster's state
	refusedSnapMalformed = "snapshot_malformed"
	refusalLogEvery      = time.Minute
	refusalLogMaxTracked = 4096
)

var refusedReasons = []string{refusedNoCluster, refusedCluster, refusedNotLearned, refusedMemberCluster,
	refusedSnapOversize, refusedSnapChunks, refusedSnapTruncated, refusedSnapChecksum, refusedSnapCorrupt,
	refusedSnapForeign, refusedSnapMalformed}

// ErrRefused is wrapped by every refusal of the peer port.
var ErrRefused = errors.New("refused by the peer port")

// RefusedError is why the peer port refused a call, a stream or a
// snapshot. Nothing of what was refused reached Raft.
type RefusedError struct {
	Reason string     // one of the refused* labels
	Code   codes.Code // the gRPC status it is sent as
	Msg    string
}

func (e *RefusedError) Error() string { return e.Msg }
func (e *RefusedError) Unwrap() error { return ErrRefused }

// GRPCStatus lets gRPC send the refusal with its code.
func (e *RefusedError) GRPCStatus() *status.Status { return status.New(e.Code, e.Msg) }

// Cluster is this member's cluster id; zero until a joining member has
// learned it.
func (t *Transport) Cluster() clusterid.ID {
	if p := t.cluster.Load(); p != nil {
		return *p
	}
	return clusterid.ID{}
}

// checkCluster refuses got unless it is this member's cluster. A member
// that has no id yet refuses everything here; it learns its id only
// through learn, from a Raft stream or a verified snapshot.
func (t *Transport) checkCluster(got clusterid.ID) *RefusedError {
	mine := t.Cluster()
	switch {
	case got.IsZero():
		return &RefusedError{Reason: refusedNoCluster, Code: codes.PermissionDenied,
			Msg: fmt.Sprintf("peer sent no cluster id; this server is in cluster %s", mine)}
	case mine.IsZero():
		return &RefusedError{Reason: refusedNotLearned, Code: codes.FailedPrecondition,
			Msg: fmt.Sprintf("peer is in cluster %s; this server joined a cluster and has not learned its id yet", got)}
	case got != mine:
		return &RefusedError{Reason: refusedCluster, Code: codes.PermissionDenied,
			Msg: fmt.Sprintf("peer is in cluster %s, this server is in cluster %s", got, mine)}
	}
	return nil
}

// learn adopts id as this member's cluster, if it has none, once the
// message that carried it came from a member this one was told of. It
// returns the refusal when id is not (or cannot become) this member's.
func (t *Transport) learn(id clusterid.ID, from uint64) *RefusedError {
	t.learnMu.Lock()
	defer t.learnMu.Unlock()
	if !t.Cluster().IsZero() || id.IsZero() {
		return t.checkCluster(id)
	}
	t.mu.Lock()
	_, known := t.peers[from]
	t.mu.Unlock()
	if !known {
		return &RefusedError{Reason: refusedNotLearned, Code: codes.FailedPrecondition,
			Msg: fmt.Sprintf("peer %x is in cluster %s, but it is not a member this server was told of, so it does not learn its cluster id from it", from, id)}
	}
	if t.onLearn != nil {
		if err := t.onLearn(id); err != nil {
			return &RefusedError{Reason: refusedNotLearned, Code: codes.Unavailable,
				Msg: fmt.Sprintf("learning cluster id %s: %v", id, err)}
		}
	}
	t.cluster.Store(&id)
	t.logger.Info("learned the cluster id", "cluster", id.String(), "from", fmt.Sprintf("%x", from))
	return nil
}

// refused counts a refusal and logs it, once a minute per remote host and
// reason, so a misconfigured peer redialling every second does not flood
// the log. It returns e for the caller to send.
func (t *Transport) refused(remote string, e *RefusedError) *RefusedError {
	t.metrics.refused.WithLabelValues(e.Reason).Inc()
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h
	}
	if t.refusals.allow(host+" "+e.Reason, time.Now()) {
		t.logger.Warn("refused a peer", "remote", remote, "reason", e.Reason, "err", e.Msg)
	}
	return e
}

// logLimiter allows one log line per key per refusalLogEvery.
type logLimiter struct {
	mu   sync.Mutex
	last map[string]time.Time
}

func (l *logLimiter) allow(key string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = map[string]time.Time{}
	}
	if at, ok := l.last[key]; ok && now.Sub(at) < refusalLogEvery {
		return false
	}
	if len(l.last) >= refusalLogMaxTracked {
		// NB: bounds the map under a storm of hosts; forgetting only
		// means one more line for a host.
		for k, at := range l.last {
			if now.Sub(at) >= refusalLogEvery {
				delete(l.last, k)
			}
		}
		if len(l.last) >= refusalLogMaxTracked {
			clear(l.last)
		}
	}
	l.last[key] = now
	return true
}

// remoteAddr is the caller's address of a gRPC call, for logs.
func remoteAddr(ctx context.Context) string {
	if p, ok := grpcpeer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return "unknown"
}

// clusterFromMD reads the sender's id from a call's metadata (zero: none,
// or not an id).
func clusterFromMD(ctx context.Context) clusterid.ID {
	md, _ := metadata.FromIncomingContext(ctx)
	vs := md.Get(clusterMD)
	if len(vs) != 1 {
		return clusterid.ID{}
	}
	id, err := clusterid.Parse(strings.TrimSpace(vs[0]))
	if err != nil {
		return clusterid.ID{}
	}
	return id
}

// snapshotMethod is checked in receiveSnapshot, against its first chunk
// too, so that a joining member can learn its id from a verified snapshot.
var snapshotMethod = "/" + lodestonepb.Peer_ServiceDesc.ServiceName + "/Snapshot"

// unaryCheck and streamCheck are the peer gRPC server's interceptors.
func (t *Transport) unaryCheck(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if e := t.checkCluster(clusterFromMD(ctx)); e != nil {
		return nil, t.refused(remoteAddr(ctx), e)
	}
	return handler(ctx, req)
}

func (t *Transport) streamCheck(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if info.FullMethod != snapshotMethod {
		if e := t.checkCluster(clusterFromMD(ss.Context())); e != nil {
			return t.refused(remoteAddr(ss.Context()), e)
		}
	}
	return handler(srv, ss)
}

// withCluster adds this member's id to an outgoing call; a member that
// has none yet sends none (and is refused).
func (t *Transport) withCluster(ctx context.Context) context.Context {
	if id := t.Cluster(); !id.IsZero() {
		return metadata.AppendToOutgoingContext(ctx, clusterMD, id.String())
	}
	return ctx
}

func (t *Transport) unarySend(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(t.withCluster(ctx), method, req, reply, cc, opts...)
}

func (t *Transport) streamSend(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	return streamer(t.withCluster(ctx), desc, cc, method, opts...)
}

// ServerOptions are the peer gRPC server's options for t's checks.
func (t *Transport) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(t.unaryCheck), grpc.ChainStreamInterceptor(t.streamCheck)}
}

// SetCluster sets this member's cluster id. Call it before the peer port
// serves anything; a joining member learns its id instead.
func (t *Transport) SetCluster(id clusterid.ID) { t.cluster.Store(&id) }
