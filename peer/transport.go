package peer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/clusterid"
	"github.com/lodestone-kv/lodestone/internal/grpcopt"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/prometheus/client_golang/prometheus"
)

// The peer transport keeps one Raft stream per peer for ordinary Raft
// messages (raftstream.go) and opens a gRPC stream per snapshot, so a
// large snapshot never delays heartbeats. Raft tolerates loss, so when a
// peer's queue is full or its stream is down messages are dropped and Raft
// is told the peer is unreachable; it retries by itself.

const (
	peerQueueLen      = 4096
	peerBatchMax      = 256
	snapshotChunkSize = 1 << 20
	maxMsgBytes       = 64 << 20
	snapshotTimeout   = 10 * time.Minute

	// DefaultMaxSnapshotBytes bounds a snapshot a peer may stream in. The
	// receiver holds it all in memory (and decodes it once to check it)
	// before Raft sees it, so the bound is a bound on that memory: 2 GiB,
	// several times the state of the largest deployments measured.
	DefaultMaxSnapshotBytes = 2 << 30
	// DefaultMaxSnapshotChunks bounds the chunks of one snapshot stream,
	// so empty chunks cannot keep a receiver busy: twice what
	// DefaultMaxSnapshotBytes takes in the sender's 1 MiB chunks.
	DefaultMaxSnapshotChunks = 2 * (DefaultMaxSnapshotBytes / snapshotChunkSize)
	// SnapshotChunkSize is the data a sender puts in one chunk; a chunk
	// limit must leave room for MaxSnapshotBytes in chunks this size.
	SnapshotChunkSize = snapshotChunkSize
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Node is the Raft member a Transport serves; *raftnode.Node is one.
type Node interface {
	// Step hands a received message to the Raft loop; it may block to
	// push back on a peer that sends faster than the loop steps.
	Step(ctx context.Context, m raftpb.Message) error
	// ReportUnreachable must not block; ReportSnapshot may.
	ReportUnreachable(id uint64)
	ReportSnapshot(id uint64, st raft.SnapshotStatus)
	// Dropped is told of every message that was never sent. Raft does
	// not resend a follower's proposals (MsgProp), so their callers can
	// be told at once that nothing was applied. It must not block.
	Dropped(m raftpb.Message)
	// MarkRemoved is called when a peer refuses our messages because this
	// member was removed: a removed follower may never see the commit of
	// its own removal, so this is how it learns.
	MarkRemoved()
}

// Transport carries Raft messages between members: it implements
// raftnode.Sender and feeds what it receives to its Node.
type Transport struct {
	self    uint64
	logger  *slog.Logger
	metrics *metrics
	node    Node
	// commitHold is Config.CommitNoticeHold (0: never hold).
	commitHold time.Duration
	// learnerHold is Config.LearnerAppendHold (0: never hold); learners
	// are the peers it applies to (SetLearners).
	learnerHold time.Duration
	learners    atomic.Pointer[map[uint64]bool]
	tls         *tls.Config // Config.TLS

	removedMu sync.Mutex
	removed   map[uint64]bool // members removed from the cluster

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	peers map[uint64]*peer

	index indexStream // a follower's questions to its leader (indexstream.go)

	// cluster is this member's cluster id; zero until a joining member
	// learns it (identity.go). learnMu makes learning happen once.
	cluster  atomic.Pointer[clusterid.ID]
	learnMu  sync.Mutex
	onLearn  func(clusterid.ID) error
	refusals logLimiter

	maxSnapBytes  int64
	maxSnapChunks int
}

type peer struct {
	id     uint64
	addr   string
	conn   *grpc.ClientConn
	queue  chan raftpb.Message
	cancel context.CancelFunc

	// calls counts the unary calls in flight on conn (a forwarded
	// membership change, a leader's index). A retired peer's conn closes
	// when the last one ends. NB: a member that forwards the removal of
	// the leader applies it, and retires the leader, while the leader's
	// answer is on its way; closing conn at once cancelled that answer.
	callsMu sync.Mutex
	calls   int
	retired bool
	closed  bool
}

// countCall is a unary interceptor of p.conn that counts its calls.
func (p *peer) countCall(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	p.callsMu.Lock()
	p.calls++
	p.callsMu.Unlock()
	defer func() {
		p.callsMu.Lock()
		p.calls--
		last := p.retired && p.calls == 0 && !p.closed
		p.closed = p.closed || last
		p.callsMu.Unlock()
		if last {
			p.conn.Close()
		}
	}()
	return invoker(ctx, method, req, reply, cc, opts...)
}

// retire closes p.conn now, or when its last unary call ends.
func (p *peer) retire() error {
	p.callsMu.Lock()
	p.retired = true
	now := p.calls == 0 && !p.closed
	p.closed = p.closed || now
	p.callsMu.Unlock()
	if now {
		return p.conn.Close()
	}
	return nil
}

// Config configures a Transport.
type Config struct {
	Self uint64 // this member's Raft id
	// CommitNoticeHold is how long an entry-less commit notice may wait
	// for the next append to the same peer, which carries the same news
	// (0: never hold).
	CommitNoticeHold time.Duration
	// LearnerAppendHold is how long appends to a learner may wait to go
	// out together (appendhold.go; 0: never hold).
	LearnerAppendHold time.Duration
	// Cluster is this member's cluster id. Zero only for a member that
	// joins a cluster and has not learned it: it then learns it from the
	// first Raft stream or verified snapshot of a member it was told of
	// (SetPeer), and calls OnLearn first, which must persist it.
	Cluster clusterid.ID
	OnLearn func(clusterid.ID) error
	// MaxSnapshotBytes and MaxSnapshotChunks bound one snapshot a peer
	// streams in (0: DefaultMaxSnapshotBytes, DefaultMaxSnapshotChunks).
	MaxSnapshotBytes  int64
	MaxSnapshotChunks int
	Logger            *slog.Logger
	Registerer        prometheus.Registerer
	// TLS, when set, secures every dial to a peer (Raft streams and peer
	// gRPC): it presents this member's certificate and verifies the
	// peer's. The peer port's listener terminates TLS before peerMux.
	TLS *tls.Config
}

// NewTransport makes a Transport with no peers. Messages received before
// SetNode are refused.
func NewTransport(cfg Config) *Transport {
	ctx, cancel := context.WithCancel(context.Background())
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.MaxSnapshotBytes <= 0 {
		cfg.MaxSnapshotBytes = DefaultMaxSnapshotBytes
	}
	if cfg.MaxSnapshotChunks <= 0 {
		cfg.MaxSnapshotChunks = DefaultMaxSnapshotChunks
	}
	t := &Transport{
		self:          cfg.Self,
		logger:        cfg.Logger,
		metrics:       newMetrics(cfg.Registerer),
		commitHold:    cfg.CommitNoticeHold,
		learnerHold:   cfg.LearnerAppendHold,
		node:          unset{},
		ctx:           ctx,
		cancel:        cancel,
		peers:         map[uint64]*peer{},
		removed:       map[uint64]bool{},
		onLearn:       cfg.OnLearn,
		maxSnapBytes:  cfg.MaxSnapshotBytes,
		maxSnapChunks: cfg.MaxSnapshotChunks,
		tls:           cfg.TLS,
	}
	if !cfg.Cluster.IsZero() {
		t.cluster.Store(&cfg.Cluster)
	}
	return t
}

// SetNode sets the member received messages go to. Call it once, before
// the peer port serves anything.
func (t *Transport) SetNode(n Node) { t.node = n }

// unset is the Node before SetNode: it refuses what arrives.
type unset struct{}

func (unset) Step(context.Context, raftpb.Message) error { return ErrStopped }
func (unset) ReportUnreachable(uint64)                   {}
func (unset) ReportSnapshot(uint64, raft.SnapshotStatus) {}
func (unset) Dropped(raftpb.Message)                     {}
func (unset) MarkRemoved()                               {}

// ErrStopped is returned once the transport is closed.
var ErrStopped = errors.New("peer transport stopped")

// SetPeer adds a peer or changes its address. Adding self is a no-op.
func (t *Transport) SetPeer(id uint64, addr string) error {
	if id == t.self || addr == "" {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ctx.Err() != nil {
		return ErrStopped
	}
	if p, ok := t.peers[id]; ok {
		if p.addr == addr {
			return nil
		}
		t.stopPeerLocked(p)
	}
	creds := insecure.NewCredentials()
	if t.tls != nil {
		creds = credentials.NewTLS(t.tls)
	}
	p := &peer{id: id, addr: addr, queue: make(chan raftpb.Message, peerQueueLen)}
	conn, err := grpc.NewClient(addr, append(grpcopt.PeerDialOptions(),
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgBytes), grpc.MaxCallSendMsgSize(maxMsgBytes)),
		// Every call names this member's cluster (identity.go).
		grpc.WithChainUnaryInterceptor(p.countCall, t.unarySend), grpc.WithChainStreamInterceptor(t.streamSend),
		// NB: gRPC's default reconnect backoff grows to two minutes; a
		// member that restarts must hear heartbeats within an election.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 5 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
	)...)
	if err != nil {
		return fmt.Errorf("dial peer %x at %s: %w", id, addr, err)
	}
	ctx, cancel := context.WithCancel(t.ctx)
	p.conn, p.cancel = conn, cancel
	t.peers[id] = p
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		t.runPeer(ctx, p)
	}()
	t.logger.Info("peer added", "peer", fmt.Sprintf("%x", id), "addr", addr)
	return nil
}

// SetLearners says which members are learners now; the rest are voters.
// The Raft loop calls it whenever its configuration changes.
func (t *Transport) SetLearners(ids []uint64) {
	set := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		set[id] = true
	}
	t.learners.Store(&set)
}

// holdsAppends says whether appends to id wait to go out together.
func (t *Transport) holdsAppends(id uint64) bool {
	if t.learnerHold <= 0 {
		return false
	}
	set := t.learners.Load()
	return set != nil && (*set)[id]
}

// RemovePeer forgets a peer; its messages are refused from now on. Its
// Raft streams end at once; a unary call in flight to it still gets its
// answer, and its connection closes when the last such call ends.
func (t *Transport) RemovePeer(id uint64) {
	t.removedMu.Lock()
	t.removed[id] = true
	t.removedMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.peers[id]; ok {
		t.stopPeerLocked(p)
		delete(t.peers, id)
		t.logger.Info("peer removed", "peer", fmt.Sprintf("%x", id))
	}
}

func (t *Transport) stopPeerLocked(p *peer) {
	p.cancel()
	if err := p.retire(); err != nil {
		t.logger.Debug("close peer connection", "peer", fmt.Sprintf("%x", p.id), "err", err)
	}
}

// PeerAddr returns the known address of a peer.
func (t *Transport) PeerAddr(id uint64) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.peers[id]
	if !ok {
		return "", false
	}
	return p.addr, true
}

// Client returns a Peer client on the transport's connection to id, for
// small calls beside its Raft stream.
func (t *Transport) Client(id uint64) (lodestonepb.PeerClient, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.peers[id]
	if !ok {
		return nil, false
	}
	return lodestonepb.NewPeerClient(p.conn), true
}

// Send queues m for its peer without blocking; a full queue drops it and
// reports the peer unreachable. MsgSnap goes on its own stream.
func (t *Transport) Send(m raftpb.Message) {
	if m.To == t.self {
		return
	}
	t.mu.Lock()
	p, ok := t.peers[m.To]
	t.mu.Unlock()
	if !ok {
		t.logger.Debug("drop message to unknown peer", "peer", fmt.Sprintf("%x", m.To), "type", m.Type.String())
		t.drop(m)
		return
	}
	if m.Type == raftpb.MsgSnap {
		// NB: raftnode sends every MsgSnap through SendSnapshot; one that
		// carries its data goes the same way.
		t.goSendSnapshot(p, m, io.NopCloser(bytes.NewReader(m.Snapshot.Data)), int64(len(m.Snapshot.Data)))
		return
	}
	select {
	case p.queue <- m:
	default:
		t.drop(m)
		t.node.ReportUnreachable(m.To)
	}
}

// SendSnapshot streams m, a MsgSnap, with size bytes of snapshot data
// read from data (closed when done), on a goroutine of its own, and
// reports how it ended through Node.ReportSnapshot. It never blocks.
func (t *Transport) SendSnapshot(m raftpb.Message, data io.ReadCloser, size int64) {
	t.mu.Lock()
	p, ok := t.peers[m.To]
	t.mu.Unlock()
	if !ok || m.To == t.self {
		_ = data.Close()
		t.logger.Debug("drop snapshot to unknown peer", "peer", fmt.Sprintf("%x", m.To))
		t.drop(m)
		return
	}
	t.goSendSnapshot(p, m, data, size)
}

// goSendSnapshot streams m on a goroutine of its own. NB: a function of
// its own so that only a snapshot's message escapes to the heap, not
// every message send queues (3% of a leader's allocations).
func (t *Transport) goSendSnapshot(p *peer, m raftpb.Message, data io.ReadCloser, size int64) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		t.sendSnapshot(p, m, data, size)
	}()
}

func (t *Transport) drop(m raftpb.Message) {
	t.metrics.peerDropped.WithLabelValues(fmt.Sprintf("%x", m.To)).Inc()
	t.node.Dropped(m)
}

// runPeer keeps a stream open to one peer and writes queued messages to it
// in batches, reconnecting with jittered backoff.
func (t *Transport) runPeer(ctx context.Context, p *peer) {
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := t.streamTo(ctx, p)
		if ctx.Err() != nil {
			return
		}
		t.metrics.peerStreamEnds.WithLabelValues(fmt.Sprintf("%x", p.id)).Inc()
		t.logger.Info("raft stream to peer ended; redialling", "peer", fmt.Sprintf("%x", p.id), "err", err)
		t.node.ReportUnreachable(p.id)
		// Drop what queued up while the stream was down: it is stale, and
		// Raft resends what matters once the peer answers again.
		for drained := false; !drained; {
			select {
			case m := <-p.queue:
				t.drop(m)
			default:
				drained = true
			}
		}
		sleep := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-time.After(sleep):
		case <-ctx.Done():
			return
		}
		backoff = min(backoff*2, time.Second)
	}
}

// streamTo dials p's Raft stream and writes queued messages to it in
// batches, one write each, until the stream fails or ctx ends.
func (t *Transport) streamTo(ctx context.Context, p *peer) error {
	conn, err := dialRaftStream(ctx, p.addr, t.Cluster(), t.tls)
	if err != nil {
		return err
	}
	// The receiver only ever says why it ends the stream; a reader waits
	// for that, so a closed or refusing peer ends the stream at once
	// rather than at a later write.
	ended := make(chan error, 1)
	var reader sync.WaitGroup
	reader.Add(1)
	go func() {
		defer reader.Done()
		ended <- readRejection(conn)
	}()
	stopClose := context.AfterFunc(ctx, func() { conn.Close() })
	defer func() {
		stopClose()
		conn.Close()
		reader.Wait()
	}()
	label := fmt.Sprintf("%x", p.id)
	sentTotal, mergedTotal := t.metrics.peerSent.WithLabelValues(label), t.metrics.peerMerged.WithLabelValues(label)
	appsMerged := t.metrics.learnerAppendsMerged.WithLabelValues(label)
	var (
		buf       []byte
		queued    []raftpb.Message
		hold      noticeHold
		apps      appendHold
		holdTimer *time.Timer
		holdC     <-chan time.Time
	)
	// NB: every hold gets a new timer rather than a Reset of the last one.
	// A stopped timer stays in the runtime's timer heap until the runtime
	// cleans it out, and a Reset of such a timer marks it modified; when a
	// modified timer comes due the runtime walks its whole heap. With a
	// hold per write, that walk ran hundreds of times a second over the
	// timers of 10,000 blocking queries: 8% of the leader's CPU. A new
	// timer goes into the heap in O(log n).
	stopHold := func() {
		if holdTimer != nil {
			holdTimer.Stop()
			holdTimer, holdC = nil, nil
		}
	}
	defer stopHold()
	for {
		queued = queued[:0]
		expired := false
		select {
		case m := <-p.queue:
			queued = drainQueue(p.queue, append(queued, m))
			// A small batch first lets whatever else is ready to run go,
			// the Raft loop among it, and takes what that queued into the
			// same write: under load, several Readies' messages per system
			// call instead of one each (a leader at 4,000 puts/s made
			// twice the socket writes without it); idle, nothing else runs
			// and it costs nothing. A big batch goes at once: waiting
			// behind every runnable goroutine would only delay it. gRPC's
			// writer goroutine does the same below 1,000 bytes. Without
			// the yield, 64 closed-loop clients put 12% fewer per second
			// at 13% more server CPU per put. Yielding on a leader only
			// while four or more of its proposals were in flight kept
			// that, and left the blocking-query write p99 as it was.
			// A batch a read round waits on goes at once (waitsRead).
			if batchBytes(queued) < smallBatch && !waitsRead(queued) {
				runtime.Gosched()
				queued = drainQueue(p.queue, queued)
			}
		case <-holdC:
			expired = true
		case err := <-ended:
			return t.streamEnded(label, err)
		case <-ctx.Done():
			return ctx.Err()
		}
		wasHolding := hold.holding || apps.holding()
		var msgs []raftpb.Message
		var merged int
		wait := t.commitHold
		if t.holdsAppends(p.id) {
			wait = t.learnerHold
			if hold.holding { // NB: it became a learner while a notice waited
				queued = slices.Insert(queued, 0, hold.msg)
				hold.holding = false
			}
			var folded int
			if msgs, folded = apps.next(queued, expired); folded > 0 {
				appsMerged.Add(float64(folded))
			}
		} else {
			if apps.holding() { // NB: promoted while appends waited
				held, _ := apps.next(nil, true)
				queued = slices.Insert(queued, 0, held...)
			}
			msgs, merged = hold.next(queued, expired, t.commitHold > 0)
		}
		if merged > 0 {
			mergedTotal.Add(float64(merged))
		}
		switch {
		case !hold.holding && !apps.holding():
			stopHold()
		case !wasHolding:
			// The hold's deadline runs from the first message held, so a
			// run of them with nothing between them cannot delay the first.
			holdTimer = time.NewTimer(wait)
			holdC = holdTimer.C
		}
		if len(msgs) == 0 {
			continue
		}
		buf = appendFrames(buf[:0], msgs, func(i int, err error) {
			// NB: Raft would send it again and again; it is dropped and
			// the rest of the batch goes.
			t.logger.Error("dropping a raft message that cannot be sent", "peer", label, "err", err)
			t.drop(msgs[i])
		})
		if len(buf) == 0 {
			continue
		}
		if _, err := conn.Write(buf); err != nil {
			// The peer may have said why before it closed: a removed
			// member must learn it, or it redials forever.
			select {
			case rerr := <-ended:
				if errors.Is(rerr, errStreamRemoved) {
					return t.streamEnded(label, rerr)
				}
			case <-time.After(time.Second):
			}
			return fmt.Errorf("send: %w", err)
		}
		sentTotal.Add(float64(len(msgs)))
		if cap(buf) > peerBufKeep {
			buf = nil // NB: a batch of big appends does not pin its buffer
		}
	}
}

// streamEnded acts on the reason a peer gave for ending a Raft stream and
// returns it.
func (t *Transport) streamEnded(peer string, err error) error {
	if errors.Is(err, errStreamRemoved) {
		t.logger.Warn("a peer says this member was removed", "peer", peer, "err", err)
		t.node.MarkRemoved()
	}
	return err
}

// smallBatch is the size under which a stream yields before it writes.
const smallBatch = 1000

// waitsRead says whether msgs hold a message of a ReadIndex round, which
// every linearizable read in the round waits on. A yield puts the stream
// behind every runnable goroutine, and on a leader serving reads those are
// the handlers of the reads the last round answered: the next round's
// heartbeats waited for all their responses.
func waitsRead(msgs []raftpb.Message) bool {
	for i := range msgs {
		switch msgs[i].Type {
		case raftpb.MsgHeartbeat, raftpb.MsgHeartbeatResp, raftpb.MsgReadIndex, raftpb.MsgReadIndexResp:
			return true
		}
	}
	return false
}

// drainQueue appends what q holds now to msgs, up to peerBatchMax.
func drainQueue(q <-chan raftpb.Message, msgs []raftpb.Message) []raftpb.Message {
	for len(msgs) < peerBatchMax {
		select {
		case m := <-q:
			msgs = append(msgs, m)
		default:
			return msgs
		}
	}
	return msgs
}

// batchBytes is about what msgs take on the wire: their entries' data
// and a few dozen bytes of header each, without marshalling them.
func batchBytes(msgs []raftpb.Message) int {
	n := 0
	for i := range msgs {
		n += 32
		for _, e := range msgs[i].Entries {
			n += 16 + len(e.Data)
		}
	}
	return n
}

// peerBufKeep is the largest write buffer a Raft stream keeps between
// batches. NB: four appends of raft's 1 MiB MaxSizePerMsg: under a stream
// of large writes a smaller bound made every batch allocate and zero a
// fresh buffer (2% of a leader's CPU under 64 KiB puts); it is held per
// peer, so a leader of three pins at most 8 MiB for it.
const peerBufKeep = 4 << 20

// A leader tells its followers of every new commit index at once, with an
// append that carries no entries (a commit notice), and each follower
// answers it. Under a steady stream of single writes that doubles the Raft
// messages per write, and on a busy machine a message's system calls cost
// more than the rest of its handling. So a peer stream holds a notice that
// ends a batch for up to Config.CommitNoticeHold: when the next message to
// that peer is an append of the same term whose commit index is at least
// the notice's (every later append is), the notice says nothing new and is
// dropped; otherwise it goes out first, or alone when the hold ends. A
// follower learns of a commit at most that much later; Raft itself never
// waits for a notice (loss is always allowed).

// noticeHold is one peer stream's held commit notice.
type noticeHold struct {
	msg     raftpb.Message
	holding bool
}

func isCommitNotice(m raftpb.Message) bool {
	return m.Type == raftpb.MsgApp && len(m.Entries) == 0
}

// next takes the messages just queued for the peer (none when the hold
// expired) and returns those to send now, in order, and how many held
// notices were dropped as superseded. It may hold a trailing notice
// (unless expired or !enabled), replacing msgs' last element.
func (h *noticeHold) next(msgs []raftpb.Message, expired, enabled bool) (_ []raftpb.Message, merged int) {
	if h.holding && len(msgs) > 0 && msgs[0].Type == raftpb.MsgApp &&
		msgs[0].Term == h.msg.Term && msgs[0].Commit >= h.msg.Commit {
		h.holding = false
		merged = 1
	}
	if h.holding {
		h.holding = false
		msgs = append(msgs, raftpb.Message{})
		copy(msgs[1:], msgs)
		msgs[0] = h.msg
	}
	if enabled && !expired && len(msgs) > 0 && isCommitNotice(msgs[len(msgs)-1]) {
		h.msg, h.holding = msgs[len(msgs)-1], true
		msgs = msgs[:len(msgs)-1]
	}
	return msgs, merged
}

// sendSnapshot streams m with data, closes data, then reports the outcome.
func (t *Transport) sendSnapshot(p *peer, m raftpb.Message, data io.ReadCloser, size int64) {
	start := time.Now()
	err := t.streamSnapshot(p, m, data, size)
	if cerr := data.Close(); cerr != nil {
		t.logger.Debug("close snapshot data", "err", cerr)
	}
	status := raft.SnapshotFinish
	if err != nil {
		status = raft.SnapshotFailure
		t.logger.Warn("snapshot send failed", "peer", fmt.Sprintf("%x", p.id), "index", m.Snapshot.Metadata.Index, "err", err)
	} else {
		t.logger.Info("snapshot sent", "peer", fmt.Sprintf("%x", p.id), "index", m.Snapshot.Metadata.Index,
			"bytes", size, "took", time.Since(start))
	}
	t.node.ReportSnapshot(p.id, status)
}

func (t *Transport) streamSnapshot(p *peer, m raftpb.Message, data io.Reader, size int64) error {
	ctx, cancel := context.WithTimeout(t.ctx, snapshotTimeout)
	defer cancel()
	stream, err := lodestonepb.NewPeerClient(p.conn).Snapshot(ctx)
	if err != nil {
		return fmt.Errorf("open snapshot stream: %w", err)
	}
	head := m
	snap := *m.Snapshot
	snap.Data = nil
	head.Snapshot = &snap
	hb, err := head.Marshal()
	if err != nil {
		return fmt.Errorf("marshal snapshot message: %w", err)
	}
	if err := stream.Send(&lodestonepb.SnapshotChunk{Message: hb, ClusterId: clusterBytes(t.Cluster()), Size: uint64(size)}); err != nil {
		return fmt.Errorf("send snapshot header: %w", err)
	}
	// NB: read from the sender's file a chunk at a time: the data is never
	// whole in this process's memory. A chunk's buffer is not reused, since
	// grpc may still hold a message after Send returns.
	var crc uint32
	sum := sha256.New()
	var off int64
	for off < size {
		buf := make([]byte, min(snapshotChunkSize, size-off))
		n, err := io.ReadFull(data, buf)
		if err != nil {
			return fmt.Errorf("read snapshot data at %d of %d: %w", off, size, err)
		}
		crc = crc32.Update(crc, castagnoli, buf[:n])
		sum.Write(buf[:n])
		if err := stream.Send(&lodestonepb.SnapshotChunk{Data: buf[:n]}); err != nil {
			return fmt.Errorf("send snapshot chunk at %d: %w", off, err)
		}
		off += int64(n)
	}
	// The reader checks its source at its end (a snapshot file's CRC):
	// read it to the end before the trailer vouches for the data.
	if n, err := io.Copy(io.Discard, data); err != nil || n != 0 {
		return fmt.Errorf("snapshot data after %d bytes: %d more bytes, %w", size, n, err)
	}
	if err := stream.Send(&lodestonepb.SnapshotChunk{Last: true, Crc32C: crc, Sha256: sum.Sum(nil)}); err != nil {
		return fmt.Errorf("send snapshot trailer: %w", err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		return fmt.Errorf("snapshot not accepted: %w", err)
	}
	return nil
}

// ReceiveStream serves a Raft stream whose magic was read: it reads the
// version byte and the sender's cluster id, then decodes frames and hands
// each message to the Raft loop in order, until the stream ends or ctx
// does. A sender of another cluster, or of none, is refused before any of
// its messages reach Raft. A message from a removed member ends the
// stream with a rejection, so that member learns it was removed.
func (t *Transport) ReceiveStream(ctx context.Context, conn net.Conn) error {
	remote := conn.RemoteAddr().String()
	got, err := readPreambleRest(conn)
	if err != nil {
		return err
	}
	learning := false
	if e := t.checkCluster(got); e != nil {
		if e.Reason != refusedNotLearned {
			return t.refuseStream(conn, remote, e)
		}
		learning = true // NB: decided at the first message, by its sender
	}
	f := newFrameReader(conn, raftStreamReadBuffer)
	for {
		var m raftpb.Message
		if err := f.message(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if learning {
			if e := t.learn(got, m.From); e != nil {
				return t.refuseStream(conn, remote, e)
			}
			learning = false
		}
		t.removedMu.Lock()
		gone := t.removed[m.From]
		t.removedMu.Unlock()
		if gone {
			why := fmt.Sprintf("member %x was removed from the cluster", m.From)
			if err := writeRejection(conn, rejectRemoved, why); err != nil {
				t.logger.Debug("telling a removed member", "peer", fmt.Sprintf("%x", m.From), "err", err)
			}
			return errors.New(why)
		}
		if err := t.node.Step(ctx, m); err != nil {
			return err
		}
	}
}

// refuseStream tells a Raft stream's sender why it is refused and ends it.
func (t *Transport) refuseStream(conn net.Conn, remote string, e *RefusedError) error {
	t.refused(remote, e)
	if err := writeRejection(conn, rejectCluster, e.Msg); err != nil {
		t.logger.Debug("telling a refused peer", "remote", remote, "err", err)
	}
	return e
}

// receiveSnapshot serves Peer.Snapshot. Before Raft sees anything it
// checks, in order: the sender's cluster (metadata and first chunk), the
// announced size and the chunk count against the limits, the bytes
// received against the announced size, the CRC-32C and SHA-256 of the
// data, and that the data decodes as a store snapshot of this cluster. A
// refused snapshot changes nothing.
func (t *Transport) receiveSnapshot(stream lodestonepb.Peer_SnapshotServer) error {
	ctx := stream.Context()
	remote := remoteAddr(ctx)
	refuse := func(reason string, code codes.Code, format string, args ...any) error {
		return t.refused(remote, &RefusedError{Reason: reason, Code: code, Msg: fmt.Sprintf(format, args...)})
	}
	first, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("receive snapshot header: %w", err)
	}
	sender, err := clusterid.FromBytes(first.ClusterId)
	if err != nil {
		return refuse(refusedNoCluster, codes.PermissionDenied, "snapshot header: %v", err)
	}
	if md := clusterFromMD(ctx); md != sender {
		return refuse(refusedNoCluster, codes.PermissionDenied,
			"snapshot stream names cluster %s in its metadata and %s in its header", md, sender)
	}
	if e := t.checkCluster(sender); e != nil && e.Reason != refusedNotLearned {
		return t.refused(remote, e)
	}
	var m raftpb.Message
	if err := m.Unmarshal(first.Message); err != nil || m.Type != raftpb.MsgSnap || m.Snapshot == nil {
		return refuse(refusedSnapMalformed, codes.InvalidArgument, "snapshot stream does not start with a MsgSnap (decode error: %v)", err)
	}
	index := m.Snapshot.Metadata.Index
	if first.Size > uint64(t.maxSnapBytes) {
		return refuse(refusedSnapOversize, codes.ResourceExhausted,
			"snapshot at index %d is %d bytes, over this server's limit of %d (--max-peer-snapshot-bytes)", index, first.Size, t.maxSnapBytes)
	}
	var (
		data   []byte
		chunks int
		crc    uint32
		sum    = sha256.New()
	)
	for {
		c, err := stream.Recv()
		if err == io.EOF {
			return refuse(refusedSnapTruncated, codes.InvalidArgument,
				"snapshot at index %d truncated: the stream ended after %d of %d bytes without its last chunk", index, len(data), first.Size)
		}
		if err != nil {
			return fmt.Errorf("receive snapshot data after %d bytes: %w", len(data), err)
		}
		if chunks++; chunks > t.maxSnapChunks {
			return refuse(refusedSnapChunks, codes.ResourceExhausted,
				"snapshot at index %d: more than %d chunks (--max-peer-snapshot-chunks)", index, t.maxSnapChunks)
		}
		if uint64(len(data))+uint64(len(c.Data)) > first.Size {
			return refuse(refusedSnapOversize, codes.InvalidArgument,
				"snapshot at index %d: more data than the %d bytes announced", index, first.Size)
		}
		data = append(data, c.Data...)
		crc = crc32.Update(crc, castagnoli, c.Data)
		sum.Write(c.Data)
		if c.Last {
			if uint64(len(data)) != first.Size {
				return refuse(refusedSnapTruncated, codes.InvalidArgument,
					"snapshot at index %d truncated: %d of %d bytes", index, len(data), first.Size)
			}
			if got := sum.Sum(nil); !bytes.Equal(got, c.Sha256) || crc != c.Crc32C {
				return refuse(refusedSnapChecksum, codes.InvalidArgument,
					"snapshot at index %d: checksum mismatch (sha256 %x, crc32c %08x; the sender says %x, %08x)", index, got, crc, c.Sha256, c.Crc32C)
			}
			break
		}
	}
	info, err := store.VerifySnapshot(bytes.NewReader(data))
	if err != nil {
		return refuse(refusedSnapCorrupt, codes.InvalidArgument, "snapshot at index %d does not decode: %v", index, err)
	}
	if info.Cluster != sender {
		return refuse(refusedSnapForeign, codes.PermissionDenied,
			"snapshot at index %d holds the state of cluster %s, its sender is in cluster %s", index, info.Cluster, sender)
	}
	if info.Index != index {
		return refuse(refusedSnapCorrupt, codes.InvalidArgument, "snapshot message is at index %d, its state at index %d", index, info.Index)
	}
	if e := t.learn(sender, m.From); e != nil {
		return t.refused(remote, e)
	}
	m.Snapshot.Data = data
	t.metrics.snapshotBytes.Add(float64(len(data)))
	t.logger.Info("snapshot received", "index", index, "bytes", len(data), "cluster", sender.String())
	if err := t.node.Step(ctx, m); err != nil {
		return err
	}
	return stream.SendAndClose(&lodestonepb.RaftAck{})
}

// clusterBytes is id on the wire; the zero id is sent as nothing.
func clusterBytes(id clusterid.ID) []byte {
	if id.IsZero() {
		return nil
	}
	return id[:]
}

// Close stops every peer goroutine and waits for them.
func (t *Transport) Close() error {
	t.cancel()
	t.index.close()
	t.mu.Lock()
	var errs []error
	for id, p := range t.peers {
		p.cancel()
		if err := p.conn.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close peer %x: %w", id, err))
		}
		delete(t.peers, id)
	}
	t.mu.Unlock()
	t.wg.Wait()
	return errors.Join(errs...)
}
