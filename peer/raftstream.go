package peer

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"syscall"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"golang.org/x/sys/unix"

	"github.com/lodestone-kv/lodestone/internal/clusterid"
)

// Raft streams. Ordinary Raft messages go from a member to each peer over
// a TCP connection of their own, on the peer port, framed by hand rather
// than as a gRPC stream. Each message on gRPC went through HTTP/2 framing,
// a hand-off to gRPC's writer goroutine, and on the receiving side a
// hand-off from its reader goroutine to the stream's: with one write per
// Raft message at 1,000 puts/s that machinery was 10-17% of every
// member's CPU (gRPC's code, system calls excluded), on a core the three
// members of a benchmark share. Snapshots and the small peer calls
// (LeaderIndex, ChangeConf, TransferLeader) stay on gRPC: they are rare,
// or want its request/response shape.
//
// Wire format, one direction (the dialling member sends, the other
// receives):
//
//	preamble  8 bytes: raftStreamMagic ("LDRAFT\x00" and version byte 2),
//	          then 16 bytes: the sender's cluster id (identity.go)
//	frame     4-byte big-endian length n, 1 <= n <= maxMsgBytes,
//	          then n bytes: one raftpb.Message in protobuf wire form
//
// The receiver writes back at most one frame, its reason for ending the
// stream, and closes: a first byte rejectRemoved says the sender was
// removed from the cluster, rejectCluster that the receiver refuses the
// sender's cluster id (the rest is text for the log, naming both ids). A
// version 1 preamble (no cluster id, older builds) is refused so. Anything else
// the receiver sends, or a closed connection, ends the stream; the sender
// redials with backoff and Raft resends what was lost (it tolerates loss).
//
// The peer port tells the two protocols apart by the first bytes a client
// sends (peermux.go): an HTTP/2 client opens with "PRI * HTTP/2.0".
//
// Failure cases:
//   - A peer that dies or is cut off with data in flight: TCP_USER_TIMEOUT
//     (raftStreamUserTimeout) makes the kernel fail the connection once
//     sent data has gone unacknowledged that long, where TCP's own
//     retransmission would keep it for minutes; keepalives do the same
//     for an idle connection. gRPC's keepalive pings did this before.
//   - A receiver that reads slower than the sender writes (its Raft loop
//     is busy): the sender's write blocks, its queue fills, and further
//     messages are dropped with the peer reported unreachable, as when
//     gRPC's flow control blocked.
//   - A corrupt or oversized frame: the receiver closes the connection
//     with an error in its log; nothing of the frame reaches Raft.
//   - A torn frame at close: the partial message is never delivered.

// raftStreamMagic opens every Raft stream; its last byte is the version.
// Version 1 (older builds) carried no cluster id and is refused.
var raftStreamMagic = [8]byte{'L', 'D', 'R', 'A', 'F', 'T', 0, raftStreamVersion}

const raftStreamVersion = 2

const (
	// rejectRemoved opens the receiver's frame that says the sender was
	// removed from the cluster.
	rejectRemoved = 1
	// rejectCluster opens the receiver's frame that refuses the sender's
	// cluster id (none, another cluster's, or not learned yet).
	rejectCluster = 2

	raftStreamDialTimeout = time.Second
	// raftStreamUserTimeout is how long sent data may go unacknowledged
	// before the kernel gives the connection up (TCP_USER_TIMEOUT); the
	// same 5 s as the keepalive timeout of the peer gRPC connections.
	raftStreamUserTimeout = 5 * time.Second
	raftStreamReadBuffer  = 64 << 10
	// frameKeep is the largest frame buffer a reader keeps for the next
	// frame; a bigger frame (a large append batch) gets a buffer of its
	// own, so one burst does not pin its size for the stream's life.
	frameKeep = 1 << 20
)

// errStreamRemoved is what a sender gets when its peer says this member
// was removed.
var errStreamRemoved = errors.New("the peer says this member was removed from the cluster")

// errStreamRefused is what a sender gets when its peer refuses its
// cluster id; the text that follows names both.
var errStreamRefused = errors.New("the peer refused this member's cluster")

// dialRaftStream connects to a peer's Raft stream, over TLS when tlsCfg
// is set, and sends the preamble naming cluster (zero: a joining member
// that has not learned it, which the peer refuses).
func dialRaftStream(ctx context.Context, addr string, cluster clusterid.ID, tlsCfg *tls.Config) (net.Conn, error) {
	d := net.Dialer{
		Timeout:         raftStreamDialTimeout,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: time.Second, Count: 3},
		Control:         setUserTimeout,
	}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial raft stream to %s: %w", addr, err)
	}
	if tlsCfg != nil {
		if conn, err = handshakeTLS(ctx, conn, tlsCfg); err != nil {
			return nil, fmt.Errorf("raft stream TLS handshake with %s: %w", addr, err)
		}
	}
	if _, err := conn.Write(append(raftStreamMagic[:], cluster[:]...)); err != nil {
		conn.Close()
		return nil, fmt.Errorf("raft stream preamble to %s: %w", addr, err)
	}
	return conn, nil
}

// readPreambleRest reads what follows the magic's first 7 bytes (which
// the mux matched): the version byte and, from version 2, the cluster id.
// Version 1 yields the zero id, which the caller refuses.
func readPreambleRest(r io.Reader) (clusterid.ID, error) {
	var v [1]byte
	if _, err := io.ReadFull(r, v[:]); err != nil {
		return clusterid.ID{}, fmt.Errorf("raft stream preamble: %w", err)
	}
	var id clusterid.ID
	switch v[0] {
	case 1:
		return id, nil
	case raftStreamVersion:
		if _, err := io.ReadFull(r, id[:]); err != nil {
			return id, fmt.Errorf("raft stream preamble: cluster id: %w", err)
		}
		return id, nil
	default:
		return id, fmt.Errorf("raft stream version %d unsupported (this build speaks 1 and %d)", v[0], raftStreamVersion)
	}
}

// handshakeTLS runs the client handshake on conn within the dial timeout;
// on failure it closes conn.
func handshakeTLS(ctx context.Context, conn net.Conn, cfg *tls.Config) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, raftStreamDialTimeout)
	defer cancel()
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	return tc, nil
}

func setUserTimeout(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(raftStreamUserTimeout.Milliseconds()))
	})
	if err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set TCP_USER_TIMEOUT: %w", serr)
	}
	return nil
}

// appendFrames appends msgs as frames, growing buf once to hold them
// all; a message that cannot be framed is left out and handed to drop
// with its index. NB: grown frame by frame, a batch of large appends was
// copied about twice over on its way to the socket: 12% of a leader's
// CPU under 64 KiB puts.
func appendFrames(buf []byte, msgs []raftpb.Message, drop func(int, error)) []byte {
	need := 0
	for i := range msgs {
		need += 4 + msgs[i].Size()
	}
	buf = slices.Grow(buf, need)
	for i := range msgs {
		var err error
		if buf, err = appendFrame(buf, &msgs[i]); err != nil {
			drop(i, err)
		}
	}
	return buf
}

// appendFrame appends m as one frame.
func appendFrame(buf []byte, m *raftpb.Message) ([]byte, error) {
	n := m.Size()
	if n > maxMsgBytes {
		return buf, fmt.Errorf("%s of %d bytes: over the %d-byte message limit", m.Type, n, maxMsgBytes)
	}
	start := len(buf)
	buf = binary.BigEndian.AppendUint32(buf, uint32(n))
	// NB: no zeroing: MarshalToSizedBuffer writes every byte.
	buf = slices.Grow(buf, n)[:len(buf)+n]
	if _, err := m.MarshalToSizedBuffer(buf[start+4:]); err != nil {
		return buf[:start], fmt.Errorf("marshal %s: %w", m.Type, err)
	}
	return buf, nil
}

// frameReader reads a Raft stream's frames.
type frameReader struct {
	r   *bufio.Reader
	buf []byte
}

// newFrameReader reads frames from r through a buffer of size bytes.
func newFrameReader(r io.Reader, size int) *frameReader {
	return &frameReader{r: bufio.NewReaderSize(r, size)}
}

// next reads one frame's payload; it is valid until the next call. A
// clean end of stream between frames is io.EOF.
func (f *frameReader) next() ([]byte, error) {
	var head [4]byte
	if _, err := io.ReadFull(f.r, head[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(head[:])
	if n == 0 || n > maxMsgBytes {
		return nil, fmt.Errorf("frame of %d bytes: want 1 to %d", n, maxMsgBytes)
	}
	var keep []byte
	if n <= frameKeep {
		keep = f.buf
	}
	b, err := readGrowing(f.r, keep, int(n))
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // NB: the length came; its payload did not
		}
		return nil, fmt.Errorf("frame of %d bytes: %w", n, err)
	}
	if n <= frameKeep {
		f.buf = b[:0]
	}
	return b, nil
}

// readGrowing reads n bytes into buf's storage, growing it as the bytes
// arrive rather than to n at once: a length is only a claim, and four
// bytes claiming 64 MiB must not cost 64 MiB (FuzzRaftStreamFrames).
func readGrowing(r io.Reader, buf []byte, n int) ([]byte, error) {
	const first = 32 << 10
	buf = buf[:0]
	for len(buf) < n {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(n-len(buf), max(len(buf), first)))
		}
		m, err := io.ReadFull(r, buf[len(buf):min(n, cap(buf))])
		buf = buf[:len(buf)+m]
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// message reads one message.
func (f *frameReader) message(m *raftpb.Message) error {
	b, err := f.next()
	if err != nil {
		return err
	}
	*m = raftpb.Message{}
	if err := m.Unmarshal(b); err != nil {
		return fmt.Errorf("decode raft message: %w", err)
	}
	return nil
}

// readRejection waits for what the receiver says before it ends the
// stream: errStreamRemoved, or why the connection ended.
func readRejection(conn net.Conn) error {
	f := newFrameReader(conn, 512) // NB: one short frame at most
	b, err := f.next()
	switch {
	case err != nil:
		return fmt.Errorf("peer ended the raft stream: %w", err)
	case b[0] == rejectRemoved:
		return fmt.Errorf("%w: %s", errStreamRemoved, b[1:])
	case b[0] == rejectCluster:
		return fmt.Errorf("%w: %s", errStreamRefused, b[1:])
	default:
		return fmt.Errorf("peer ended the raft stream: %q", b)
	}
}

// writeRejection tells the sender why its stream ends. The sender may be
// gone already, so a caller only logs an error.
func writeRejection(conn net.Conn, code byte, why string) error {
	frame := binary.BigEndian.AppendUint32(nil, uint32(1+len(why)))
	frame = append(frame, code)
	frame = append(frame, why...)
	if err := conn.SetWriteDeadline(time.Now().Add(time.Second)); err != nil {
		return err
	}
	_, err := conn.Write(frame)
	return err
}
