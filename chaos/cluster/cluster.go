// Package cluster runs a Lodestone cluster as real processes, one per
// network namespace (chaos/netns), and performs the process-level faults:
// kill -9 and restart, SIGSTOP/SIGCONT, and membership changes.
//
// # What it owns
//
// The node processes (each started through `ip netns exec`, in its own
// process group, killed if the harness dies), their data directories and
// log files under Options.Dir, and one gRPC connection per node slot that
// outlives restarts (two on a secure cluster: the workloads' and the
// harness's, each with its token). Unless Options.Plaintext, it also owns
// the campaign's certificates under Options.Dir/tls and bootstraps ACLs
// (Security). A slot is a namespace and address; the member in it
// has a name that changes when a membership fault replaces it.
//
// # Caller's duties
//
//  1. Build the network (netns.Setup) before Start.
//  2. Serialize faults: methods that change a node are safe for concurrent
//     use, but the nemesis decides what runs when.
//  3. Close at the end: it kills every process and closes the connections.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/chaos/netns"
	"github.com/lodestone-kv/lodestone/internal/faulthook"
	"github.com/lodestone-kv/lodestone/internal/member"
)

// Options configures a cluster.
type Options struct {
	// Binary is the lodestone executable.
	Binary string
	// Dir receives nodes/<name>/ data dirs and nodes/<name>.log.
	Dir string
	// Nodes is the number of voters (3 or 5).
	Nodes int
	// ServerArgs are appended to every `lodestone server` command line
	// (tuning, hidden unsafe flags).
	ServerArgs []string
	// DialOptions are added to the per-slot gRPC connections.
	DialOptions []grpc.DialOption
	// Plaintext runs the nodes without TLS and ACLs (--insecure-plaintext).
	// Otherwise every port speaks TLS and requires a client certificate
	// from the campaign CA, ACLs deny by default, and Start bootstraps
	// them (Security).
	Plaintext bool
	// WorkloadRules is the ACL policy (Consul rule language) of the token
	// every Node.Conn carries; unused in plain text.
	WorkloadRules string
	// HostileRules, if set, is the policy of a second token,
	// Security.Hostile, for the hostile client; unused in plain text.
	HostileRules string
	// ClusterToken is every founding member's --cluster-token.
	ClusterToken string
	// Logger receives state changes; nil discards.
	Logger *slog.Logger
}

// Node is one slot: a namespace, an address, and the member running there.
type Node struct {
	Slot int
	IP   string
	// Conn reaches the slot's gRPC port whoever runs there, with the
	// workload's token on a secure cluster.
	Conn *grpc.ClientConn
	// admin is the harness's connection to the slot (the management
	// token); Conn itself in plain text.
	admin *grpc.ClientConn

	mu   sync.Mutex
	name string
	gen  int
	// pending is the name an Add is trying to give the slot; it is kept
	// across failed attempts so a lost answer is not followed by a second
	// member in the slot.
	pending string
	member  bool // a member of the cluster as far as the harness knows
	proc    *proc
	paused  bool
}

// Name is the current member name in the slot.
func (n *Node) Name() string { n.mu.Lock(); defer n.mu.Unlock(); return n.name }

// ID is the current member's Raft id (member.ID of the name).
func (n *Node) ID() uint64 { return member.ID(n.Name()) }

// Running reports whether the process runs and is not paused.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc != nil && !n.proc.exited() && !n.paused
}

func (n *Node) peerAddr() string { return net.JoinHostPort(n.IP, strconv.Itoa(netns.PeerPort)) }
func (n *Node) grpcAddr() string { return net.JoinHostPort(n.IP, strconv.Itoa(netns.GRPCPort)) }
func (n *Node) httpAddr() string { return net.JoinHostPort(n.IP, strconv.Itoa(netns.HTTPPort)) }

// Cluster is a running cluster.
type Cluster struct {
	opts   Options
	net    *netns.Net
	logger *slog.Logger
	Nodes  []*Node
	sec    *Security // nil in plain text
	hc     *http.Client
}

// Start creates the namespaces, starts every node and waits until each is
// ready.
func Start(ctx context.Context, nw *netns.Net, opts Options) (*Cluster, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Cluster{opts: opts, net: nw, logger: opts.Logger}
	if err := os.MkdirAll(filepath.Join(opts.Dir, "nodes"), 0o755); err != nil {
		return nil, fmt.Errorf("create nodes dir: %w", err)
	}
	if !opts.Plaintext {
		sec, err := newSecurity(opts.Dir)
		if err != nil {
			return nil, err
		}
		c.sec = sec
	}
	c.hc = c.sec.httpClient()
	var wsecret, msecret string
	if c.sec != nil {
		wsecret, msecret = c.sec.Workload, c.sec.Management
	}
	var initial []string
	for k := 0; k < opts.Nodes; k++ {
		if err := nw.AddNode(ctx, k); err != nil {
			return nil, err
		}
		n := &Node{Slot: k, IP: netns.NodeIP(k), name: fmt.Sprintf("n%d", k+1), member: true}
		c.Nodes = append(c.Nodes, n)
		conn, err := c.dial(n, wsecret)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("dial slot %d: %w", k, err)
		}
		n.Conn, n.admin = conn, conn
		if c.sec != nil {
			if n.admin, err = c.dial(n, msecret); err != nil {
				c.Close()
				return nil, fmt.Errorf("dial slot %d: %w", k, err)
			}
		}
		initial = append(initial, n.name+"="+n.peerAddr())
	}
	for _, n := range c.Nodes {
		if err := c.startProc(n, strings.Join(initial, ","), false); err != nil {
			c.Close()
			return nil, err
		}
	}
	for _, n := range c.Nodes {
		if err := c.WaitReady(ctx, n, 30*time.Second); err != nil {
			c.Close()
			return nil, err
		}
	}
	if c.sec != nil {
		if err := c.bootstrapACL(ctx, opts.WorkloadRules, 30*time.Second); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// dial opens the slot's connection with secret as its ACL token.
func (c *Cluster) dial(n *Node, secret string) (*grpc.ClientConn, error) {
	return grpc.NewClient(n.grpcAddr(), append(append(c.sec.dialOptions(secret),
		// NB: gRPC's default reconnect backoff grows to 2 minutes; a
		// restarted node must be reachable again within a second.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}),
	), c.opts.DialOptions...)...)
}

// proc is one node process.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  *os.File
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (c *Cluster) dataDir(name string) string { return filepath.Join(c.opts.Dir, "nodes", name) }

// startProc starts the slot's current member. Caller must not hold n.mu.
func (c *Cluster) startProc(n *Node, initial string, join bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil && !n.proc.exited() {
		return fmt.Errorf("slot %d (%s) already runs", n.Slot, n.name)
	}
	args := []string{"server", "--name", n.name, "--data-dir", c.dataDir(n.name),
		"--listen-peer", n.peerAddr(), "--listen-grpc", n.grpcAddr(), "--listen-http", n.httpAddr(),
		"--initial-cluster", initial}
	if c.sec == nil {
		args = append(args, "--insecure-plaintext")
	} else {
		// The member's certificate is issued on its first start and kept
		// for every restart.
		sargs, err := c.sec.serverArgs(n.name, n.IP)
		if err != nil {
			return err
		}
		args = append(args, sargs...)
	}
	if c.opts.ClusterToken != "" {
		args = append(args, "--cluster-token", c.opts.ClusterToken)
	}
	if join {
		args = append(args, "--join")
	}
	args = append(args, c.opts.ServerArgs...)
	f, err := os.OpenFile(filepath.Join(c.opts.Dir, "nodes", n.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open log of %s: %w", n.name, err)
	}
	fmt.Fprintf(f, "--- chaos: start %s at %s: %s\n", n.name, time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	cmd := c.net.Command(n.Slot, c.opts.Binary, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", n.name, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{}), log: f}
	// The waiter is owned by the proc: it ends when the process does,
	// which Kill and Close guarantee.
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	n.proc, n.paused = p, false
	c.logger.Info("node started", "node", n.name, "slot", n.Slot, "pid", cmd.Process.Pid, "join", join)
	return nil
}

// WaitReady polls the node's /readyz until it answers 200.
func (c *Cluster) WaitReady(ctx context.Context, n *Node, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, c.URL(n)+"/readyz", nil)
		resp, err := c.hc.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		n.mu.Lock()
		dead := n.proc == nil || n.proc.exited()
		n.mu.Unlock()
		if dead {
			return fmt.Errorf("%s exited before it was ready (see nodes/%s.log)", n.Name(), n.Name())
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%s not ready within %v (see nodes/%s.log)", n.Name(), within, n.Name())
}

// SetDiskDelay makes every log write of the node wait d before it
// reaches the disk, through the server's fault hooks (--fault-hooks).
func (c *Cluster) SetDiskDelay(ctx context.Context, n *Node, d time.Duration) error {
	fc := faulthook.Client{HTTP: c.hc}
	if c.sec != nil {
		fc.HTTPS, fc.Token = true, c.sec.Management
	}
	return fc.SetDiskDelay(ctx, n.httpAddr(), d)
}

// Kill sends SIGKILL and waits until the process is gone.
func (c *Cluster) Kill(n *Node) error {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil || p.exited() {
		return nil
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s did not exit within 10s of SIGKILL", n.Name())
	}
	n.mu.Lock()
	n.paused = false
	n.mu.Unlock()
	c.logger.Info("node killed", "node", n.Name())
	return nil
}

// Restart starts the slot's member again on its data dir, if it is not
// running. It does not wait for readiness.
func (c *Cluster) Restart(ctx context.Context, n *Node) error {
	n.mu.Lock()
	running := n.proc != nil && !n.proc.exited()
	member := n.member
	n.mu.Unlock()
	if running || !member {
		return nil
	}
	initial := c.initialCluster(ctx, n)
	return c.startProc(n, initial, n.gen > 0)
}

// initialCluster names the members a restarting node should know: the
// current membership when some node answers, else the slots' members.
func (c *Cluster) initialCluster(ctx context.Context, self *Node) string {
	var parts []string
	if ms, err := c.Members(ctx); err == nil {
		for _, m := range ms {
			parts = append(parts, m.Name+"="+m.PeerAddr)
		}
	}
	if len(parts) == 0 {
		for _, n := range c.Nodes {
			parts = append(parts, n.Name()+"="+n.peerAddr())
		}
	}
	if !slicesContainsPrefix(parts, self.Name()+"=") {
		parts = append(parts, self.Name()+"="+self.peerAddr())
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func slicesContainsPrefix(s []string, p string) bool {
	for _, x := range s {
		if strings.HasPrefix(x, p) {
			return true
		}
	}
	return false
}

// Pause sends SIGSTOP; Resume sends SIGCONT.
func (c *Cluster) Pause(n *Node) error  { return c.signal(n, syscall.SIGSTOP, true) }
func (c *Cluster) Resume(n *Node) error { return c.signal(n, syscall.SIGCONT, false) }

func (c *Cluster) signal(n *Node, sig syscall.Signal, paused bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc == nil || n.proc.exited() {
		n.paused = false
		return nil
	}
	if err := n.proc.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%v %s: %w", sig, n.name, err)
	}
	n.paused = paused
	return nil
}

// Status asks one node for its status with a short timeout.
func (c *Cluster) Status(ctx context.Context, n *Node) (*lodestonepb.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	return lodestonepb.NewClusterClient(n.admin).Status(ctx, &lodestonepb.StatusRequest{})
}

// Leader returns the node that the most running nodes name as leader, with
// the highest term seen; nil if none does.
func (c *Cluster) Leader(ctx context.Context) (*Node, uint64) {
	type answer struct {
		lead, term uint64
	}
	answers := make([]answer, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if st, err := c.Status(ctx, n); err == nil {
				answers[i] = answer{st.LeaderId, st.Term}
			}
		}()
	}
	wg.Wait()
	votes := map[uint64]int{}
	var term uint64
	for _, a := range answers {
		if a.lead != 0 {
			votes[a.lead]++
			term = max(term, a.term)
		}
	}
	var best uint64
	for id, v := range votes {
		if v > votes[best] {
			best = id
		}
	}
	for _, n := range c.Nodes {
		if best != 0 && n.ID() == best {
			return n, term
		}
	}
	return nil, term
}

// Members lists the membership from the first node that answers.
func (c *Cluster) Members(ctx context.Context) ([]*lodestonepb.Member, error) {
	var last error = errors.New("no node running")
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := lodestonepb.NewClusterClient(n.admin).Members(cctx, &lodestonepb.MembersRequest{})
		cancel()
		if err == nil {
			return resp.Members, nil
		}
		last = err
	}
	return nil, fmt.Errorf("list members: %w", last)
}

// Close kills every process and closes the connections.
func (c *Cluster) Close() error {
	var errs []error
	for _, n := range c.Nodes {
		errs = append(errs, c.Kill(n))
		if n.Conn != nil {
			n.Conn.Close()
		}
		if n.admin != nil && n.admin != n.Conn {
			n.admin.Close()
		}
	}
	return errors.Join(errs...)
}
