// Package clienttest serves fake Lodestone KV, Cluster and Watch services
// over real gRPC on loopback sockets, for tests of the client and of the
// CLI.
//
// A Server answers each RPC with the matching function of its Funcs (nil:
// Unimplemented), counts calls per method, and can cut every connection it
// accepted to simulate a server dying mid-call. Memory provides Funcs
// backed by an in-memory KV store and a static membership, for tests that
// need plausible answers rather than scripted ones. WatchLog serves the
// Watch service from an in-memory history, with faults (broken streams,
// resyncs, replayed duplicates, silence) for testing resume logic.
//
// It knows nothing of Raft: the fakes answer at once, from one map.
package clienttest

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Funcs answers RPCs. A nil field answers Unimplemented.
type Funcs struct {
	Get     func(context.Context, *lodestonepb.GetRequest) (*lodestonepb.GetResponse, error)
	GetMany func(context.Context, *lodestonepb.GetManyRequest) (*lodestonepb.GetManyResponse, error)
	// GetStream serves one GetStream.
	GetStream func(lodestonepb.KV_GetStreamServer) error
	Range     func(context.Context, *lodestonepb.RangeRequest) (*lodestonepb.RangeResponse, error)
	Put       func(context.Context, *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error)
	Delete    func(context.Context, *lodestonepb.DeleteRequest) (*lodestonepb.DeleteResponse, error)
	Txn       func(context.Context, *lodestonepb.TxnRequest) (*lodestonepb.TxnResponse, error)

	Members        func(context.Context, *lodestonepb.MembersRequest) (*lodestonepb.MembersResponse, error)
	AddMember      func(context.Context, *lodestonepb.AddMemberRequest) (*lodestonepb.AddMemberResponse, error)
	RemoveMember   func(context.Context, *lodestonepb.RemoveMemberRequest) (*lodestonepb.RemoveMemberResponse, error)
	PromoteMember  func(context.Context, *lodestonepb.PromoteMemberRequest) (*lodestonepb.PromoteMemberResponse, error)
	TransferLeader func(context.Context, *lodestonepb.TransferLeaderRequest) (*lodestonepb.TransferLeaderResponse, error)
	Status         func(context.Context, *lodestonepb.StatusRequest) (*lodestonepb.StatusResponse, error)

	// Watch serves one Watch stream (see WatchLog.Serve).
	Watch func(lodestonepb.Watch_WatchServer) error
}

// Server is a gRPC server on 127.0.0.1 serving Funcs.
type Server struct {
	// Addr is the server's host:port.
	Addr string

	srv *grpc.Server
	lis *trackingListener
	wg  sync.WaitGroup

	mu    sync.Mutex
	calls map[string]int // by method name, e.g. "Put"
}

// Start serves f on a fresh loopback port until the test ends (or Stop).
func Start(tb testing.TB, f *Funcs) *Server {
	tb.Helper()
	return StartAt(tb, "127.0.0.1:0", f)
}

// StartAt serves f on addr (host:port) until the test ends (or Stop), e.g.
// to bring a server back on the port of one that stopped.
func StartAt(tb testing.TB, addr string, f *Funcs) *Server {
	tb.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatalf("clienttest: listen on %s: %v", addr, err)
	}
	s := &Server{
		Addr:  l.Addr().String(),
		lis:   &trackingListener{Listener: l},
		calls: map[string]int{},
	}
	s.srv = grpc.NewServer(grpc.UnaryInterceptor(s.count))
	lodestonepb.RegisterKVServer(s.srv, &kvServer{f: f})
	lodestonepb.RegisterClusterServer(s.srv, &clusterServer{f: f})
	lodestonepb.RegisterWatchServer(s.srv, &watchServer{f: f})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.srv.Serve(s.lis)
	}()
	tb.Cleanup(s.Stop)
	return s
}

func (s *Server) count(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	name := info.FullMethod
	for i := len(name) - 1; i >= 0; i-- {
		if name[i] == '/' {
			name = name[i+1:]
			break
		}
	}
	s.mu.Lock()
	s.calls[name]++
	s.mu.Unlock()
	return h(ctx, req)
}

// Calls returns how many times method (e.g. "Put") was called.
func (s *Server) Calls(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[method]
}

// DropConnections closes every connection the server accepted, at the TCP
// level, without a GOAWAY: clients see their in-flight calls fail mid-call.
// The server keeps listening.
func (s *Server) DropConnections() { s.lis.closeAll() }

// Stop closes the listener and every connection and waits for the server's
// goroutines. It is idempotent.
func (s *Server) Stop() {
	s.srv.Stop()
	s.wg.Wait()
}

type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *trackingListener) closeAll() {
	l.mu.Lock()
	conns := l.conns
	l.conns = nil
	l.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

func unimplemented(method string) error {
	return status.Errorf(codes.Unimplemented, "clienttest: %s not scripted", method)
}

type kvServer struct {
	lodestonepb.UnimplementedKVServer
	f *Funcs
}

func (s *kvServer) Get(ctx context.Context, r *lodestonepb.GetRequest) (*lodestonepb.GetResponse, error) {
	if s.f.Get == nil {
		return nil, unimplemented("Get")
	}
	return s.f.Get(ctx, r)
}

func (s *kvServer) GetMany(ctx context.Context, r *lodestonepb.GetManyRequest) (*lodestonepb.GetManyResponse, error) {
	if s.f.GetMany == nil {
		return nil, unimplemented("GetMany")
	}
	return s.f.GetMany(ctx, r)
}

func (s *kvServer) GetStream(st lodestonepb.KV_GetStreamServer) error {
	if s.f.GetStream == nil {
		return unimplemented("GetStream")
	}
	return s.f.GetStream(st)
}

func (s *kvServer) Range(ctx context.Context, r *lodestonepb.RangeRequest) (*lodestonepb.RangeResponse, error) {
	if s.f.Range == nil {
		return nil, unimplemented("Range")
	}
	return s.f.Range(ctx, r)
}

func (s *kvServer) Put(ctx context.Context, r *lodestonepb.PutRequest) (*lodestonepb.PutResponse, error) {
	if s.f.Put == nil {
		return nil, unimplemented("Put")
	}
	return s.f.Put(ctx, r)
}

func (s *kvServer) Delete(ctx context.Context, r *lodestonepb.DeleteRequest) (*lodestonepb.DeleteResponse, error) {
	if s.f.Delete == nil {
		return nil, unimplemented("Delete")
	}
	return s.f.Delete(ctx, r)
}

func (s *kvServer) Txn(ctx context.Context, r *lodestonepb.TxnRequest) (*lodestonepb.TxnResponse, error) {
	if s.f.Txn == nil {
		return nil, unimplemented("Txn")
	}
	return s.f.Txn(ctx, r)
}

type clusterServer struct {
	lodestonepb.UnimplementedClusterServer
	f *Funcs
}

func (s *clusterServer) Members(ctx context.Context, r *lodestonepb.MembersRequest) (*lodestonepb.MembersResponse, error) {
	if s.f.Members == nil {
		return nil, unimplemented("Members")
	}
	return s.f.Members(ctx, r)
}

func (s *clusterServer) AddMember(ctx context.Context, r *lodestonepb.AddMemberRequest) (*lodestonepb.AddMemberResponse, error) {
	if s.f.AddMember == nil {
		return nil, unimplemented("AddMember")
	}
	return s.f.AddMember(ctx, r)
}

func (s *clusterServer) RemoveMember(ctx context.Context, r *lodestonepb.RemoveMemberRequest) (*lodestonepb.RemoveMemberResponse, error) {
	if s.f.RemoveMember == nil {
		return nil, unimplemented("RemoveMember")
	}
	return s.f.RemoveMember(ctx, r)
}

func (s *clusterServer) PromoteMember(ctx context.Context, r *lodestonepb.PromoteMemberRequest) (*lodestonepb.PromoteMemberResponse, error) {
	if s.f.PromoteMember == nil {
		return nil, unimplemented("PromoteMember")
	}
	return s.f.PromoteMember(ctx, r)
}

func (s *clusterServer) TransferLeader(ctx context.Context, r *lodestonepb.TransferLeaderRequest) (*lodestonepb.TransferLeaderResponse, error) {
	if s.f.TransferLeader == nil {
		return nil, unimplemented("TransferLeader")
	}
	return s.f.TransferLeader(ctx, r)
}

func (s *clusterServer) Status(ctx context.Context, r *lodestonepb.StatusRequest) (*lodestonepb.StatusResponse, error) {
	if s.f.Status == nil {
		return nil, unimplemented("Status")
	}
	return s.f.Status(ctx, r)
}

type watchServer struct {
	lodestonepb.UnimplementedWatchServer
	f *Funcs
}

func (s *watchServer) Watch(stream lodestonepb.Watch_WatchServer) error {
	if s.f.Watch == nil {
		return unimplemented("Watch")
	}
	return s.f.Watch(stream)
}
