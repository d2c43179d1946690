package compose

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
)

// The writers' keys live under loadPrefix. Each writer writes its own keys
// in sequence, cycling through keysPerWriter of them, and retries a write
// (same key, same value) until it is acknowledged before the next: so a
// key's writes are ordered, every value a key holds is its writer's
// sequence number, and a key's value never goes below its last
// acknowledged one. At 20 writes/s a key comes round again after 30 s,
// far longer than a write can stay in flight on a server (the 7 s hold
// for a leader, plus a commit), so a late duplicate of an earlier attempt
// cannot overwrite a newer value.
const (
	loadPrefix    = "app/load/"
	keysPerWriter = 600
	writePace     = 50 * time.Millisecond
)

// ledger records the writers' acknowledged writes: per key the last
// acknowledged sequence number, and the one in flight when they stopped.
type ledger struct {
	mu      sync.Mutex
	acked   map[string]int
	pending map[string]int // attempted, not acknowledged (at most one per writer)
	latest  struct {
		key string
		seq int
	}
	acks, failures atomic.Int64
	errs           map[string]int // failure messages (shortened), counted
}

func newLedger() *ledger {
	return &ledger{acked: map[string]int{}, pending: map[string]int{}, errs: map[string]int{}}
}

func (l *ledger) attempt(key string, seq int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending[key] = seq
}

func (l *ledger) ack(key string, seq int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.pending, key)
	l.acked[key] = seq
	l.latest.key, l.latest.seq = key, seq
	l.acks.Add(1)
}

func (l *ledger) fail(err error) {
	l.failures.Add(1)
	msg := err.Error()
	if i := strings.Index(msg, ": "); i > 0 && strings.HasPrefix(msg, "Put ") {
		msg = msg[i+2:] // NB: drop the URL, which names the port tried
	}
	if len(msg) > 80 {
		msg = msg[:80]
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs[msg]++
}

// snapshot is a copy of the acknowledged writes.
func (l *ledger) snapshot() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int, len(l.acked))
	for k, v := range l.acked {
		out[k] = v
	}
	return out
}

// last is the most recently acknowledged write.
func (l *ledger) last() (string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.latest.key, l.latest.seq
}

func (l *ledger) errorSummary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var lines []string
	for msg, n := range l.errs {
		lines = append(lines, fmt.Sprintf("%dx %s", n, msg))
	}
	sort.Strings(lines)
	return strings.Join(lines, "; ")
}

// checkNotBehind compares stored values with acknowledged writes taken
// before the read: none may be missing or older. It returns the problems.
func checkNotBehind(acked map[string]int, stored map[string]int) []string {
	var bad []string
	for k, seq := range acked {
		got, ok := stored[k]
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("%s: acknowledged %d, missing", k, seq))
		case got < seq:
			bad = append(bad, fmt.Sprintf("%s: acknowledged %d, holds older %d", k, seq, got))
		}
	}
	sort.Strings(bad)
	return bad
}

// checkFinal compares stored values with every write once the writers
// stopped: each key holds exactly its last acknowledged value, or the
// write that was in flight when they stopped, and no key was written
// that no writer wrote.
func (l *ledger) checkFinal(stored map[string]int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var bad []string
	for k, seq := range l.acked {
		got, ok := stored[k]
		if p, inFlight := l.pending[k]; inFlight && ok && got == p {
			continue
		}
		if !ok || got != seq {
			bad = append(bad, fmt.Sprintf("%s: acknowledged %d, holds %d (present %v)", k, seq, got, ok))
		}
	}
	for k, got := range stored {
		if _, ok := l.acked[k]; !ok && l.pending[k] != got {
			bad = append(bad, fmt.Sprintf("%s: holds %d, which no writer had acknowledged or in flight", k, got))
		}
	}
	sort.Strings(bad)
	return bad
}

// writer writes its keys through the servers' Consul HTTP APIs in turn,
// moving to the next server on any failure.
type writer struct {
	id      int
	clients []*api.Client
	l       *ledger
}

func (w *writer) run(ctx context.Context) {
	ep := w.id % len(w.clients)
	for seq := 1; ctx.Err() == nil; seq++ {
		key := fmt.Sprintf("%sw%d/k%03d", loadPrefix, w.id, seq%keysPerWriter)
		w.l.attempt(key, seq)
		for ctx.Err() == nil {
			opts := (&api.WriteOptions{}).WithContext(ctx)
			_, err := w.clients[ep].KV().Put(&api.KVPair{Key: key, Value: []byte(strconv.Itoa(seq))}, opts)
			if err == nil {
				w.l.ack(key, seq)
				break
			}
			if ctx.Err() != nil {
				return
			}
			w.l.fail(err)
			ep = (ep + 1) % len(w.clients)
			sleep(ctx, 100*time.Millisecond)
		}
		sleep(ctx, writePace)
	}
}

// readAll lists every key under loadPrefix with a consistent read.
func readAll(cl *api.Client) (map[string]int, error) {
	pairs, _, err := cl.KV().List(loadPrefix, &api.QueryOptions{RequireConsistent: true})
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(pairs))
	for _, p := range pairs {
		n, err := strconv.Atoi(string(p.Value))
		if err != nil {
			return nil, fmt.Errorf("%s holds %q, not a writer's number", p.Key, p.Value)
		}
		out[p.Key] = n
	}
	return out, nil
}

// gatewayLoad sends GET / through the gateway from a few workers and
// counts the outcomes; instances counts which demo instance answered.
type gatewayLoad struct {
	requests, ok, status5xx, other, errs atomic.Int64
	mu                                   sync.Mutex
	instances                            map[string]int64
	lastErr                              atomic.Value // string
}

// loadCount is gatewayLoad's counters at one moment.
type loadCount struct{ requests, ok, status5xx, other, errs int64 }

func (g *gatewayLoad) count() loadCount {
	return loadCount{g.requests.Load(), g.ok.Load(), g.status5xx.Load(), g.other.Load(), g.errs.Load()}
}

func (a loadCount) minus(b loadCount) loadCount {
	return loadCount{a.requests - b.requests, a.ok - b.ok, a.status5xx - b.status5xx, a.other - b.other, a.errs - b.errs}
}

func (a loadCount) String() string {
	ratio := 0.0
	if a.requests > 0 {
		ratio = float64(a.status5xx) / float64(a.requests)
	}
	return fmt.Sprintf("requests=%d 2xx=%d 5xx=%d (%.4f%%) other=%d errors=%d", a.requests, a.ok, a.status5xx, 100*ratio, a.other, a.errs)
}

func (g *gatewayLoad) run(ctx context.Context, url string, workers int, pace time.Duration) *sync.WaitGroup {
	g.instances = map[string]int64{}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				g.once(ctx, hc, url)
				sleep(ctx, pace)
			}
		})
	}
	return &wg
}

func (g *gatewayLoad) once(ctx context.Context, hc *http.Client, url string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		panic(err) // NB: url is built by the test
	}
	resp, err := hc.Do(req)
	if ctx.Err() != nil {
		return // NB: the load stopped under this request; not the gateway's doing
	}
	g.requests.Add(1)
	if err != nil {
		g.errs.Add(1)
		g.lastErr.Store(err.Error())
		return
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	switch resp.StatusCode / 100 {
	case 2:
		g.ok.Add(1)
		if name := demoInstance(body); name != "" {
			g.mu.Lock()
			g.instances[name]++
			g.mu.Unlock()
		}
	case 5:
		g.status5xx.Add(1)
		g.lastErr.Store(fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body))))
	default:
		g.other.Add(1)
	}
}

func (g *gatewayLoad) served() map[string]int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[string]int64{}
	for k, v := range g.instances {
		out[k] = v
	}
	return out
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
