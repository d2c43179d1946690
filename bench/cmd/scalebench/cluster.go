package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

const members = 3

// cluster is three members of one system, started on fresh loopback ports
// with data under dir; members can be stopped and started again on the
// same ports and data.
type cluster struct {
	sys     system
	dir     string
	cpus    string
	procs   []*harness.Proc
	args    [][]string // each member's command line
	clients []string   // gRPC addresses, member order
	http    []string   // HTTP addresses, member order (etcd: its client port)
	leader  int        // index of the member found leading, -1 before
}

// memberName is the name of member i (0-based): n1, n2, n3.
func memberName(i int) string { return fmt.Sprintf("n%d", i+1) }

func initialCluster(names, peers []string) string {
	var parts []string
	for i := range names {
		parts = append(parts, names[i]+"="+peers[i])
	}
	return strings.Join(parts, ",")
}

// startCluster starts three members of sys under `taskset -c cpus` and
// waits for a leader that acknowledges a put. On error everything it
// started is stopped and removed.
func startCluster(ctx context.Context, sys system, workDir, cpus string) (_ *cluster, err error) {
	dir, err := os.MkdirTemp(workDir, sys.name+"-")
	if err != nil {
		return nil, fmt.Errorf("make data dir: %w", err)
	}
	c := &cluster{sys: sys, dir: dir, cpus: cpus, leader: -1}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%s: %w%s", sys.name, err, c.logTails())
			c.stop()
		}
	}()
	ports, err := harness.FreePorts(3 * members)
	if err != nil {
		return nil, err
	}
	var names, peers []string
	for i := range members {
		names = append(names, memberName(i))
		peers = append(peers, fmt.Sprintf("127.0.0.1:%d", ports[i]))
		c.clients = append(c.clients, fmt.Sprintf("127.0.0.1:%d", ports[members+i]))
		c.http = append(c.http, fmt.Sprintf("127.0.0.1:%d", ports[2*members+i]))
	}
	for i := range members {
		c.args = append(c.args, sys.args(i, names, peers, c.clients, c.http, filepath.Join(dir, names[i])))
		if sys.httpOnClient {
			c.http[i] = c.clients[i]
		}
	}
	c.procs = make([]*harness.Proc, members)
	for i := range members {
		if err := c.startMember(i); err != nil {
			return nil, err
		}
	}
	if err := c.findLeader(ctx, 60*time.Second); err != nil {
		return nil, err
	}
	if err := c.probe(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	return c, nil
}

// startMember starts member i with its command line, appending to its log.
func (c *cluster) startMember(i int) error {
	name := memberName(i)
	log := filepath.Join(c.dir, fmt.Sprintf("%s.%d.log", name, time.Now().UnixNano()))
	p, err := harness.Start(name, c.sys.bin, c.args[i], log, c.cpus)
	if err != nil {
		return err
	}
	c.procs[i] = p
	return nil
}

// findLeader polls until a member says it leads.
func (c *cluster) findLeader(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if err := c.checkAlive(); err != nil {
			return err
		}
		qctx, qcancel := context.WithTimeout(ctx, 2*time.Second)
		i, err := c.sys.leader(qctx, c.clients)
		qcancel()
		if err == nil {
			c.leader = i
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("no leader within %s: %w", timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// probe retries a put on the leader until it is acknowledged.
func (c *cluster) probe(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := dial(c.clients[c.leader])
	if err != nil {
		return err
	}
	defer conn.Close()
	ops := c.sys.ops(conn)
	for {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		err := ops.putBatch(pctx, [][]byte{[]byte(probeKey)}, [][]byte{[]byte("ok")})
		pcancel()
		if err == nil {
			return nil
		}
		if aerr := c.checkAlive(); aerr != nil {
			return aerr
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("probe put on leader %s: %w", c.clients[c.leader], err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *cluster) checkAlive() error {
	for _, p := range c.procs {
		if p == nil {
			continue
		}
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%w: %s (%v)", harness.ErrExited, p.Name, err)
		}
	}
	return nil
}

// stopGrace is how long a member has to exit after SIGTERM.
const stopGrace = 30 * time.Second

// stop stops every member (followers first) and removes the data unless
// -keep.
func (c *cluster) stop() error {
	var live []*harness.Proc
	leader := -1
	for i, p := range c.procs {
		if p != nil {
			if i == c.leader {
				leader = len(live)
			}
			live = append(live, p)
		}
	}
	err := harness.StopLeaderLast(live, leader, stopGrace)
	if !*flagKeep {
		if rerr := os.RemoveAll(c.dir); rerr != nil && err == nil {
			err = rerr
		}
	}
	return err
}

func (c *cluster) logTails() string {
	var live []*harness.Proc
	for _, p := range c.procs {
		if p != nil {
			live = append(live, p)
		}
	}
	return harness.LogTails(c.sys.name, live, 1500)
}

// follower returns the index of a member that is not the leader.
func (c *cluster) follower() int { return (c.leader + 1) % members }

// restarted is what one restart of some members took, per member.
type restarted struct {
	took []time.Duration // from process start to its first answer
	cpu  []time.Duration // CPU time the process used until then
}

// restart stops the members in which (SIGTERM, waiting for each to exit),
// starts them again together and returns, per member, the time from its
// process start to its first answer to a linearizable read of key with
// the value want, and the CPU time it used until then: unlike the wall
// time, the CPU time hardly moves with the load of a shared machine. Every
// other member keeps running.
func (c *cluster) restart(ctx context.Context, which []int, key, want []byte, timeout time.Duration) (restarted, error) {
	var procs []*harness.Proc
	for _, i := range which {
		procs = append(procs, c.procs[i])
	}
	if err := harness.StopAll(procs, stopGrace); err != nil {
		return restarted{}, err
	}
	started := make([]time.Time, len(which))
	for k, i := range which {
		started[k] = time.Now()
		if err := c.startMember(i); err != nil {
			return restarted{}, err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r := restarted{took: make([]time.Duration, len(which)), cpu: make([]time.Duration, len(which))}
	errs := make([]error, len(which))
	var wg sync.WaitGroup
	for k, i := range which {
		wg.Go(func() {
			if errs[k] = c.awaitRead(ctx, i, key, want); errs[k] != nil {
				return
			}
			r.took[k] = time.Since(started[k])
			r.cpu[k], errs[k] = harness.CPUTime(c.procs[i].Pid())
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return restarted{}, fmt.Errorf("%w%s", err, c.logTails())
	}
	if slices.Contains(which, c.leader) {
		if err := c.findLeader(ctx, timeout); err != nil {
			return restarted{}, err
		}
	}
	return r, nil
}

// awaitRead polls member i with linearizable reads of key until one
// returns want. Each attempt waits for the port to accept, then uses a
// connection of its own, so no gRPC reconnect backoff delays the answer.
func (c *cluster) awaitRead(ctx context.Context, i int, key, want []byte) error {
	addr := c.clients[i]
	var last error
	for {
		if exited, err := c.procs[i].Exited(); exited {
			return fmt.Errorf("%s exited during restart: %v", memberName(i), err)
		}
		last = c.readOnce(ctx, addr, key, want)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s serves no linearizable read: %w", memberName(i), last)
		case <-time.After(pollInterval):
		}
	}
}

// pollInterval is the pause between two read attempts on a restarting
// member: it bounds how late the answer can be noticed.
const pollInterval = 5 * time.Millisecond

func (c *cluster) readOnce(ctx context.Context, addr string, key, want []byte) error {
	d := net.Dialer{Timeout: 200 * time.Millisecond}
	tc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	tc.Close()
	conn, err := dial(addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	got, found, err := c.sys.ops(conn).getLinearizable(rctx, key)
	switch {
	case err != nil:
		return err
	case !found:
		return fmt.Errorf("key %s not found", key)
	case string(got) != string(want):
		return fmt.Errorf("key %s: value of %d bytes differs from the one written", key, len(got))
	}
	return nil
}

// dial opens a plain-text gRPC connection to addr.
func dial(addr string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return conn, nil
}

// rss returns every member's resident memory in bytes.
func (c *cluster) rss() ([]int64, error) {
	out := make([]int64, members)
	for i, p := range c.procs {
		v, err := harness.RSS(p.Pid())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", memberName(i), err)
		}
		out[i] = v
	}
	return out, nil
}

// dataBytes is the size on disk of member i's data directory.
func (c *cluster) dataBytes(i int) (int64, error) {
	var sum int64
	err := filepath.WalkDir(filepath.Join(c.dir, memberName(i)), func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			sum += info.Size()
		}
		return nil
	})
	return sum, err
}
