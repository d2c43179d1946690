package server

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/raftnode"
)

// startFaulty restarts member name with its own fault hooks.
func (c *testCluster) startFaulty(name string, f *raftnode.Faults) {
	c.t.Helper()
	c.stop(name)
	c.base.Faults = f
	defer func() { c.base.Faults = nil }()
	c.start(name, false)
}

// TestSlowLeaderStepsDown injects a disk delay on the leader of a real
// three-node cluster under a steady write load and checks that leadership
// leaves it once its writes stayed slow for the window, and that it does
// not come back during the cool-down even when the new leader dies and
// the slow node is one of the two left.
func TestSlowLeaderStepsDown(t *testing.T) {
	slow := raftnode.SlowLeaderConfig{Threshold: 50 * time.Millisecond, Window: time.Second, Cooldown: 5 * time.Second}
	c := newTestCluster(t, 3, func(cfg *Config) { cfg.SlowLeader = slow; cfg.ElectionTicks = 25 })
	faults := map[string]*raftnode.Faults{}
	for _, n := range c.names {
		faults[n] = &raftnode.Faults{}
		c.startFaulty(n, faults[n])
	}
	lead := c.waitLeader()
	var writeTo string
	for _, n := range c.names {
		if n != lead {
			writeTo = n
		}
	}
	kv := c.kv(writeTo)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			rctx, rcancel := context.WithTimeout(ctx, time.Second)
			_, _ = kv.Put(rctx, &lodestonepb.PutRequest{Key: []byte("load"), Value: []byte{byte(i)}})
			rcancel()
		}
	}()
	defer func() { cancel(); wg.Wait() }()

	faults[lead].SetDiskDelay(120 * time.Millisecond)
	start := time.Now()
	waitFor(t, slow.Window+5*time.Second, func() bool {
		l := c.agreedLeader()
		return l != "" && l != lead
	})
	took := time.Since(start)
	newLead := c.agreedLeader()
	t.Logf("leadership left the slow node %s for %s after %v (window %v)", lead, newLead, took.Round(time.Millisecond), slow.Window)
	if took < slow.Window {
		t.Errorf("stepped down after %v, before the %v window", took, slow.Window)
	}
	if got, want := gauge(t, c.servers[lead], "lodestone_leader_step_downs_total"), 1.0; got != want {
		t.Errorf("lodestone_leader_step_downs_total{reason=slow_disk} = %v, want %v", got, want)
	}
	cooldownEnd := start.Add(took).Add(slow.Cooldown)

	// The new leader dies: of the two left, only the healthy one may lead.
	cancel()
	wg.Wait()
	c.stop(newLead)
	var third string
	for _, n := range c.names {
		if n != lead && n != newLead {
			third = n
		}
	}
	sawThird := false
	for time.Until(cooldownEnd) > 300*time.Millisecond {
		if st := c.servers[lead].raft.Status(); st.State == raft.StateLeader {
			t.Fatalf("the slow node %s led again %v before its cool-down ended", lead, time.Until(cooldownEnd))
		}
		if c.servers[third].raft.Status().State == raft.StateLeader {
			sawThird = true
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !sawThird {
		t.Errorf("%s never became leader after %s died", third, newLead)
	}
	t.Logf("the slow node stayed a follower for the whole cool-down; %s led", third)
}
