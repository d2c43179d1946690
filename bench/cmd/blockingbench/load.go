package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
	"github.com/lodestone-kv/lodestone/internal/ctxtime"
)

// keyPrefix holds every key the benchmark writes and watches: key k is
// keyPrefix + five digits.
const keyPrefix = "blk/"

func keyName(k int) string { return fmt.Sprintf("%sk%05d", keyPrefix, k) }

// valueSize is the bytes of every written value.
const valueSize = 64

// encodeValue makes the value of write seq in phase ph ("ph:seq:" padded
// with x); a query that reads it back knows which write woke it. Phase 0
// is the initial population.
func encodeValue(ph byte, seq int) []byte {
	v := fmt.Appendf(nil, "%d:%d:", ph, seq)
	return append(v, bytes.Repeat([]byte{'x'}, max(0, valueSize-len(v)))...)
}

func decodeValue(v []byte) (ph byte, seq int, ok bool) {
	a, rest, ok1 := strings.Cut(string(v), ":")
	b, _, ok2 := strings.Cut(rest, ":")
	p, err1 := strconv.ParseUint(a, 10, 8)
	s, err2 := strconv.Atoi(b)
	if !ok1 || !ok2 || err1 != nil || err2 != nil || s < 0 {
		return 0, 0, false
	}
	return byte(p), s, true
}

// nextIndex is consul-template's handling of X-Consul-Index (watch/view.go
// fetch): an answer with the index it asked with is a timeout, so it asks
// again with the same; a lower one means the server's state went back (a
// restore, another server), so it resets to 0 and reads afresh; a higher
// one is new data and the next wait starts from it.
func nextIndex(last, got uint64) (next uint64, changed bool) {
	switch {
	case got == last:
		return last, false
	case got < last:
		return 0, false
	}
	return got, true
}

// phase is one write window; write seq goes to key seq mod the key count.
type phase struct {
	harness.WritePhase
	acked []bool        // by write number; set once the writer has answered
	seen  []atomic.Bool // by write number: a query read its value
}

func newPhase(id byte, rate int, warmup, dur time.Duration) *phase {
	p := &phase{WritePhase: harness.NewWritePhase(id, rate, warmup, dur)}
	p.seen = make([]atomic.Bool, p.TotalN)
	return p
}

// writer puts through the Consul KV API of one server.
type writer struct {
	base   string
	tr     *http.Transport
	client *http.Client
}

// newWriter keeps a connection per write a writer can have in flight.
func newWriter(base string) *writer {
	tr := &http.Transport{MaxIdleConnsPerHost: harness.WriteWorkers, IdleConnTimeout: time.Minute}
	return &writer{base: base, tr: tr, client: &http.Client{Transport: tr}}
}

func (w *writer) close() { w.tr.CloseIdleConnections() }

// put is `PUT /v1/kv/<key>`; Consul answers true when it stored the value.
func (w *writer) put(ctx context.Context, key string, value []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, w.base+"/v1/kv/"+key, bytes.NewReader(value))
	if err != nil {
		return err
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("PUT %s: read body: %w", key, err)
	}
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "true" {
		return fmt.Errorf("PUT %s: %s: %s", key, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// populate writes every key once (closed loop, 64 at a time), so every
// phase overwrites existing keys and every query starts on a value.
func (w *writer) populate(ctx context.Context, nkeys int) error {
	var next atomic.Int64
	errs := make(chan error, 64)
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for k := int(next.Add(1) - 1); k < nkeys; k = int(next.Add(1) - 1) {
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := w.put(pctx, keyName(k), encodeValue(0, k))
				cancel()
				if err != nil {
					errs <- fmt.Errorf("populate: %w", err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// writeResult is what one phase's writes measured.
type writeResult struct {
	lat       []time.Duration // acknowledged window writes, from intended start, ascending
	tail      harness.TailSpread
	acked     int // acknowledged writes, warm-up included
	errors    int
	firstErr  error
	writerCPU time.Duration // the writer child's CPU time during the phase
	queryCPU  time.Duration // this process's (the queries') CPU time during the phase
}

// runWrites has wr drive p's writes, open loop. q, if not nil, is told the
// phase first so it can attribute what it reads.
func runWrites(ctx context.Context, wr *harness.Writer, p *phase, q *queries) (writeResult, error) {
	self0, _ := harness.CPUTime(os.Getpid())
	writer0, _ := harness.CPUTime(wr.Proc().Pid())
	if q != nil {
		q.cur.Store(p)
	}
	res, err := wr.Run(ctx, p.WritePhase)
	if err != nil {
		return writeResult{}, err
	}
	r := writeResult{lat: res.Latencies, tail: res.Tail, errors: len(res.Failed)}
	if r.errors > 0 {
		r.firstErr = errors.New(res.FirstErr)
	}
	p.acked = make([]bool, p.TotalN)
	for seq := range p.acked {
		if p.acked[seq] = res.Acked(seq); p.acked[seq] {
			r.acked++
		}
	}
	self1, _ := harness.CPUTime(os.Getpid())
	writer1, _ := harness.CPUTime(wr.Proc().Pid())
	r.queryCPU, r.writerCPU = self1-self0, writer1-writer0
	return r, nil
}

// queries runs one consul-template-style blocking query per key, each in
// its own goroutine on its own keep-alive connection.
type queries struct {
	trs       []*http.Transport
	clients   []*http.Client // query k sends on clients[k mod len]
	wait      time.Duration
	cur       atomic.Pointer[phase]
	stopped   atomic.Bool
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once

	due, answered, changed, timedOut, early, errs, resets atomic.Int64

	mu       sync.Mutex
	firstErr error
	wake     []time.Duration
}

// queryCounts is what the queries saw over one phase, for the report.
type queryCounts struct {
	due       int64 // blocking requests sent (each must be answered)
	answered  int64 // ...and answered with X-Consul-Index
	changed   int64 // answers with a higher index
	timedOut  int64 // answers with the same index after the wait
	early     int64 // answers with the same index before the wait
	errors    int64 // failed requests (any read, blocking or not)
	resets    int64 // answers with a lower index
	wakesDue  int64 // acknowledged writes while the queries ran
	wakesSeen int64 // ...whose value their key's query read
	wake      []time.Duration
	firstErr  error
}

func (a *queryCounts) add(b queryCounts) {
	a.due += b.due
	a.answered += b.answered
	a.changed += b.changed
	a.timedOut += b.timedOut
	a.early += b.early
	a.errors += b.errors
	a.resets += b.resets
	a.wakesDue += b.wakesDue
	a.wakesSeen += b.wakesSeen
}

// openQueries starts n queries, query k on keyName(k) at targets[k mod
// len(targets)], their first reads spread evenly over one wait so their
// timeouts are spread too (as a fleet's are in steady state, not as a
// fleet's are right after it restarts at once). It returns once every
// query has read its key and sent its first blocking request.
func openQueries(parent context.Context, targets []string, n int, wait time.Duration) (*queries, error) {
	ctx, cancel := context.WithCancel(parent)
	q := &queries{wait: wait, cancel: cancel}
	sources := sourceAddrs(n)
	for _, src := range sources {
		// NB: the default MaxIdleConnsPerHost (2) would close all but two
		// connections after each answer and redial: 10k dials per wait.
		tr := &http.Transport{MaxIdleConnsPerHost: n/len(sources) + 16, IdleConnTimeout: 0}
		if src != nil {
			tr.DialContext = (&net.Dialer{LocalAddr: src}).DialContext
		}
		q.trs = append(q.trs, tr)
		q.clients = append(q.clients, &http.Client{Transport: tr})
	}
	var ready sync.WaitGroup
	ready.Add(n)
	start := time.Now()
	for k := range n {
		url := targets[k%len(targets)] + "/v1/kv/" + keyName(k)
		at := start.Add(time.Duration(k) * wait / time.Duration(n))
		q.wg.Add(1)
		go q.run(ctx, q.clients[k%len(q.clients)], url, at, sync.OnceFunc(ready.Done))
	}
	allReady := make(chan struct{})
	go func() { ready.Wait(); close(allReady) }()
	select {
	case <-allReady:
		return q, nil
	case <-time.After(wait + 30*time.Second):
	case <-ctx.Done():
	}
	q.close()
	<-allReady // every goroutine has returned, so each called ready
	if err := parent.Err(); err != nil {
		return nil, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return nil, fmt.Errorf("not every query started within %v (first error: %v)", wait+30*time.Second, q.firstErr)
}

// perSource is the most query connections one source address opens:
// every connection to a server's one port needs a port of its own from
// the source address's ephemeral range, about 28,000 by default on Linux.
const perSource = 20000

// sourceAddrs are the local addresses the queries dial from: none chosen
// (nil) up to perSource queries, else 127.0.0.2, 127.0.0.3, ... (all
// loopback), one per perSource queries.
func sourceAddrs(n int) []*net.TCPAddr {
	if n <= perSource {
		return []*net.TCPAddr{nil}
	}
	var out []*net.TCPAddr
	for i := range (n + perSource - 1) / perSource {
		out = append(out, &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i))})
	}
	return out
}

// raiseFileLimit lifts this process's open-file limit to at least need
// (the hard limit too, which needs root), so that it, and the servers it
// starts, which inherit it, can hold a connection per query.
func raiseFileLimit(need uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur >= need {
		return nil
	}
	want := syscall.Rlimit{Cur: need, Max: max(lim.Max, need)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		return fmt.Errorf("raise the open-file limit from %d (hard %d) to %d for the queries' connections (needs root with CAP_SYS_RESOURCE, or a higher ulimit -Hn): %w", lim.Cur, lim.Max, need, err)
	}
	return nil
}

// run is one query's loop, as consul-template's view: read, then block on
// the index read, until stopped. ready is called once its first blocking
// request is about to go out (or when it returns).
func (q *queries) run(ctx context.Context, client *http.Client, url string, at time.Time, ready func()) {
	defer q.wg.Done()
	defer ready()
	if ctxtime.Sleep(ctx, time.Until(at)) != nil {
		return
	}
	var index uint64
	for !q.stopped.Load() && ctx.Err() == nil {
		blocking := index > 0
		if blocking {
			ready()
			q.due.Add(1)
		}
		t0 := time.Now()
		got, val, err := q.get(ctx, client, url, index)
		if err != nil {
			if ctx.Err() != nil {
				return // cut off by close: due, not answered
			}
			q.fail(err)
			// consul-template backs off (250ms base) and retries.
			if ctxtime.Sleep(ctx, 250*time.Millisecond) != nil {
				return
			}
			continue
		}
		now := time.Now()
		next, changed := nextIndex(index, got)
		if blocking {
			q.answered.Add(1)
			switch {
			case changed:
				q.changed.Add(1)
			case got < index:
				q.resets.Add(1)
			case now.Sub(t0) >= q.wait:
				q.timedOut.Add(1)
			default:
				q.early.Add(1)
			}
		}
		if changed {
			q.observe(val, now)
		}
		index = next
	}
}

// get reads url as Consul's client does: ?wait always, ?index when
// waiting on one. It returns X-Consul-Index and the value (nil on 404).
func (q *queries) get(ctx context.Context, client *http.Client, url string, index uint64) (uint64, []byte, error) {
	u := fmt.Sprintf("%s?wait=%dms", url, q.wait.Milliseconds())
	if index > 0 {
		u += "&index=" + strconv.FormatUint(index, 10)
	}
	ctx, cancel := context.WithTimeout(ctx, q.wait+q.wait/16+10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: read body: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusNotFound {
		return 0, nil, fmt.Errorf("GET %s: %s: %s", u, resp.Status, strings.TrimSpace(string(body)))
	}
	got, err := strconv.ParseUint(resp.Header.Get("X-Consul-Index"), 10, 64)
	if err != nil || got == 0 {
		return 0, nil, fmt.Errorf("GET %s: X-Consul-Index %q", u, resp.Header.Get("X-Consul-Index"))
	}
	if resp.StatusCode == http.StatusNotFound {
		return got, nil, nil
	}
	var kvs []struct{ Value []byte }
	if err := json.Unmarshal(body, &kvs); err != nil || len(kvs) != 1 {
		return 0, nil, fmt.Errorf("GET %s: want one entry, got %.200s (%v)", u, body, err)
	}
	return got, kvs[0].Value, nil
}

// observe attributes a changed value to the write that made it.
func (q *queries) observe(val []byte, now time.Time) {
	ph, seq, ok := decodeValue(val)
	p := q.cur.Load()
	if !ok || p == nil || ph != p.ID || seq >= p.TotalN {
		return // the population, or another phase's write
	}
	if p.seen[seq].CompareAndSwap(false, true) && seq >= p.WarmN {
		q.mu.Lock()
		q.wake = append(q.wake, now.Sub(p.Intended(seq)))
		q.mu.Unlock()
	}
}

func (q *queries) fail(err error) {
	q.errs.Add(1)
	q.mu.Lock()
	if q.firstErr == nil {
		q.firstErr = err
	}
	q.mu.Unlock()
}

// finish waits (up to one wait) until the query of every acknowledged
// write of the current phase has read it, stops re-issuing, gives every
// outstanding request its wait plus jitter plus 5s to be answered, cuts
// off the rest, and returns the counts.
func (q *queries) finish(ctx context.Context) queryCounts {
	p := q.cur.Load()
	pending := func() (due, seen int64) {
		for i := range p.acked {
			if p.acked[i] {
				due++
				if p.seen[i].Load() {
					seen++
				}
			}
		}
		return due, seen
	}
	for deadline := time.Now().Add(q.wait); ; {
		due, seen := pending()
		if seen == due || time.Now().After(deadline) || ctxtime.Sleep(ctx, 20*time.Millisecond) != nil {
			break
		}
	}
	q.stopped.Store(true)
	done := make(chan struct{})
	go func() { q.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(q.wait + q.wait/16 + 5*time.Second):
	case <-ctx.Done():
	}
	q.close()
	q.cur.Store(nil)

	c := queryCounts{due: q.due.Load(), answered: q.answered.Load(), changed: q.changed.Load(), timedOut: q.timedOut.Load(),
		early: q.early.Load(), errors: q.errs.Load(), resets: q.resets.Load()}
	c.wakesDue, c.wakesSeen = pending()
	q.mu.Lock()
	c.wake, c.firstErr = slices.Sorted(slices.Values(q.wake)), q.firstErr
	q.mu.Unlock()
	return c
}

// close stops every query, cutting off requests in flight, and waits for
// the goroutines. It is idempotent.
func (q *queries) close() {
	q.closeOnce.Do(func() {
		q.stopped.Store(true)
		q.cancel()
		q.wg.Wait()
		for _, tr := range q.trs {
			tr.CloseIdleConnections()
		}
	})
}
