package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

// system is one store under test: how to start a member and how to talk to
// the cluster. Everything else (ports, data dirs, pinning, connection
// scheme, workload, shutdown) is shared so both systems run the same way.
type system struct {
	name string
	bin  string // path of the built server binary
	// args returns the command line of member i. peers[j] and clients[j]
	// are member j's peer and client (gRPC) addresses; http is a spare
	// port per member for systems that listen on HTTP too.
	args func(i int, names, peers, clients, http []string, dataDir string) []string
	// leader asks each client address who leads and returns the leader's
	// client address; it fails while there is none.
	leader func(ctx context.Context, sys system, clients []string) (string, error)
	// ops opens one bench connection to c's leader and returns its
	// operations, each a single call of the system's Go client (see each
	// system for which); close releases it.
	ops func(ctx context.Context, c *cluster) (connOps, error)
	// stubPut is a put of the raw generated stub on conn, whatever
	// credentials conn carries: the secure setup's checks.
	stubPut func(conn *grpc.ClientConn) func(ctx context.Context, key, value []byte) error
	// dialOptions are the connection options of the system's own Go
	// client, so each side runs as its users run it.
	dialOptions []grpc.DialOption
	// sec, when set, is the CA and certificates of the secure variant:
	// every dial uses TLS with the bench's client certificate.
	sec *secureFiles
	// prepare, if set, runs once the cluster has a leader and before the
	// probe put: the secure variants set up their access control there
	// (and may add to the cluster's connOptions).
	prepare func(ctx context.Context, c *cluster) error
	// login, if set, opens one authenticated bench connection to addr
	// (etcd: Authenticate on it); otherwise a bench connection is a dial
	// with the cluster's connOptions.
	login func(ctx context.Context, sys system, addr string) (*grpc.ClientConn, error)
	// profiles: its members serve /debug/pprof on their HTTP port when
	// started with -pprof.
	profiles bool
	// readRounds: its members export lodestone_read_index_batch_size on
	// their HTTP port's /metrics.
	readRounds bool
}

// dial opens one gRPC connection to addr with the system's options, over
// TLS with the bench's client certificate for a secure variant and in
// plain text otherwise.
func (s system) dial(addr string, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if s.sec != nil {
		creds = credentials.NewTLS(s.sec.client)
	}
	opts := append(slices.Clone(s.dialOptions), extra...)
	conn, err := grpc.NewClient("passthrough:///"+addr, append(opts, grpc.WithTransportCredentials(creds))...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return conn, nil
}

// cluster is three running members of one system.
type cluster struct {
	sys     system
	dir     string
	procs   []*harness.Proc
	clients []string // gRPC addresses, member order
	http    []string // each member's spare (HTTP) address, member order
	leader  string   // the leader's gRPC address once known
	// connOptions are added to every bench connection (a secure
	// Lodestone's ACL token); set by the system's prepare.
	connOptions []grpc.DialOption
	// token is the secret connOptions send, for a secure Lodestone.
	token string
	// mgmtToken is a secure Lodestone's management token (prepare).
	mgmtToken string
}

// connect opens one bench connection to addr (authenticated, for a secure
// variant).
func (c *cluster) connect(ctx context.Context, addr string) (*grpc.ClientConn, error) {
	if c.sys.login != nil {
		return c.sys.login(ctx, c.sys, addr)
	}
	return c.sys.dial(addr, c.connOptions...)
}

const members = 3

// errPortTaken marks a start that failed because another process on the
// machine bound one of the free ports picked between the pick and the
// member's listen; a start with fresh ports may succeed.
var errPortTaken = errors.New("a port was taken before a member could listen on it")

// portTaken wraps err in errPortTaken when a member exited and the logs
// (tails) say a listen found its address in use.
func portTaken(err error, tails string) error {
	if errors.Is(err, harness.ErrExited) && strings.Contains(tails, "address already in use") {
		return fmt.Errorf("%w: %w", errPortTaken, err)
	}
	return err
}

// startAttempts is how many times a cluster start that lost a port is
// made with fresh ports before the run fails.
const startAttempts = 3

// startClusterRetrying is startCluster, retried with fresh ports when a
// port was taken.
func startClusterRetrying(ctx context.Context, sys system, workDir, cpus string) (*cluster, error) {
	for attempt := 1; ; attempt++ {
		c, err := startCluster(ctx, sys, workDir, cpus)
		if err == nil || !errors.Is(err, errPortTaken) || attempt == startAttempts {
			return c, err
		}
		logf("%s: a port was taken during start (attempt %d of %d); starting again on fresh ports", sys.name, attempt, startAttempts)
	}
}

// startCluster starts three members of sys on fresh loopback ports with
// data under a fresh directory in workDir, each under `taskset -c cpus`
// when cpus is set, and waits until a leader accepts a put. On error
// everything it started is stopped and removed.
func startCluster(ctx context.Context, sys system, workDir, cpus string) (_ *cluster, err error) {
	dir, err := os.MkdirTemp(workDir, sys.name+"-")
	if err != nil {
		return nil, fmt.Errorf("make data dir: %w", err)
	}
	c := &cluster{sys: sys, dir: dir}
	defer func() {
		if err != nil {
			tails := c.logTails()
			err = fmt.Errorf("%s: %w%s", sys.name, portTaken(err, tails), tails)
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
		data := filepath.Join(dir, names[i])
		args := sys.args(i, names, peers, c.clients, c.http, data)
		p, err := harness.Start(names[i], sys.bin, args, filepath.Join(dir, names[i]+".log"), cpus)
		if err != nil {
			return nil, err
		}
		c.procs = append(c.procs, p)
	}

	if c.leader, err = c.waitLeader(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	if sys.prepare != nil {
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := sys.prepare(pctx, c)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	if err := c.probe(ctx, 20*time.Second); err != nil {
		return nil, err
	}
	if sys.sec != nil {
		if err := c.checkSecure(ctx); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// waitLeader polls until some member says it is the leader.
func (c *cluster) waitLeader(ctx context.Context, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if err := c.checkAlive(); err != nil {
			return "", err
		}
		qctx, qcancel := context.WithTimeout(ctx, time.Second)
		addr, err := c.sys.leader(qctx, c.sys, c.clients)
		qcancel()
		if err == nil {
			return addr, nil
		}
		last = err
		select {
		case <-ctx.Done():
			if parent := context.Cause(ctx); errors.Is(parent, context.Canceled) {
				return "", parent
			}
			return "", fmt.Errorf("no leader within %s: %w", timeout, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// probe retries one put on the leader until it is acknowledged, so the
// measured run starts on a cluster that commits.
func (c *cluster) probe(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ops, err := c.sys.ops(ctx, c)
	if err != nil {
		return err
	}
	defer ops.close()
	put := ops.put
	for {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		err := put(pctx, []byte("kvbench/probe"), []byte("ok"))
		pcancel()
		if err == nil {
			return nil
		}
		if err := c.checkAlive(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("probe put on leader %s: %w", c.leader, err)
		case <-time.After(100 * time.Millisecond):
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

// stop stops every member (SIGTERM, then SIGKILL after 10s) and removes
// the data directory unless keep is set. Followers go first, then the
// leader: a leader stopped with its followers up tries to hand leadership
// over first (etcd does, and waits seconds for followers that are
// themselves shutting down), which only slows the benchmark down.
func (c *cluster) stop() error {
	err := harness.StopLeaderLast(c.procs, slices.Index(c.clients, c.leader), 10*time.Second)
	if !*flagKeep {
		if rerr := os.RemoveAll(c.dir); rerr != nil && err == nil {
			err = rerr
		}
	}
	return err
}

// cpuTime is the user+system CPU time all servers have used so far (0 for
// a server whose time cannot be read).
func (c *cluster) cpuTime() time.Duration {
	var sum time.Duration
	for _, p := range c.procs {
		if d, err := harness.CPUTime(p.Pid()); err == nil {
			sum += d
		}
	}
	return sum
}

func (c *cluster) logTails() string { return harness.LogTails(c.sys.name, c.procs, 1500) }

// memberName is the name of member i (0-based): n1, n2, n3.
func memberName(i int) string { return fmt.Sprintf("n%d", i+1) }

// preload writes the preloadKeys read keys with values of size bytes on
// the leader, in transactions of preloadBatch puts from 8 writers on
// connections of their own, and fails unless every one commits. Both
// systems are loaded the same way; batches make it take a fraction of a
// second instead of seconds of single puts.
func (c *cluster) preload(ctx context.Context, size int) error {
	const writers = 8
	var next atomic.Int64 // the next batch to write
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		ops, err := c.sys.ops(ctx, c)
		if err != nil {
			return err
		}
		defer ops.close()
		putBatch := ops.putBatch
		value := make([]byte, size)
		rand.Read(value)
		wg.Go(func() {
			for b := int(next.Add(1) - 1); b*preloadBatch < preloadKeys && errs[w] == nil; b = int(next.Add(1) - 1) {
				var keys [][]byte
				for i := b * preloadBatch; i < min((b+1)*preloadBatch, preloadKeys); i++ {
					keys = append(keys, preloadKey(i))
				}
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				if err := putBatch(pctx, keys, value); err != nil {
					errs[w] = fmt.Errorf("preload %s to %s: %w", keys[0], keys[len(keys)-1], err)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
