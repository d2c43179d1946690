package server

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/gossip"
)

// fastPool detects failures in about a second on loopback.
func fastPool(c *gossip.Config) {
	c.BindAddr = "127.0.0.1:0"
	c.ProbeInterval, c.ProbeTimeout = 200*time.Millisecond, 100*time.Millisecond
	c.SuspicionMult, c.SuspicionMaxTimeoutMult = 3, 1
	c.GossipInterval = 50 * time.Millisecond
}

func withGossip() clusterOption {
	return func(c *Config) {
		g := DefaultGossipConfig()
		fastPool(&g.Pool)
		g.ReconcileInterval, g.RetryInterval = 200*time.Millisecond, 100*time.Millisecond
		c.Gossip = g
	}
}

func serfOf(s *Server, node string) (lodestonepb.HealthStatus, string) {
	checks, _ := s.Store().NodeChecks(node)
	for _, c := range checks {
		if c.CheckId == SerfCheckID {
			return c.Status, c.Output
		}
	}
	return 0, ""
}

// reconcileRuns sums every member's reconcile runs (only the leader's
// move).
func reconcileRuns(t *testing.T, c *testCluster) float64 {
	t.Helper()
	sum := 0.0
	for _, s := range c.servers {
		var m dto.Metric
		if err := s.gossip.runs.Write(&m); err != nil {
			t.Fatal(err)
		}
		sum += m.GetCounter().GetValue()
	}
	return sum
}

// assertIndexStill checks docs/architecture.md invariant 9, "Liveness costs
// no steady Raft writes": while the leader reconciles n more times, no member's applied
// index moves. An election appends an entry of its own, so a window with
// a leader change (a loaded host) is measured again.
func assertIndexStill(t *testing.T, c *testCluster, n float64) {
	t.Helper()
	for range 3 {
		leader := c.waitLeader()
		term := c.servers[leader].raft.Status().Term
		// Followers may still be applying the last write: start from the
		// leader's index once everyone has it.
		li := c.servers[leader].Store().Index()
		idx := map[string]uint64{}
		for name, s := range c.servers {
			c.waitApplied(name, li)
			idx[name] = s.Store().Index()
		}
		start := reconcileRuns(t, c)
		waitFor(t, 20*time.Second, func() bool { return reconcileRuns(t, c) >= start+n })
		changed := false
		for _, s := range c.servers {
			changed = changed || s.raft.Status().Term != term
		}
		if changed {
			t.Logf("leader changed during the window; measuring again")
			continue
		}
		for name, s := range c.servers {
			if got := s.Store().Index(); got != idx[name] {
				t.Fatalf("%s: index moved from %d to %d over %v reconciles with nothing changing", name, idx[name], got, n)
			}
		}
		return
	}
	t.Fatal("no window without a leader change in three tries")
}

// TestGossipReconcileAcrossLeaderChange: three servers and one agent-like
// member in one pool. The leader registers everyone with a passing
// serfHealth, writes nothing while nothing changes, marks a crashed member
// critical within the detection bound, and after a leader change the new
// leader marks the old one left without rewriting anything else.
func TestGossipReconcileAcrossLeaderChange(t *testing.T) {
	c := newTestCluster(t, 3, withGossip())
	var addrs []string
	for _, s := range c.servers {
		addrs = append(addrs, s.GossipAddr())
	}
	acfg := gossip.DefaultConfig()
	fastPool(&acfg)
	acfg.Name, acfg.Role, acfg.Join = "a1", gossip.RoleAgent, addrs
	ap, err := gossip.New(acfg)
	if err != nil {
		t.Fatal(err)
	}
	ap.Start()
	t.Cleanup(func() { ap.Close() })

	leader := c.waitLeader()
	ls := c.servers[leader]
	waitFor(t, 15*time.Second, func() bool {
		for _, n := range []string{"n1", "n2", "n3", "a1"} {
			if st, _ := serfOf(ls, n); st != lodestonepb.HealthStatus_HEALTH_PASSING {
				return false
			}
		}
		return true
	})
	// Each member publishes its client addresses once at start: a startup
	// write, not liveness. Let those land before watching the index.
	waitFor(t, 15*time.Second, func() bool { return c.publishedOn(ls) })
	assertIndexStill(t, c, 5)

	if err := ap.Close(); err != nil { // a crash: no leave message
		t.Fatal(err)
	}
	crashed := time.Now()
	bound := acfg.DetectionBound(4) + time.Second
	waitFor(t, bound, func() bool {
		st, _ := serfOf(ls, "a1")
		return st == lodestonepb.HealthStatus_HEALTH_CRITICAL
	})
	t.Logf("crash to critical: %v (bound %v)", time.Since(crashed), bound)
	assertIndexStill(t, c, 5)

	c.stop(leader) // graceful: leaves the pool
	next := c.waitLeader()
	ns := c.servers[next]
	waitFor(t, 15*time.Second, func() bool {
		st, out := serfOf(ns, leader)
		return st == lodestonepb.HealthStatus_HEALTH_CRITICAL && out == serfOutputLeft
	})
	if st, _ := serfOf(ns, "a1"); st != lodestonepb.HealthStatus_HEALTH_CRITICAL {
		t.Fatalf("a1 is %v under the new leader, want still critical", st)
	}
	assertIndexStill(t, c, 5)
}
