package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The poll probe measures how long this process takes to notice network
// input. Go reads a socket only after its scheduler polls the network,
// which a busy process does when its run queue runs dry (or every 10 ms
// from a monitor thread), so a server can be running, with short run-queue
// waits, and still leave requests and Raft messages unread for many
// milliseconds. Every interval the probe sends a datagram to itself on
// loopback and records, in lodestone_runtime_poll_delay_seconds, the time
// until a goroutine has read it. Beside
// lodestone_runtime_sched_latency_seconds (how long runnable goroutines
// wait for a processor, schedlatency.go) it tells an operator whether a
// slow server is short of CPU or too busy to read its sockets.

// pollProbe sends and reads the datagrams. The zero value is not usable;
// use newPollProbe.
type pollProbe struct {
	conn  *net.UDPConn // bound to a loopback port
	self  netip.AddrPort
	start time.Time // datagrams carry the monotonic time since start
	delay prometheus.Histogram
}

func newPollProbe(delay prometheus.Histogram) (*pollProbe, error) {
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, fmt.Errorf("poll probe: listen on loopback: %w", err)
	}
	self := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	return &pollProbe{conn: conn, self: self, start: time.Now(), delay: delay}, nil
}

// run sends a datagram every interval until ctx is done, and reads them on
// a second goroutine, which it waits for.
func (p *pollProbe) run(ctx context.Context, interval time.Duration) error {
	readErr := make(chan error, 1)
	go func() { readErr <- p.read() }()
	t := time.NewTicker(interval)
	defer t.Stop()
	var b [8]byte
	var sendErr error
	for sendErr == nil {
		select {
		case <-ctx.Done():
			p.conn.Close()
			return ignoreClosed(<-readErr)
		case <-t.C:
		}
		binary.LittleEndian.PutUint64(b[:], uint64(time.Since(p.start)))
		if _, err := p.conn.WriteToUDPAddrPort(b[:], p.self); err != nil {
			sendErr = fmt.Errorf("poll probe: send: %w", err)
		}
	}
	p.conn.Close()
	return errors.Join(sendErr, ignoreClosed(<-readErr))
}

// read records each datagram's delay until the socket is closed. It
// ignores datagrams from anyone but itself.
func (p *pollProbe) read() error {
	var b [16]byte
	for {
		n, from, err := p.conn.ReadFromUDPAddrPort(b[:])
		if err != nil {
			return fmt.Errorf("poll probe: read: %w", err)
		}
		if n != 8 || netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) != p.self {
			continue
		}
		sent := time.Duration(binary.LittleEndian.Uint64(b[:8]))
		p.delay.Observe((time.Since(p.start) - sent).Seconds())
	}
}

func ignoreClosed(err error) error {
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
