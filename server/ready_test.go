package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// TestReadyFollowsTheQuorum: Ready and /readyz say the same, ready with
// a leader and ErrNoLeader once the quorum is gone (the leader steps down
// under CheckQuorum), while Healthy holds throughout.
func TestReadyFollowsTheQuorum(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	s := c.servers[lead]
	readyz := func() (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + s.HTTPAddr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Reason string `json:"reason"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, body.Reason
	}
	waitFor(t, 5*time.Second, func() bool { return s.Ready() == nil })
	if code, reason := readyz(); code != http.StatusOK || reason != "" {
		t.Fatalf("ready member: /readyz %d %q", code, reason)
	}
	for _, f := range c.followersOf(lead) {
		c.stop(f)
	}
	waitFor(t, 10*time.Second, func() bool { return errors.Is(s.Ready(), ErrNoLeader) })
	if code, reason := readyz(); code != http.StatusServiceUnavailable || reason != ErrNoLeader.Error() {
		t.Errorf("member without a quorum: /readyz %d %q, want 503 %q", code, reason, ErrNoLeader)
	}
	if err := s.Healthy(); err != nil {
		t.Errorf("Healthy = %v, want nil while the Raft loop runs", err)
	}
}

// TestReadyHoldsUnderWrites: a member applies each entry just after it
// commits, so under writes applied trails commit at most instants. Ready
// must not flap then: with the old rule (applied == commit) the leader
// read ErrApplying in the gaps between commit and apply.
func TestReadyHoldsUnderWrites(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	s := c.servers[lead]
	waitFor(t, 5*time.Second, func() bool { return s.Ready() == nil })
	kv := c.kv(lead)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // NB: ends the writers if the test fails early
	var writers sync.WaitGroup
	var puts atomic.Int64
	for w := range 16 {
		writers.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				_, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: []byte(fmt.Sprintf("ready/%d/%d", w, i)), Value: []byte("v")})
				if err == nil {
					puts.Add(1)
				}
			}
		})
	}
	var checks, notReady int
	var last error
	start := time.Now()
	for ; time.Since(start) < 2*time.Second || puts.Load() < 200; checks++ {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("only %d puts in 30s", puts.Load())
		}
		if err := s.Ready(); err != nil {
			notReady, last = notReady+1, err
		}
	}
	cancel()
	writers.Wait()
	if notReady > 0 {
		t.Errorf("leader under %d puts: not ready in %d of %d checks (last: %v)", puts.Load(), notReady, checks, last)
	}
}

// TestApplyGate: before its first catch-up a member waits for the commit
// index it first saw; afterwards it tolerates a gap of up to lag entries.
func TestApplyGate(t *testing.T) {
	var g applyGate
	steps := []struct {
		commit, applied uint64
		want            bool
	}{
		{100, 10, false},  // restarted: 90 entries to apply; target is 100
		{150, 99, false},  // the target stays the first commit seen
		{160, 100, true},  // target reached: 60 behind is within the lag
		{160, 159, true},  // the usual gap under writes
		{300, 199, false}, // fell more than lag (100) behind
		{300, 200, true},
	}
	for i, st := range steps {
		if got := g.caughtUp(st.commit, st.applied, 100); got != st.want {
			t.Errorf("step %d: caughtUp(commit %d, applied %d) = %v, want %v", i, st.commit, st.applied, got, st.want)
		}
	}
	var strict applyGate
	if strict.caughtUp(5, 4, 0) || !strict.caughtUp(5, 5, 0) || strict.caughtUp(6, 5, 0) {
		t.Error("lag 0 must ask for every committed entry applied")
	}
}

// TestReadyOnceListed: a member is ready only once the membership it
// serves lists its own client addresses, so a client sent to a ready
// member finds it there (a watch stream's placement reads that list).
func TestReadyOnceListed(t *testing.T) {
	c := newTestCluster(t, 3)
	for _, n := range c.names {
		s := c.servers[n]
		waitFor(t, 10*time.Second, func() bool { return s.Ready() == nil })
		listed := false
		for _, m := range s.store.Members() {
			listed = listed || m.Id == s.raft.ID() && m.GrpcAddr == s.AdvertisedGRPC() && m.HttpAddr == s.AdvertisedHTTP()
		}
		if !listed {
			t.Errorf("%s is ready, but its membership %v does not list it at %s and %s", n, s.store.Members(), s.AdvertisedGRPC(), s.AdvertisedHTTP())
		}
	}
}
