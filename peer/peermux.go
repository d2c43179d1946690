package peer

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/lodestone-kv/lodestone/internal/prefixconn"
)

// peerMux splits the peer port between Raft streams (raftstream.go) and
// the peer gRPC server, by the first bytes each client sends: a Raft
// stream opens with raftStreamMagic, an HTTP/2 client with its preface.
// One port keeps a member's address one address, as operators and
// --initial-cluster know it.
//
// The gRPC server sees peerMux as its listener. Each accepted connection
// is told apart on a goroutine of its own, so a client that connects and
// says nothing holds up no other (it is dropped after preambleTimeout).
type peerMux struct {
	ln     net.Listener
	logger *slog.Logger
	serve  func(context.Context, net.Conn) error // a Raft stream, preamble read
	toGRPC chan net.Conn
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	// conns are those route has: before their preamble, or Raft
	// streams being served. Close closes them.
	conns  map[net.Conn]struct{}
	closed bool
}

// preambleTimeout bounds how long a new peer connection may take to say
// which protocol it speaks.
const preambleTimeout = 10 * time.Second

func newPeerMux(ln net.Listener, logger *slog.Logger, serve func(context.Context, net.Conn) error) *peerMux {
	ctx, cancel := context.WithCancel(context.Background())
	m := &peerMux{ln: ln, logger: logger, serve: serve, toGRPC: make(chan net.Conn),
		ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	m.wg.Add(1)
	go m.acceptLoop()
	return m
}

func (m *peerMux) acceptLoop() {
	defer m.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := m.ln.Accept()
		if err != nil {
			if m.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				m.cancel() // NB: Accept on the gRPC side returns once nothing more can come
				return
			}
			// Out of file descriptors, say: net/http and gRPC wait and
			// try again too.
			m.logger.Warn("accepting a peer connection", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-m.ctx.Done():
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.route(c)
		}()
	}
}

// route reads c's first bytes and serves it as a Raft stream or hands it
// to gRPC, those bytes put back.
func (m *peerMux) route(c net.Conn) {
	if !m.track(c) {
		c.Close()
		return
	}
	defer m.untrack(c)
	var head [len(raftStreamMagic)]byte
	err := c.SetReadDeadline(time.Now().Add(preambleTimeout))
	if err == nil {
		_, err = io.ReadFull(c, head[:])
	}
	if err == nil {
		err = c.SetReadDeadline(time.Time{})
	}
	if err != nil {
		m.logger.Debug("peer connection closed before its preamble", "remote", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	// NB: any version of the Raft stream goes to serve, the version byte
	// put back, so an older build's stream is refused with a reason
	// rather than handed to gRPC as garbage.
	if [7]byte(head[:7]) != [7]byte(raftStreamMagic[:7]) {
		select {
		case m.toGRPC <- &prefixconn.Conn{Conn: c, Prefix: head[:]}:
		case <-m.ctx.Done():
			c.Close()
		}
		return
	}
	if err := m.serve(m.ctx, &prefixconn.Conn{Conn: c, Prefix: head[7:]}); err != nil && m.ctx.Err() == nil {
		m.logger.Debug("raft stream ended", "remote", c.RemoteAddr().String(), "err", err)
	}
	c.Close()
}

func (m *peerMux) track(c net.Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.conns[c] = struct{}{}
	return true
}

func (m *peerMux) untrack(c net.Conn) {
	m.mu.Lock()
	delete(m.conns, c)
	m.mu.Unlock()
}

// Accept returns the next connection for the gRPC server.
func (m *peerMux) Accept() (net.Conn, error) {
	select {
	case c := <-m.toGRPC:
		return c, nil
	case <-m.ctx.Done():
		return nil, net.ErrClosed
	}
}

// Close stops accepting, closes every connection not yet handed to gRPC
// (Raft streams, connections yet to send their preamble) and waits for
// their goroutines. Connections already handed to gRPC are its own to close.
func (m *peerMux) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	for c := range m.conns {
		c.Close()
	}
	m.mu.Unlock()
	m.cancel()
	err := m.ln.Close()
	m.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func (m *peerMux) Addr() net.Addr { return m.ln.Addr() }
