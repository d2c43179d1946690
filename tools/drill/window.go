package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Series the drill reads.
const (
	commitLatency = "lodestone_commit_latency_seconds"
	saveDuration  = "lodestone_raftlog_save_duration_seconds"
	checkpoints   = "lodestone_raftlog_checkpoints_total"
	gcCycles      = "go_gc_duration_seconds_count"
	cpuSeconds    = "process_cpu_seconds_total"
	watchStreams  = "lodestone_watch_streams"
	isLeader      = "lodestone_is_leader"
	appliedIndex  = "lodestone_raft_applied_index"
	commitIndex   = "lodestone_raft_commit_index"
	rejected      = "lodestone_admission_rejected_total"
	loadHolds     = "lodestone_admission_load_holds_total"
	grpcConns     = "lodestone_grpc_connections"
	schedLatency  = "lodestone_runtime_sched_latency_seconds"
	pollDelay     = "lodestone_runtime_poll_delay_seconds"
	goroutines    = "go_goroutines"
)

// probeEvery is how often the disk probe fdatasyncs: often enough to see a
// stall of a second's fraction, too seldom to load the device.
const probeEvery = 100 * time.Millisecond

// measured is one window in progress: the scrape it started from, and a
// sampler that reports each second in which a server committed slowly.
type measured struct {
	name  string
	c     *cluster
	start time.Time
	first []metrics
	stop  chan struct{}
	done  sync.WaitGroup
}

// startWindow starts a window now, from the servers' figures now, or
// from zero when the servers were just started (their counters are).
func startWindow(c *cluster, o options, name string, fromStart bool, log io.Writer) *measured {
	m := &measured{name: name, c: c, start: time.Now(), stop: make(chan struct{})}
	if fromStart {
		m.first = make([]metrics, len(c.servers))
		for i := range m.first {
			m.first[i] = metrics{}
		}
	} else {
		m.first = c.scrapeAll()
	}
	m.done.Add(1)
	go func() {
		defer m.done.Done()
		m.sample(o.slow.Seconds(), log)
	}()
	return m
}

// sample scrapes every second and prints, per server, the seconds with
// commits over slow beside that second's raftlog checkpoints, saves over
// slow, GC cycles, CPU, the Go scheduler's run-queue wait, how late it
// read the network (the poll probe), goroutines, open watch streams and
// the disk probe's worst fdatasync: the timestamps and suspects of a slow
// tail.
func (m *measured) sample(slow float64, log io.Writer) {
	prev, prevAt := m.first, m.start
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		now, nowAt := m.c.scrapeAll(), time.Now()
		disk := m.c.probe.worst(prevAt, nowAt)
		for i, s := range m.c.servers {
			a, b := prev[i:i+1], now[i:i+1]
			n := above(slow, histogram(a, commitLatency), histogram(b, commitLatency))
			if n <= 0 {
				continue
			}
			fmt.Fprintf(log, "drill: %s +%.1fs %s: %.0f commits >%.0fms (p99 %.0fms) | checkpoints +%.0f, saves >%.0fms +%.0f (max bucket %.0fms), gc +%.0f, cpu %.2fs, run-queue wait p99 %.1fms, poll delay p99 %.1fms, goroutines %.0f, watch streams %.0f, admission rejects +%.0f, held short of CPU: connections +%.0f, watches +%.0f, disk probe worst %.1fms\n",
				m.name, time.Since(m.start).Seconds(), s.name, n, slow*1000, p99(histogram(a, commitLatency), histogram(b, commitLatency))*1000,
				sum(b, checkpoints)-sum(a, checkpoints),
				slow*1000, above(slow, histogram(a, saveDuration), histogram(b, saveDuration)), quantile(1, histogram(a, saveDuration), histogram(b, saveDuration))*1000,
				sum(b, gcCycles)-sum(a, gcCycles), sum(b, cpuSeconds)-sum(a, cpuSeconds),
				p99(histogram(a, schedLatency), histogram(b, schedLatency))*1000, p99(histogram(a, pollDelay), histogram(b, pollDelay))*1000, sum(b, goroutines), sum(b, watchStreams), rejects(b)-rejects(a),
				held(b, "connection")-held(a, "connection"), held(b, "watch")-held(a, "watch"), disk.Seconds()*1000)
		}
		prev, prevAt = now, nowAt
	}
}

func rejects(ms []metrics) float64 {
	var t float64
	for _, c := range refusalClasses {
		t += classRejects(ms, c)
	}
	return t
}

// held is the setups of kind (connection, watch) servers held while short
// of CPU.
func held(ms []metrics, kind string) float64 {
	return sum(ms, loadHolds+`{kind="`+kind+`"}`)
}

// refusalClasses are admission control's request classes.
var refusalClasses = [...]string{"read", "write", "watch"}

func classRejects(ms []metrics, class string) float64 {
	return sum(ms, rejected+`{class="`+class+`"}`)
}

func (m *measured) end() window {
	close(m.stop)
	m.done.Wait()
	last, lastAt := m.c.scrapeAll(), time.Now()
	h0, h1 := histogram(m.first, commitLatency), histogram(last, commitLatency)
	w := window{
		dur: time.Since(m.start), commits: count(h0, h1), p99: p99(h0, h1),
		saveP99: p99(histogram(m.first, saveDuration), histogram(last, saveDuration)),
		cpu:     sum(last, cpuSeconds) - sum(m.first, cpuSeconds), conns: sum(last, grpcConns),
		diskWorst: m.c.probe.worst(m.start, lastAt).Seconds(),
	}
	for i, c := range refusalClasses {
		w.rejectsBy[i] = classRejects(last, c) - classRejects(m.first, c)
	}
	w.heldConns = held(last, "connection") - held(m.first, "connection")
	w.heldWatches = held(last, "watch") - held(m.first, "watch")
	w.placement = placement(m.c, last)
	return w
}

// placement names each server with its open watch streams, the leader
// marked: "n1:0,n2*:12,n3:988". NB: a watcher's fan-out costs the server
// that holds it, so a rep's steady p99 is read beside where the watchers
// were (all on one follower, split, or on the leader).
func placement(c *cluster, ms []metrics) string {
	var b strings.Builder
	for i, s := range c.servers {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s.name)
		if ms[i][isLeader] == 1 {
			b.WriteByte('*')
		}
		fmt.Fprintf(&b, ":%.0f", ms[i][watchStreams])
	}
	return b.String()
}

// waitIdle waits until the cluster is idle of catch-up: every member has
// applied what any member reported committed a second before, and the
// open watch streams changed by at most 1% over that second (no
// reconnecting watchers). It reports whether that happened within limit.
func waitIdle(ctx context.Context, c *cluster, limit time.Duration) (bool, error) {
	deadline := time.Now().Add(limit)
	prev := c.scrapeAll()
	for {
		if err := sleep(ctx, time.Second); err != nil {
			return false, err
		}
		now := c.scrapeAll()
		var committed float64
		for _, m := range prev {
			committed = max(committed, m[commitIndex])
		}
		caughtUp := true
		for _, m := range now {
			caughtUp = caughtUp && m[appliedIndex] >= committed
		}
		streams, before := sum(now, watchStreams), sum(prev, watchStreams)
		if caughtUp && math.Abs(streams-before) <= 0.01*before {
			return true, nil
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		prev = now
	}
}

// waitApplied waits until every server has applied a tick written after
// index: each then holds index as committed in its own state.
func waitApplied(ctx context.Context, c *cluster, index uint64, tick *atomic.Uint64, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		if t := tick.Load(); t > index {
			applied := true
			for _, m := range c.scrapeAll() {
				applied = applied && m[appliedIndex] >= float64(t)
			}
			if applied {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not applied by every server within %v", limit)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}
