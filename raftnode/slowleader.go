package raftnode

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// SlowLeaderConfig moves leadership off a leader whose own disk is slow.
//
// A leader's log write (one bbolt commit: its fsync) is on the path of
// every write in the cluster. When it stays slower than Threshold for
// Window, the leader transfers leadership to the healthiest up-to-date
// follower and then does not campaign for Cooldown, so the cluster is not
// led by the slow disk again until the operator looked at it (in the
// Consul outage of Roblox's public post-mortem of October 2021, leaders
// whose writes took 2 s kept being elected).
type SlowLeaderConfig struct {
	// Threshold is the log-write latency above which a write counts as
	// slow. Default 500ms (a healthy fsync takes milliseconds). Zero turns
	// the step-down off.
	Threshold time.Duration
	// Window is how long every write must stay slow before the leader
	// steps down. Default 10s: long enough to ride out one stall, short
	// against an outage.
	Window time.Duration
	// Cooldown is how long a node that stepped down for slowness does not
	// campaign (it still votes). Default 5m.
	Cooldown time.Duration
}

// DefaultSlowLeaderConfig returns the production defaults.
func DefaultSlowLeaderConfig() SlowLeaderConfig {
	return SlowLeaderConfig{
		Threshold: 500 * time.Millisecond, // a write slower than this is slow
		Window:    10 * time.Second,       // slow this long → step down
		Cooldown:  5 * time.Minute,        // then no campaigning this long
	}
}

func (c SlowLeaderConfig) Validate() error {
	if c.Threshold < 0 || (c.Threshold > 0 && (c.Window <= 0 || c.Cooldown < 0)) {
		return fmt.Errorf("threshold %v, window %v, cooldown %v: want threshold >= 0 and, with a threshold, a positive window and cooldown >= 0", c.Threshold, c.Window, c.Cooldown)
	}
	return nil
}

// Faults are fault-injection hooks for tests and the chaos harness. They
// are off unless a Faults is set in Config (the hidden server flag
// --fault-hooks); production servers never have one.
type Faults struct {
	diskDelay atomic.Int64
}

// SetDiskDelay makes every log write of the node sleep d first (0: none).
func (f *Faults) SetDiskDelay(d time.Duration) { f.diskDelay.Store(int64(d)) }

// DiskDelay is the injected delay per log write.
func (f *Faults) DiskDelay() time.Duration {
	if f == nil {
		return 0
	}
	return time.Duration(f.diskDelay.Load())
}

// slowLeader is the step-down state; it belongs to the Raft loop.
type slowLeader struct {
	cfg           SlowLeaderConfig
	slowSince     time.Time // first of an unbroken run of slow writes
	lastSlow      time.Time
	cooldownUntil time.Time

	stepDowns *prometheus.CounterVec
	saveTime  prometheus.Histogram
	cooling   prometheus.Gauge
}

func newSlowLeader(cfg SlowLeaderConfig, reg prometheus.Registerer) *slowLeader {
	sl := &slowLeader{
		cfg: cfg,
		stepDowns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "lodestone", Name: "leader_step_downs_total",
			Help: "Leaderships this node gave up by itself, by reason (slow_disk).",
		}, []string{"reason"}),
		saveTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "lodestone", Name: "log_write_latency_seconds",
			Help:    "One log write with entries (bbolt commit and fsync), as the slow-leader check sees it.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18),
		}),
		cooling: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "lodestone", Name: "campaign_cooldown_seconds",
			Help: "Seconds left during which this node does not campaign after stepping down for a slow disk.",
		}),
	}
	sl.stepDowns.WithLabelValues("slow_disk")
	reg.MustRegister(sl.stepDowns, sl.saveTime, sl.cooling)
	return sl
}

// saveTimed persists one write of the log writer (after the injected disk
// delay, if any) and returns how long it took. It runs on the log writer
// (logwriter.go); the loop feeds the latency of writes with entries to the
// slow-leader check (observeWrite) when it gets the result.
func (n *Node) saveTimed(hs raftpb.HardState, ents []raftpb.Entry) (time.Duration, error) {
	start := n.clock.Now()
	if d := n.cfg.Faults.DiskDelay(); d > 0 && len(ents) > 0 {
		<-n.clock.After(d) // NB: the fault hook: a disk that takes d per write
	}
	if err := n.log.Save(hs, ents); err != nil {
		return 0, err
	}
	took := n.clock.Now().Sub(start)
	if len(ents) > 0 {
		n.slow.saveTime.Observe(took.Seconds())
	}
	return took, nil
}

// observeWrite runs in the loop for each finished log write with entries.
// NB: only while leading: a follower's slow disk does not hold up the
// cluster's writes (the leader needs only a quorum of acknowledgements).
func (n *Node) observeWrite(d appendDone) {
	if d.wrote && n.status.Load().State == raft.StateLeader {
		n.slow.observe(d.at, d.took)
	}
}

func (sl *slowLeader) observe(now time.Time, took time.Duration) {
	if sl.cfg.Threshold <= 0 {
		return
	}
	if took < sl.cfg.Threshold {
		sl.slowSince = time.Time{}
		return
	}
	if sl.slowSince.IsZero() {
		sl.slowSince = now
	}
	sl.lastSlow = now
}

// checkSlowLeader runs on every tick: a leader whose writes stayed slow
// for the window hands leadership to the healthiest up-to-date follower.
func (n *Node) checkSlowLeader() {
	sl := n.slow
	now := n.clock.Now()
	if left := sl.cooldownUntil.Sub(now); left > 0 {
		sl.cooling.Set(left.Seconds())
	} else {
		sl.cooling.Set(0)
	}
	if sl.slowSince.IsZero() || n.status.Load().State != raft.StateLeader {
		if n.status.Load().State != raft.StateLeader {
			sl.slowSince = time.Time{}
		}
		return
	}
	// NB: an idle leader writes nothing; evidence older than the window
	// says nothing about the disk now.
	if now.Sub(sl.lastSlow) > sl.cfg.Window {
		sl.slowSince = time.Time{}
		return
	}
	if sl.lastSlow.Sub(sl.slowSince) < sl.cfg.Window {
		return
	}
	to := n.healthiestFollower()
	if to == 0 {
		n.logger.Warn("leader writes are slow but no follower is up to date and reachable; staying leader",
			"slow_for", now.Sub(sl.slowSince), "threshold", sl.cfg.Threshold)
		sl.slowSince = time.Time{} // NB: warn once per window, not every tick
		return
	}
	n.logger.Warn("stepping down: log writes slow", "slow_for", now.Sub(sl.slowSince).Round(time.Millisecond),
		"threshold", sl.cfg.Threshold, "to", fmt.Sprintf("%x", to), "cooldown", sl.cfg.Cooldown)
	sl.stepDowns.WithLabelValues("slow_disk").Inc()
	sl.slowSince = time.Time{}
	sl.cooldownUntil = now.Add(sl.cfg.Cooldown)
	n.rn.TransferLeader(to)
}

// healthiestFollower picks the voter to hand leadership to: reachable
// (heard from within an election timeout), with the most of the log, then
// the one heard from most recently. 0 if none is reachable.
//
// NB: not peerActive's few heartbeats: a slow leader's own loop sits in
// its slow writes, so it reads its followers' messages late; their last
// message can look older than they are.
func (n *Node) healthiestFollower() uint64 {
	st := n.rn.Status()
	reachable := n.ElectionTimeout()
	var best uint64
	var bestMatch uint64
	var bestHeard time.Time
	for _, id := range st.Config.Voters[0].Slice() { // NB: sorted, so ties go the same way every time
		if id == n.id {
			continue
		}
		pr, ok := st.Progress[id]
		if !ok {
			continue
		}
		heard, _ := n.LastHeard(id)
		if n.clock.Now().Sub(heard) > reachable {
			continue
		}
		if best == 0 || pr.Match > bestMatch || (pr.Match == bestMatch && heard.After(bestHeard)) {
			best, bestMatch, bestHeard = id, pr.Match, heard
		}
	}
	return best
}

// coolingDown reports whether this node must not campaign now.
func (n *Node) coolingDown() bool {
	return n.clock.Now().Before(n.slow.cooldownUntil)
}

// holdCampaign drops, during a cool-down, the messages by which this node
// would campaign: its pre-vote requests (every election starts with one,
// PreVote is on) and an incoming MsgTimeoutNow (a transfer to it, which
// skips the pre-vote). It still answers others' votes.
func (n *Node) holdCampaign(msgs []raftpb.Message) []raftpb.Message {
	if !n.coolingDown() {
		return msgs
	}
	out := msgs[:0]
	for _, m := range msgs {
		if m.Type == raftpb.MsgPreVote || m.Type == raftpb.MsgVote {
			continue
		}
		out = append(out, m)
	}
	return out
}
