package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

// cluster is three running Lodestone members, talked to only over HTTP.
type cluster struct {
	dir    string
	procs  []*harness.Proc
	peers  []string // Raft peer addresses, member order
	https  []string // "http://host:port", member order
	leader int      // index of the leader once known
}

const members = 3

// startCluster starts three members on fresh loopback ports with data in
// a fresh directory under workDir, each under `taskset -c -server-cpus`,
// and waits until the leader acknowledges a Consul KV put. On error
// everything it started is stopped and removed.
func startCluster(ctx context.Context, bin, workDir string) (_ *cluster, err error) {
	dir, err := os.MkdirTemp(workDir, "lodestone-")
	if err != nil {
		return nil, err
	}
	c := &cluster{dir: dir}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w%s", err, c.logTails())
			c.stop()
		}
	}()
	ports, err := harness.FreePorts(3 * members)
	if err != nil {
		return nil, err
	}
	var names, initial []string
	for i := range members {
		names = append(names, fmt.Sprintf("n%d", i+1))
		c.peers = append(c.peers, fmt.Sprintf("127.0.0.1:%d", ports[i]))
		c.https = append(c.https, fmt.Sprintf("http://127.0.0.1:%d", ports[2*members+i]))
		initial = append(initial, names[i]+"="+c.peers[i])
	}
	for i := range members {
		args := []string{"server", "--name", names[i], "--data-dir", filepath.Join(dir, names[i]),
			"--listen-peer", c.peers[i], "--listen-grpc", fmt.Sprintf("127.0.0.1:%d", ports[members+i]),
			"--listen-http", strings.TrimPrefix(c.https[i], "http://"),
			"--initial-cluster", strings.Join(initial, ","), "--log-level", "warn", "--enable-pprof=" + strconv.FormatBool(*flagPprof != "" || *flagTrace != ""),
			"--no-parking=" + strconv.FormatBool(*flagNoParking), "--snapshot-entries", strconv.Itoa(snapshotEntries())}
		p, err := harness.Start(names[i], bin, args, filepath.Join(dir, names[i]+".log"), *flagServerCPUs)
		if err != nil {
			return nil, err
		}
		c.procs = append(c.procs, p)
	}

	// The leader: the member whose peer address /v1/status/leader names
	// (Consul answers with the leader's Raft address).
	deadline := time.Now().Add(30 * time.Second)
	for c.leader = -1; c.leader < 0; {
		if err := c.checkAlive(); err != nil {
			return nil, err
		}
		var addr string
		if err := getJSON(ctx, c.https[0]+"/v1/status/leader", &addr); err == nil {
			for i, p := range c.peers {
				if p == addr {
					c.leader = i
				}
			}
		}
		if c.leader >= 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no leader within 30s (last answer %q)", addr)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
	w := newWriter(c.https[c.leader])
	defer w.close()
	for deadline := time.Now().Add(20 * time.Second); ; {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := w.put(pctx, "blockingbench/probe", []byte("ok"))
		cancel()
		if err == nil {
			return c, nil
		}
		if aerr := c.checkAlive(); aerr != nil {
			return nil, aerr
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("probe put on leader %s: %w", c.https[c.leader], err)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

func (c *cluster) checkAlive() error {
	for _, p := range c.procs {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%w: %s (%v)", harness.ErrExited, p.Name, err)
		}
	}
	return nil
}

// cpu is the CPU time each member has used so far, in member order.
func (c *cluster) cpu() []time.Duration {
	t := make([]time.Duration, len(c.procs))
	for i, p := range c.procs {
		t[i], _ = harness.CPUTime(p.Pid())
	}
	return t
}

// stop stops the followers, then the leader (SIGTERM, SIGKILL after
// 10s), and removes the data unless -keep.
func (c *cluster) stop() error {
	err := harness.StopLeaderLast(c.procs, c.leader, 10*time.Second)
	if !*flagKeep {
		if rerr := os.RemoveAll(c.dir); rerr != nil && err == nil {
			err = rerr
		}
	}
	return err
}

func (c *cluster) logTails() string { return harness.LogTails("", c.procs, 1500) }

func getJSON(ctx context.Context, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := harness.Get(ctx, url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// The metrics the benchmark reads: the HTTP blocking queries a server
// holds, and the questions a follower asked the leader for its commit
// index on behalf of default-mode reads.
const (
	inFlightMetric    = `lodestone_blocking_queries_in_flight{api="http"}`
	leaderIndexMetric = `lodestone_leader_index_calls_total`
)

// metricsURLs are the members' /metrics, in process order.
func (c *cluster) metricsURLs() []string {
	urls := make([]string, len(c.https))
	for i, base := range c.https {
		urls[i] = base + "/metrics"
	}
	return urls
}

// metricValue reads one metric from the server at base.
func metricValue(ctx context.Context, base, metric string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := harness.Scrape(ctx, base+"/metrics", metric)
	return m[metric], err
}

// members reads metric from every member, in process order.
func (c *cluster) members(ctx context.Context, metric string) ([]float64, error) {
	vs := make([]float64, len(c.https))
	for i, base := range c.https {
		v, err := metricValue(ctx, base, metric)
		if err != nil {
			return nil, err
		}
		vs[i] = v
	}
	return vs, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// profile starts CPU and allocation profiles of every server for dur when
// dir is set, and returns a func that waits for them and writes them to
// dir/ROLE-NAME.pprof, .allocs-base.pprof and .allocs.pprof: leader, f1, f2
// (harness.Roles).
func (c *cluster) profile(ctx context.Context, dur time.Duration, dir, name string) func() error {
	return harness.ProfileAll(ctx, c.https, harness.Roles(len(c.https), c.leader), dur, dir, name)
}
