package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/member"
)

// With heartbeats far apart, only the end of a hold can bring a follower
// the commit of the last write in a while: it must apply it about a hold
// later, not a heartbeat later.
func TestHeldCommitNoticeReachesFollowers(t *testing.T) {
	c := newTestCluster(t, 3, func(cfg *Config) {
		farHeartbeats(cfg)
		cfg.CommitNoticeHold = 20 * time.Millisecond
	})
	lead := c.waitLeader()
	for i := range 5 {
		resp := put(t, c.kv(lead), "k", "v")
		acked := time.Now()
		for _, n := range c.names {
			if n == lead {
				continue
			}
			c.appliedWithinHold(n, resp.Header.Index, acked, i)
		}
	}
}

// Back-to-back writes are the case the hold is for: the leader must merge
// notices into the appends that follow, and followers still apply
// everything.
func TestCommitNoticesMergeUnderSteadyWrites(t *testing.T) {
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.CommitNoticeHold = 15 * time.Millisecond })
	lead := c.waitLeader()
	var last uint64
	for range 50 {
		last = put(t, c.kv(lead), "k", "v").Header.Index
	}
	if merged := gauge(t, c.servers[lead], "lodestone_peer_commit_notices_merged_total"); merged == 0 {
		t.Fatalf("50 back-to-back puts merged no commit notice")
	}
	for _, n := range c.names {
		c.waitApplied(n, last)
	}
}

func TestConfigCommitNoticeHold(t *testing.T) {
	// singleMemberConfig's heartbeat is one 100ms tick.
	checkDurationField(t, "commit-notice-hold", func(c *Config, d time.Duration) { c.CommitNoticeHold = d },
		[]time.Duration{0, 50 * time.Millisecond}, []time.Duration{-time.Millisecond, 100 * time.Millisecond})
}

// farHeartbeats puts a cluster's heartbeats a second apart, so that only
// the end of a 20ms hold can bring a member the last write soon.
func farHeartbeats(cfg *Config) {
	cfg.TickInterval = 50 * time.Millisecond
	cfg.HeartbeatTicks = 20 // 1s
	cfg.ElectionTicks = 40
}

// appliedWithinHold waits for name to apply index, the ack of put i at
// acked, and fails if that takes 400ms: far more than a 20ms hold, far
// less than a heartbeat.
func (c *testCluster) appliedWithinHold(name string, index uint64, acked time.Time, i int) {
	c.t.Helper()
	for c.servers[name].Store().Index() < index {
		if time.Since(acked) > 400*time.Millisecond {
			c.t.Fatalf("put %d: %s at index %d, %v after the ack of index %d (hold 20ms, heartbeat 1s)",
				i, name, c.servers[name].Store().Index(), time.Since(acked), index)
		}
		time.Sleep(time.Millisecond)
	}
}

// A learner's appends wait up to the hold and go out together: under
// back-to-back writes the leader folds them, for the learner only, and
// the learner still applies every write. With heartbeats a second apart,
// only the hold's end brings it a lone write: it must apply it about a
// hold after the ack, not a heartbeat later.
func TestLearnerAppendsGoOutTogether(t *testing.T) {
	c := newTestCluster(t, 3, func(cfg *Config) {
		farHeartbeats(cfg)
		cfg.LearnerAppendHold = 20 * time.Millisecond
	})
	lead := c.waitLeader()
	c.addLearner(lead, "n4")
	c.waitApplied("n4", put(t, c.kv(lead), "k", "v").Header.Index)

	var last uint64
	for range 50 {
		last = put(t, c.kv(lead), "k", "v").Header.Index
	}
	c.waitApplied("n4", last)
	merged := mergedByPeer(t, c.servers[lead])
	if merged[member.ID("n4")] == 0 {
		t.Fatalf("50 back-to-back puts folded no append to the learner (merged by peer: %v)", merged)
	}
	for _, n := range c.names {
		if id := member.ID(n); n != "n4" && merged[id] != 0 {
			t.Fatalf("appends to voter %s were held and folded (%v): a voter's appends must go at once", n, merged[id])
		}
	}

	for i := range 5 {
		resp := put(t, c.kv(lead), "k", "v")
		acked := time.Now()
		c.appliedWithinHold("n4", resp.Header.Index, acked, i)
	}
}

// mergedByPeer reads lodestone_peer_learner_appends_merged_total by peer id.
func mergedByPeer(t *testing.T, s *Server) map[uint64]float64 {
	t.Helper()
	out := map[uint64]float64{}
	mf := family(t, s.Registry(), "lodestone_peer_learner_appends_merged_total")
	if mf == nil {
		return out
	}
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			var id uint64
			if _, err := fmt.Sscanf(l.GetValue(), "%x", &id); l.GetName() == "peer" && err == nil {
				out[id] += metricValue(m)
			}
		}
	}
	return out
}

func TestConfigLearnerAppendHold(t *testing.T) {
	// singleMemberConfig's heartbeat is one 100ms tick.
	checkDurationField(t, "learner-append-hold", func(c *Config, d time.Duration) { c.LearnerAppendHold = d },
		[]time.Duration{0, 50 * time.Millisecond}, []time.Duration{-time.Millisecond, 100 * time.Millisecond})
}
