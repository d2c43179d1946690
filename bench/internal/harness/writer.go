package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lodestone-kv/lodestone/internal/ctxtime"
)

// Open-loop writes from a process of their own.
//
// The watch and blocking-query benchmarks time writes while thousands of
// events or query answers per second arrive. If one process did both, it
// would time its own scheduler as much as the server: pinned to one CPU,
// the Go runtime polls the network only when its one P runs out of work
// or when sysmon gets to it, so a write's response can sit unread behind
// the decoding goroutines for up to 10 ms. In a fleet the writers are not
// the watchers either. So those benchmarks start a writer child (this
// file's ServeWrites, in their own binary) and drive it one phase at a
// time (Writer.Run): one JSON WritePhase per line on its stdin, one JSON
// WriteResult per line back on its stdout.

// WritePhase is one open-loop write window: write seq is due at Base +
// seq*Period, whether or not earlier writes have returned, and its latency
// counts from then. Writes before WarmN are sent and checked, not timed.
type WritePhase struct {
	ID     byte          `json:"id"`
	Base   time.Time     `json:"base"`
	Period time.Duration `json:"period"`
	WarmN  int           `json:"warm_n"`
	TotalN int           `json:"total_n"`
	// Cap bounds how long the phase may run past its schedule: at
	// Deadline no further write is sent and none in flight is waited
	// for, so a server that stalls ends the phase instead of holding it
	// for every write's own timeout in turn. Zero: no cap.
	Cap time.Duration `json:"cap,omitempty"`
}

// NewWritePhase is phase id of rate writes/s for warmup, then dur timed,
// starting far enough ahead for a writer child to have it in time.
func NewWritePhase(id byte, rate int, warmup, dur time.Duration) WritePhase {
	period := time.Second / time.Duration(rate)
	return WritePhase{ID: id, Base: time.Now().Add(100 * time.Millisecond), Period: period,
		WarmN: int(warmup / period), TotalN: int((warmup + dur) / period)}
}

// Intended is when write seq is due.
func (p WritePhase) Intended(seq int) time.Time { return p.Base.Add(time.Duration(seq) * p.Period) }

// Deadline is when a capped phase ends, Cap after its schedule did (the
// zero time when it has no Cap).
func (p WritePhase) Deadline() time.Time {
	if p.Cap <= 0 {
		return time.Time{}
	}
	return p.Intended(p.TotalN).Add(p.Cap)
}

// WriteResult is what one phase's writes measured.
type WriteResult struct {
	Latencies []time.Duration `json:"latencies"` // acknowledged writes from WarmN on, ascending
	Failed    []int           `json:"failed"`    // writes not acknowledged, ascending
	FirstErr  string          `json:"first_err,omitempty"`
	Tail      TailSpread      `json:"tail"`
	// Cut counts the writes in Failed that the phase's Cap ended: not
	// sent, or not answered, by its Deadline.
	Cut int `json:"cut,omitempty"`
	// CutWaited is, for each timed write among them, how long after it
	// was due it was cut: a lower bound on its latency, ascending.
	CutWaited []time.Duration `json:"cut_waited,omitempty"`
}

// TailSpan is the span TailSpread cuts a timed window into.
const TailSpan = 100 * time.Millisecond

// TailSpread says whether a phase's slowest writes came in a few stalls or
// all along: how many of the timed window's TailSpan spans (by intended
// start) hold a write at or over the p99. A handful out of a hundred is a
// few stalls (a GC, a disk flush) that set the p99; most of them is a
// slowdown of every write.
type TailSpread struct {
	Spans int `json:"spans"` // spans holding a write at or over the p99
	Of    int `json:"of"`    // spans in the timed window
	// Slowest are the writes at or over the p99, by intended start: with
	// the servers' execution traces (TraceAll), where to look.
	Slowest []TailWrite `json:"slowest,omitempty"`
	// Stalls are the largest runs of consecutive spans that each hold at
	// least StallWrites of those writes, most writes first (at most
	// MaxStalls): where a phase's p99 came from, by when.
	Stalls []TailStall `json:"stalls,omitempty"`
}

// TailStall is a run of consecutive TailSpan spans of a timed window, each
// holding at least StallWrites writes at or over the window's p99.
type TailStall struct {
	Offset time.Duration `json:"offset"` // from the window's start to the run's
	Length time.Duration `json:"length"`
	Writes int           `json:"writes"` // at or over the p99, in the run
}

// A span with StallWrites writes at or over the p99 (5 in 100 ms) is part
// of a stall; TailSpread keeps the MaxStalls largest.
const (
	StallWrites = 5
	MaxStalls   = 3
)

// StallsString is "+OFFSET+LENGTH:WRITES" for each stall, comma-separated,
// or "none".
func (t TailSpread) StallsString() string {
	if len(t.Stalls) == 0 {
		return "none"
	}
	parts := make([]string, len(t.Stalls))
	for i, s := range t.Stalls {
		parts[i] = fmt.Sprintf("+%.1fs+%.1fs:%d", s.Offset.Seconds(), s.Length.Seconds(), s.Writes)
	}
	return strings.Join(parts, ",")
}

// TailWrite is one of a phase's slowest writes.
type TailWrite struct {
	At      time.Time     `json:"at"` // when it was due
	Latency time.Duration `json:"latency"`
}

// String is "K/N", as run lines print it.
func (t TailSpread) String() string { return fmt.Sprintf("%d/%d", t.Spans, t.Of) }

// tailSpread is p's TailSpread for timed writes seqs[i] (WarmN on) that
// took lats[i].
func tailSpread(p WritePhase, seqs []int, lats []time.Duration) TailSpread {
	sorted := slices.Sorted(slices.Values(lats))
	p99 := Percentile(sorted, 99)
	span := func(seq int) int { return int(time.Duration(seq-p.WarmN) * p.Period / TailSpan) }
	t := TailSpread{Of: span(p.TotalN-1) + 1}
	if len(lats) == 0 {
		return t
	}
	perSpan := make([]int, t.Of)
	for i, lat := range lats {
		if lat >= p99 {
			if sp := span(seqs[i]); sp >= 0 && sp < len(perSpan) {
				perSpan[sp]++
			}
			t.Slowest = append(t.Slowest, TailWrite{At: p.Intended(seqs[i]), Latency: lat})
		}
	}
	for _, n := range perSpan {
		if n > 0 {
			t.Spans++
		}
	}
	t.Stalls = stalls(perSpan)
	slices.SortFunc(t.Slowest, func(a, b TailWrite) int { return a.At.Compare(b.At) })
	return t
}

// stalls finds the runs of spans holding at least StallWrites slow writes
// each, and keeps the MaxStalls with the most.
func stalls(perSpan []int) []TailStall {
	var out []TailStall
	for i := 0; i < len(perSpan); {
		if perSpan[i] < StallWrites {
			i++
			continue
		}
		s := TailStall{Offset: time.Duration(i) * TailSpan}
		for ; i < len(perSpan) && perSpan[i] >= StallWrites; i++ {
			s.Length += TailSpan
			s.Writes += perSpan[i]
		}
		out = append(out, s)
	}
	// NB: stable, so equal stalls stay in time order.
	slices.SortStableFunc(out, func(a, b TailStall) int { return b.Writes - a.Writes })
	return out[:min(len(out), MaxStalls)]
}

// SaveSlowest writes t.Slowest to path, one write a line: when it was
// due (UTC, as execution traces give wall times) and its latency.
func SaveSlowest(path string, t TailSpread) error {
	var b strings.Builder
	for _, w := range t.Slowest {
		fmt.Fprintf(&b, "%s %s\n", w.At.UTC().Format("2006-01-02T15:04:05.000000Z"), w.Latency)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// Acked reports whether write seq was acknowledged.
func (r WriteResult) Acked(seq int) bool {
	_, failed := slices.BinarySearch(r.Failed, seq)
	return !failed
}

// WriteFunc sends write seq of phase id and returns once it is
// acknowledged. It must return when ctx ends.
type WriteFunc func(ctx context.Context, id byte, seq int) error

// WriteWorkers bounds the writes in flight; an open loop needs enough of
// them to ride out a server stall without falling behind its schedule.
const WriteWorkers = 256

// WriteTimeout bounds each write: an open loop must not wait on one
// write forever.
const WriteTimeout = 10 * time.Second

// RunWrites drives p's writes open loop through write and returns what
// they measured, or ctx.Err() if ctx ended first. A phase with a Cap ends
// at its Deadline whatever its writes are doing: the rest are cut.
func RunWrites(ctx context.Context, p WritePhase, write WriteFunc) (WriteResult, error) {
	capped := ctx
	if d := p.Deadline(); !d.IsZero() {
		var cancel context.CancelFunc
		capped, cancel = context.WithDeadline(ctx, d)
		defer cancel()
	}
	var next atomic.Int64
	ws := make([]workerResult, WriteWorkers)
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	for wi := range WriteWorkers {
		w := &ws[wi]
		wg.Go(func() {
			for seq := int(next.Add(1) - 1); seq < p.TotalN && ctx.Err() == nil; seq = int(next.Add(1) - 1) {
				at := p.Intended(seq)
				if ctxtime.Sleep(ctx, time.Until(at)) != nil {
					return
				}
				if capped.Err() != nil {
					w.cut(p, seq, time.Since(at))
					continue
				}
				wctx, cancel := context.WithTimeout(capped, WriteTimeout)
				err := write(wctx, p.ID, seq)
				cancel()
				lat := time.Since(at)
				switch {
				case err != nil && ctx.Err() == nil && capped.Err() != nil:
					w.cut(p, seq, lat)
				case err != nil:
					w.failed = append(w.failed, seq)
					firstErr.CompareAndSwap(nil, &err)
				case seq >= p.WarmN:
					w.lats = append(w.lats, lat)
					w.seqs = append(w.seqs, seq)
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return WriteResult{}, err
	}
	var r WriteResult
	var timed []int
	for _, w := range ws {
		r.Latencies = append(r.Latencies, w.lats...)
		timed = append(timed, w.seqs...)
		r.Failed = append(r.Failed, w.failed...)
		r.Cut += w.cutN
		r.CutWaited = append(r.CutWaited, w.cutWaited...)
	}
	r.Tail = tailSpread(p, timed, r.Latencies)
	slices.Sort(r.Latencies)
	slices.Sort(r.Failed)
	slices.Sort(r.CutWaited)
	if e := firstErr.Load(); e != nil {
		r.FirstErr = (*e).Error()
	}
	return r, nil
}

// workerResult is what one of RunWrites' workers measured.
type workerResult struct {
	lats      []time.Duration
	seqs      []int // seqs[i] took lats[i]
	failed    []int // cut ones included
	cutN      int
	cutWaited []time.Duration // timed cut writes only
}

// cut records write seq of p as cut by p's Cap, waited after it was due.
func (w *workerResult) cut(p WritePhase, seq int, waited time.Duration) {
	w.failed = append(w.failed, seq)
	w.cutN++
	if seq >= p.WarmN {
		w.cutWaited = append(w.cutWaited, waited)
	}
}

// WithCut is r's timed latencies with each timed write the Cap cut
// counted as the time it had waited (a lower bound), ascending: the
// latencies a capped phase's percentiles come from.
func (r WriteResult) WithCut() []time.Duration {
	if len(r.CutWaited) == 0 {
		return r.Latencies
	}
	return slices.Sorted(slices.Values(slices.Concat(r.Latencies, r.CutWaited)))
}

// ServeWrites is the writer child's main loop: it runs each WritePhase
// read from in with RunWrites and answers with its WriteResult on out,
// until in ends (nil) or ctx does.
func ServeWrites(ctx context.Context, in io.Reader, out io.Writer, write WriteFunc) error {
	dec := json.NewDecoder(bufio.NewReader(in))
	enc := json.NewEncoder(out)
	for {
		var p WritePhase
		if err := dec.Decode(&p); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("writer: read phase: %w", err)
		}
		r, err := RunWrites(ctx, p, write)
		if err != nil {
			return err
		}
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("writer: send result: %w", err)
		}
	}
}

// Writer is a writer child process (ServeWrites) started by StartWriter.
type Writer struct{ *Child }

// StartWriter starts bin with args as a writer child, its stderr going to
// logPath, pinned to cpus when not empty (see Start).
func StartWriter(name, bin string, args []string, logPath, cpus string) (*Writer, error) {
	c, err := StartChild(name, bin, args, logPath, cpus)
	if err != nil {
		return nil, err
	}
	return &Writer{c}, nil
}

// Run has the child drive p and returns its result. A Writer runs one
// phase at a time. If ctx ends first the child is stopped, since its
// answer can no longer be matched to a request.
func (w *Writer) Run(ctx context.Context, p WritePhase) (WriteResult, error) {
	if err := w.Send(p); err != nil {
		return WriteResult{}, err
	}
	var r WriteResult
	if err := w.Recv(ctx, &r); err != nil {
		return WriteResult{}, err
	}
	return r, nil
}
