package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// ErrCompacted means a watch asked to resume from an index the server no
// longer retains (its event history was compacted past it). The watch has
// ended; every batch before the error was delivered. Reload the state with
// a read (Range or Get) and watch again with FromIndex(read's Header.Index).
// Returned errors are *CompactedError.
var ErrCompacted = errors.New("client: watch history compacted")

// ErrWatchCanceled means the server ended a watch for a reason other than
// compaction or a resync (for instance it refused the request); the
// *WatchCanceledError carries the server's reason. Resubscribing with the
// same options will most likely fail again.
var ErrWatchCanceled = errors.New("client: watch canceled by the server")

// CompactedError is the terminal error of a watch whose resume index was
// compacted away on the server. It matches ErrCompacted.
type CompactedError struct {
	// Key is the watched key or prefix.
	Key string
	// Requested is the start index the server could not serve: the watch
	// had delivered every matching event up to it.
	Requested uint64
	// CompactedIndex is the server's compacted_index: the oldest index it
	// could resume from. Reload at this index or later.
	CompactedIndex uint64
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("client: watch %q: history compacted: resume index %d is older than %d; reload with a read and watch from its index",
		e.Key, e.Requested, e.CompactedIndex)
}

// Unwrap makes errors.Is(err, ErrCompacted) true.
func (e *CompactedError) Unwrap() error { return ErrCompacted }

// WatchCanceledError is the terminal error of a watch the server canceled
// without a resync or compacted index. It matches ErrWatchCanceled.
type WatchCanceledError struct {
	Key    string // the watched key or prefix
	Reason string // the server's cancel_reason
}

func (e *WatchCanceledError) Error() string {
	return fmt.Sprintf("client: watch %q canceled by the server: %s", e.Key, e.Reason)
}

// Unwrap makes errors.Is(err, ErrWatchCanceled) true.
func (e *WatchCanceledError) Unwrap() error { return ErrWatchCanceled }

// WatchOption configures a Watch.
type WatchOption func(*watchSettings)

type watchSettings struct {
	prefix, prevKV, noPut, noDelete, progress bool
	catalog                                   bool // WatchCatalogServices
	start                                     uint64
	buffer                                    int
	giveUp                                    time.Duration
}

func (s *watchSettings) target() lodestonepb.WatchTarget {
	if s.catalog {
		return lodestonepb.WatchTarget_WATCH_TARGET_CATALOG_SERVICES
	}
	return lodestonepb.WatchTarget_WATCH_TARGET_KV
}

// DefaultWatchBuffer is how many events a Watch queues for its consumer
// before the client stops feeding it (see WatchBuffer).
const DefaultWatchBuffer = 4096

// WatchPrefix watches every key that starts with the given key ("" with
// WatchPrefix watches every key).
func WatchPrefix() WatchOption { return func(s *watchSettings) { s.prefix = true } }

// FromIndex delivers every matching event with index > idx, replayed from
// the server's retained history when idx lies in the past: pass the
// Header.Index of the read the watch follows up, or the Index of the last
// batch a previous watch returned. idx 0 (the default) means "from now".
// An idx older than the server's retained history ends the watch with
// ErrCompacted.
func FromIndex(idx uint64) WatchOption { return func(s *watchSettings) { s.start = idx } }

// WithPrevKV asks for each event's previous entry (Event.PrevKv).
func WithPrevKV() WatchOption { return func(s *watchSettings) { s.prevKV = true } }

// NoPut drops put events.
func NoPut() WatchOption { return func(s *watchSettings) { s.noPut = true } }

// NoDelete drops delete events.
func NoDelete() WatchOption { return func(s *watchSettings) { s.noDelete = true } }

// WithProgressNotify makes Next also return progress batches (no events,
// a newer Index) when the server reports that the watch is up to date.
// Without it progress only moves Watch.Index and the resume point.
func WithProgressNotify() WatchOption { return func(s *watchSettings) { s.progress = true } }

// WatchCatalogServices makes the watch follow the catalog's
// service-instance events instead of KV keys: the key passed to Watch is a
// service name, "" for every service (WatchPrefix is implied). Events are
// read-only views of the store's reserved keys; decode them with
// DecodeServiceInstanceEvent. FromIndex, progress, resume and ErrCompacted
// work as for KV watches, so a reader loads the catalog (Services, Health)
// and follows it from the reads' index.
func WatchCatalogServices() WatchOption { return func(s *watchSettings) { s.catalog = true } }

// ServiceInstanceEvent is a decoded catalog service-instance event.
type ServiceInstanceEvent struct {
	Service, Node, ID string // the instance's service name, node and service id
	// Index is the index of the change.
	Index uint64
	// Health is the instance with its node, the checks that count for it
	// and their aggregated status; nil when the instance was deregistered.
	Health *lodestonepb.ServiceHealth
}

// serviceEventPrefix is the key prefix of catalog service-instance events
// (store.ServiceEventPrefix; see WATCH_TARGET_CATALOG_SERVICES).
const serviceEventPrefix = "\x00catalog/service/"

// DecodeServiceInstanceEvent decodes one event of a WatchCatalogServices
// watch. The result shares nothing with ev.
func DecodeServiceInstanceEvent(ev *lodestonepb.Event) (ServiceInstanceEvent, error) {
	key := string(ev.GetKv().GetKey())
	rest, ok := strings.CutPrefix(key, serviceEventPrefix)
	parts := strings.Split(rest, "\x00")
	if !ok || len(parts) != 3 || parts[0] == "" || parts[2] == "" {
		return ServiceInstanceEvent{}, fmt.Errorf("client: %q is not a service-instance event key", key)
	}
	out := ServiceInstanceEvent{Service: parts[0], Node: parts[1], ID: parts[2], Index: ev.GetKv().GetModifyIndex()}
	if ev.GetType() == lodestonepb.Event_PUT {
		out.Health = &lodestonepb.ServiceHealth{}
		if err := proto.Unmarshal(ev.GetKv().GetValue(), out.Health); err != nil {
			return ServiceInstanceEvent{}, fmt.Errorf("client: decode service-instance event %s/%s/%s: %w", parts[0], parts[1], parts[2], err)
		}
	}
	return out, nil
}

// WatchBuffer caps the events queued for the consumer (default
// DefaultWatchBuffer; n < 1 means the default). When the queue reaches n
// the client cancels the watch on its stream, so a slow consumer never
// holds up the other watches sharing it, and creates it again from the
// last queued index once Next has drained half of the queue. If the server
// no longer retains that index by then, the watch ends with ErrCompacted.
func WatchBuffer(n int) WatchOption { return func(s *watchSettings) { s.buffer = n } }

// WatchGiveUpAfter ends the watch with ErrUnavailable once no server has
// served the client's watch stream for d (counting from the Watch call or
// from the last stream break). Default (0): retry until the watch's ctx
// ends or it is closed.
func WatchGiveUpAfter(d time.Duration) WatchOption { return func(s *watchSettings) { s.giveUp = d } }

// WatchBatch is what Watch.Next returns: the events of one or more whole
// indices, in index order, or a progress notification (no events).
type WatchBatch struct {
	// Index: every matching event with index ≤ Index has now been
	// returned. It never decreases from one batch to the next. Resume a
	// later watch with FromIndex(Index).
	Index uint64
	// Events are the matching events in index order (within an index, in
	// the order the server applied them). The caller owns them. An event's
	// index is Kv.ModifyIndex (for a delete: the index of the delete).
	Events []*lodestonepb.Event
}

// IsProgress reports whether b is a progress notification.
func (b WatchBatch) IsProgress() bool { return len(b.Events) == 0 }

// Watch is one watch on a key or prefix; see the package doc ("Watches")
// for its delivery contract. Next may be called from one goroutine at a
// time; Close and Index from any.
type Watch struct {
	mux  *watchMux
	key  string
	set  watchSettings
	born time.Time

	mu     sync.Mutex
	queue  []WatchBatch
	queued int    // events in queue
	last   uint64 // resume point: every matching event ≤ last is queued or was returned
	index  uint64 // Index of the last batch Next returned (or the start index)
	paused bool   // the queue filled up: the stream stopped feeding this watch
	// stale: the watch paused on the current stream, so deliver drops
	// what that stream sends from then on, even after Next resumed the
	// watch; the stream's copy must be canceled and the watch created
	// again from last. Read and cleared by sync (streamStart), which does
	// that.
	stale bool
	err   error // terminal error, returned once the queue is drained
	done  error // set by Close, the ctx or Client.Close: Next returns it at once
	wake  chan struct{}
	stop  func() bool // unregisters the ctx hook

	registered bool // added to mux; set before any other goroutine sees w
}

// Watch starts watching key (with WatchPrefix: every key under it) and
// returns at once; read what happens with Next. The watch lives until ctx
// ends, Close is called, the client is closed, or it ends with a terminal
// error (ErrCompacted, ErrWatchCanceled, ErrInvalidArgument, or
// ErrUnavailable under WatchGiveUpAfter). Every watch of a Client shares
// one gRPC stream to one server, which the client moves to another server
// when it breaks; each watch then resumes from the last index it queued,
// with no gap and no duplicate.
func (c *Client) Watch(ctx context.Context, key string, opts ...WatchOption) *Watch {
	w := &Watch{mux: c.watchMux(), key: key, born: time.Now(), wake: make(chan struct{}, 1)}
	for _, o := range opts {
		o(&w.set)
	}
	if w.set.buffer < 1 {
		w.set.buffer = DefaultWatchBuffer
	}
	w.last, w.index = w.set.start, w.set.start
	if w.set.catalog {
		w.set.prefix = true
	}
	if key == "" && !w.set.prefix {
		w.err = &Error{Op: w.op(), Code: codes.InvalidArgument, Message: "an empty key needs WatchPrefix"}
		return w
	}
	if err := ctx.Err(); err != nil {
		w.done = err
		return w
	}
	w.registered = true
	w.mu.Lock()
	w.stop = context.AfterFunc(ctx, func() { w.finish(ctx.Err()) })
	w.mu.Unlock()
	if !w.mux.add(w) {
		w.Close()
	}
	return w
}

func (w *Watch) op() string {
	if w.set.catalog {
		return fmt.Sprintf("watch catalog service %q", w.key)
	}
	if w.set.prefix {
		return fmt.Sprintf("watch prefix %q", w.key)
	}
	return fmt.Sprintf("watch %q", w.key)
}

// Next returns the next batch, waiting until there is one, the watch ends,
// or ctx ends (then it returns ctx.Err() and the watch goes on). After the
// watch ended it returns its terminal error, first draining the batches
// queued before a server-side end (ErrCompacted, ErrWatchCanceled): those
// were delivered before it. After Close or the watch's ctx ended it returns
// at once an error matching ErrClosed or the ctx's error.
func (w *Watch) Next(ctx context.Context) (WatchBatch, error) {
	for {
		w.mu.Lock()
		if w.done != nil {
			err := w.done
			w.mu.Unlock()
			return WatchBatch{}, err
		}
		if len(w.queue) > 0 {
			b := w.queue[0]
			w.queue[0] = WatchBatch{}
			w.queue = w.queue[1:]
			w.queued -= len(b.Events)
			w.index = b.Index
			resume := w.paused && w.err == nil && w.queued <= w.set.buffer/2
			if resume {
				w.paused = false
			}
			w.mu.Unlock()
			if resume {
				w.mux.requeue(w)
			}
			return b, nil
		}
		if w.err != nil {
			err := w.err
			w.mu.Unlock()
			return WatchBatch{}, err
		}
		wake := w.wake
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return WatchBatch{}, ctx.Err()
		case <-wake:
		}
	}
}

// Index returns the Index of the last batch Next returned (before the
// first: the FromIndex given, or 0). A caller that stops watching and wants
// to continue later passes it to FromIndex.
func (w *Watch) Index() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.index
}

// Close ends the watch: the server is told to cancel it, and Next returns
// an error matching ErrClosed. Close is idempotent and never blocks on the
// network.
func (w *Watch) Close() {
	w.finish(fmt.Errorf("client: watch %q: %w", w.key, ErrClosed))
}

// finish ends the watch from the caller's side with err.
func (w *Watch) finish(err error) {
	w.mu.Lock()
	if w.done != nil {
		w.mu.Unlock()
		return
	}
	w.done = err
	w.queue, w.queued = nil, 0
	stop := w.stop
	w.mu.Unlock()
	if stop != nil {
		stop()
	}
	signal(w.wake)
	if w.registered {
		w.mux.requeue(w)
	}
}

// fail ends the watch from the server's side; queued batches still go out.
func (w *Watch) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	signal(w.wake)
}

// live reports whether the watch still wants a stream.
func (w *Watch) live() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.done == nil && w.err == nil
}

// startIndex returns where a (re)created watch starts and whether it may
// be created now (false while paused or ended).
func (w *Watch) startIndex() (uint64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last, w.done == nil && w.err == nil && !w.paused
}

// streamStart is startIndex for sync: it also reports, and clears,
// whether the watch's copy on the current stream went stale (it paused and
// dropped responses since) and must be created again from start.
func (w *Watch) streamStart() (start uint64, ok, stale bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	stale, w.stale = w.stale, false
	return w.last, w.done == nil && w.err == nil && !w.paused, stale
}

// deliver queues what resp carries for the watch, dropping events at or
// below the resume point (a server replaying from an older index must not
// produce duplicates). It reports whether the queue is now full, in which
// case the caller must stop the watch on its stream. A paused watch, and a
// stale one, drops resp (its events are above last, so the watch's next
// create replays them) and stays stale.
func (w *Watch) deliver(resp *lodestonepb.WatchResponse) (full bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done != nil || w.err != nil {
		return false
	}
	if w.paused || w.stale {
		// Paused, or resumed by Next but still on the stream that paused
		// it: what that stream sends now follows a gap.
		w.stale = true
		return false
	}
	var evs []*lodestonepb.Event
	top := w.last
	for i, ev := range resp.GetEvents() {
		idx := ev.GetKv().GetModifyIndex()
		if idx <= w.last {
			continue
		}
		if evs == nil {
			evs = resp.Events[i:i:len(resp.Events)]
		}
		evs = append(evs, ev) // in place: keeps order, drops the duplicates
		top = max(top, idx)
	}
	top = max(top, resp.GetIndex())
	if top <= w.last {
		return false
	}
	switch n := len(w.queue); {
	case len(evs) > 0:
		w.queue = append(w.queue, WatchBatch{Index: top, Events: evs})
		w.queued += len(evs)
	case n > 0:
		// No event between the last queued batch and top: once the
		// consumer has that batch it has everything up to top.
		w.queue[n-1].Index = top
	case w.set.progress:
		w.queue = append(w.queue, WatchBatch{Index: top})
	default:
		w.index = top // nothing pending: the caller is up to date at top
	}
	w.last = top
	signal(w.wake)
	if w.queued >= w.set.buffer {
		// NB: stale as well as paused. Next may resume the watch before
		// sync sees the pause; what the stream sent in between was
		// dropped, so the stream's copy must go even then, and what it
		// sends until it is gone must be dropped too. Without stale the
		// watch stayed on the stream and took the next response after
		// the gap (TestWatchSlowConsumerDoesNotBlockOthers hung waiting
		// for the missing events).
		w.paused, w.stale = true, true
		return true
	}
	return false
}

// advance moves the resume point to idx without events (a resync).
func (w *Watch) advance(idx uint64) {
	w.deliver(&lodestonepb.WatchResponse{Index: idx})
}

// signal does a non-blocking send on a cap-1 channel.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// ---- the multiplexer ----

// watchMux carries every Watch of a Client over one gRPC Watch stream at a
// time. Its one goroutine (run), started by the first Watch and stopped by
// Client.Close, owns the stream: it picks an endpoint, sends creates and
// cancels, dispatches responses, and on a break moves to the next endpoint
// and recreates every live watch from its resume point. A second goroutine
// per stream only calls Recv.
type watchMux struct {
	c *Client

	ctx    context.Context // canceled by shutdown
	cancel context.CancelFunc
	kick   chan struct{} // cap 1: pending has work
	done   chan struct{} // closed when run returns

	spread int // where followerPlan starts; random per client

	mu      sync.Mutex
	closed  bool
	started bool
	watches map[*Watch]struct{}
	pending []*Watch // need a create or cancel on the current stream
}

func newWatchMux(c *Client) *watchMux {
	ctx, cancel := context.WithCancel(context.Background())
	return &watchMux{c: c, ctx: ctx, cancel: cancel, kick: make(chan struct{}, 1),
		done: make(chan struct{}), watches: map[*Watch]struct{}{}, spread: rand.IntN(1 << 16)}
}

// plan returns the endpoints a new stream tries, in order
// (Config.WatchFrom). For followers it first refreshes the membership,
// within DialTimeout; without an answer it plans with what it knows.
func (m *watchMux) plan() []string {
	if m.c.cfg.WatchFrom == WatchFromLeader {
		m.c.mu.Lock()
		defer m.c.mu.Unlock()
		return m.c.book.plan()
	}
	ctx, cancel := context.WithTimeout(m.ctx, m.c.cfg.DialTimeout)
	_, err := m.c.Members(ctx)
	cancel()
	if err != nil && m.ctx.Err() == nil {
		m.c.log.Debug("client: watch placement: membership not refreshed; planning with the members known", "err", err)
	}
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	return m.c.book.followerPlan(m.spread)
}

// watchMux returns the client's multiplexer, creating it on first use.
func (c *Client) watchMux() *watchMux {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.wmux == nil {
		c.wmux = newWatchMux(c)
	}
	return c.wmux
}

// add registers w and starts run if needed; false after shutdown.
func (m *watchMux) add(w *Watch) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.watches[w] = struct{}{}
	m.pending = append(m.pending, w)
	if !m.started {
		m.started = true
		go m.run()
	}
	signal(m.kick)
	return true
}

// requeue asks run to look at w again (closed, unpaused, to recreate).
func (m *watchMux) requeue(w *Watch) {
	m.mu.Lock()
	if !m.closed {
		m.pending = append(m.pending, w)
	}
	m.mu.Unlock()
	signal(m.kick)
}

// shutdown stops run, waits for it, and ends every watch with ErrClosed.
func (m *watchMux) shutdown() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	started := m.started
	ws := m.watches
	m.watches, m.pending = nil, nil
	m.mu.Unlock()
	m.cancel()
	if started {
		<-m.done
	}
	for w := range ws {
		w.finish(fmt.Errorf("client: watch %q: %w", w.key, ErrClosed))
	}
}

// errSessionIdle ends a stream that carries no watch any more.
var errSessionIdle = errors.New("client: watch stream idle")

// errStalled ends a stream that stayed silent and whose server did not
// answer a probe.
var errStalled = errors.New("client: watch stream stalled: its server did not answer a probe")

// run keeps a stream up while there are live watches, until shutdown.
func (m *watchMux) run() {
	defer close(m.done)
	var (
		plan      []string
		round     int // rounds (every endpoint once) without a serving stream
		downSince = time.Now()
		lastEP    string
		lastErr   error
	)
	for {
		if !m.waitWork() {
			return
		}
		if len(plan) == 0 {
			if round > 0 {
				d := backoff(round, m.c.cfg.BackoffBase, m.c.cfg.BackoffMax, rand.Int64N)
				if hint := hintDelay(retryHint(lastErr), rand.Int64N); hint > d {
					d = hint // admission control asked for it
				}
				if err := sleep(m.ctx, d); err != nil {
					return
				}
			}
			round++
			plan = m.plan()
		}
		ep := plan[0]
		plan = plan[1:]
		served, err := m.session(ep)
		if m.ctx.Err() != nil || errors.Is(err, ErrClosed) {
			return
		}
		if served {
			round = 0
			downSince = time.Now()
		}
		if errors.Is(err, errSessionIdle) {
			plan = nil
			continue
		}
		if st, ok := status.FromError(err); ok && terminalStreamCode(st.Code()) {
			m.failAll(&Error{Op: "watch", Endpoint: ep, Code: st.Code(), Message: st.Message(), FromServer: true, cause: err})
			plan = nil
			continue
		}
		lastEP, lastErr = ep, err
		m.c.log.Debug("client: watch stream ended; resuming on the next endpoint",
			"endpoint", ep, "served", served, "err", err)
		m.c.mu.Lock()
		m.c.book.failed(ep)
		m.c.mu.Unlock()
		m.expire(downSince, lastEP, lastErr)
	}
}

// terminalStreamCode reports whether a stream error code means every
// endpoint would refuse the watches the same way.
func terminalStreamCode(c codes.Code) bool {
	switch c {
	case codes.Unimplemented, codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated:
		return true
	}
	return false
}

// waitWork prunes ended watches and waits until a live one exists; false
// on shutdown.
func (m *watchMux) waitWork() bool {
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return false
		}
		for w := range m.watches {
			if !w.live() {
				delete(m.watches, w)
			}
		}
		n := len(m.watches)
		m.pending = m.pending[:0]
		m.mu.Unlock()
		if n > 0 {
			return true
		}
		select {
		case <-m.ctx.Done():
			return false
		case <-m.kick:
		}
	}
}

// failAll ends every live watch with err.
func (m *watchMux) failAll(err *Error) {
	m.mu.Lock()
	ws := make([]*Watch, 0, len(m.watches))
	for w := range m.watches {
		ws = append(ws, w)
	}
	m.mu.Unlock()
	for _, w := range ws {
		e := *err
		e.Op = w.op()
		w.fail(&e)
	}
}

// expire ends the watches whose WatchGiveUpAfter has passed without a
// serving stream.
func (m *watchMux) expire(downSince time.Time, ep string, last error) {
	now := time.Now()
	m.mu.Lock()
	var ws []*Watch
	for w := range m.watches {
		if w.set.giveUp > 0 && now.Sub(maxTime(downSince, w.born)) >= w.set.giveUp {
			ws = append(ws, w)
		}
	}
	m.mu.Unlock()
	for _, w := range ws {
		st := status.Convert(last)
		w.fail(&Error{Op: w.op(), Endpoint: ep, Code: codes.Unavailable,
			Message: fmt.Sprintf("no server served the watch for %v (last: %s)", w.set.giveUp, st.Message()), cause: last})
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// session is one Watch stream; it lives inside one call of
// watchMux.session.
type session struct {
	ep      string
	stream  lodestonepb.Watch_WatchClient
	nextID  int64
	byID    map[int64]*Watch
	ids     map[*Watch]int64
	created map[int64]bool // the server acknowledged the create
	served  bool           // a response arrived

	// inbox: the receiving goroutine appends, run takes. Unbounded on
	// purpose: the receiver must never wait for run, which may itself be
	// blocked sending to a server that is blocked sending to us.
	inMu  sync.Mutex
	in    []*lodestonepb.WatchResponse
	inErr error
	inSig chan struct{}
}

// session runs one stream to ep until it fails, goes idle, or shutdown.
// served reports whether any response arrived on it.
func (m *watchMux) session(ep string) (served bool, err error) {
	cc, err := m.c.conn(ep)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithCancel(m.ctx)
	stream, err := lodestonepb.NewWatchClient(cc).Watch(ctx)
	if err != nil {
		cancel()
		return false, err
	}
	s := &session{ep: ep, stream: stream, byID: map[int64]*Watch{}, ids: map[*Watch]int64{}, created: map[int64]bool{}, inSig: make(chan struct{}, 1)}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			resp, err := stream.Recv()
			s.inMu.Lock()
			if err != nil {
				s.inErr = err
			} else {
				s.in = append(s.in, resp)
			}
			s.inMu.Unlock()
			signal(s.inSig)
			if err != nil {
				return
			}
		}
	})
	defer func() {
		cancel()
		wg.Wait()
	}()

	// Every live watch is (re)created on the new stream.
	m.mu.Lock()
	m.pending = m.pending[:0]
	for w := range m.watches {
		m.pending = append(m.pending, w)
	}
	m.mu.Unlock()

	// Liveness: a stream silent for an interval gets a probe, a Status
	// call on the same connection. No answer within an interval means the
	// server or the path to it is gone (no TCP reset came); an answer
	// naming no leader means the member is cut off from the cluster and
	// would hold the watches back. Either way the watches move on.
	interval := m.c.cfg.WatchProgressInterval
	tick := time.NewTicker(interval)
	defer tick.Stop()
	lastRecv := time.Now()
	probing := false
	probed := make(chan error, 1)
	for {
		if err := m.sync(s); err != nil {
			return s.served, err
		}
		select {
		case <-m.ctx.Done():
			return s.served, m.ctx.Err()
		case <-m.kick:
		case <-s.inSig:
			s.inMu.Lock()
			in, inErr := s.in, s.inErr
			s.in = nil
			s.inMu.Unlock()
			if len(in) > 0 {
				s.served = true
				lastRecv = time.Now()
			}
			for _, resp := range in {
				if err := m.handle(s, resp); err != nil {
					return s.served, err
				}
			}
			if inErr != nil {
				if errors.Is(inErr, io.EOF) {
					inErr = status.Error(codes.Unavailable, "watch stream closed by the server")
				}
				return s.served, inErr
			}
		case <-tick.C:
			if len(s.byID) == 0 || probing || time.Since(lastRecv) < interval {
				break
			}
			probing = true
			wg.Go(func() { probed <- probe(ctx, cc, interval) })
		case err := <-probed:
			probing = false
			if err != nil {
				return s.served, err
			}
			lastRecv = time.Now()
		}
	}
}

// probe asks the server behind cc for its status and reports why a watch
// stream to it should be abandoned, or nil.
func probe(ctx context.Context, cc grpc.ClientConnInterface, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	st, err := lodestonepb.NewClusterClient(cc).Status(ctx, &lodestonepb.StatusRequest{})
	switch code := status.Code(err); {
	case err == nil && st.GetLeaderId() == 0:
		return status.Error(codes.Unavailable, "watch stream's server knows no leader; moving to another member")
	case code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Canceled:
		return status.Errorf(codes.Unavailable, "%v: %v", errStalled, err)
	}
	return nil // answered (even an error status proves the server is there)
}

// sync sends the creates and cancels that pending asks for.
func (m *watchMux) sync(s *session) error {
	m.mu.Lock()
	todo := m.pending
	m.pending = nil
	m.mu.Unlock()
	for _, w := range todo {
		start, ok, stale := w.streamStart()
		id, onStream := s.ids[w]
		if onStream && (!ok || stale) {
			// Ended, paused, or paused and resumed already: in every case
			// the stream's copy stops here; a live watch is created
			// again below from its resume point.
			delete(s.ids, w)
			delete(s.byID, id)
			delete(s.created, id)
			if err := s.stream.Send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Cancel{Cancel: &lodestonepb.WatchCancel{WatchId: id}}}); err != nil {
				return err
			}
			onStream = false
		}
		if ok && !onStream {
			s.nextID++
			id = s.nextID
			s.ids[w], s.byID[id] = id, w
			if err := s.stream.Send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Create{Create: &lodestonepb.WatchCreate{
				WatchId: id, Key: []byte(w.key), Prefix: w.set.prefix, StartIndex: start,
				PrevKv: w.set.prevKV, NoPut: w.set.noPut, NoDelete: w.set.noDelete, Target: w.set.target(),
				Grouped: true,
			}}}); err != nil {
				return err
			}
		}
		if !w.live() {
			m.mu.Lock()
			delete(m.watches, w)
			m.mu.Unlock()
		}
	}
	m.mu.Lock()
	idle := len(m.watches) == 0 && len(m.pending) == 0
	m.mu.Unlock()
	if idle && len(s.ids) == 0 {
		return errSessionIdle
	}
	return nil
}

// handle applies one response. A non-nil error ends the stream.
func (m *watchMux) handle(s *session, resp *lodestonepb.WatchResponse) error {
	if gs := resp.GetGroups(); len(gs) > 0 {
		// Each group reads as a response of its own with only watch_id,
		// index and events (WatchResponse.groups).
		for _, g := range gs {
			if err := m.handle(s, &lodestonepb.WatchResponse{WatchId: g.GetWatchId(), Index: g.GetIndex(), Events: g.GetEvents()}); err != nil {
				return err
			}
		}
		return nil
	}
	id := resp.GetWatchId()
	w := s.byID[id]
	if w == nil {
		return nil // canceled by us; late responses are dropped
	}
	if resp.GetCreated() {
		s.created[id] = true
		if resp.GetHeader() != nil {
			m.c.observe(s.ep, resp.GetHeader())
		}
		if len(resp.GetEvents()) == 0 {
			// NB: a created response's index is taken only by a watch with
			// no position yet ("from now"): for a watch created with a
			// start index the replay of (start, now] follows, and moving
			// the resume point past it would drop that replay as
			// duplicates.
			if start, _ := w.startIndex(); start != 0 {
				return nil
			}
		}
	}
	if resp.GetCanceled() {
		created := s.created[id]
		delete(s.byID, id)
		delete(s.ids, w)
		delete(s.created, id)
		switch {
		case resp.GetCompactedIndex() > 0:
			start, _ := w.startIndex()
			w.fail(&CompactedError{Key: w.key, Requested: start, CompactedIndex: resp.GetCompactedIndex()})
		case resp.GetResyncIndex() > 0:
			// Every event up to the resync index was delivered (they
			// preceded this response): go on from there.
			w.advance(resp.GetResyncIndex())
			m.c.log.Debug("client: watch resyncs", "key", w.key, "index", resp.GetResyncIndex(), "reason", resp.GetCancelReason())
			m.requeue(w)
		case !created:
			// The server refused the create: every server would.
			w.fail(&WatchCanceledError{Key: w.key, Reason: resp.GetCancelReason()})
		default:
			// A running watch ended without a resume index (e.g. the
			// server is shutting down): resume it, and every other watch,
			// on another member.
			m.requeue(w)
			return status.Errorf(codes.Unavailable, "server ended watch %q: %s", w.key, resp.GetCancelReason())
		}
		return nil
	}
	if w.deliver(resp) {
		m.requeue(w) // full: cancel it on the stream until Next drains it
	}
	return nil
}
