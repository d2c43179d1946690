// Package httppark holds blocking HTTP/1.1 requests (Consul's blocking
// queries) while they wait, without a goroutine, a request or net/http's
// connection state per request.
//
// Waiting in its handler, a query holds two goroutines (the handler and
// net/http's background reader of its connection) and the connection's
// buffers: about 14 KB of heap and 12 KB of stack. The garbage collector
// scans those stacks and pointers in every cycle, and on a busy core that
// work stalls the writes the same server orders. A parked query is a hub
// watcher, a place in the Lot's deadline heap and its connection: about
// 1.4 KB in 18 heap objects, the connection's own included (it keeps the
// request's strings, not its Request, URL or Header, and only the headers
// Config.ResumeHeaders names), and no goroutine; with 2,000 of them a GC
// cycle costs a third of the CPU (BenchmarkConsulBlockingMemory in
// server/, both ways in one run).
//
// How it works:
//
//   - Park hijacks the connection of a request that must wait and
//     subscribes to the hub with the Lot's shared watch.Ready list. The
//     handler returns at once.
//   - One goroutine serves the Ready list: a watcher with events asks its
//     Wait.Changed, and a request whose answer changed is resumed. It
//     also keeps one alarm, for the earliest deadline of the parked
//     requests (deadline.go), and answers those whose time is up.
//   - Resuming runs the server's handler again on a new goroutine (or the
//     handler the Wait names, sparing the routing), with WaitOver(ctx)
//     true so it answers instead of waiting, and writes the answer on the
//     connection in one piece.
//   - That goroutine then reads the connection's next request (serve.go):
//     a blocking query is run there and usually parks again; anything
//     else, or a client quiet for Config.NextRequestWait, is handed back
//     to the http.Server through the listener Wrap returned.
//   - A sweep notices clients that went away while parked (a peek at the
//     socket) and frees their state, as net/http's background reader would.
//     It peeks at a few connections at a time, spread over the interval,
//     so that 10,000 parked queries cost no burst of work (sweep.go).
//
// Only what net/http would serve identically is parked: an HTTP/1.x GET
// without a body. Anything else waits in its handler as before.
package httppark

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lodestone-kv/lodestone/internal/handback"
	"github.com/lodestone-kv/lodestone/watch"
)

// Config sets up a Lot.
type Config struct {
	// Hub is what parked requests subscribe to.
	Hub *watch.Hub
	// Handler serves the requests the Lot reads itself: the blocking GETs
	// that follow an answered one on its connection (the server's whole
	// handler, admission included).
	Handler http.Handler
	// Resume serves a request once its wait is over (the server's
	// handler after admission: the request was admitted once). It sees
	// the request's method, URL, protocol, Host, RemoteAddr and the
	// headers ResumeHeaders names, and nothing else of it.
	Resume http.Handler
	// ResumeHeaders are the request headers a parked request keeps for
	// Resume. The rest, a header map of about 700 bytes with what the mux
	// attached in routing, would sit in the heap for the whole wait and
	// be marked by every GC cycle.
	ResumeHeaders []string
	// NextRequestWait is how long an answered connection is read for its
	// client's next request before it goes back to the http.Server. Zero
	// means 1s.
	NextRequestWait time.Duration
	// Context is the base of every resumed request's context; cancelling
	// it does not end parked requests (Close does).
	Context context.Context
	// SweepInterval is how long a sweep takes to peek at every parked
	// connection once, for clients that went away; such a client is let go
	// within two intervals. Zero means 5s.
	SweepInterval time.Duration
	// WriteTimeout bounds writing one response. Zero means 10s.
	WriteTimeout time.Duration
	// Logger receives connection errors; nil discards.
	Logger *slog.Logger
}

// Wait is what a parked request waits for.
type Wait struct {
	// Watch selects the events that may change the answer. Its Ready and
	// NoProgress fields are set by Park.
	Watch watch.Request
	// Changed reports whether the answer changed; it is asked after
	// events and must be cheap (see watch.Hub.WaitFor).
	Changed func() bool
	// Deadline is when the request is answered regardless.
	Deadline time.Time
	// Done, if set, is called once when the wait ends, however it ends.
	Done func()
	// Resume, if set, serves the request once its wait is over instead of
	// Config.Resume: a handler that knows it is the one Config.Resume
	// would route the request to spares it the routing, the second time
	// the same URL is routed.
	Resume http.Handler
}

// Lot is the set of parked requests of one HTTP listener.
type Lot struct {
	cfg    Config
	logger *slog.Logger
	ready  *watch.Ready
	fresh  chan *parked // just parked, for serveReady's first look

	mu      sync.Mutex
	byWatch map[*watch.Watcher]*parked
	// order holds the same requests as byWatch, p at order[p.slot], for
	// the sweep to go through a chunk at a time (cursor is where the
	// current round is).
	order  []*parked
	cursor int
	// deadlines orders the parked requests by Wait.Deadline, for the one
	// alarm serveReady keeps (a timer per request was two more objects
	// per request for the GC to mark).
	deadlines deadlineHeap
	closed    bool
	listener  *handback.Listener

	resumed, gone, wakeups, sweeps atomic.Uint64
	served, handedBack, workers    atomic.Uint64

	// serving are the connections serveConn reads now: Close interrupts them.
	serving map[net.Conn]struct{}
	readers sync.Pool // *bufio.Reader for serveConn
	bufs    sync.Pool // *bytes.Buffer for responses

	// work hands a resumed request to an idle worker (see dispatch).
	work chan *parked
	idle atomic.Int32

	pause func(time.Duration) bool // before each sweep chunk: sleep, false once the Lot closes

	stop chan struct{}
	wg   sync.WaitGroup
}

type parked struct {
	at       time.Time // when Park took it
	w        *watch.Watcher
	req      heldRequest
	wait     Wait
	conn     net.Conn
	leftover []byte // what the client sent after the request
	slot     int    // index in Lot.order while parked
	due      int    // index in Lot.deadlines while parked
}

// New starts a Lot's goroutines; Close stops them.
func New(cfg Config) *Lot {
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = 5 * time.Second
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	if cfg.NextRequestWait <= 0 {
		cfg.NextRequestWait = time.Second
	}
	if cfg.Context == nil {
		cfg.Context = context.Background()
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	l := &Lot{cfg: cfg, logger: logger, ready: watch.NewReady(),
		byWatch: make(map[*watch.Watcher]*parked), serving: make(map[net.Conn]struct{}),
		fresh: make(chan *parked, 1024), work: make(chan *parked), stop: make(chan struct{})}
	l.pause = l.sleep
	l.readers.New = func() any { return bufio.NewReaderSize(nil, headBytes) }
	l.bufs.New = func() any { return new(bytes.Buffer) }
	l.wg.Add(2)
	go l.serveReady()
	go l.sweepLoop()
	return l
}

// parkedAtKey is the context key of a resumed request's park time.
type parkedAtKey struct{}

// WaitOver reports whether ctx is a resumed request's: its wait is over
// and the handler must answer now.
func WaitOver(ctx context.Context) bool {
	_, ok := ParkedAt(ctx)
	return ok
}

// ParkedAt returns when a resumed request was parked, if ctx is one's.
// Its read is taken to begin then: the answer owes every write
// acknowledged before that moment, and no later one.
func ParkedAt(ctx context.Context) (time.Time, bool) {
	// NB: a pointer into the parked request: boxing a time.Time in the
	// context was one more allocation per answer.
	at, ok := ctx.Value(parkedAtKey{}).(*time.Time)
	if !ok {
		return time.Time{}, false
	}
	return *at, true
}

// Parkable reports whether Park could take r: an HTTP/1.x GET without a
// body, on a Lot whose listener serves it. It does not look at w.
func (l *Lot) Parkable(r *http.Request) bool {
	if l == nil || r.ProtoMajor != 1 || r.Method != http.MethodGet ||
		r.ContentLength != 0 || len(r.TransferEncoding) > 0 || r.Header.Get("Expect") != "" {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.closed && l.listener != nil
}

// Park takes over r until wt is over. It returns false, with nothing
// changed, when r cannot be parked (see Parkable; or w cannot be
// hijacked): the caller then waits itself. When it returns true the
// handler must return without touching w. An error is the hub's refusal
// of wt.Watch (a watch.ErrBadRequest, a *watch.CompactedError).
func (l *Lot) Park(w http.ResponseWriter, r *http.Request, wt Wait) (bool, error) {
	hj, ok := w.(http.Hijacker)
	if !ok || !l.Parkable(r) {
		return false, nil
	}
	at := time.Now()
	wt.Watch.Ready = l.ready
	wt.Watch.NoProgress = true
	watcher, err := l.cfg.Hub.Watch(context.Background(), wt.Watch)
	if err != nil {
		return false, err
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		watcher.Close()
		return false, nil
	}
	p := &parked{at: at, w: watcher, req: l.keep(r), wait: wt, conn: conn}
	if n := rw.Reader.Buffered(); n > 0 {
		b, _ := rw.Reader.Peek(n) // NB: Peek of what is buffered cannot fail
		p.leftover = bytes.Clone(b)
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		watcher.Close()
		conn.Close()
		if wt.Done != nil {
			wt.Done()
		}
		return true, nil
	}
	l.addLocked(p)
	l.mu.Unlock()
	// An event published since the watcher started may have been taken
	// off the Ready list before p was registered, and would not be listed
	// again: serveReady looks at every new watcher once, and arms its
	// deadline.
	select {
	case l.fresh <- p:
	case <-l.stop:
	}
	return true, nil
}

// addLocked registers p; the caller holds mu.
func (l *Lot) addLocked(p *parked) {
	l.byWatch[p.w] = p
	p.slot = len(l.order)
	l.order = append(l.order, p)
	l.deadlines.push(p)
}

// heldRequest is what a parked request keeps of its http.Request for
// Resume (see Config.Resume): strings, which share the memory of the
// request line and headers, and no Request, URL or Header of its own.
// Every object a parked request holds is one more for each GC cycle to
// mark, 10,000 times over; the request is rebuilt when it resumes.
type heldRequest struct {
	method, uri, proto, host string
	major, minor             int
	close                    bool
	header                   http.Header // the ResumeHeaders it had; nil if none
}

func (l *Lot) keep(r *http.Request) heldRequest {
	k := heldRequest{method: r.Method, uri: r.RequestURI, proto: r.Proto, host: r.Host,
		major: r.ProtoMajor, minor: r.ProtoMinor, close: r.Close}
	for _, name := range l.cfg.ResumeHeaders {
		if vs := r.Header.Values(name); len(vs) > 0 {
			if k.header == nil {
				k.header = make(http.Header, len(l.cfg.ResumeHeaders))
			}
			k.header[textproto.CanonicalMIMEHeaderKey(name)] = slices.Clone(vs)
		}
	}
	return k
}

// request rebuilds the held request, with ctx, from remote (the
// connection's address: kept in the request, it was one more string per
// parked request). Its URI parsed once already, as the request it came
// from.
func (k *heldRequest) request(ctx context.Context, remote string) (*http.Request, error) {
	u, err := url.ParseRequestURI(k.uri)
	if err != nil {
		return nil, fmt.Errorf("parked request %q: %w", k.uri, err)
	}
	h := k.header
	if h == nil {
		h = make(http.Header)
	}
	// NB: a value, not &http.Request: WithContext copies it into the one
	// Request this allocates.
	r := http.Request{Method: k.method, URL: u, Proto: k.proto, ProtoMajor: k.major, ProtoMinor: k.minor,
		Header: h, Body: http.NoBody, Host: k.host, RemoteAddr: remote, RequestURI: k.uri, Close: k.close}
	return r.WithContext(ctx), nil
}

// parkedNow is a snapshot of the parked requests, to go through without
// holding mu.
func (l *Lot) parkedNow() []*parked {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.order)
}

// Len is how many requests are parked.
func (l *Lot) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.byWatch)
}

// Stats counts what a Lot did since New.
type Stats struct {
	Parked  int    // parked now
	Resumed uint64 // answered
	Gone    uint64 // dropped because the client hung up
	Wakeups uint64 // Changed asked after events, whether or not it found a change
	Sweeps  uint64 // sweeps for hung-up clients done
	// Served counts the requests the Lot read itself on answered
	// connections; HandedBack, the connections it gave back to the
	// http.Server (a request it does not serve, or a quiet client).
	Served, HandedBack uint64
	// Workers counts the goroutines started to resume requests; once
	// requests come steadily, idle workers take them and it stays put.
	// IdleWorkers wait for the next one now.
	Workers     uint64
	IdleWorkers int
}

// Stats returns the Lot's counters.
func (l *Lot) Stats() Stats {
	return Stats{Parked: l.Len(), Resumed: l.resumed.Load(), Gone: l.gone.Load(),
		Wakeups: l.wakeups.Load(), Sweeps: l.sweeps.Load(), Served: l.served.Load(), HandedBack: l.handedBack.Load(),
		Workers: l.workers.Load(), IdleWorkers: int(l.idle.Load())}
}

// serveReady asks Changed for every parked request whose watcher has
// events, and resumes those that changed.
func (l *Lot) serveReady() {
	defer l.wg.Done()
	done, cancel := context.WithCancel(context.Background())
	cancel() // Next with a done context polls
	alarm := time.NewTimer(time.Hour)
	defer alarm.Stop()
	var armed time.Time // the deadline alarm is set for; zero: none
	for {
		select {
		case <-l.stop:
			return
		case p := <-l.fresh:
			l.check(done, p)
			armed = l.arm(alarm, armed)
		case <-alarm.C:
			armed = time.Time{}
			l.expire(time.Now())
			armed = l.arm(alarm, armed)
		case <-l.ready.C():
			// The write that woke these requests was applied a moment
			// ago, and the response to it and the Raft messages it led
			// to are ready to run too. Going behind them keeps the answers'
			// handlers and system calls off the write path: on a leader
			// answering 1,000 blocking queries a second on one processor,
			// this took the write p99 from 1.96 to 1.71 ms.
			runtime.Gosched()
			for _, w := range l.ready.Take() {
				l.mu.Lock()
				p := l.byWatch[w]
				l.mu.Unlock()
				if p != nil { // NB: nil: finished meanwhile, or not yet registered (then fresh has it)
					l.check(done, p)
				}
			}
		}
	}
}

// arm sets alarm for the earliest deadline of the parked requests, if it
// is not set for it already, and returns what it is set for.
func (l *Lot) arm(alarm *time.Timer, armed time.Time) time.Time {
	l.mu.Lock()
	next, ok := l.deadlines.first()
	l.mu.Unlock()
	if !ok || next.Equal(armed) {
		return armed
	}
	alarm.Reset(time.Until(next))
	return next
}

// expire answers the requests whose deadline is not after now.
func (l *Lot) expire(now time.Time) {
	l.mu.Lock()
	var due []*parked
	for {
		p, ok := l.deadlines.popDue(now)
		if !ok {
			break
		}
		due = append(due, p)
	}
	l.mu.Unlock()
	for _, p := range due {
		l.finish(p)
	}
}

// check resumes p if its watcher has events and its answer changed.
func (l *Lot) check(done context.Context, p *parked) {
	l.mu.Lock()
	live := l.byWatch[p.w] == p
	l.mu.Unlock()
	if live && l.woken(done, p) {
		l.wakeups.Add(1)
		if p.wait.Changed() {
			l.finish(p)
		}
	}
}

// woken drains p's watcher and reports whether it had events. A
// subscription that ended (cut loose, compacted) cannot wake p again, so
// woken answers p itself and reports false.
func (l *Lot) woken(done context.Context, p *parked) bool {
	events := false
	for {
		b, err := p.w.Next(done)
		switch {
		case errors.Is(err, context.Canceled):
			return events
		case err != nil:
			// NB: a subscription that ended cannot wake the request
			// again; answering now, changed or not, is what Consul's
			// clients expect of a wait cut short.
			l.finish(p)
			return false
		case len(b.Events) > 0:
			events = true
		}
	}
}

// finish ends p's wait, at most once, and answers it on a worker.
func (l *Lot) finish(p *parked) {
	if l.unpark(p) {
		l.dispatch(p)
	}
}

// maxIdleWorkers bounds the workers kept waiting for the next resumed
// request; a burst beyond it gets new goroutines, which end after it.
const maxIdleWorkers = 64

// dispatch resumes p on an idle worker, or on a new one if none is idle.
// NB: a resumed request runs the whole handler (mux, admission, the
// Consul API, a store lookup, then the next request's park); on a new
// goroutine every time, its stack grew from the minimum by copying, 3-4%
// of a leader's CPU with 10k parked queries answering 2,000 times a
// second. A worker grows its stack once.
func (l *Lot) dispatch(p *parked) {
	select {
	case l.work <- p:
		return
	default:
	}
	l.workers.Add(1)
	l.wg.Add(1)
	go l.worker(p)
}

// worker resumes p, then the requests dispatch hands it while it is idle.
func (l *Lot) worker(p *parked) {
	defer l.wg.Done()
	for {
		l.resume(p)
		if l.idle.Add(1) > maxIdleWorkers {
			l.idle.Add(-1)
			return
		}
		select {
		case p = <-l.work:
			l.idle.Add(-1)
		case <-l.stop:
			return
		}
	}
}

// unpark removes p; only the first caller gets true and owns p.conn.
func (l *Lot) unpark(p *parked) bool {
	l.mu.Lock()
	if l.byWatch[p.w] != p {
		l.mu.Unlock()
		return false
	}
	delete(l.byWatch, p.w)
	l.deadlines.remove(p)
	last := l.order[len(l.order)-1]
	l.order[p.slot], last.slot = last, p.slot
	l.order[len(l.order)-1] = nil
	l.order = l.order[:len(l.order)-1]
	l.mu.Unlock()
	p.w.Close()
	if p.wait.Done != nil {
		p.wait.Done()
	}
	return true
}

// resume answers p, then serves its connection's next requests.
func (l *Lot) resume(p *parked) {
	l.resumed.Add(1)
	remote := p.conn.RemoteAddr().String()
	req, err := p.req.request(context.WithValue(l.cfg.Context, parkedAtKey{}, &p.at), remote)
	if err != nil {
		l.logger.Warn("dropping a parked request", "remote", remote, "err", err)
		p.conn.Close()
		return
	}
	h := l.cfg.Resume
	if p.wait.Resume != nil {
		h = p.wait.Resume
	}
	if keep, _ := l.answer(p.conn, nil, h, req); !keep {
		p.conn.Close()
		return
	}
	l.serveConn(p.conn, p.leftover, remote)
}

// answer runs h for req and writes its response on c. br, if set, is
// what the handler may hijack with c (to park again). keep reports
// whether c is still open for another request; parked, that h took c.
func (l *Lot) answer(c net.Conn, br *bufio.Reader, h http.Handler, req *http.Request) (keep, parked bool) {
	rec := &recorder{header: make(http.Header), conn: c, br: br}
	if !l.serve(h, rec, req) {
		return false, rec.hijacked
	}
	if rec.hijacked {
		return false, true
	}
	keep = req.ProtoAtLeast(1, 1) && !req.Close
	buf := l.bufs.Get().(*bytes.Buffer)
	defer l.bufs.Put(buf)
	buf.Reset()
	rec.writeTo(buf, req, keep)
	// NB: the deadline stays set after the write: only the Lot writes on
	// c, each answer with a deadline of its own, until handBack clears it
	// for the http.Server. Clearing it here was one more timer change per
	// answer.
	err := c.SetWriteDeadline(time.Now().Add(l.cfg.WriteTimeout))
	if err == nil {
		_, err = c.Write(buf.Bytes())
	}
	if err != nil {
		l.logger.Debug("parked request: writing the answer", "remote", c.RemoteAddr().String(), "err", err)
		return false, false
	}
	return keep, false
}

// serve runs h as net/http would: a panic is logged with its stack and
// costs only its connection (false), never the server.
func (l *Lot) serve(h http.Handler, w http.ResponseWriter, req *http.Request) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			ok = false
			if v != http.ErrAbortHandler {
				l.logger.Error("panic serving a request", "remote", req.RemoteAddr, "uri", req.RequestURI,
					"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			}
		}
	}()
	h.ServeHTTP(w, req)
	return true
}

// Close answers nothing more: it closes every parked connection (their
// clients retry, as after a server restart) and stops the Lot's
// goroutines. The http.Server is shut down first by its owner.
func (l *Lot) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	ln := l.listener
	l.mu.Unlock()
	for _, p := range l.parkedNow() {
		if l.unpark(p) {
			p.conn.Close()
		}
	}
	l.mu.Lock()
	for c := range l.serving {
		c.SetReadDeadline(time.Unix(1, 0)) // NB: wakes serveConn, which then finds the Lot closed
	}
	l.mu.Unlock()
	close(l.stop)
	var err error
	if ln != nil {
		err = ln.Close() // NB: usually the http.Server's Shutdown closed it already (nil)
	}
	l.wg.Wait()
	return err
}

// recorder is the ResponseWriter of the requests the Lot runs: the
// answer is small (one read's result) and is written in one piece. With
// a connection, the handler may hijack it, to park the request again.
type recorder struct {
	header   http.Header
	code     int
	body     bytes.Buffer
	conn     net.Conn
	br       *bufio.Reader
	hijacked bool
}

func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if r.br == nil || r.hijacked || r.code != 0 {
		return nil, nil, http.ErrNotSupported
	}
	r.hijacked = true
	// NB: Park reads only what the reader holds; the writer is a token.
	return r.conn, bufio.NewReadWriter(r.br, bufio.NewWriterSize(r.conn, 16)), nil
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(b)
}

// writeTo writes an HTTP/1.1 response as net/http would for a handler
// that wrote r's header and body: a Date, a Content-Type sniffed when the
// handler set none, and a Content-Length.
func (r *recorder) writeTo(w *bytes.Buffer, req *http.Request, keep bool) {
	code := r.code
	if code == 0 {
		code = http.StatusOK
	}
	h := r.header
	bodyAllowed := code >= 200 && code != http.StatusNoContent && code != http.StatusNotModified
	if bodyAllowed && r.body.Len() > 0 && h.Get("Content-Type") == "" {
		h.Set("Content-Type", http.DetectContentType(r.body.Bytes()))
	}
	// NB: the lot's own headers are appended, not Set: an answer a
	// second is worth not allocating for.
	h.Del("Content-Length")
	h.Del("Connection")
	w.WriteString("HTTP/1.1 ")
	w.Write(strconv.AppendInt(w.AvailableBuffer(), int64(code), 10))
	w.WriteByte(' ')
	w.WriteString(http.StatusText(code))
	w.WriteString("\r\n")
	if h.Get("Date") == "" {
		w.WriteString("Date: ")
		w.Write(time.Now().UTC().AppendFormat(w.AvailableBuffer(), http.TimeFormat))
		w.WriteString("\r\n")
	}
	if bodyAllowed {
		w.WriteString("Content-Length: ")
		w.Write(strconv.AppendInt(w.AvailableBuffer(), int64(r.body.Len()), 10))
		w.WriteString("\r\n")
	}
	if !keep {
		w.WriteString("Connection: close\r\n")
	}
	h.Write(w) // NB: a bytes.Buffer's Write does not fail
	w.WriteString("\r\n")
	if bodyAllowed && req.Method != http.MethodHead {
		w.Write(r.body.Bytes())
	}
}
