package server

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// fakeLeader answers leaderIndexer calls one at a time, as the test says.
type fakeLeader struct {
	started chan struct{} // one send per call, when it starts
	answer  chan uint64   // the index each call returns
}

func (f *fakeLeader) ask(ctx context.Context) (uint64, error) {
	select {
	case f.started <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	select {
	case i := <-f.answer:
		return i, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// A read that starts while a call is out must not take that call's
// answer: the leader may have given it before the read began. Every read
// waiting meanwhile shares the next call.
func TestLeaderIndexerReadsWaitForACallSentAfterThem(t *testing.T) {
	f := &fakeLeader{started: make(chan struct{}), answer: make(chan uint64)}
	l := newLeaderIndexer(f.ask)
	defer l.close()
	ctx := context.Background()

	type got struct {
		index uint64
		err   error
	}
	read := func() chan got {
		ch := make(chan got, 1)
		go func() {
			i, err := l.index(ctx, time.Now())
			ch <- got{i, err}
		}()
		return ch
	}

	first := read()
	<-f.started // call 1 is out
	const later = 5
	var waiting []chan got
	for range later {
		waiting = append(waiting, read())
	}
	// Every later read is queued for call 2 before call 1 answers.
	waitFor(t, time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.next != nil && l.next.reads == later
	})
	f.answer <- 10
	if g := <-first; g.index != 10 || g.err != nil {
		t.Fatalf("first read: %d, %v; want 10", g.index, g.err)
	}
	<-f.started // call 2 starts for the later reads
	select {
	case g := <-waiting[0]:
		t.Fatalf("a read that started during call 1 returned %d before call 2 answered", g.index)
	case <-time.After(20 * time.Millisecond):
	}
	f.answer <- 20
	for i, ch := range waiting {
		if g := <-ch; g.index != 20 || g.err != nil {
			t.Errorf("later read %d: %d, %v; want 20 from the one shared call", i, g.index, g.err)
		}
	}
	// No read waits: no third call starts.
	select {
	case <-f.started:
		t.Fatal("a call started with no read waiting")
	case <-time.After(20 * time.Millisecond):
	}
}

// A read that began before the last answered call was sent takes its
// answer with no call of its own (a parked blocking query's read began
// when it parked); a read that began after it, or after a failed call,
// waits for a new one.
func TestLeaderIndexerReusesACallSentAfterTheRead(t *testing.T) {
	f := &fakeLeader{started: make(chan struct{}), answer: make(chan uint64)}
	l := newLeaderIndexer(f.ask)
	defer l.close()
	ctx := context.Background()
	read := func(began time.Time) chan uint64 {
		ch := make(chan uint64, 1)
		go func() {
			i, err := l.index(ctx, began)
			if err != nil {
				t.Errorf("read: %v", err)
			}
			ch <- i
		}()
		return ch
	}
	answer := func(ch chan uint64, what string) uint64 {
		t.Helper()
		select {
		case i := <-ch:
			return i
		case <-time.After(2 * time.Second):
			t.Fatalf("%s: no answer within 2s", what)
			return 0
		}
	}
	parked := time.Now()
	first := read(time.Now())
	<-f.started
	f.answer <- 10
	if i := <-first; i != 10 {
		t.Fatalf("first read: %d, want 10", i)
	}
	if i := answer(read(parked), "a read that began before the call"); i != 10 {
		t.Errorf("a read that began before the call: %d, want its answer 10", i)
	}
	later := read(time.Now())
	select {
	case <-f.started: // NB: the call the later read needs
	case i := <-later:
		t.Fatalf("a read that began after the last call was sent took its answer %d", i)
	}
	f.answer <- 20
	if i := <-later; i != 20 {
		t.Errorf("later read: %d, want 20 from a call of its own", i)
	}
	if i := answer(read(parked), "the parked read again"); i != 20 {
		t.Errorf("the parked read again: %d, want the newest answer 20", i)
	}
	select {
	case <-f.started:
		t.Fatal("a call started for reads the last call settles")
	case <-time.After(20 * time.Millisecond):
	}
}

// close fails the call out and refuses reads after it, leaving no
// goroutine behind (TestMain checks for leaks).
func TestLeaderIndexerClose(t *testing.T) {
	f := &fakeLeader{started: make(chan struct{}), answer: make(chan uint64)}
	l := newLeaderIndexer(f.ask)
	var wg sync.WaitGroup
	wg.Add(1)
	var err error
	go func() {
		defer wg.Done()
		_, err = l.index(context.Background(), time.Now())
	}()
	<-f.started
	l.close()
	wg.Wait()
	if !errors.Is(err, context.Canceled) {
		t.Errorf("read out at close: %v, want context.Canceled", err)
	}
	if _, err := l.index(context.Background(), time.Now()); !errors.Is(err, errStopped) {
		t.Errorf("read after close: %v, want errStopped", err)
	}
}

// A reader's own context bounds its wait; the call goes on for others.
func TestLeaderIndexerReaderContext(t *testing.T) {
	f := &fakeLeader{started: make(chan struct{}), answer: make(chan uint64)}
	l := newLeaderIndexer(f.ask)
	defer l.close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := l.index(ctx, time.Now())
		done <- err
	}()
	<-f.started
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("canceled reader: %v, want context.Canceled", err)
	}
	f.answer <- 1
}

// The leader answers LeaderIndex only when it could serve the read
// itself: leading, holding every committed entry, and not of an older
// term than the follower asking.
func TestLeaderIndexAnswersOnlyAsAServingLeader(t *testing.T) {
	for _, tc := range []struct {
		name    string
		st      nodeStatus
		askTerm uint64
		want    uint64 // 0: refused
	}{
		{"leader", nodeStatus{state: raft.StateLeader, term: 3, commit: 40, termStart: 35}, 3, 40},
		{"asker behind", nodeStatus{state: raft.StateLeader, term: 3, commit: 40, termStart: 35}, 2, 40},
		{"follower", nodeStatus{state: raft.StateFollower, term: 3, commit: 40}, 3, 0},
		{"new leader before its first commit", nodeStatus{state: raft.StateLeader, term: 3, commit: 34, termStart: 35}, 3, 0},
		{"deposed leader", nodeStatus{state: raft.StateLeader, term: 3, commit: 40, termStart: 35}, 4, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &node{}
			n.status.Store(&tc.st)
			index, term, err := n.leaderIndex(tc.askTerm)
			switch {
			case tc.want == 0 && !errors.Is(err, errNotLeader):
				t.Errorf("got %d, %v; want errNotLeader", index, err)
			case tc.want != 0 && (err != nil || index != tc.want || term != tc.st.term):
				t.Errorf("got index %d term %d, %v; want %d, %d", index, term, err, tc.want, tc.st.term)
			}
		})
	}
}

// A follower asks its leader over one stream, reopened only when the
// leader changes; a refusal keeps the stream, and every answer is at or
// past the writes the leader acknowledged before the question.
func TestIndexStreamFollowsTheLeader(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	fol := c.follower()
	n := c.servers[fol].node
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ask := func(want uint64) {
		t.Helper()
		index, err := n.askLeaderIndex(ctx)
		if err != nil || index < want {
			t.Fatalf("%s asked its leader: index %d, %v; want at least %d", fol, index, err, want)
		}
	}
	putIndex := func(on string) uint64 {
		t.Helper()
		resp, err := c.kv(on).Put(ctx, &lodestonepb.PutRequest{Key: []byte("idx"), Value: []byte(on)})
		if err != nil {
			t.Fatalf("put on %s: %v", on, err)
		}
		return resp.GetHeader().GetIndex()
	}

	// current reads the stream under its lock: the node's own reads may
	// use it too.
	current := func() (uint64, lodestonepb.Peer_LeaderIndexStreamClient) {
		n.indexStream.mu.Lock()
		defer n.indexStream.mu.Unlock()
		return n.indexStream.lead, n.indexStream.stream
	}

	ask(putIndex(lead))
	_, first := current()
	for range 5 {
		ask(putIndex(lead))
	}
	if to, stream := current(); stream != first || to != c.servers[lead].ID() {
		t.Fatalf("asks to one leader opened another stream, or the stream is to %x, not the leader %x", to, c.servers[lead].ID())
	}

	var other string
	for _, name := range c.names {
		if name != lead && name != fol {
			other = name
		}
	}
	if _, err := c.servers[lead].node.transferLeader(ctx, c.servers[other].ID()); err != nil {
		t.Fatalf("transfer leadership to %s: %v", other, err)
	}
	if got := c.waitLeader(); got != other {
		t.Fatalf("leader after the transfer is %s, want %s", got, other)
	}
	ask(putIndex(other))
	if to, _ := current(); to != c.servers[other].ID() {
		t.Fatalf("after the leader changed the stream is to %x, want the new leader %x", to, c.servers[other].ID())
	}

	// The old leader refuses, and the stream to it stays open.
	st := n.status.Load()
	_, err := n.indexStream.ask(ctx, c.servers[lead].ID(), st.term, c.electionTimeout(), n.transport.peerClient)
	if !errors.Is(err, errNotLeader) {
		t.Fatalf("asking the deposed leader: %v, want errNotLeader", err)
	}
	if to, stream := current(); stream == nil || to != c.servers[lead].ID() {
		t.Fatal("a refusal closed the stream")
	}
	ask(putIndex(other)) // and back to the leader
}

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
