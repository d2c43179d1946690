package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
	"github.com/lodestone-kv/lodestone/bench/internal/rawhttp"
	"github.com/lodestone-kv/lodestone/internal/ctxtime"
)

// The blocking queries of one query process (fleet.go starts them): one
// consul-template-style query per key of its share (querySpec), each in
// its own goroutine on its own keep-alive connection to one server.

// querySpec is one query process's share of the queries: keys Offset +
// i*Stride for i < Count, all on Target.
type querySpec struct {
	Target string `json:"target"` // the server's "http://host:port"
	Offset int    `json:"offset"`
	Stride int    `json:"stride"`
	Count  int    `json:"count"`
	// Keys is every process's keys together: write seq goes to key seq
	// mod Keys, and key k's first read is due at Start + k*Wait/Keys.
	Keys  int           `json:"keys"`
	Start time.Time     `json:"start"`
	Wait  time.Duration `json:"wait"`
	// Source is the local address the queries dial from ("": the
	// kernel's choice), so that no source runs out of ephemeral ports.
	Source string `json:"source,omitempty"`
	// PhaseID is the write phase whose values the queries attribute to
	// their writes (encodeValue).
	PhaseID byte `json:"phase_id"`
}

// key is the spec's i-th key.
func (s querySpec) key(i int) int { return s.Offset + i*s.Stride }

// holds reports whether key k is one of the spec's.
func (s querySpec) holds(k int) bool {
	return k >= s.Offset && (k-s.Offset)%s.Stride == 0 && (k-s.Offset)/s.Stride < s.Count
}

// queries runs one spec's queries.
type queries struct {
	spec      querySpec
	source    net.Addr // local address to dial from; nil: the kernel's choice
	stopped   atomic.Bool
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once

	due, answered, changed, timedOut, early, errs, resets atomic.Int64
	started                                               atomic.Int64 // queries with their first blocking request out
	notStarted                                            int64        // ...not yet when openQueries returned

	mu       sync.Mutex
	firstErr error
	seen     map[int]time.Time // write seq of phase PhaseID -> when its value was first read
}

// queryCounts is what queries saw over one phase, for the report; it is
// also what a query process answers with (JSON), summed over them.
type queryCounts struct {
	Due       int64           `json:"due"`      // blocking requests sent (each must be answered)
	Answered  int64           `json:"answered"` // ...and answered with X-Consul-Index
	Changed   int64           `json:"changed"`  // answers with a higher index
	TimedOut  int64           `json:"timed_out"`
	Early     int64           `json:"early"`  // answers with the same index before the wait
	Errors    int64           `json:"errors"` // failed requests (any read, blocking or not)
	Resets    int64           `json:"resets"` // answers with a lower index
	WakesDue  int64           `json:"wakes_due"`
	WakesSeen int64           `json:"wakes_seen"` // acknowledged writes whose value their key's query read
	Wake      []time.Duration `json:"wake"`       // timed writes: read minus intended start, ascending
	FirstErr  string          `json:"first_err,omitempty"`
	// NotStarted counts queries that had no blocking request out by the
	// time the phase began: a server too slow to take them all.
	NotStarted int64 `json:"not_started"`
}

func (a *queryCounts) add(b queryCounts) {
	a.Due += b.Due
	a.Answered += b.Answered
	a.Changed += b.Changed
	a.TimedOut += b.TimedOut
	a.Early += b.Early
	a.Errors += b.Errors
	a.Resets += b.Resets
	a.WakesDue += b.WakesDue
	a.WakesSeen += b.WakesSeen
	a.NotStarted += b.NotStarted
	a.Wake = append(a.Wake, b.Wake...)
	if a.FirstErr == "" {
		a.FirstErr = b.FirstErr
	}
}

// openQueries starts spec's queries, key k's first read at spec.Start +
// k*Wait/Keys, so the fleet's timeouts are spread over one wait (as a
// fleet's are in steady state, not as a fleet's are right after it
// restarts at once). It returns once every query has read its key and
// sent its first blocking request, or startGrace after the last was due,
// with those not out yet counted (queries.notStarted).
func openQueries(parent context.Context, spec querySpec) (*queries, error) {
	ctx, cancel := context.WithCancel(parent)
	var source net.Addr
	if spec.Source != "" {
		ip := net.ParseIP(spec.Source)
		if ip == nil {
			cancel()
			return nil, fmt.Errorf("source address %q", spec.Source)
		}
		source = &net.TCPAddr{IP: ip}
	}
	q := &queries{spec: spec, source: source, cancel: cancel, seen: make(map[int]time.Time)}
	var ready sync.WaitGroup
	ready.Add(spec.Count)
	for i := range spec.Count {
		k := spec.key(i)
		at := spec.Start.Add(time.Duration(k) * spec.Wait / time.Duration(spec.Keys))
		q.wg.Add(1)
		go q.run(ctx, "/v1/kv/"+keyName(k), at, sync.OnceFunc(func() {
			q.started.Add(1)
			ready.Done()
		}))
	}
	allReady := make(chan struct{})
	go func() { ready.Wait(); close(allReady) }()
	select {
	case <-allReady:
	case <-time.After(time.Until(spec.Start) + spec.Wait + startGrace):
		// A server that cannot take them all is measured as it is, not
		// waited for: the queries not out yet go on trying, and count.
	case <-ctx.Done():
		q.close()
		return nil, parent.Err()
	}
	q.notStarted = int64(spec.Count) - q.started.Load()
	return q, nil
}

// startGrace is how long past its first read's due time a query may take
// to get its first blocking request out before it counts as not started.
const startGrace = 30 * time.Second

// run is one query's loop, as consul-template's view: read, then block on
// the index read, until stopped. ready is called once its first blocking
// request is about to go out (or when it returns).
func (q *queries) run(ctx context.Context, path string, at time.Time, ready func()) {
	defer q.wg.Done()
	defer ready()
	if ctxtime.Sleep(ctx, time.Until(at)) != nil {
		return
	}
	c := rawhttp.New(q.spec.Target, "X-Consul-Index")
	c.Dialer.LocalAddr = q.source
	defer context.AfterFunc(ctx, c.Close)() // cuts off the request in flight
	defer c.Close()
	var index uint64
	for !q.stopped.Load() && ctx.Err() == nil {
		blocking := index > 0
		if blocking {
			ready()
			q.due.Add(1)
		}
		t0 := time.Now()
		a, err := q.read(ctx, c, path, index)
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
		if blocking {
			q.answered.Add(1)
			switch {
			case a.changed:
				q.changed.Add(1)
			case a.got < index:
				q.resets.Add(1)
			case now.Sub(t0) >= q.spec.Wait:
				q.timedOut.Add(1)
			default:
				q.early.Add(1)
			}
		}
		if a.changed {
			q.observe(a.val, now)
		}
		index = a.next
	}
}

// answer is one read's outcome: X-Consul-Index (got), the index to wait
// on next and whether it changed (nextIndex), and, if it did, the value
// (nil on 404).
type answer struct {
	got, next uint64
	changed   bool
	val       []byte
}

// read is one read of path after index. NB: only a changed answer's body
// is decoded; a timeout's holds the value already seen.
func (q *queries) read(ctx context.Context, c *rawhttp.Conn, path string, index uint64) (answer, error) {
	got, body, err := q.get(ctx, c, path, index)
	if err != nil {
		return answer{}, err
	}
	a := answer{got: got}
	a.next, a.changed = nextIndex(index, got)
	if a.changed && body != nil {
		if a.val, err = kvValue(body); err != nil {
			return answer{}, fmt.Errorf("GET %s: %w", path, err)
		}
	}
	return a, nil
}

// get reads path as Consul's client does: ?wait always, ?index when
// waiting on one. It returns X-Consul-Index and the body (nil on 404),
// valid until c's next request.
func (q *queries) get(ctx context.Context, c *rawhttp.Conn, path string, index uint64) (uint64, []byte, error) {
	target := path + "?wait=" + strconv.FormatInt(q.spec.Wait.Milliseconds(), 10) + "ms"
	if index > 0 {
		target += "&index=" + strconv.FormatUint(index, 10)
	}
	ctx, cancel := context.WithTimeout(ctx, q.spec.Wait+q.spec.Wait/16+10*time.Second)
	defer cancel()
	status, body, err := c.Do(ctx, c.Request(http.MethodGet, target, nil))
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: %w", target, err)
	}
	if status != http.StatusOK && status != http.StatusNotFound {
		return 0, nil, fmt.Errorf("GET %s: %d %s: %s", target, status, http.StatusText(status), bytes.TrimSpace(body[:min(len(body), 512)]))
	}
	got, err := strconv.ParseUint(c.Header("X-Consul-Index"), 10, 64)
	if err != nil || got == 0 {
		return 0, nil, fmt.Errorf("GET %s: X-Consul-Index %q", target, c.Header("X-Consul-Index"))
	}
	if status == http.StatusNotFound {
		return got, nil, nil
	}
	return got, body, nil
}

// kvValue is the value of the one entry a KV read's body holds.
func kvValue(body []byte) ([]byte, error) {
	var kvs []struct{ Value []byte }
	if err := json.Unmarshal(body, &kvs); err != nil || len(kvs) != 1 {
		return nil, fmt.Errorf("want one entry, got %.200s (%v)", body, err)
	}
	return kvs[0].Value, nil
}

// observe records when a changed value of phase PhaseID was first read.
func (q *queries) observe(val []byte, now time.Time) {
	ph, seq, ok := decodeValue(val)
	if !ok || ph != q.spec.PhaseID {
		return // the population, or another phase's write
	}
	q.mu.Lock()
	if _, dup := q.seen[seq]; !dup {
		q.seen[seq] = now
	}
	q.mu.Unlock()
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
// write of p to the spec's keys (every write but those in failed,
// ascending) has read it, stops re-issuing, gives every outstanding
// request its wait plus jitter plus 5s to be answered, cuts off the rest,
// and returns the counts.
func (q *queries) finish(ctx context.Context, p harness.WritePhase, failed []int) queryCounts {
	mine := func(seq int) bool {
		_, lost := slices.BinarySearch(failed, seq)
		return !lost && q.spec.holds(seq%q.spec.Keys)
	}
	pending := func() (due, seen int64) {
		q.mu.Lock()
		defer q.mu.Unlock()
		for seq := range p.TotalN {
			if mine(seq) {
				due++
				if _, ok := q.seen[seq]; ok {
					seen++
				}
			}
		}
		return due, seen
	}
	for deadline := time.Now().Add(q.spec.Wait); ; {
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
	case <-time.After(q.spec.Wait + q.spec.Wait/16 + 5*time.Second):
	case <-ctx.Done():
	}
	q.close()

	c := queryCounts{Due: q.due.Load(), Answered: q.answered.Load(), Changed: q.changed.Load(), TimedOut: q.timedOut.Load(),
		Early: q.early.Load(), Errors: q.errs.Load(), Resets: q.resets.Load(), NotStarted: q.notStarted}
	c.WakesDue, c.WakesSeen = pending()
	q.mu.Lock()
	defer q.mu.Unlock()
	for seq, at := range q.seen {
		if seq >= p.WarmN && seq < p.TotalN && mine(seq) {
			c.Wake = append(c.Wake, at.Sub(p.Intended(seq)))
		}
	}
	slices.Sort(c.Wake)
	if q.firstErr != nil {
		c.FirstErr = q.firstErr.Error()
	}
	return c
}

// close stops every query, cutting off requests in flight, and waits for
// the goroutines. It is idempotent.
func (q *queries) close() {
	q.closeOnce.Do(func() {
		q.stopped.Store(true)
		q.cancel()
		q.wg.Wait()
	})
}
