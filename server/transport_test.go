package server

import (
	"testing"
	"time"
)

// With heartbeats far apart, only the end of a hold can bring a follower
// the commit of the last write in a while: it must apply it about a hold
// later, not a heartbeat later.
func TestHeldCommitNoticeReachesFollowers(t *testing.T) {
	c := newTestCluster(t, 3, func(cfg *Config) {
		cfg.TickInterval = 50 * time.Millisecond
		cfg.HeartbeatTicks = 20 // 1s
		cfg.ElectionTicks = 40
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
			for c.servers[n].Store().Index() < resp.Header.Index {
				if time.Since(acked) > 400*time.Millisecond {
					t.Fatalf("put %d: follower %s at index %d, %v after the ack of index %d (hold 20ms, heartbeat 1s)",
						i, n, c.servers[n].Store().Index(), time.Since(acked), resp.Header.Index)
				}
				time.Sleep(time.Millisecond)
			}
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
