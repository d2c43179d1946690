package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/consulpeer"
	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

// members is the size of each system's cluster.
const members = 3

// cluster is three running servers of one system, as the workloads see
// them: the leader's HTTP base URL, and the processes (CPU time, logs).
type cluster struct {
	system string
	procs  []*harness.Proc
	https  []string // "http://127.0.0.1:port", member order
	leader int      // index into https
	// profiles: the members serve /debug/pprof on their HTTP port.
	profiles bool
	stop     func() error
}

func (c *cluster) leaderURL() string { return c.https[c.leader] }

func (c *cluster) roles() []string { return harness.Roles(len(c.procs), c.leader) }

// metricsURLs are the members' /metrics (Consul's answer there is not
// Prometheus text: counts read from it come out empty).
func (c *cluster) metricsURLs() []string { return harness.MetricsURLs(c.https) }

// cpuTime is the user+system CPU time all servers have used so far.
func (c *cluster) cpuTime() time.Duration {
	var sum time.Duration
	for _, p := range c.procs {
		if d, err := harness.CPUTime(p.Pid()); err == nil {
			sum += d
		}
	}
	return sum
}

func (c *cluster) checkAlive() error {
	for _, p := range c.procs {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%w: %s (%v)", harness.ErrExited, p.Name, err)
		}
	}
	return nil
}

func (c *cluster) logTails() string { return harness.LogTails(c.system, c.procs, 1500) }

// system starts a fresh cluster of one system in workDir.
type system struct {
	name  string
	start func(ctx context.Context, workDir string) (*cluster, error)
}

// consulSystem runs bin (Consul Version) through consulpeer: servers with
// -bootstrap-expect 3, not dev mode, Raft on disk with its default fsync.
func consulSystem(bin string) system {
	return system{name: "consul", start: func(ctx context.Context, workDir string) (*cluster, error) {
		opts := consulpeer.Options{Members: members, CPUs: *flagServerCPUs, LogLevel: logLevel}
		profiles := *flagPprof != ""
		if profiles {
			// Consul serves /debug/pprof only with enable_debug.
			opts.Extra = []string{"-hcl", "enable_debug = true"}
		}
		cc, err := consulpeer.StartCluster(ctx, bin, workDir, opts)
		if err != nil {
			return nil, err
		}
		return &cluster{system: "consul", procs: cc.Procs, https: cc.HTTP, leader: cc.Leader, profiles: profiles,
			stop: func() error { return cc.Stop(*flagKeep) }}, nil
	}}
}

// logLevel is given to the servers of both systems.
const logLevel = "warn"

// lodestoneSystem runs `lodestone server` members from bin.
func lodestoneSystem(bin string) system {
	return system{name: "lodestone", start: func(ctx context.Context, workDir string) (*cluster, error) {
		return startLodestone(ctx, bin, workDir)
	}}
}

// startLodestone starts three voters on fresh loopback ports with data in
// a fresh directory under workDir, each under `taskset -c -server-cpus`,
// and waits until the leader acknowledges a Consul KV put.
func startLodestone(ctx context.Context, bin, workDir string) (_ *cluster, err error) {
	dir, err := os.MkdirTemp(workDir, "lodestone-")
	if err != nil {
		return nil, err
	}
	c := &cluster{system: "lodestone", leader: -1, profiles: *flagPprof != ""}
	c.stop = func() error {
		err := harness.StopLeaderLast(c.procs, c.leader, 10*time.Second)
		if !*flagKeep {
			if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
				err = rerr
			}
		}
		return err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("lodestone: %w%s", err, c.logTails())
			c.stop()
		}
	}()
	ports, err := harness.FreePorts(3 * members)
	if err != nil {
		return nil, err
	}
	var peers, grpcs, initial []string
	for i := range members {
		peers = append(peers, fmt.Sprintf("127.0.0.1:%d", ports[i]))
		grpcs = append(grpcs, fmt.Sprintf("127.0.0.1:%d", ports[members+i]))
		c.https = append(c.https, fmt.Sprintf("http://127.0.0.1:%d", ports[2*members+i]))
		initial = append(initial, memberName(i)+"="+peers[i])
	}
	for i := range members {
		name := memberName(i)
		args := []string{"server", "--name", name, "--data-dir", filepath.Join(dir, name),
			"--listen-peer", peers[i], "--listen-grpc", grpcs[i], "--listen-http", strings.TrimPrefix(c.https[i], "http://"),
			"--initial-cluster", strings.Join(initial, ","), "--log-level", logLevel,
			"--enable-pprof=" + strconv.FormatBool(c.profiles)}
		p, err := harness.Start(name, bin, args, filepath.Join(dir, name+".log"), *flagServerCPUs)
		if err != nil {
			return nil, err
		}
		c.procs = append(c.procs, p)
	}
	if err := c.waitLeader(ctx, peers, 30*time.Second); err != nil {
		return nil, err
	}
	return c, harness.Poll(ctx, 20*time.Second, "the probe put on "+c.leaderURL(), c.checkAlive, func(ctx context.Context) error {
		return send(ctx, http.DefaultClient, http.MethodPut, c.leaderURL()+"/v1/kv/consulbench/probe", []byte("ok"))
	})
}

// waitLeader polls /v1/status/leader until it names a member's peer
// address (Consul's API answers with the leader's Raft address).
func (c *cluster) waitLeader(ctx context.Context, peers []string, timeout time.Duration) error {
	return harness.Poll(ctx, timeout, "a leader", c.checkAlive, func(ctx context.Context) error {
		var addr string
		if err := consulpeer.GetJSON(ctx, c.https[0]+"/v1/status/leader", &addr); err != nil {
			return err
		}
		if i := slices.Index(peers, addr); i >= 0 {
			c.leader = i
			return nil
		}
		return fmt.Errorf("/v1/status/leader answered %q", addr)
	})
}

func memberName(i int) string { return fmt.Sprintf("n%d", i+1) }
