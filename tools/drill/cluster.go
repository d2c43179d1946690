package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lodestone-kv/lodestone/internal/testnet"
)

type server struct {
	name, dir, peer, grpc, http string
	cmd                         *exec.Cmd
	done                        chan struct{}
}

type cluster struct {
	bin      string
	cpus     string // taskset CPU list of every server; "" = unpinned
	logDir   string
	logLevel string
	servers  []*server
	initial  string
	probe    *diskProbe // the servers' device; nil: not probed
}

// freeAddr is a loopback address below the ephemeral port range: a port
// picked by listening on :0 and closing could come back for another of
// the cluster's addresses, or go to one of the clients' thousands of
// outgoing connections, before its server binds it (a rep once found its
// n1's HTTP port answered by another server's gRPC listener).
func freeAddr() (string, error) { return testnet.Pick("127.0.0.1", false) }

func newCluster(bin, dir, cpus, logLevel string) (*cluster, error) {
	c := &cluster{bin: bin, cpus: cpus, logDir: dir, logLevel: logLevel}
	var parts []string
	for i := 1; i <= 3; i++ {
		s := &server{name: fmt.Sprintf("n%d", i), dir: filepath.Join(dir, fmt.Sprintf("n%d", i))}
		for _, p := range []*string{&s.peer, &s.grpc, &s.http} {
			a, err := freeAddr()
			if err != nil {
				return nil, err
			}
			*p = a
		}
		c.servers = append(c.servers, s)
		parts = append(parts, s.name+"="+s.peer)
	}
	c.initial = strings.Join(parts, ",")
	return c, nil
}

func (c *cluster) endpoints() []string {
	var eps []string
	for _, s := range c.servers {
		eps = append(eps, s.grpc)
	}
	return eps
}

// start runs every server. The drill's clients all come from loopback,
// standing in for a fleet of hosts, so loopback is exempt from the
// per-client connection cap; pprof is on so a slow run can be profiled.
func (c *cluster) start() error {
	for _, s := range c.servers {
		args := []string{"server", "--name", s.name, "--data-dir", s.dir, "--listen-peer", s.peer,
			"--listen-grpc", s.grpc, "--listen-http", s.http, "--listen-dns", "", "--initial-cluster", c.initial,
			"--log-level", c.logLevel, "--connection-limit-exempt", "127.0.0.0/8", "--enable-pprof"}
		bin := c.bin
		if c.cpus != "" {
			args = append([]string{"-c", c.cpus, bin}, args...)
			bin = "taskset"
		}
		logf, err := os.OpenFile(filepath.Join(c.logDir, s.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		s.cmd = exec.Command(bin, args...)
		s.cmd.Stdout, s.cmd.Stderr = logf, logf
		s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		err = s.cmd.Start()
		logf.Close() // the child holds its own descriptor
		if err != nil {
			return fmt.Errorf("start %s: %w", s.name, err)
		}
		s.done = make(chan struct{})
		go func(s *server) {
			defer close(s.done)
			_ = s.cmd.Wait()
		}(s)
	}
	return nil
}

// kill ends every server with sig, SIGKILL if one outlives 30 s.
func (c *cluster) kill(sig syscall.Signal) {
	for _, s := range c.servers {
		if s.cmd == nil {
			continue
		}
		_ = s.cmd.Process.Signal(sig)
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
		s.cmd = nil
	}
}

// waitReady polls every server's /readyz until all answer 200, and logs
// when each first answered at all and when it was ready.
func (c *cluster) waitReady(ctx context.Context, limit time.Duration, log io.Writer) error {
	start := time.Now()
	deadline := start.Add(limit)
	up := make([]time.Duration, len(c.servers))
	ready := make([]time.Duration, len(c.servers))
	last := make([]string, len(c.servers)) // each one's last answer or error
	hc := &http.Client{Timeout: time.Second}
	for {
		n := 0
		for i, s := range c.servers {
			if ready[i] > 0 {
				n++
				continue
			}
			resp, err := hc.Get("http://" + s.http + "/readyz")
			if err != nil {
				last[i] = err.Error()
				continue
			}
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			last[i] = strings.TrimSpace(string(body))
			if up[i] == 0 {
				up[i] = time.Since(start)
			}
			if resp.StatusCode == http.StatusOK {
				ready[i] = time.Since(start)
				n++
			}
		}
		if n == len(c.servers) {
			var parts []string
			for i, s := range c.servers {
				parts = append(parts, fmt.Sprintf("%s up %.1fs ready %.1fs", s.name, up[i].Seconds(), ready[i].Seconds()))
			}
			fmt.Fprintf(log, "drill: %s servers: %s\n", time.Now().UTC().Format("15:04:05.000"), strings.Join(parts, ", "))
			return nil
		}
		if time.Now().After(deadline) {
			var parts []string
			for i, s := range c.servers {
				parts = append(parts, s.name+": "+last[i])
			}
			return fmt.Errorf("cluster not ready within %v (last /readyz: %s)", limit, strings.Join(parts, "; "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// metrics is one scrape of one server: series (name and labels, as
// /metrics prints them) → value.
type metrics map[string]float64

func (s *server) scrape() metrics {
	m := metrics{}
	resp, err := http.Get("http://" + s.http + "/metrics")
	if err != nil {
		return m
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			m[line[:i]] = v
		}
	}
	return m
}

// scrapeAll scrapes every server, in the cluster's order.
func (c *cluster) scrapeAll() []metrics {
	out := make([]metrics, len(c.servers))
	for i, s := range c.servers {
		out[i] = s.scrape()
	}
	return out
}

// histogram sums the buckets of histogram name over scrapes: upper
// bound → cumulative count.
func histogram(ms []metrics, name string) map[float64]float64 {
	h := map[float64]float64{}
	prefix := name + `_bucket{le="`
	for _, m := range ms {
		for k, v := range m {
			le, ok := strings.CutPrefix(k, prefix)
			if !ok {
				continue
			}
			bound, err := strconv.ParseFloat(strings.TrimSuffix(le, `"}`), 64)
			if err == nil {
				h[bound] += v
			}
		}
	}
	return h
}

// sum adds series over scrapes.
func sum(ms []metrics, series string) float64 {
	var t float64
	for _, m := range ms {
		t += m[series]
	}
	return t
}
