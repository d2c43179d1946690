// Package netns builds and tears down the chaos harness's private network
// and applies network faults to it.
//
// # What it owns
//
// Everything it creates is named with Prefix ("ldch-") so a later run can
// find and remove what a crashed run left:
//
//   - namespace ldch-net holding bridge br0 (NB: the bridge lives in its
//     own namespace, not the root one, so the root namespace's iptables —
//     Docker sets FORWARD to DROP, and br_netfilter sends bridged frames
//     through it — never sees the cluster's traffic);
//   - one namespace ldch-nK per node slot K, with eth0 at NodeIP(K) plugged
//     into br0;
//   - link ldch-host in the root namespace at HostIP, plugged into br0, so
//     the harness's clients reach every node, with a second address,
//     HostileIP, that only the hostile client binds to (the servers'
//     per-client connection caps count by source address, so its abuse
//     does not eat the checked clients' share);
//   - the delay proxy's listeners on HostIP.
//
// All addresses are in 10.77.0.0/24 and exist only inside these
// namespaces and on ldch-host: no traffic leaves them.
//
// # What it refuses to know
//
// Nothing about Lodestone beyond the peer port, which the delay fault
// redirects.
//
// # Caller's duties
//
//  1. Hold the Lock for the whole run (one campaign per machine).
//  2. Cleanup before Setup (it removes a crashed run's leftovers).
//  3. Start node processes with Command, so they live in their namespace.
//  4. Cleanup at the end, also when interrupted.
package netns

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Names and addresses of the harness's network.
const (
	Prefix   = "ldch-"
	BridgeNS = Prefix + "net"
	HostLink = Prefix + "host"
	HostIP   = "10.77.0.1"
	// HostileIP is the hostile client's source address, on the same
	// link: the kernel picks HostIP for every other client, so only a
	// dialer that binds HostileIP uses it.
	HostileIP = "10.77.0.2"
	// PeerPort, GRPCPort and HTTPPort are what every node listens on,
	// each in its own namespace.
	PeerPort = 7401
	GRPCPort = 7400
	HTTPPort = 8500
	// MaxSlots bounds node slots (NodeIP stays inside the /24).
	MaxSlots = 16
)

// NodeNS is the namespace of node slot k (0-based).
func NodeNS(k int) string { return fmt.Sprintf("%sn%d", Prefix, k) }

// NodeIP is node slot k's address.
func NodeIP(k int) string { return fmt.Sprintf("10.77.0.%d", 11+k) }

// Available says why this process cannot build the network, or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("chaos needs root (network namespaces, iptables)")
	}
	for _, tool := range []string{"ip", "iptables", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("chaos needs %s on PATH (Debian: apt-get install -y iproute2 iptables): %w", tool, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := run(ctx, "ip", "netns", "list"); err != nil {
		return fmt.Errorf("ip netns is unavailable: %w", err)
	}
	return nil
}

// LockPath is the file whose flock makes campaigns on one machine take
// turns.
const LockPath = "/run/lock/" + Prefix + "chaos.lock"

// Lock takes the machine-wide campaign lock, waiting up to wait. The
// returned func releases it.
func Lock(ctx context.Context, wait time.Duration) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(LockPath), 0o755); err != nil {
		return nil, fmt.Errorf("create lock dir: %w", err)
	}
	f, err := os.OpenFile(LockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock: %w", err)
	}
	deadline := time.Now().Add(wait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", LockPath, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("another chaos campaign holds %s for more than %v", LockPath, wait)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// run executes one command with a bounded time and returns its stdout.
func run(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// Cleanup removes every namespace and link named with Prefix, killing the
// processes inside the namespaces first. It is safe to call when nothing
// exists.
func Cleanup(ctx context.Context, logger *slog.Logger) error {
	var errs []error
	out, err := run(ctx, "ip", "netns", "list")
	if err != nil {
		return fmt.Errorf("list namespaces: %w", err)
	}
	var spaces []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 && strings.HasPrefix(f[0], Prefix) {
			spaces = append(spaces, f[0])
		}
	}
	for _, ns := range spaces {
		pids, _ := run(ctx, "ip", "netns", "pids", ns)
		var killed []int
		for _, p := range strings.Fields(pids) {
			pid, err := strconv.Atoi(p)
			if err != nil || pid == os.Getpid() {
				continue
			}
			// SIGKILL ends stopped (SIGSTOPped) processes too.
			if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
				killed = append(killed, pid)
			}
		}
		waitGone(ctx, killed, 5*time.Second)
		if len(killed) > 0 {
			logger.Info("killed leftover processes", "namespace", ns, "pids", killed)
		}
		if _, err := run(ctx, "ip", "netns", "del", ns); err != nil {
			errs = append(errs, fmt.Errorf("delete namespace %s: %w", ns, err))
		}
	}
	links, err := run(ctx, "ip", "-o", "link", "show")
	if err != nil {
		errs = append(errs, fmt.Errorf("list links: %w", err))
	}
	sc = bufio.NewScanner(strings.NewReader(links))
	for sc.Scan() {
		// "12: ldch-host@if11: <...>"
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if strings.HasPrefix(name, Prefix) {
			// NB: a veth whose peer was in a deleted namespace goes away
			// when the kernel finishes tearing that namespace down, which
			// may be after the listing above: gone is what we want.
			if _, err := run(ctx, "ip", "link", "del", name); err != nil {
				if _, serr := run(ctx, "ip", "link", "show", "dev", name); serr != nil {
					continue
				}
				errs = append(errs, fmt.Errorf("delete link %s: %w", name, err))
			}
		}
	}
	if len(spaces) > 0 {
		logger.Info("removed namespaces", "namespaces", spaces)
	}
	return errors.Join(errs...)
}

func waitGone(ctx context.Context, pids []int, within time.Duration) {
	deadline := time.Now().Add(within)
	for _, pid := range pids {
		for time.Now().Before(deadline) && ctx.Err() == nil {
			if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// Net is the harness's network once Setup built it.
type Net struct {
	logger *slog.Logger
	slots  map[int]bool
	delay  *delayProxy
}

// Setup creates the bridge namespace and the host link. Call Cleanup
// first.
func Setup(ctx context.Context, logger *slog.Logger) (*Net, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	n := &Net{logger: logger, slots: map[int]bool{}}
	steps := [][]string{
		{"ip", "netns", "add", BridgeNS},
		{"ip", "-n", BridgeNS, "link", "set", "lo", "up"},
		{"ip", "-n", BridgeNS, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", BridgeNS, "link", "set", "br0", "up"},
		{"ip", "link", "add", HostLink, "type", "veth", "peer", "name", "host", "netns", BridgeNS},
		{"ip", "-n", BridgeNS, "link", "set", "host", "master", "br0", "up"},
		{"ip", "addr", "add", HostIP + "/24", "dev", HostLink},
		// A secondary address: source selection keeps HostIP.
		{"ip", "addr", "add", HostileIP + "/24", "dev", HostLink},
		{"ip", "link", "set", HostLink, "up"},
	}
	for _, s := range steps {
		if _, err := run(ctx, s[0], s[1:]...); err != nil {
			return nil, fmt.Errorf("set up bridge: %w", err)
		}
	}
	return n, nil
}

// AddNode creates slot k's namespace and plugs it into the bridge.
func (n *Net) AddNode(ctx context.Context, k int) error {
	if k < 0 || k >= MaxSlots {
		return fmt.Errorf("node slot %d out of range [0, %d)", k, MaxSlots)
	}
	ns, veth := NodeNS(k), fmt.Sprintf("v%d", k)
	steps := [][]string{
		{"ip", "netns", "add", ns},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "-n", BridgeNS, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"ip", "-n", BridgeNS, "link", "set", veth, "master", "br0", "up"},
		{"ip", "-n", ns, "addr", "add", NodeIP(k) + "/24", "dev", "eth0"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
	}
	for _, s := range steps {
		if _, err := run(ctx, s[0], s[1:]...); err != nil {
			return fmt.Errorf("add node slot %d: %w", k, err)
		}
	}
	n.slots[k] = true
	return nil
}

// Command returns a command that runs bin inside slot k's namespace. It
// runs in its own process group (a terminal's Ctrl-C reaches only the
// harness, which then stops the nodes) and is killed if the harness dies.
func (n *Net) Command(k int, bin string, args ...string) *exec.Cmd {
	cmd := exec.Command("ip", append([]string{"netns", "exec", NodeNS(k), bin}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

func (n *Net) ipt(ctx context.Context, k int, args ...string) error {
	_, err := run(ctx, "ip", append([]string{"netns", "exec", NodeNS(k), "iptables", "-w", "5"}, args...)...)
	return err
}

// Partition makes slot k drop every packet to and from the given slots.
// Apply it on both sides for a clean cut (the caller does).
func (n *Net) Partition(ctx context.Context, k int, from []int) error {
	for _, o := range from {
		if err := n.ipt(ctx, k, "-A", "INPUT", "-s", NodeIP(o), "-j", "DROP"); err != nil {
			return fmt.Errorf("partition slot %d from %d: %w", k, o, err)
		}
		if err := n.ipt(ctx, k, "-A", "OUTPUT", "-d", NodeIP(o), "-j", "DROP"); err != nil {
			return fmt.Errorf("partition slot %d from %d: %w", k, o, err)
		}
	}
	return nil
}

// Loss makes slot k drop each packet from the given slots with probability
// p (iptables statistic match; client traffic from the host is spared).
func (n *Net) Loss(ctx context.Context, k int, from []int, p float64) error {
	for _, o := range from {
		if err := n.ipt(ctx, k, "-A", "INPUT", "-s", NodeIP(o), "-m", "statistic", "--mode", "random",
			"--probability", strconv.FormatFloat(p, 'f', 3, 64), "-j", "DROP"); err != nil {
			return fmt.Errorf("packet loss on slot %d from %d: %w", k, o, err)
		}
	}
	return nil
}

// Heal removes every rule from slot k's namespace.
func (n *Net) Heal(ctx context.Context, k int) error {
	var errs []error
	if err := n.ipt(ctx, k, "-F"); err != nil {
		errs = append(errs, fmt.Errorf("heal slot %d filter: %w", k, err))
	}
	if err := n.ipt(ctx, k, "-t", "nat", "-F"); err != nil {
		errs = append(errs, fmt.Errorf("heal slot %d nat: %w", k, err))
	}
	return errors.Join(errs...)
}

// HealAll removes every network fault: rules in every slot, and the delay
// proxy.
func (n *Net) HealAll(ctx context.Context) error {
	var errs []error
	for k := range n.slots {
		errs = append(errs, n.Heal(ctx, k))
	}
	if n.delay != nil {
		errs = append(errs, n.delay.close())
		n.delay = nil
	}
	return errors.Join(errs...)
}

// Close heals and removes everything Setup and AddNode made.
func (n *Net) Close(ctx context.Context) error {
	var errs []error
	if n.delay != nil {
		errs = append(errs, n.delay.close())
		n.delay = nil
	}
	errs = append(errs, Cleanup(ctx, n.logger))
	return errors.Join(errs...)
}
