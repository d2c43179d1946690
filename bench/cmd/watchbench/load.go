package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
	"github.com/lodestone-kv/lodestone/internal/ctxtime"
)

// The workload, in numbers (docs/architecture.md, "A watch"; the service-
// discovery shape): keys under one prefix, written at a steady rate; exact
// watchers spread evenly over the keys; a few prefix watchers that see
// every write; all on S streams over C connections to the target server.

// valueSize is the bytes of every written value: phase (1), sequence (8),
// padding.
const valueSize = 64

// encodeValue makes the value of write seq in phase ph; the watchers read
// both back to attribute each event.
func encodeValue(ph byte, seq int) []byte {
	v := make([]byte, valueSize)
	v[0] = ph
	binary.BigEndian.PutUint64(v[1:9], uint64(seq))
	for i := 9; i < valueSize; i++ {
		v[i] = 'x'
	}
	return v
}

func decodeValue(v []byte) (ph byte, seq int, ok bool) {
	if len(v) != valueSize {
		return 0, 0, false
	}
	return v[0], int(binary.BigEndian.Uint64(v[1:9])), true
}

// keyOf spreads the writes of a phase over every key: consecutive writes
// hit keys far apart, and each key is written once per nkeys writes.
func keyOf(seq, nkeys int) int { return int(uint64(seq) * 7919 % uint64(nkeys)) }

// phase is what one measured write window records. The watchers' receive
// goroutines write recv and lags; the driver reads them after the drain.
type phase struct {
	harness.WritePhase

	recv    []atomic.Int32 // events received per watcher id
	dups    atomic.Int64   // events at or below a watcher's last index
	resyncs atomic.Int64   // watches the server cut loose (and we resumed)
	lags    []lagBuf       // per stream
}

type lagBuf struct {
	mu sync.Mutex
	xs []time.Duration
}

// watchers is the load generator's side of every watch.
type watchers struct {
	sys       system
	nkeys     int
	keys      [][]byte
	prefix    []byte
	conns     []*grpc.ClientConn
	streams   []*wstream
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once

	// Watchers are numbered by slot: exact watcher j (on key j % nkeys) is
	// slot j, prefix watcher i is slot maxExact+i; its watch id on the
	// wire is slot+1.
	maxExact int
	exact    int // exact watchers attached
	prefixes int // prefix watchers attached
	// lastIdx is each slot's newest event index, written only by the
	// receive goroutine of the watcher's stream.
	lastIdx []uint64

	createdSlot []bool // by slot; written only by the slot's stream goroutine
	cur         atomic.Pointer[phase]
	created     atomic.Int64
	canceled    atomic.Int64
	errMu       sync.Mutex
	firstErr    error
}

// maxPrefixes bounds the prefix watchers.
const maxPrefixes = 1024

func (w *watchers) slots() int { return w.maxExact + maxPrefixes }

type wstream struct {
	idx    int
	ws     watchStream
	sendMu sync.Mutex // Create is called by attach and by resyncs
}

func (s *wstream) create(id int64, key []byte, prefix bool, start uint64) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.ws.Create(id, key, prefix, start)
}

// openWatchers opens nconns connections, taking targets in turn, and
// nstreams streams spread over them, each with a receive goroutine that
// lives until close.
func openWatchers(ctx context.Context, sys system, targets []string, nconns, nstreams, nkeys, maxExact int) (*watchers, error) {
	ctx, cancel := context.WithCancel(ctx)
	w := &watchers{sys: sys, nkeys: nkeys, prefix: []byte("disc/"), cancel: cancel, maxExact: maxExact}
	w.lastIdx = make([]uint64, w.slots())
	w.createdSlot = make([]bool, w.slots())
	for k := range nkeys {
		w.keys = append(w.keys, fmt.Appendf(nil, "disc/svc-%05d", k))
	}
	for i := range nconns {
		c, err := dial(targets[i%len(targets)], sys.dialOptions...)
		if err != nil {
			w.close()
			return nil, err
		}
		w.conns = append(w.conns, c)
	}
	for i := range nstreams {
		ws, err := sys.open(ctx, w.conns[i%nconns])
		if err != nil {
			w.close()
			return nil, fmt.Errorf("open watch stream %d: %w", i, err)
		}
		s := &wstream{idx: i, ws: ws}
		w.streams = append(w.streams, s)
		w.wg.Add(1)
		go w.receive(ctx, s)
	}
	return w, nil
}

func (w *watchers) fail(err error) {
	w.errMu.Lock()
	if w.firstErr == nil {
		w.firstErr = err
	}
	w.errMu.Unlock()
}

func (w *watchers) err() error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return w.firstErr
}

// receive reads one stream until ctx ends, attributing each event.
func (w *watchers) receive(ctx context.Context, s *wstream) {
	defer w.wg.Done()
	var rs []watchResp
	for {
		var err error
		rs, err = s.ws.Recv(rs[:0])
		if err != nil {
			if ctx.Err() == nil {
				w.fail(fmt.Errorf("stream %d: %w", s.idx, err))
			}
			return
		}
		now := time.Now()
		for i := range rs {
			w.handle(ctx, s, &rs[i], now)
		}
	}
}

// handle applies one watch's response received at now.
func (w *watchers) handle(ctx context.Context, s *wstream, r *watchResp, now time.Time) {
	if r.created && !w.seenCreated(r.id) {
		w.created.Add(1)
	}
	if r.canceled && r.resync > 0 {
		// Cut loose for falling behind: resume after the resync index,
		// as a client does (no gap), and count it.
		if p := w.cur.Load(); p != nil {
			p.resyncs.Add(1)
		}
		slot := int(r.id - 1)
		key, prefix := w.prefix, true
		if slot < w.maxExact {
			key, prefix = w.keys[slot%w.nkeys], false
		}
		if err := s.create(r.id, key, prefix, r.resync); err != nil && ctx.Err() == nil {
			w.fail(fmt.Errorf("resume watch %d: %w", r.id, err))
		}
	} else if r.canceled {
		w.canceled.Add(1)
		w.fail(fmt.Errorf("watch %d canceled by the server: %s", r.id, r.reason))
	}
	if len(r.events) == 0 {
		return
	}
	p := w.cur.Load()
	wid := r.id - 1
	if wid < 0 || int(wid) >= len(w.lastIdx) {
		w.fail(fmt.Errorf("event for unknown watch id %d", r.id))
		return
	}
	for _, ev := range r.events {
		if ev.index <= w.lastIdx[wid] {
			if p != nil {
				p.dups.Add(1)
			}
			continue
		}
		w.lastIdx[wid] = ev.index
		ph, seq, ok := decodeValue(ev.value)
		if !ok || p == nil || ph != p.ID || seq >= p.TotalN {
			continue // the probe write, or an earlier phase's
		}
		p.recv[wid].Add(1)
		if seq >= p.WarmN {
			lb := &p.lags[s.idx]
			lb.mu.Lock()
			lb.xs = append(lb.xs, now.Sub(p.Intended(seq)))
			lb.mu.Unlock()
		}
	}
}

// attach creates exact watchers up to exact and prefix watchers up to
// prefixes (ids continue where the last attach stopped), spread over the
// streams, and waits until the server acknowledged every one.
func (w *watchers) attach(ctx context.Context, exact, prefixes int) error {
	type create struct {
		id     int64
		key    []byte
		prefix bool
	}
	per := make([][]create, len(w.streams))
	for j := w.exact; j < exact; j++ {
		s := j % len(w.streams)
		per[s] = append(per[s], create{int64(j) + 1, w.keys[j%w.nkeys], false})
	}
	// Prefix watchers go to evenly spaced streams, shifted by one each so
	// that they also spread over the connections (stream s is on
	// connection s mod conns): with the watches on several members each
	// serves its share, as a fleet's prefix watchers spread over clients.
	for i := w.prefixes; i < prefixes; i++ {
		s := (i*len(w.streams)/max(prefixes, 1) + i) % len(w.streams)
		per[s] = append(per[s], create{int64(w.maxExact+i) + 1, w.prefix, true})
	}
	want := w.created.Load() + int64(exact-w.exact) + int64(prefixes-w.prefixes)
	w.exact, w.prefixes = exact, prefixes

	var wg sync.WaitGroup
	errs := make(chan error, len(w.streams))
	sem := make(chan struct{}, 16)
	for si, cs := range per {
		if len(cs) == 0 {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			for _, c := range cs {
				if err := w.streams[si].create(c.id, c.key, c.prefix, 0); err != nil {
					errs <- fmt.Errorf("create watch %d on stream %d: %w", c.id, si, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for w.created.Load() < want {
		if err := w.err(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d watches acknowledged after 2m", w.created.Load(), want)
		}
		if err := ctxtime.Sleep(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	return w.err()
}

// seenCreated reports whether watch id was acknowledged before (a resync
// acknowledges it again), and marks it.
func (w *watchers) seenCreated(id int64) bool {
	slot := int(id - 1)
	if slot < 0 || slot >= len(w.createdSlot) {
		return false
	}
	seen := w.createdSlot[slot]
	w.createdSlot[slot] = true
	return seen
}

// close ends every stream and waits for the receive goroutines. It is
// idempotent.
func (w *watchers) close() {
	w.closeOnce.Do(func() {
		w.cancel()
		w.wg.Wait()
		for _, c := range w.conns {
			c.Close()
		}
	})
}

// phaseResult is what one phase measured.
type phaseResult struct {
	writeLat []time.Duration // acknowledged writes in the window, ascending
	tail     harness.TailSpread
	writes   int // acknowledged writes, warm-up included
	errors   int
	firstErr error
	lag      []time.Duration // deliveries of window writes, ascending
	expected int64           // deliveries the acknowledged writes call for
	exact    int64           // deliveries that matched an expected one
	extra    int64           // deliveries beyond those (e.g. of failed writes)
	dups     int64
	resyncs  int64
	drained  bool // every expected delivery arrived before the drain timeout
	cpu      string
	// leaderCPUPerWrite is the leader's CPU time over the phase (warm-up
	// and drain included) per acknowledged write, in µs.
	leaderCPUPerWrite float64
	// watchCPUPerDelivery is the CPU time of the members serving the
	// watches over the phase (their Raft work included) per delivery, in
	// µs; 0 when nothing was delivered.
	watchCPUPerDelivery float64
}

// runPhase has wr drive rate writes/s for warmup+dur, waits up to drainFor
// after the last write for the watchers to receive every event, and
// checks the counts per watcher. w may be nil (no watchers).
func runPhase(ctx context.Context, id byte, wr *harness.Writer, w *watchers,
	nkeys, rate int, warmup, dur, drainFor time.Duration) (phaseResult, error) {
	p := &phase{WritePhase: harness.NewWritePhase(id, rate, warmup, dur)}
	if w != nil {
		p.recv = make([]atomic.Int32, w.slots())
		p.lags = make([]lagBuf, len(w.streams))
		w.cur.Store(p)
	}
	wres, err := wr.Run(ctx, p.WritePhase)
	if err != nil {
		return phaseResult{}, err
	}
	res := phaseResult{writeLat: wres.Latencies, tail: wres.Tail, errors: len(wres.Failed)}
	if len(wres.Failed) > 0 {
		res.firstErr = errors.New(wres.FirstErr)
	}
	perKey := make([]int64, nkeys)
	for seq := range p.TotalN {
		if wres.Acked(seq) {
			perKey[keyOf(seq, nkeys)]++
			res.writes++
		}
	}
	if w == nil {
		res.drained = true
		return res, nil
	}

	// Expected deliveries per watcher: an exact watcher, every acknowledged
	// write to its key; a prefix watcher, every acknowledged write.
	expect := func(slot int) int64 {
		if slot < w.maxExact {
			return perKey[slot%nkeys]
		}
		return int64(res.writes)
	}
	var slots []int
	for j := range w.exact {
		slots = append(slots, j)
	}
	for i := range w.prefixes {
		slots = append(slots, w.maxExact+i)
	}
	for _, s := range slots {
		res.expected += expect(s)
	}
	deadline := time.Now().Add(drainFor)
	for {
		var got int64
		for _, s := range slots {
			got += min(int64(p.recv[s].Load()), expect(s))
		}
		if got >= res.expected {
			res.drained = true
			break
		}
		if time.Now().After(deadline) || w.err() != nil {
			break
		}
		if err := ctxtime.Sleep(ctx, 20*time.Millisecond); err != nil {
			return phaseResult{}, err
		}
	}
	w.cur.Store(nil)
	for _, s := range slots {
		got, want := int64(p.recv[s].Load()), expect(s)
		res.exact += min(got, want)
		res.extra += max(0, got-want)
	}
	res.dups = p.dups.Load()
	res.resyncs = p.resyncs.Load()
	for i := range p.lags {
		lb := &p.lags[i]
		lb.mu.Lock()
		res.lag = append(res.lag, lb.xs...)
		lb.mu.Unlock()
	}
	slices.Sort(res.lag)
	if err := w.err(); err != nil {
		return res, err
	}
	return res, nil
}
