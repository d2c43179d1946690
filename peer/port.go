package peer

import (
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/grpcopt"
)

// Port serves a member's peer port: the Raft streams of t and the Peer
// gRPC service, told apart by their first bytes (peermux.go).
type Port struct {
	mux *peerMux
	srv *grpc.Server
}

// NewPort starts accepting on ln. members lists the cluster for the
// answer to a forwarded membership change.
func NewPort(ln net.Listener, t *Transport, local Local, members func() []*lodestonepb.Member, logger *slog.Logger) *Port {
	opts := append(grpcopt.PeerServerOptions(),
		grpc.MaxRecvMsgSize(maxMsgBytes), grpc.MaxSendMsgSize(maxMsgBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
	)
	// Every call must name this member's cluster (identity.go).
	srv := grpc.NewServer(append(opts, t.ServerOptions()...)...)
	lodestonepb.RegisterPeerServer(srv, &service{t: t, local: local, members: members})
	return &Port{mux: newPeerMux(ln, logger, t.ReceiveStream), srv: srv}
}

// Serve serves the gRPC side until Close.
func (p *Port) Serve() error { return p.srv.Serve(p.mux) }

// Close stops both sides and closes every connection they hold.
func (p *Port) Close() error {
	p.srv.Stop()
	return p.mux.Close()
}
