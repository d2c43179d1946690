package dnsapi

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// The UDP fast path (doc.go says why it exists). A fixed set of readers
// own the socket; each reads datagrams in batches, answers those that
// ask a kept service answer (cache.go) with a copy of it under the
// question's id, and passes every other datagram, as it came, to
// miekg/dns's server through handoffConn, so that what the full handler
// answers, and how, is unchanged.

// batchSize is how many datagrams a reader takes from the socket at once
// (where the system reads several per call, batch_linux.go) and answers
// with one write.
const batchSize = 32

// maxDatagram is the largest question read: miekg/dns's UDP buffer
// (dns.Server.UDPSize as New sets it), so a longer one is cut as it was.
const maxDatagram = dns.DefaultMsgSize

// datagram is one packet read from or written to the socket.
type datagram struct {
	b     []byte // read: the buffer, then the packet; write: the answer
	addr  netip.AddrPort
	qtype uint16 // of an answer, for the metrics
}

// batchConn reads and writes datagrams several at a time where the
// system can (batch_linux.go), else one at a time (batch_other.go).
type batchConn interface {
	// read fills ds[:n] (each b sliced to its packet and addr set),
	// waiting for at least one.
	read(ds []datagram) (n int, err error)
	// write sends every ds[i].b to ds[i].addr; a datagram the system
	// refuses is skipped, and the first such error returned.
	write(ds []datagram) error
}

type fastPath struct {
	s       *Server
	conn    *net.UDPConn
	handoff *handoffConn
	readers int
	// newBatch opens a batchConn on conn for one reader.
	newBatch func(*net.UDPConn) (batchConn, error)

	answered, notKept, other, dropped prometheus.Counter

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// boundAddress says whether pc is bound to one address: only then can a
// reply leave from the socket's own address without asking the kernel
// where each datagram came to (IP_PKTINFO, what miekg/dns does on a
// *net.UDPConn, and a large share of an answer's cost).
func boundAddress(pc net.PacketConn) (*net.UDPConn, bool) {
	u, ok := pc.(*net.UDPConn)
	if !ok {
		return nil, false
	}
	a, ok := u.LocalAddr().(*net.UDPAddr)
	return u, ok && !a.IP.IsUnspecified()
}

func newFastPath(s *Server, conn *net.UDPConn, readers, queue int) *fastPath {
	outcomes := s.metrics.fastPath
	return &fastPath{s: s, conn: conn, readers: readers, newBatch: newBatchConn,
		handoff:  &handoffConn{udp: conn, in: make(chan handoff, queue), done: make(chan struct{}), wake: make(chan struct{}, 1)},
		answered: outcomes.WithLabelValues(outcomeAnswered), notKept: outcomes.WithLabelValues(outcomeNotKept),
		other: outcomes.WithLabelValues(outcomeOther), dropped: s.metrics.refused.WithLabelValues(reasonHandoff)}
}

// start runs the readers; false once closed.
func (f *fastPath) start() (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false, nil
	}
	conns := make([]batchConn, f.readers)
	for i := range conns {
		c, err := f.newBatch(f.conn)
		if err != nil {
			return false, err
		}
		conns[i] = c
	}
	for _, c := range conns {
		f.wg.Go(func() { f.read(c) })
	}
	return true, nil
}

// close closes the socket and waits for the readers.
func (f *fastPath) close() error {
	f.mu.Lock()
	first := !f.closed
	f.closed = true
	f.mu.Unlock()
	var err error
	if first {
		err = f.conn.Close()
	}
	f.wg.Wait()
	return err
}

func (f *fastPath) read(c batchConn) {
	in := make([]datagram, batchSize)
	for i := range in {
		in[i].b = make([]byte, maxDatagram)
	}
	out := make([]datagram, batchSize)
	key := make([]byte, 0, 512)
	var scratch shuffleScratch
	for {
		for i := range in {
			in[i].b = in[i].b[:maxDatagram]
		}
		n, err := c.read(in)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			f.s.logger.Warn("could not read a DNS question", "err", err)
			// NB: an error the socket keeps giving must not spin a core.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		start := time.Now()
		k := 0
		for i := range in[:n] {
			if f.answer(&in[i], &out[k], &key, &scratch) {
				k++
			}
		}
		if k == 0 {
			continue
		}
		// NB: counted before they are written, as the handler does.
		took := time.Since(start)
		for i := range out[:k] {
			f.s.metrics.observe(out[i].qtype, dns.RcodeSuccess, took)
		}
		if err := c.write(out[:k]); err != nil {
			f.s.logger.Debug("could not write a DNS answer", "err", err)
		}
	}
}

// answer answers d into out from a kept answer, or hands d to the full
// handler and says false.
func (f *fastPath) answer(d, out *datagram, key *[]byte, scratch *shuffleScratch) bool {
	q, k, ok := readQuery(d.b, (*key)[:0])
	*key = k
	if !ok {
		f.other.Inc()
		f.pass(d)
		return false
	}
	v, sh := f.s.variant(f.s.cache.getBytes(k))
	if v == nil {
		f.notKept.Inc()
		f.pass(d)
		return false
	}
	if cap(out.b) < len(v) {
		out.b = make([]byte, len(v), max(len(v), 4096))
	}
	out.b = out.b[:len(v)]
	if sh != nil {
		sh.copyShuffled(out.b, v, scratch)
	} else {
		copy(out.b, v)
	}
	setID(out.b, q.id, q.flags)
	out.addr, out.qtype = d.addr, q.qtype
	f.answered.Inc()
	return true
}

// pass hands d to the full handler, dropping it when the queue is full.
func (f *fastPath) pass(d *datagram) {
	h := handoff{b: append([]byte(nil), d.b...), from: d.addr}
	select {
	case f.handoff.in <- h:
	case <-f.handoff.done:
	default:
		f.dropped.Inc()
	}
}

// handoff is a datagram passed to the full handler.
type handoff struct {
	b    []byte
	from netip.AddrPort
}

// handoffConn is the net.PacketConn miekg/dns's server reads the passed
// datagrams from; its answers go out on the socket itself. Closing it
// leaves the socket to the fast path.
type handoffConn struct {
	udp  *net.UDPConn
	in   chan handoff
	done chan struct{}
	once sync.Once
	// wake tells a waiting ReadFrom the deadline moved.
	wake     chan struct{}
	mu       sync.Mutex
	deadline time.Time
}

func (c *handoffConn) ReadFrom(p []byte) (int, net.Addr, error) {
	for {
		select {
		case <-c.wake:
		default:
		}
		c.mu.Lock()
		d := c.deadline
		c.mu.Unlock()
		var expired <-chan time.Time
		var timer *time.Timer
		if !d.IsZero() {
			wait := time.Until(d)
			if wait <= 0 {
				return 0, nil, os.ErrDeadlineExceeded
			}
			timer = time.NewTimer(wait)
			expired = timer.C
		}
		select {
		case h := <-c.in:
			stop(timer)
			return copy(p, h.b), net.UDPAddrFromAddrPort(h.from), nil
		case <-c.done:
			stop(timer)
			return 0, nil, net.ErrClosed
		case <-expired:
			return 0, nil, os.ErrDeadlineExceeded
		case <-c.wake:
			stop(timer)
		}
	}
}

func stop(t *time.Timer) {
	if t != nil {
		t.Stop()
	}
}

func (c *handoffConn) WriteTo(p []byte, addr net.Addr) (int, error) { return c.udp.WriteTo(p, addr) }

func (c *handoffConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return nil
}

func (c *handoffConn) LocalAddr() net.Addr { return c.udp.LocalAddr() }

func (c *handoffConn) SetDeadline(t time.Time) error { return c.SetReadDeadline(t) }

func (c *handoffConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	return nil
}

// SetWriteDeadline does nothing: the socket is shared with the readers,
// and a UDP write does not wait for the peer.
func (c *handoffConn) SetWriteDeadline(time.Time) error { return nil }
