package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"
)

// This kernel has no netem qdisc, so delay is made by relaying peer
// traffic through a proxy on HostIP that holds every chunk for a fixed
// time. In each delayed slot's namespace, a nat OUTPUT rule sends new
// connections to another slot's peer port to the proxy port of that
// (from, to) pair, and a filter rule resets the slot's existing direct
// peer connections so they reconnect through the proxy. Heal flushes both
// and closes the proxy, so the nodes reconnect directly.

func delayPort(from, to int) int { return 21000 + from*MaxSlots + to }

// Delay relays every peer connection between the given slots through the
// proxy with one-way delay d.
func (n *Net) Delay(ctx context.Context, slots []int, d time.Duration) error {
	if n.delay != nil {
		return errors.New("delay already in force; heal first")
	}
	p := &delayProxy{delay: d, logger: n.logger, conns: map[net.Conn]struct{}{}}
	n.delay = p
	for _, from := range slots {
		for _, to := range slots {
			if from == to {
				continue
			}
			if err := p.listen(delayPort(from, to), net.JoinHostPort(NodeIP(to), strconv.Itoa(PeerPort))); err != nil {
				return err
			}
		}
	}
	for _, from := range slots {
		for _, to := range slots {
			if from == to {
				continue
			}
			peer := strconv.Itoa(PeerPort)
			if err := n.ipt(ctx, from, "-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", NodeIP(to), "--dport", peer,
				"-j", "DNAT", "--to-destination", net.JoinHostPort(HostIP, strconv.Itoa(delayPort(from, to)))); err != nil {
				return fmt.Errorf("redirect slot %d to %d through the delay proxy: %w", from, to, err)
			}
			// NB: NAT applies to new connections only; reset the direct
			// ones so gRPC redials through the proxy.
			if err := n.ipt(ctx, from, "-A", "OUTPUT", "-p", "tcp", "-d", NodeIP(to), "--dport", peer,
				"-m", "conntrack", "--ctstate", "ESTABLISHED", "-m", "conntrack", "!", "--ctstate", "DNAT",
				"-j", "REJECT", "--reject-with", "tcp-reset"); err != nil {
				return fmt.Errorf("reset direct connections of slot %d to %d: %w", from, to, err)
			}
		}
	}
	return nil
}

// delayProxy owns its listeners, every relayed connection and the
// goroutines that copy them; close stops and waits for all of them.
type delayProxy struct {
	delay  time.Duration
	logger *slog.Logger

	mu     sync.Mutex
	lis    []net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

func (p *delayProxy) listen(port int, target string) error {
	l, err := net.Listen("tcp", net.JoinHostPort(HostIP, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("delay proxy listen on port %d: %w", port, err)
	}
	p.mu.Lock()
	p.lis = append(p.lis, l)
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.relay(c, target)
			}()
		}
	}()
	return nil
}

// track registers a connection; false when the proxy is closing.
func (p *delayProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *delayProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *delayProxy) relay(in net.Conn, target string) {
	if !p.track(in) {
		in.Close()
		return
	}
	defer p.untrack(in)
	out, err := net.DialTimeout("tcp", target, time.Second)
	if err != nil {
		return
	}
	if !p.track(out) {
		out.Close()
		return
	}
	defer p.untrack(out)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(in, out) }()
	go func() { defer wg.Done(); p.pipe(out, in) }()
	wg.Wait()
}

type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies src to dst, each chunk held for the delay. The queue is
// bounded: a full queue stops reading, so TCP flow control pushes back.
func (p *delayProxy) pipe(src, dst net.Conn) {
	q := make(chan chunk, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range q {
			if wait := time.Until(c.due); wait > 0 {
				time.Sleep(wait)
			}
			if _, err := dst.Write(c.data); err != nil {
				src.Close()
				for range q {
				}
				return
			}
		}
	}()
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{data: buf[:n], due: time.Now().Add(p.delay)}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				p.logger.Debug("delay proxy read", "err", err)
			}
			break
		}
	}
	close(q)
	<-done
	dst.Close()
}

func (p *delayProxy) close() error {
	p.mu.Lock()
	p.closed = true
	for _, l := range p.lis {
		l.Close()
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("delay proxy: relays did not stop within 10s")
	}
}
