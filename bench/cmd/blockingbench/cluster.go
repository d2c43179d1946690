package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
	"github.com/lodestone-kv/lodestone/internal/member"
)

// cluster is three running Lodestone voters, and with -queries-on learner
// members after them that do not vote, talked to only over HTTP (and the
// CLI, to add the learners).
type cluster struct {
	dir      string
	ldir     string // the learners' data, where -learner-data-dir puts it ("": dir)
	procs    []*harness.Proc
	peers    []string // Raft peer addresses, member order
	grpcs    []string // client gRPC addresses, member order
	https    []string // "http://host:port", member order
	leader   int      // index of the leader once known
	learners int      // members after the voters, none voting
}

// voters is the cluster's voting members; a learner comes after them.
const voters = 3

// startCluster starts three members on fresh loopback ports with data in
// a fresh directory under workDir, each under `taskset -c -server-cpus`,
// and waits until the leader acknowledges a Consul KV put; it then adds
// learners members as learners, one at a time, each once the one before
// has that put.
// On error everything it started is stopped and removed.
func startCluster(ctx context.Context, bin, workDir string, learners int) (_ *cluster, err error) {
	dir, err := os.MkdirTemp(workDir, "lodestone-")
	if err != nil {
		return nil, err
	}
	c := &cluster{dir: dir}
	if *flagLearnerDir != "" {
		if c.ldir, err = os.MkdirTemp(*flagLearnerDir, "lodestone-learners-"); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("-learner-data-dir: %w", err)
		}
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w%s", err, c.logTails())
			c.stop()
		}
	}()
	n := voters + learners
	ports, err := harness.FreePorts(3 * n)
	if err != nil {
		return nil, err
	}
	var initial []string
	for i := range n {
		c.peers = append(c.peers, fmt.Sprintf("127.0.0.1:%d", ports[i]))
		c.grpcs = append(c.grpcs, fmt.Sprintf("127.0.0.1:%d", ports[n+i]))
		c.https = append(c.https, fmt.Sprintf("http://127.0.0.1:%d", ports[2*n+i]))
		if i < voters {
			initial = append(initial, memberName(i)+"="+c.peers[i])
		}
	}
	for i := range voters {
		if err := c.startMember(bin, i, initial, false); err != nil {
			return nil, err
		}
	}

	// The leader: the member whose peer address /v1/status/leader names
	// (Consul answers with the leader's Raft address).
	c.leader = -1
	err = c.poll(ctx, 30*time.Second, "a leader", func(ctx context.Context) error {
		var addr string
		if err := getJSON(ctx, c.https[0]+"/v1/status/leader", &addr); err != nil {
			return err
		}
		if i := slices.Index(c.peers, addr); i >= 0 {
			c.leader = i
			return nil
		}
		return fmt.Errorf("/v1/status/leader answered %q", addr)
	})
	if err != nil {
		return nil, err
	}
	w := newWriter(c.https[c.leader])
	defer w.close()
	err = c.poll(ctx, 20*time.Second, "the probe put on leader "+c.https[c.leader], func(ctx context.Context) error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return w.put(pctx, probeKey, []byte("ok"))
	})
	if err != nil {
		return nil, err
	}
	for i := voters; i < n; i++ {
		initial = append(initial, memberName(i)+"="+c.peers[i])
		if err := c.addLearner(ctx, bin, i, initial); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// poll runs try until it succeeds, a member exits, ctx ends or timeout
// passes (harness.Poll).
func (c *cluster) poll(ctx context.Context, timeout time.Duration, what string, try func(context.Context) error) error {
	return harness.Poll(ctx, timeout, what, c.checkAlive, try)
}

// probeKey is the key startCluster writes to see the cluster serve.
const probeKey = "blockingbench/probe"

func memberName(i int) string { return fmt.Sprintf("n%d", i+1) }

// startMember starts member i with initial as its --initial-cluster, to
// join a running cluster with join.
func (c *cluster) startMember(bin string, i int, initial []string, join bool) error {
	name := memberName(i)
	data := filepath.Join(c.dir, name)
	if i >= voters && c.ldir != "" {
		data = filepath.Join(c.ldir, name)
	}
	args := []string{"server", "--name", name, "--data-dir", data,
		"--listen-peer", c.peers[i], "--listen-grpc", c.grpcs[i], "--listen-http", strings.TrimPrefix(c.https[i], "http://"),
		"--initial-cluster", strings.Join(initial, ","), "--join=" + strconv.FormatBool(join),
		"--log-level", "warn", "--enable-pprof=" + strconv.FormatBool(*flagGCBefore || *flagPprof != "" || *flagTrace != ""),
		"--no-parking=" + strconv.FormatBool(*flagNoParking), "--snapshot-entries", strconv.Itoa(snapshotEntries()),
		// Every query is a connection from this one process: lift the
		// per-client cap and keep the listener's above the queries.
		"--max-http-connections-per-client=-1", "--max-http-connections", strconv.Itoa(max(20000, *flagQueries+1000))}
	if *flagServerProcs > 0 {
		bin, args = "env", append([]string{"GOMAXPROCS=" + strconv.Itoa(*flagServerProcs), bin}, args...)
	}
	p, err := harness.Start(name, bin, args, filepath.Join(c.dir, name+".log"), *flagServerCPUs)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return nil
}

// addLearner adds member i as a learner, as an operator would (lodestone
// members add --learner, then start it with --join), and waits until it
// serves the probe put from its own state (a stale read).
func (c *cluster) addLearner(ctx context.Context, bin string, i int, initial []string) error {
	add := exec.CommandContext(ctx, bin, "members", "add", memberName(i), "--learner", "--peer", c.peers[i],
		"--grpc", c.grpcs[i], "--http", strings.TrimPrefix(c.https[i], "http://"), "--endpoints", strings.Join(c.grpcs[:voters], ","))
	if out, err := add.CombinedOutput(); err != nil {
		return fmt.Errorf("lodestone members add --learner: %w: %s", err, bytes.TrimSpace(out))
	}
	if err := c.startMember(bin, i, initial, true); err != nil {
		return err
	}
	c.learners++
	return c.poll(ctx, 30*time.Second, "learner "+c.https[i]+" catching up", func(ctx context.Context) error {
		var got []struct{ Value []byte }
		if err := getJSON(ctx, c.https[i]+"/v1/kv/"+probeKey+"?stale", &got); err != nil {
			return err
		}
		if len(got) != 1 || string(got[0].Value) != "ok" {
			return fmt.Errorf("stale read of %s gave %d entries", probeKey, len(got))
		}
		return nil
	})
}

// roles names the members in process order for the run lines: leader, f1,
// f2 (harness.Roles), then "learner" for one learner, l1, l2, ... for more.
func (c *cluster) roles() []string {
	roles := harness.Roles(voters, c.leader)
	for i := range c.learners {
		if c.learners == 1 {
			roles = append(roles, "learner")
		} else {
			roles = append(roles, fmt.Sprintf("l%d", i+1))
		}
	}
	return roles
}

// queryMembers are the members -queries-on on names (queryMembers).
func (c *cluster) queryMembers(on string) []int {
	return queryMembers(voters, c.learners, c.leader, on)
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

// elsewhere is the part of busy, the time the servers' CPUs were busy
// between the CPU readings before and after, that neither the members
// left there nor the writer (when it shares them) used: other programs
// on a shared machine, and interrupt work charged to no process. A phase
// that fills the query members' CPU can push other programs here.
func (c *cluster) elsewhere(busy time.Duration, before, after []time.Duration, writer time.Duration) time.Duration {
	moved := []int(nil)
	if *flagQueryCPUs != "" {
		moved = c.queryMembers(*flagQueriesOn)
	}
	for i := range c.procs {
		if !slices.Contains(moved, i) {
			busy -= after[i] - before[i]
		}
	}
	if cmp.Or(*flagWriterCPUs, *flagClientCPUs) == *flagServerCPUs {
		busy -= writer
	}
	return max(busy, 0)
}

// footprint says, per member, its resident memory and its Raft log
// file's size, in MiB: "leader=610/48,...". The two grow over a fresh
// cluster's first minutes (README, "Settling").
func (c *cluster) footprint(ctx context.Context) (string, error) {
	files, err := c.members(ctx, raftLogFileMetric)
	if err != nil {
		return "", err
	}
	var parts []string
	for i, role := range c.roles() {
		rss, err := harness.RSS(c.procs[i].Pid())
		if err != nil {
			return "", err
		}
		parts = append(parts, fmt.Sprintf("%s=%.0f/%.0f", role, float64(rss)/(1<<20), files[i]/(1<<20)))
	}
	return strings.Join(parts, ","), nil
}

// appendAcks reads, from the leader's lodestone_peer_append_ack_seconds,
// each other member's acknowledged appends and their summed lag in
// seconds, in process order (the leader's own are zero).
func (c *cluster) appendAcks(ctx context.Context) (count, sum []float64, err error) {
	var names []string
	for i := range c.procs {
		if i != c.leader {
			sel := fmt.Sprintf(`{peer="%x"}`, member.ID(memberName(i)))
			names = append(names, appendAckMetric+"_count"+sel, appendAckMetric+"_sum"+sel)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, metricTimeout)
	defer cancel()
	m, err := harness.Scrape(sctx, c.https[c.leader]+"/metrics", names...)
	if err != nil {
		return nil, nil, err
	}
	count, sum = make([]float64, len(c.procs)), make([]float64, len(c.procs))
	for i, j := 0, 0; i < len(c.procs); i++ {
		if i != c.leader {
			count[i], sum[i] = m[names[j]], m[names[j+1]]
			j += 2
		}
	}
	return count, sum, nil
}

// stop stops the followers, then the leader (SIGTERM, SIGKILL after
// 10s), and removes the data unless -keep.
func (c *cluster) stop() error {
	err := harness.StopLeaderLast(c.procs, c.leader, 10*time.Second)
	if !*flagKeep {
		for _, d := range []string{c.dir, c.ldir} {
			if d == "" {
				continue
			}
			if rerr := os.RemoveAll(d); rerr != nil && err == nil {
				err = rerr
			}
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
	raftLogFileMetric = `lodestone_raftlog_file_bytes`
	appendAckMetric   = `lodestone_peer_append_ack_seconds`
)

// metricTimeout bounds one read of a member's /metrics. A learner taking
// 12,500 queries on a crowded CPU took more than 5 s to answer, and the
// run ended there.
const metricTimeout = 30 * time.Second

// metricsURLs are the members' /metrics, in process order.
func (c *cluster) metricsURLs() []string { return harness.MetricsURLs(c.https) }

// metricValue reads one metric from the server at base.
func metricValue(ctx context.Context, base, metric string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, metricTimeout)
	defer cancel()
	m, err := harness.Scrape(ctx, base+"/metrics", metric)
	return m[metric], err
}

// members reads metric from every member, in process order. A member
// that does not answer within metricTimeout gets NaN (its figures on the
// run line read NaN) and a log line: a learner on a crowded CPU is slow
// to answer, and a diagnostic figure is no reason to end the run. Only
// ctx's end is an error.
func (c *cluster) members(ctx context.Context, metric string) ([]float64, error) {
	vs := make([]float64, len(c.https))
	for i, base := range c.https {
		v, err := metricValue(ctx, base, metric)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			logf("%s: %s: %v", c.procs[i].Name, metric, err)
			v = math.NaN()
		}
		vs[i] = v
	}
	return vs, nil
}

// profile starts CPU and allocation profiles of every server for dur when
// dir is set, and returns a func that waits for them and writes them to
// dir/ROLE-NAME.pprof, .allocs-base.pprof and .allocs.pprof: leader, f1, f2
// (harness.Roles).
func (c *cluster) profile(ctx context.Context, dur time.Duration, dir, name string) func() error {
	return harness.ProfileAll(ctx, c.https, c.roles(), dur, dir, name)
}
