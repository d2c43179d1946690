package server

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/member"
	"github.com/lodestone-kv/lodestone/raftnode"
	"github.com/prometheus/client_golang/prometheus"
)

// Cluster tests of behaviours of the Raft node that only a real cluster
// shows end to end; raftnode's own tests drive the same behaviours
// deterministically.

// A member whose log writes are slow still applies, and delivers watch
// events for, what the other two made durable, long before its own write
// finishes; a leader whose log writes are slow answers writes the two
// followers committed. Each member's injected disk delay is far longer than
// the time allowed for the answer, so the assertions fail if applying waits
// for the local fsync, as it did.
func TestAppliesBeforeLocalFsync(t *testing.T) {
	const delay = 2 * time.Second
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.SlowLeader = raftnode.SlowLeaderConfig{} })
	faults := map[string]*raftnode.Faults{}
	for _, n := range c.names {
		faults[n] = &raftnode.Faults{}
		c.startFaulty(n, faults[n])
	}
	lead := c.waitLeader()
	slow := c.follower()
	kv := c.kv(lead)
	put(t, kv, "warm", "up")

	w := openWatch(t, c, slow)
	w.create(&lodestonepb.WatchCreate{WatchId: 1, Key: []byte("k")})
	faults[slow].SetDiskDelay(delay)
	start := time.Now()
	resp := put(t, kv, "k", "v1")
	evs, _ := w.collect(1)
	if took := time.Since(start); took > delay/2 {
		t.Fatalf("the watch on %s (log writes take %v) got the write after %v", slow, delay, took)
	}
	if string(evs[0].Kv.GetValue()) != "v1" || evs[0].Kv.GetModifyIndex() != resp.Header.GetIndex() {
		t.Fatalf("watch event %+v, want k=v1 at index %d", evs[0].Kv, resp.Header.GetIndex())
	}
	if n := gauge(t, c.servers[slow], "lodestone_raft_entries_applied_before_local_fsync_total"); n < 1 {
		t.Errorf("%s: lodestone_raft_entries_applied_before_local_fsync_total = %v, want >= 1", slow, n)
	}
	faults[slow].SetDiskDelay(0)
	// NB: the slow write still sleeps; until it is done the follower
	// acknowledges nothing, and a leader without it has no quorum to
	// commit by.
	waitFor(t, 2*delay, func() bool {
		mf := family(t, c.servers[slow].Registry(), "lodestone_log_write_latency_seconds")
		return mf != nil && mf.GetMetric()[0].GetHistogram().GetSampleSum() >= delay.Seconds()
	})

	faults[lead].SetDiskDelay(delay)
	ctx, cancel := context.WithTimeout(context.Background(), delay/2)
	defer cancel()
	start = time.Now()
	written, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: []byte("k"), Value: []byte("v2")})
	if err != nil {
		t.Fatalf("put on the leader %s (log writes take %v): %v after %v", lead, delay, err, time.Since(start))
	}
	if n := gauge(t, c.servers[lead], "lodestone_raft_entries_applied_before_local_fsync_total"); n < 1 {
		t.Errorf("%s: lodestone_raft_entries_applied_before_local_fsync_total = %v, want >= 1", lead, n)
	}
	// An operator's snapshot of the leader covers the write its log does
	// not hold yet, with that entry's term.
	st, err := c.cluster(lead).Status(ctx, &lodestonepb.StatusRequest{})
	if err != nil {
		t.Fatalf("status of %s: %v", lead, err)
	}
	snaps, err := lodestonepb.NewAdminClient(c.conn(lead)).SaveSnapshot(ctx, &lodestonepb.SaveSnapshotRequest{})
	if err != nil {
		t.Fatalf("save snapshot on %s: %v", lead, err)
	}
	chunk, err := snaps.Recv()
	if err != nil {
		t.Fatalf("save snapshot on %s (log writes take %v): %v", lead, delay, err)
	}
	if h := chunk.GetHeader(); h.GetIndex() < written.Header.GetIndex() || h.GetTerm() != st.Term {
		t.Fatalf("snapshot header %+v, want index >= %d in term %d", h, written.Header.GetIndex(), st.Term)
	}
	for {
		if _, err := snaps.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("save snapshot on %s: %v", lead, err)
		}
	}
	faults[lead].SetDiskDelay(0)
	// Every member holds both writes once the delayed writes are done: the
	// early apply was not instead of the durable one.
	if got := get(t, c.kv(slow), "k", lodestonepb.Consistency_LINEARIZABLE); string(got.GetValue()) != "v2" {
		t.Fatalf("linearizable read on %s: %q, want v2", slow, got.GetValue())
	}
}

// appendAcksOf is the sample count of lodestone_peer_append_ack_seconds
// for peer in g: the appends to it the leader has seen acknowledged.
func appendAcksOf(t *testing.T, g prometheus.Gatherer, peer string) uint64 {
	t.Helper()
	for _, m := range family(t, g, "lodestone_peer_append_ack_seconds").GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "peer" && l.GetValue() == peer {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}

// TestLeaderTimesEachFollowersAppends: on a real cluster the leader
// times every follower's appends, and a stopped follower's count stops
// while the other's goes on, which is how an operator tells them apart.
func TestLeaderTimesEachFollowersAppends(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	followers := c.followersOf(lead)
	reg := c.servers[lead].Registry()
	peer := func(name string) string { return fmt.Sprintf("%x", member.ID(name)) }
	kv := c.kv(lead)
	const writes = 20
	for i := range writes {
		put(t, kv, fmt.Sprintf("k%d", i), "v")
	}
	// Each put is its own append to each follower; the one not needed for
	// the quorum may acknowledge after the put returns.
	waitFor(t, 10*time.Second, func() bool {
		return appendAcksOf(t, reg, peer(followers[0])) >= writes && appendAcksOf(t, reg, peer(followers[1])) >= writes
	})
	for _, f := range followers {
		if got := appendAcksOf(t, c.servers[f].Registry(), peer(lead)); got != 0 {
			t.Fatalf("follower %s timed %d appends to the leader; a follower sends none", f, got)
		}
	}

	c.stop(followers[1])
	putAll := func(prefix string) {
		for i := range writes {
			put(t, kv, fmt.Sprintf("%s%d", prefix, i), "v")
		}
	}
	// An acknowledgement the stopped follower sent before it stopped may
	// still be on its way in; a round of puts lets it land.
	putAll("settle")
	stopped := appendAcksOf(t, reg, peer(followers[1]))
	live := appendAcksOf(t, reg, peer(followers[0]))
	putAll("after")
	if got := appendAcksOf(t, reg, peer(followers[0])); got < live+writes {
		t.Fatalf("the live follower's timed appends went from %d to %d over %d puts; want at least %d more", live, got, writes, writes)
	}
	if got := appendAcksOf(t, reg, peer(followers[1])); got != stopped {
		t.Fatalf("the stopped follower's timed appends went from %d to %d; it acknowledged nothing", stopped, got)
	}
}
