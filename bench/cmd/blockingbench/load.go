package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lodestone-kv/lodestone/bench/internal/harness"
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
				if err := w.populateKey(ctx, k); err != nil {
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

// populateKey writes key k's first value, trying populateTries times: a
// keep-alive connection the server closed as it was reused fails a put
// with EOF on a loaded machine, and a put of the same value again is
// harmless. Nothing here is timed.
func (w *writer) populateKey(ctx context.Context, k int) error {
	var err error
	for range populateTries {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = w.put(pctx, keyName(k), encodeValue(0, k))
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
	}
	return fmt.Errorf("%w (tried %d times)", err, populateTries)
}

const populateTries = 3

// writeResult is what one phase's writes measured.
type writeResult struct {
	// Timed writes from their intended start, ascending: the acknowledged
	// ones, and each one the phase's cap cut counted as the time it had
	// waited (a lower bound; harness.WriteResult.WithCut).
	lat       []time.Duration
	cut       int // writes the phase's cap cut (among failed): not sent or not answered by its deadline
	tail      harness.TailSpread
	acked     int   // acknowledged writes, warm-up included
	failed    []int // writes not acknowledged, ascending
	errors    int
	firstErr  error
	writerCPU time.Duration // the writer child's CPU time during the phase
	queryCPU  time.Duration // the query processes' CPU time during the phase
}

// newPhase is write phase id: -rate writes/s for warmup, then dur timed,
// capped at -phase-cap past its schedule.
func newPhase(id byte, warmup, dur time.Duration) harness.WritePhase {
	p := harness.NewWritePhase(id, *flagRate, warmup, dur)
	p.Cap = *flagPhaseCap
	return p
}

// cutNote is the line that says a phase did not finish within its cap,
// or "" when it did: system ran phase label of rep, and r measured it.
func cutNote(system string, rep int, label string, r writeResult, p harness.WritePhase) string {
	if r.cut == 0 {
		return ""
	}
	return fmt.Sprintf("unfinished: system=%s rep=%d/%d phase=%s: %s did not finish the phase: %d of %d writes not sent or not acknowledged within -phase-cap %v after the last was due; "+
		"its percentiles count each timed one as taking as long as it had waited when cut, a lower bound\n",
		system, rep+1, *flagReps, label, system, r.cut, p.TotalN, p.Cap)
}

// runWrites has wr drive p's writes, open loop; q, if not nil, is the
// query processes, whose CPU time it counts.
func runWrites(ctx context.Context, wr *harness.Writer, p harness.WritePhase, q *fleet) (writeResult, error) {
	query0 := q.cpu()
	writer0, _ := harness.CPUTime(wr.Proc().Pid())
	res, err := wr.Run(ctx, p)
	if err != nil {
		return writeResult{}, err
	}
	r := writeResult{lat: res.WithCut(), tail: res.Tail, errors: len(res.Failed), failed: res.Failed, cut: res.Cut}
	if res.FirstErr != "" {
		r.firstErr = errors.New(res.FirstErr)
	}
	r.acked = p.TotalN - len(res.Failed)
	writer1, _ := harness.CPUTime(wr.Proc().Pid())
	r.queryCPU, r.writerCPU = q.cpu()-query0, writer1-writer0
	return r, nil
}

// raiseFileLimit lifts this process's open-file limit to at least need
// (the hard limit too, which needs root), so that the processes it starts,
// which inherit it, can hold their queries' connections; it returns the
// limit now.
func raiseFileLimit(need uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= need {
		return lim.Cur, nil
	}
	want := syscall.Rlimit{Cur: need, Max: max(lim.Max, need)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		return lim.Cur, fmt.Errorf("raise the open-file limit from %d (hard %d) to %d for the queries' connections (needs root with CAP_SYS_RESOURCE, or a higher ulimit -Hn; or lower -queries-per-process, or spread the queries over more members): %w", lim.Cur, lim.Max, need, err)
	}
	return need, nil
}
