package raftnode

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
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
	l := newLeaderIndexer(f.ask, wallClock{})
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
	l := newLeaderIndexer(f.ask, wallClock{})
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
	l := newLeaderIndexer(f.ask, wallClock{})
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
	if _, err := l.index(context.Background(), time.Now()); !errors.Is(err, ErrStopped) {
		t.Errorf("read after close: %v, want ErrStopped", err)
	}
}

// A reader's own context bounds its wait; the call goes on for others.
func TestLeaderIndexerReaderContext(t *testing.T) {
	f := &fakeLeader{started: make(chan struct{}), answer: make(chan uint64)}
	l := newLeaderIndexer(f.ask, wallClock{})
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
		st      Status
		askTerm uint64
		want    uint64 // 0: refused
	}{
		{"leader", Status{State: raft.StateLeader, Term: 3, Commit: 40, TermStart: 35}, 3, 40},
		{"asker behind", Status{State: raft.StateLeader, Term: 3, Commit: 40, TermStart: 35}, 2, 40},
		{"follower", Status{State: raft.StateFollower, Term: 3, Commit: 40}, 3, 0},
		{"new leader before its first commit", Status{State: raft.StateLeader, Term: 3, Commit: 34, TermStart: 35}, 3, 0},
		{"deposed leader", Status{State: raft.StateLeader, Term: 3, Commit: 40, TermStart: 35}, 4, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &Node{}
			n.status.Store(&tc.st)
			index, term, err := n.LeaderIndex(tc.askTerm)
			switch {
			case tc.want == 0 && !errors.Is(err, ErrNotLeader):
				t.Errorf("got %d, %v; want ErrNotLeader", index, err)
			case tc.want != 0 && (err != nil || index != tc.want || term != tc.st.Term):
				t.Errorf("got index %d term %d, %v; want %d, %d", index, term, err, tc.want, tc.st.Term)
			}
		})
	}
}
