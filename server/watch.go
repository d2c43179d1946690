package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/grpcopt"
	"github.com/lodestone-kv/lodestone/internal/rpcstatus"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// waitForChange blocks a read until what it selects changes after index or
// the wait (plus up to 1/16 jitter, so synchronized clients spread out)
// elapses. It never fails for a timeout; the caller then reads.
func (s *core) waitForChange(ctx context.Context, key []byte, prefix bool, index uint64, waitMS uint32) error {
	wait := time.Duration(waitMS) * time.Millisecond
	if wait <= 0 || wait > s.cfg.MaxBlockingWait {
		wait = s.cfg.MaxBlockingWait
	}
	err := consulapi.Block(ctx, s.hub, s.store, consulapi.KVDep(string(key), prefix), index, wait)
	if errors.Is(err, consulapi.ErrBadWait) {
		return rpcstatus.Invalidf("blocking read: %v", err)
	}
	return err
}

// watchService serves the Watch API: many watches per stream, each a view
// on the hub. One goroutine per stream sends everything; watchers never
// block it (the hub buffers per watcher and cuts loose those that fall
// behind), and a slow stream only backs up its own watchers.
type watchService struct {
	lodestonepb.UnimplementedWatchServer
	s *core

	mu      sync.Mutex
	perConn map[string]int // live watches by client connection

	wire wireCache
}

type watchStream struct {
	svc     *watchService
	stream  lodestonepb.Watch_WatchServer
	conn    string
	ready   *watch.Ready
	watches watchSet                // by watch id, which is also each watcher's Tag
	userAll map[*watch.Watcher]bool // user watches on every key: reserved keys filtered out
	// grouped: the client understands WatchResponse.groups (a create said
	// so); event and progress responses then go out as groups in out, one
	// message per delivery round rather than one per watch.
	grouped bool
	// bufs holds what a delivery round builds; borrowed from wireBufs
	// for the round and returned by flush, nil in between.
	bufs   *wireBuffers
	sentAt time.Time // when events last went out (the busy grid's test)
	// sending counts the grouped responses gRPC still holds; a delivery
	// round waits for none (see Watch).
	sending sentBuffers
	lastOut int // size of the last grouped response sent
}

// sentBuffers is a grouped stream's mem.BufferPool: gRPC gives each
// response buffer back through Put once it has written it, and Put
// passes the buffer on to outBufs and counts the response done.
type sentBuffers struct {
	inFlight atomic.Int32
	done     chan struct{} // cap 1: signalled when inFlight drops to 0
}

// Get is never called for a buffer gRPC was handed (grpcopt.Owned).
func (p *sentBuffers) Get(n int) *[]byte {
	b := make([]byte, n)
	return &b
}

func (p *sentBuffers) Put(b *[]byte) {
	*b = trimBuffer(*b)
	outBufs.Put(b)
	if p.inFlight.Add(-1) == 0 {
		select {
		case p.done <- struct{}{}:
		default:
		}
	}
}

// outBufs holds the byte slices grouped responses are built in. Each one
// goes to gRPC with its response (grpcopt.Owned, no copy) and comes back
// through the stream's sentBuffers once written; the round that sent it
// took a spare from here in its place.
var outBufs = sync.Pool{New: func() any { return new([]byte) }}

// wireBuffers are the buffers a delivery round builds responses in.
type wireBuffers struct {
	out     []byte // groups not sent yet, in wire form (watchwire.go)
	scratch []byte // a group's fields while out takes them
	resp    []byte // an ungrouped response being built
}

// wireBufs lends wireBuffers for one delivery round. NB: kept by each
// stream, they stayed as large as its largest round (a round for 100
// watches of one key is ~16 KB), which over 10,000 streams was more heap
// than their million watchers; lent per round, they are held only by the
// streams sending right now.
var wireBufs = sync.Pool{New: func() any { return new(wireBuffers) }}

// buffers returns the round's buffers, borrowing them if needed.
func (st *watchStream) buffers() *wireBuffers {
	if st.bufs == nil {
		st.bufs = wireBufs.Get().(*wireBuffers)
	}
	return st.bufs
}

// release returns the round's buffers, if any, to wireBufs.
func (st *watchStream) release() {
	b := st.bufs
	if b == nil {
		return
	}
	st.bufs = nil
	b.out, b.scratch, b.resp = trimBuffer(b.out), trimBuffer(b.scratch), trimBuffer(b.resp)
	wireBufs.Put(b)
}

// maxGroupBytes bounds a grouped response, far below a client's default
// 4 MiB receive limit. A single watch's batch bigger than that still goes
// out whole.
const maxGroupBytes = 256 << 10

// maxKeptBuffer is the most wireBufs keeps of a buffer between rounds, so
// a stream that once sent a large catch-up does not leave it pooled.
const maxKeptBuffer = 2 * maxGroupBytes

func (ws *watchService) Watch(stream lodestonepb.Watch_WatchServer) error {
	ws.s.metrics.watchStreams.Inc()
	defer ws.s.metrics.watchStreams.Dec()
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	conn := "unknown"
	if p, ok := grpcpeer.FromContext(ctx); ok {
		conn = p.Addr.String()
	}
	st := &watchStream{
		svc: ws, stream: stream, conn: conn, ready: watch.NewReady(),
	}
	st.sending.done = make(chan struct{}, 1)
	defer st.closeAll()

	reqs := make(chan *lodestonepb.WatchRequest, 16)
	recvErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	defer wg.Wait()
	defer cancel()

	// Deliveries happen on a process-wide grid (Config.WatchDeliveryInterval):
	// a wake-up waits for the next grid point (readyC is off meanwhile, the
	// timer on), so a stream sends at most one message per interval and the
	// streams of a connection send at the same instants. That costs up to
	// one interval of lag (half on average); in exchange a stream whose
	// watchers see many writes sends one message per interval rather than
	// one per write, and gRPC writes a connection's messages to the socket
	// in one system call instead of one each.
	//
	// A stream that sent less than a busy interval ago waits for the busy
	// grid instead (Config.WatchBusyDeliveryInterval): one fed by every
	// write then sends a message per busy interval, which is what fan-out
	// costs in CPU, while one that sends now and then keeps the fine grid's
	// lag.
	interval, busy := ws.s.cfg.WatchDeliveryInterval, ws.s.cfg.WatchBusyDeliveryInterval
	//
	// A grouped stream also waits until gRPC has written its previous
	// response (sendingC): while the client reads slower than the
	// stream's events come, they wait in the watchers' buffers (a pointer
	// each, cut loose past the buffer's bound) and go out together in the
	// next response, instead of queueing in gRPC as response after
	// response in wire form (up to its per-stream write quota, 64 KiB),
	// each in a buffer the collector must sweep.
	readyC := st.ready.C()
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	var timerC <-chan time.Time
	var sendingC <-chan struct{}
	for {
		select {
		case req := <-reqs:
			if err := st.handle(ctx, req); err != nil {
				return err
			}
		case err := <-recvErr:
			if err == io.EOF {
				return nil
			}
			return err
		case <-readyC:
			now := time.Now()
			grid := interval
			if busy > interval && now.Sub(st.sentAt) < busy {
				grid = busy
			}
			timer.Reset(now.Truncate(grid).Add(grid).Sub(now))
			readyC, timerC = nil, timer.C
		case <-timerC:
			timerC = nil
			if st.sending.inFlight.Load() > 0 {
				sendingC = st.sending.done
				continue
			}
			readyC = st.ready.C()
			if err := st.deliver(); err != nil {
				return err
			}
		case <-sendingC:
			if st.sending.inFlight.Load() > 0 {
				continue // a signal from an earlier response
			}
			readyC, sendingC = st.ready.C(), nil
			if err := st.deliver(); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (st *watchStream) handle(ctx context.Context, req *lodestonepb.WatchRequest) error {
	switch r := req.Request.(type) {
	case *lodestonepb.WatchRequest_Create:
		return st.create(ctx, r.Create)
	case *lodestonepb.WatchRequest_Cancel:
		w, ok := st.watches.get(r.Cancel.WatchId)
		if !ok {
			return st.send(&lodestonepb.WatchResponse{WatchId: r.Cancel.WatchId, Canceled: true, CancelReason: "no such watch on this stream"})
		}
		st.drop(r.Cancel.WatchId, w)
		return st.send(&lodestonepb.WatchResponse{WatchId: r.Cancel.WatchId, Canceled: true, CancelReason: "canceled by the client"})
	case *lodestonepb.WatchRequest_Progress:
		// This stream's watches only, as etcd answers the requesting
		// stream: a server-wide round would visit (and could notify)
		// every watcher of every stream for one client's request.
		st.svc.s.hub.ProgressOf(st.watches.all())
		return nil
	default:
		return status.Error(codes.InvalidArgument, "watch request has neither create, cancel nor progress")
	}
}

func (st *watchStream) create(ctx context.Context, c *lodestonepb.WatchCreate) error {
	s := st.svc.s
	refuse := func(reason string) error {
		return st.send(&lodestonepb.WatchResponse{WatchId: c.WatchId, Canceled: true, CancelReason: reason, Header: s.header(s.store.Index())})
	}
	if _, dup := st.watches.get(c.WatchId); dup {
		return refuse(fmt.Sprintf("watch id %d is already in use on this stream", c.WatchId))
	}
	key, prefix, err := st.hubKey(c)
	if err != nil {
		return refuse(err.Error())
	}
	live := s.live()
	if n := st.watches.len(); n >= live.MaxWatchesPerStream {
		return refuse(fmt.Sprintf("this stream has %d watches; at most %d allowed (limit max-watches-per-stream): open another stream", n, live.MaxWatchesPerStream))
	}
	if !st.svc.reserve(st.conn, live.MaxWatchesPerConnection) {
		return refuse(fmt.Sprintf("this connection has %d watches (limit max-watches-per-connection): open another connection", live.MaxWatchesPerConnection))
	}
	req := watch.Request{
		Key: key, Prefix: prefix, StartIndex: c.StartIndex, FromNow: c.StartIndex == 0,
		NoPut: c.NoPut, NoDelete: c.NoDelete, PrevKV: c.PrevKv, Ready: st.ready, Tag: c.WatchId,
	}
	// NB: not the stream's context: the stream closes every watcher it
	// made when it ends (closeAll), and a watcher without a context skips
	// a context check on every Next.
	w, err := s.hub.Watch(context.Background(), req)
	if err != nil {
		st.svc.release(st.conn)
		var ce *watch.CompactedError
		if errors.As(err, &ce) {
			return st.send(&lodestonepb.WatchResponse{
				WatchId: c.WatchId, Canceled: true, CompactedIndex: ce.Oldest, Header: s.header(s.store.Index()),
				CancelReason: fmt.Sprintf("start index %d is no longer retained; read the current state and watch from its index (at least %d)", c.StartIndex, ce.Oldest),
			})
		}
		return refuse(err.Error())
	}
	st.watches.add(w)
	st.grouped = st.grouped || c.Grouped
	if key == "" {
		if st.userAll == nil {
			st.userAll = map[*watch.Watcher]bool{}
		}
		st.userAll[w] = true
	}
	if err := st.send(&lodestonepb.WatchResponse{WatchId: c.WatchId, Created: true, Header: s.header(s.store.Index())}); err != nil {
		return err
	}
	// A replay from start_index may already be buffered; no wake-up comes
	// for it.
	if err := st.drain(w); err != nil {
		return err
	}
	return st.flush()
}

// hubKey maps a create request to the hub key or prefix it watches. User
// keys are validated (no NUL, so never a reserved key); the catalog's
// reserved service-instance events are reachable only through
// WATCH_TARGET_CATALOG_SERVICES, as a prefix under store.ServiceEventPrefix.
func (st *watchStream) hubKey(c *lodestonepb.WatchCreate) (key string, prefix bool, err error) {
	lim := st.svc.s.live().Limits
	switch c.Target {
	case lodestonepb.WatchTarget_WATCH_TARGET_KV:
		if c.Prefix {
			err = lim.ValidatePrefix(c.Key)
		} else {
			err = lim.ValidateKey(c.Key)
		}
		return string(c.Key), c.Prefix, err
	case lodestonepb.WatchTarget_WATCH_TARGET_CATALOG_SERVICES:
		if len(c.Key) == 0 {
			return store.ServiceEventPrefix, true, nil
		}
		if err := lim.ValidateKey(c.Key); err != nil {
			return "", false, fmt.Errorf("catalog service name: %w", err)
		}
		return string(store.ServiceEventKeyPrefix(string(c.Key))), true, nil
	default:
		return "", false, fmt.Errorf("unknown watch target %d", c.Target)
	}
}

// userEvents drops the store's reserved event keys from a batch of a user
// watch on every key (the only user watch whose range contains them).
func userEvents(evs []*watch.Event) []*watch.Event {
	out := evs[:0:0]
	for i := range evs {
		if !store.IsReservedKey([]byte(evs[i].KV.Key)) {
			out = append(out, evs[i])
		}
	}
	return out
}

// deliver sends what every ready watcher has: on a grouped stream one
// response per round (or per maxGroupBytes), else one per ready watch.
func (st *watchStream) deliver() error {
	for _, w := range st.ready.Take() {
		if err := st.drain(w); err != nil {
			return err
		}
	}
	return st.flush()
}

var doneCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// drain queues (grouped) or sends the batch w has ready, if any, without
// blocking on w. The caller flushes.
//
// One batch a round: what w has when the round reaches it. Events that
// come while its response is being written list w as ready again and go
// out in the next round, on the grid. NB: taking them at once (a loop
// until w was empty) sent a busy watch's events in a second message right
// after the first whenever a send took longer than the writes' spacing,
// off the grid, and a firehose faster than the client read kept the round
// on that one watch.
func (st *watchStream) drain(w *watch.Watcher) error {
	id := w.Tag()
	// NB: not a lookup in st.watches: a binary search whose every step
	// reads another watcher was 8% of a watch member's CPU at 1M
	// watchers. A watch the stream dropped was closed by it.
	if w.Closed() {
		return nil // canceled meanwhile
	}
	b, err := w.NextShared(doneCtx)
	if errors.Is(err, context.Canceled) {
		return nil // nothing right now
	}
	if err != nil {
		return st.ended(id, w, err)
	}
	shared := b.Events
	if len(st.userAll) > 0 && st.userAll[w] {
		b.Events = userEvents(b.Events)
	}
	prev := w.WantsPrevKV()
	bufs := st.buffers()
	if !st.grouped {
		bufs.resp = st.svc.wire.appendResponse(bufs.resp[:0], st.svc.s.header(b.Index), id, b.Index, b.Events, prev)
		w.Recycle(shared) // in wire form now
		return st.sendWire(bufs.resp)
	}
	if len(bufs.out) == 0 && cap(bufs.out) < st.lastOut {
		// NB: sized at once like the stream's previous response: grown
		// by append from an empty spare (outBufs is empty while many
		// streams' responses are in flight), a 100-group response cost
		// twice its size in allocations.
		bufs.out = make([]byte, 0, st.lastOut)
	}
	bufs.out, bufs.scratch = st.svc.wire.appendGroup(bufs.out, bufs.scratch, id, b.Index, b.Events, prev)
	w.Recycle(shared) // in wire form now
	if len(bufs.out) >= maxGroupBytes {
		return st.flush()
	}
	return nil
}

// flush sends the queued groups, if any, and returns the round's buffers.
func (st *watchStream) flush() error {
	if st.bufs == nil {
		return nil
	}
	var err error
	if len(st.bufs.out) > 0 {
		err = st.sendOwned()
	}
	st.release()
	return err
}

// sendOwned sends the queued groups, handing their buffer to gRPC (no
// copy); a spare from outBufs takes its place.
func (st *watchStream) sendOwned() error {
	b := st.bufs
	sent := outBufs.Get().(*[]byte)
	*sent, b.out = b.out, (*sent)[:0]
	st.lastOut = min(len(*sent), maxGroupBytes)
	st.sending.inFlight.Add(1)
	if err := st.stream.SendMsg(grpcopt.Owned{Buf: sent, Pool: &st.sending}); err != nil {
		return fmt.Errorf("send watch response: %w", err)
	}
	st.sentAt = time.Now()
	return nil
}

// trimBuffer empties b for reuse, or drops it if it grew past
// maxKeptBuffer (so the pool keeps no large catch-up).
func trimBuffer(b []byte) []byte {
	if cap(b) > maxKeptBuffer {
		return nil
	}
	return b[:0]
}

// ended tells the client why a watch stopped and how to go on.
func (st *watchStream) ended(id int64, w *watch.Watcher, err error) error {
	st.drop(id, w)
	resp := &lodestonepb.WatchResponse{WatchId: id, Canceled: true, CancelReason: err.Error(), Header: st.svc.s.header(st.svc.s.store.Index())}
	var oe *watch.OverflowError
	var ce *watch.CompactedError
	switch {
	case errors.As(err, &oe):
		resp.ResyncIndex = oe.ResumeIndex
		st.svc.s.logger.Info("watcher cut loose", "watcher", w.ID(), "reason", oe.Reason, "index", oe.ResumeIndex)
	case errors.As(err, &ce):
		resp.CompactedIndex = ce.Oldest
	case errors.Is(err, watch.ErrClosed):
		resp.CancelReason = "the server is shutting down; resume on another member"
	}
	return st.send(resp)
}

// send sends resp after any queued groups, which it must follow (a
// watch's cancel comes after its last events).
func (st *watchStream) send(resp *lodestonepb.WatchResponse) error {
	if err := st.flush(); err != nil {
		return err
	}
	return st.sendNow(resp)
}

func (st *watchStream) sendNow(resp *lodestonepb.WatchResponse) error {
	if err := st.stream.Send(resp); err != nil {
		return fmt.Errorf("send watch response: %w", err)
	}
	return nil
}

// sendWire sends a WatchResponse already in wire form; the codec copies
// it, so b can be reused at once.
func (st *watchStream) sendWire(b []byte) error {
	if err := st.stream.SendMsg(grpcopt.Encoded(b)); err != nil {
		return fmt.Errorf("send watch response: %w", err)
	}
	st.sentAt = time.Now()
	return nil
}

func (st *watchStream) drop(id int64, w *watch.Watcher) {
	w.Close()
	st.watches.remove(id)
	delete(st.userAll, w)
	st.svc.release(st.conn)
}

func (st *watchStream) closeAll() {
	ws := st.watches.all()
	st.watches = watchSet{}
	for _, w := range ws {
		w.Close()
		delete(st.userAll, w)
		st.svc.release(st.conn)
	}
}

// watchSet is a stream's watches by id (each watcher's Tag), in a slice
// sorted by id. NB: not a map: at 100 watches a stream, a map took ~20 B
// per watch over 1M watches, a slice 8-16; clients number their watches
// upwards, so adding is an append, and a lookup is a binary search over
// at most max-watches-per-stream.
type watchSet struct{ ws []*watch.Watcher }

func (s *watchSet) search(id int64) (int, bool) {
	return slices.BinarySearchFunc(s.ws, id, func(w *watch.Watcher, id int64) int { return cmp.Compare(w.Tag(), id) })
}

func (s *watchSet) get(id int64) (*watch.Watcher, bool) {
	if i, ok := s.search(id); ok {
		return s.ws[i], true
	}
	return nil, false
}

// add adds w, whose id must not be in the set.
func (s *watchSet) add(w *watch.Watcher) {
	if n := len(s.ws); n == 0 || s.ws[n-1].Tag() < w.Tag() {
		s.ws = append(s.ws, w)
		return
	}
	i, _ := s.search(w.Tag())
	s.ws = slices.Insert(s.ws, i, w)
}

func (s *watchSet) remove(id int64) {
	if i, ok := s.search(id); ok {
		s.ws = slices.Delete(s.ws, i, i+1)
	}
}

func (s *watchSet) len() int { return len(s.ws) }

// all returns the watches in a slice of the caller's.
func (s *watchSet) all() []*watch.Watcher { return slices.Clone(s.ws) }

func (ws *watchService) reserve(conn string, limit int) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.perConn == nil {
		ws.perConn = map[string]int{}
	}
	if ws.perConn[conn] >= limit {
		return false
	}
	ws.perConn[conn]++
	return true
}

func (ws *watchService) release(conn string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.perConn[conn] <= 1 {
		delete(ws.perConn, conn)
		return
	}
	ws.perConn[conn]--
}
