package consulpeer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
)

// Cluster is n running Consul servers.
type Cluster struct {
	Dir    string          // data dirs and logs
	Procs  []*harness.Proc // member order
	HTTP   []string        // "http://127.0.0.1:port", member order
	Server []string        // Raft/RPC addresses, member order
	Leader int             // index of the leader once known
}

// Options says how to start a cluster.
type Options struct {
	Members  int    // servers; must be >= 1
	CPUs     string // taskset CPU list of every server; "" = unpinned
	LogLevel string // -log-level; "" = warn
	// Extra are more agent flags, given to every server (e.g. -hcl
	// fragments).
	Extra []string
}

// portsPerMember: HTTP, server (Raft and RPC), Serf LAN, Serf WAN.
const portsPerMember = 4

// StartCluster starts opts.Members servers of bin on fresh loopback ports
// with data in a fresh directory under workDir, and waits until a leader
// has acknowledged a KV put. On error everything it started is stopped
// and the directory removed.
func StartCluster(ctx context.Context, bin, workDir string, opts Options) (_ *Cluster, err error) {
	if opts.Members < 1 {
		return nil, fmt.Errorf("consul cluster of %d members", opts.Members)
	}
	dir, err := os.MkdirTemp(workDir, "consul-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, Leader: -1}
	defer func() {
		if err != nil {
			err = fmt.Errorf("consul: %w%s", err, harness.LogTails("consul", c.Procs, 1500))
			c.Stop(false)
		}
	}()
	n := opts.Members
	ports, err := harness.FreePorts(portsPerMember * n)
	if err != nil {
		return nil, err
	}
	var lan []string
	for i := range n {
		p := ports[portsPerMember*i:]
		c.HTTP = append(c.HTTP, fmt.Sprintf("http://127.0.0.1:%d", p[0]))
		c.Server = append(c.Server, fmt.Sprintf("127.0.0.1:%d", p[1]))
		lan = append(lan, fmt.Sprintf("127.0.0.1:%d", p[2]))
	}
	for i := range n {
		p := ports[portsPerMember*i:]
		args := agentArgs(memberName(i), filepath.Join(dir, memberName(i)), n, p, lan, opts)
		proc, err := harness.Start("consul-"+memberName(i), bin, args, filepath.Join(dir, memberName(i)+".log"), opts.CPUs)
		if err != nil {
			return nil, err
		}
		c.Procs = append(c.Procs, proc)
	}
	if err := c.waitLeader(ctx, 60*time.Second); err != nil {
		return nil, err
	}
	return c, c.probe(ctx, 30*time.Second)
}

// agentArgs is member name's command line: a server expecting n servers,
// joining the others' Serf LAN addresses lan, on ports (HTTP, server,
// Serf LAN, Serf WAN), with DNS and gRPC off.
func agentArgs(name, dataDir string, n int, ports []int, lan []string, opts Options) []string {
	level := opts.LogLevel
	if level == "" {
		level = "warn"
	}
	args := []string{"agent", "-server", "-bootstrap-expect", strconv.Itoa(n),
		"-node", name, "-data-dir", dataDir,
		"-bind", "127.0.0.1", "-advertise", "127.0.0.1", "-client", "127.0.0.1",
		"-http-port", strconv.Itoa(ports[0]), "-server-port", strconv.Itoa(ports[1]),
		"-serf-lan-port", strconv.Itoa(ports[2]), "-serf-wan-port", strconv.Itoa(ports[3]),
		"-dns-port", "-1", "-grpc-port", "-1", "-grpc-tls-port", "-1",
		"-log-level", level,
	}
	self := fmt.Sprintf("127.0.0.1:%d", ports[2])
	for _, addr := range lan {
		if addr != self {
			args = append(args, "-retry-join", addr)
		}
	}
	return append(args, opts.Extra...)
}

func memberName(i int) string { return fmt.Sprintf("n%d", i+1) }

// waitLeader polls /v1/status/leader until it names a member's server
// address.
func (c *Cluster) waitLeader(ctx context.Context, timeout time.Duration) error {
	return c.poll(ctx, timeout, "a leader", func(ctx context.Context) error {
		var addr string
		if err := GetJSON(ctx, c.HTTP[0]+"/v1/status/leader", &addr); err != nil {
			return err
		}
		if i := slices.Index(c.Server, addr); i >= 0 {
			c.Leader = i
			return nil
		}
		return fmt.Errorf("/v1/status/leader answered %q", addr)
	})
}

// probeKey is the key StartCluster writes to see the cluster serve.
const probeKey = "consulpeer/probe"

// probe retries a KV put on the leader until it is acknowledged.
func (c *Cluster) probe(ctx context.Context, timeout time.Duration) error {
	return c.poll(ctx, timeout, "the probe put on "+c.HTTP[c.Leader], func(ctx context.Context) error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return Put(pctx, http.DefaultClient, c.HTTP[c.Leader], probeKey, []byte("ok"))
	})
}

// poll runs try until it succeeds, a member exits, ctx ends or timeout
// passes (harness.Poll).
func (c *Cluster) poll(ctx context.Context, timeout time.Duration, what string, try func(context.Context) error) error {
	return harness.Poll(ctx, timeout, what, c.CheckAlive, try)
}

// CheckAlive fails if a member has exited.
func (c *Cluster) CheckAlive() error {
	for _, p := range c.Procs {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%w: %s (%v)", harness.ErrExited, p.Name, err)
		}
	}
	return nil
}

// Stop stops every member, the leader last, and removes the data
// directory unless keep is set.
func (c *Cluster) Stop(keep bool) error {
	err := harness.StopLeaderLast(c.Procs, c.Leader, 10*time.Second)
	if !keep {
		if rerr := os.RemoveAll(c.Dir); rerr != nil && err == nil {
			err = rerr
		}
	}
	return err
}

// LogTails is the end of every member's log, for error messages.
func (c *Cluster) LogTails() string { return harness.LogTails("consul", c.Procs, 1500) }

// Put writes value at key through PUT /v1/kv/<key> on base and fails
// unless the answer is 200 with body true.
func Put(ctx context.Context, client *http.Client, base, key string, value []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, base+"/v1/kv/"+key, bytes.NewReader(value))
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 512))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || string(bytes.TrimSpace(body)) != "true" {
		return fmt.Errorf("PUT %s: %s: %s", key, resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

// GetJSON decodes the JSON answer of GET url into out; any status other
// than 200 is an error.
func GetJSON(ctx context.Context, url string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, bytes.TrimSpace(b))
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return errors.Join(fmt.Errorf("GET %s: decode", url), err)
	}
	return nil
}
