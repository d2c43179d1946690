package peer

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/raftnode"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// silentPeer takes LeaderIndexStream questions and never answers, like a
// leader cut off behind a network that drops its packets.
type silentPeer struct {
	lodestonepb.UnimplementedPeerServer
}

func (silentPeer) LeaderIndexStream(stream lodestonepb.Peer_LeaderIndexStreamServer) error {
	<-stream.Context().Done()
	return stream.Context().Err()
}

// A question nobody answers fails after the timeout and closes the
// stream, so the reads behind it fall back to ReadIndex instead of
// waiting, and a late answer cannot reach the next question.
func TestIndexStreamTimesOut(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	lodestonepb.RegisterPeerServer(srv, silentPeer{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := func(uint64) (lodestonepb.PeerClient, bool) { return lodestonepb.NewPeerClient(cc), true }

	var s indexStream
	defer s.close()
	const timeout = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	asked := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := s.ask(ctx, 7, 1, timeout, client)
		asked <- err
	}()
	select {
	case err = <-asked:
	case <-time.After(10 * timeout):
		cancel() // NB: ends the stream, so the ask returns before the test does
		<-asked
		t.Fatalf("ask of a silent leader still waiting after %v; want an error after about %v", 10*timeout, timeout)
	}
	if took := time.Since(start); err == nil || took < timeout {
		t.Fatalf("ask of a silent leader: %v after %v; want an error after about %v", err, took, timeout)
	}
	if s.stream != nil {
		t.Fatal("the stream stayed open after a question timed out")
	}
}

// fakeLocal is a member whose LeaderIndex answers as the test sets.
type fakeLocal struct {
	mu     sync.Mutex
	leader bool
	index  uint64
}

func (f *fakeLocal) set(leader bool, index uint64) {
	f.mu.Lock()
	f.leader, f.index = leader, index
	f.mu.Unlock()
}

func (f *fakeLocal) LeaderIndex(term uint64) (uint64, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.leader {
		return 0, 0, raftnode.ErrNotLeader
	}
	return f.index, term, nil
}

func (*fakeLocal) ChangeConf(context.Context, raftpb.ConfChangeV2, *lodestonepb.Member) (uint64, error) {
	return 0, raftnode.ErrNotLeader
}

func (*fakeLocal) TransferLeader(context.Context, uint64) (uint64, error) {
	return 0, raftnode.ErrNotLeader
}

// servePort serves a peer port for local on loopback until the test ends.
func servePort(t *testing.T, self uint64, local Local) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := newTestTransport(self, testNode{}, nil)
	p := NewPort(ln, tr, local, func() []*lodestonepb.Member { return nil }, slog.New(slog.DiscardHandler))
	served := make(chan error, 1)
	go func() { served <- p.Serve() }()
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close port: %v", err)
		}
		<-served
		tr.Close()
	})
	return ln.Addr().String()
}

// A follower asks its leader over one stream, reopened only when the
// leader changes; a refusal keeps the stream.
func TestIndexStreamFollowsTheLeader(t *testing.T) {
	a, b := &fakeLocal{leader: true, index: 10}, &fakeLocal{}
	tr := newTestTransport(3, testNode{}, nil)
	defer tr.Close()
	for id, local := range map[uint64]*fakeLocal{1: a, 2: b} {
		if err := tr.SetPeer(id, servePort(t, id, local)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	ask := func(lead, want uint64) {
		t.Helper()
		index, err := tr.AskLeaderIndex(ctx, lead, 1, 5*time.Second)
		if err != nil || index != want {
			t.Fatalf("ask %d: index %d, %v; want %d", lead, index, err, want)
		}
	}
	current := func() (uint64, lodestonepb.Peer_LeaderIndexStreamClient) {
		tr.index.mu.Lock()
		defer tr.index.mu.Unlock()
		return tr.index.lead, tr.index.stream
	}

	ask(1, 10)
	_, first := current()
	for i := range uint64(5) {
		a.set(true, 11+i)
		ask(1, 11+i)
	}
	if to, stream := current(); stream != first || to != 1 {
		t.Fatalf("asks to one leader opened another stream, or the stream is to %x, not 1", to)
	}

	a.set(false, 0)
	b.set(true, 20)
	ask(2, 20)
	if to, _ := current(); to != 2 {
		t.Fatalf("after the leader changed the stream is to %x, want 2", to)
	}

	// The old leader refuses, and the stream to it stays open.
	if _, err := tr.AskLeaderIndex(ctx, 1, 1, 5*time.Second); !errors.Is(err, raftnode.ErrNotLeader) {
		t.Fatalf("asking the deposed leader: %v, want ErrNotLeader", err)
	}
	if to, stream := current(); stream == nil || to != 1 {
		t.Fatal("a refusal closed the stream")
	}
	ask(2, 20) // and back to the leader
}
