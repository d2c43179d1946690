// Package promwin keeps a short window of samples of a Prometheus registry,
// this process's own or another's /metrics, and answers what the web UIs
// draw from them: a gauge's value, a counter's rate, a histogram's
// percentile over the last minute, and their recent history for
// sparklines. It is a tiny Prometheus for the pages that are open: a
// Sampler gathers only when asked, at most once per its interval, so a UI
// nobody looks at costs nothing.
package promwin

import (
	"context"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// Source gathers one sample's metric families: a prometheus.Gatherer's
// Gather, or a scrape of another process's /metrics.
type Source func(ctx context.Context) ([]*dto.MetricFamily, error)

// Config tunes a Sampler.
type Config struct {
	// Every is the least time between two gathers; callers asking sooner
	// get the newest sample. Default 1s.
	Every time.Duration
	// Keep is how many samples are kept for windows and sparklines.
	// Default 120 (two minutes at one a second while a page is open).
	Keep int
	// Keep only the families Keep reports true for (nil: all). A page reads
	// a few dozen of a registry's hundreds; the Go runtime's are dropped.
	Filter func(name string) bool
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Sampler gathers from a Source on demand and keeps the newest samples.
// It is safe for concurrent use; concurrent callers share one gather.
type Sampler struct {
	src Source
	cfg Config

	mu       sync.Mutex
	samples  []*Sample // oldest first, at most cfg.Keep
	lastTry  time.Time
	lastErr  error
	inflight chan struct{} // closed when the running gather ends
}

// New returns a Sampler over src.
func New(src Source, cfg Config) *Sampler {
	if cfg.Every <= 0 {
		cfg.Every = time.Second
	}
	if cfg.Keep <= 1 {
		cfg.Keep = 120
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Sampler{src: src, cfg: cfg}
}

// Refresh gathers a new sample unless the newest try is younger than
// Every, then returns the newest sample and the error of the newest try
// (nil sample: none ever succeeded). A failed try keeps the samples.
func (s *Sampler) Refresh(ctx context.Context) (*Sample, error) {
	s.mu.Lock()
	for s.inflight != nil {
		ch := s.inflight
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return s.Latest()
		}
		s.mu.Lock()
	}
	now := s.cfg.Now()
	if !s.lastTry.IsZero() && now.Sub(s.lastTry) < s.cfg.Every {
		defer s.mu.Unlock()
		return s.latestLocked()
	}
	s.lastTry = now
	ch := make(chan struct{})
	s.inflight = ch
	s.mu.Unlock()

	fams, err := s.src(ctx)
	var sm *Sample
	if err == nil {
		sm = newSample(now, fams, s.cfg.Filter)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight = nil
	close(ch)
	s.lastErr = err
	if sm != nil {
		if len(s.samples) == s.cfg.Keep {
			s.samples = s.samples[:copy(s.samples, s.samples[1:])]
		}
		s.samples = append(s.samples, sm)
	}
	return s.latestLocked()
}

// Latest is the newest sample without gathering, and the newest try's
// error.
func (s *Sampler) Latest() (*Sample, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latestLocked()
}

func (s *Sampler) latestLocked() (*Sample, error) {
	if len(s.samples) == 0 {
		return nil, s.lastErr
	}
	return s.samples[len(s.samples)-1], s.lastErr
}

// Window is the newest sample and the newest one at least d older (the
// oldest kept, if the history is shorter): what rates and percentiles over
// d are computed between. ok is false without a sample.
func (s *Sampler) Window(d time.Duration) (w Window, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.samples) == 0 {
		return Window{}, false
	}
	last := s.samples[len(s.samples)-1]
	first := s.samples[0]
	for i := len(s.samples) - 1; i >= 0; i-- {
		if last.At.Sub(s.samples[i].At) >= d {
			first = s.samples[i]
			break
		}
	}
	return Window{From: first, To: last}, true
}

// History returns f of every kept sample, oldest first: a sparkline's
// points.
func (s *Sampler) History(f func(*Sample) float64) []float64 {
	s.mu.Lock()
	samples := slices.Clone(s.samples)
	s.mu.Unlock()
	out := make([]float64, len(samples))
	for i, sm := range samples {
		out[i] = f(sm)
	}
	return out
}

// Steps returns f of each pair of consecutive kept samples, oldest first:
// a sparkline of a rate or a percentile per interval.
func (s *Sampler) Steps(f func(Window) float64) []float64 {
	s.mu.Lock()
	samples := slices.Clone(s.samples)
	s.mu.Unlock()
	if len(samples) < 2 {
		return nil
	}
	out := make([]float64, len(samples)-1)
	for i := 1; i < len(samples); i++ {
		out[i-1] = f(Window{From: samples[i-1], To: samples[i]})
	}
	return out
}

// Sample is one gather: every kept series, by family name.
type Sample struct {
	At       time.Time
	families map[string][]Series
}

// Series is one labelled series of a family: its value (a gauge's or a
// counter's; a histogram's count) and, for a histogram, its cumulative
// buckets.
type Series struct {
	Labels  map[string]string
	Value   float64
	Sum     float64
	Buckets []Bucket // ascending upper bounds, cumulative counts; +Inf last
}

// Bucket is one cumulative histogram bucket.
type Bucket struct {
	UpperBound float64
	Count      float64
}

func newSample(at time.Time, fams []*dto.MetricFamily, keep func(string) bool) *Sample {
	sm := &Sample{At: at, families: make(map[string][]Series, len(fams))}
	for _, f := range fams {
		name := f.GetName()
		if keep != nil && !keep(name) {
			continue
		}
		series := make([]Series, 0, len(f.GetMetric()))
		for _, m := range f.GetMetric() {
			s := Series{Labels: make(map[string]string, len(m.GetLabel()))}
			for _, l := range m.GetLabel() {
				s.Labels[l.GetName()] = l.GetValue()
			}
			switch {
			case m.Gauge != nil:
				s.Value = m.GetGauge().GetValue()
			case m.Counter != nil:
				s.Value = m.GetCounter().GetValue()
			case m.Untyped != nil:
				s.Value = m.GetUntyped().GetValue()
			case m.Histogram != nil:
				h := m.GetHistogram()
				s.Value, s.Sum = float64(h.GetSampleCount()), h.GetSampleSum()
				for _, b := range h.GetBucket() {
					s.Buckets = append(s.Buckets, Bucket{UpperBound: b.GetUpperBound(), Count: float64(b.GetCumulativeCount())})
				}
				sort.Slice(s.Buckets, func(i, j int) bool { return s.Buckets[i].UpperBound < s.Buckets[j].UpperBound })
				if n := len(s.Buckets); n == 0 || !math.IsInf(s.Buckets[n-1].UpperBound, 1) {
					s.Buckets = append(s.Buckets, Bucket{UpperBound: math.Inf(1), Count: s.Value})
				}
			}
			series = append(series, s)
		}
		sm.families[name] = series
	}
	return sm
}

// Has reports whether the sample holds family name.
func (sm *Sample) Has(name string) bool {
	_, ok := sm.families[name]
	return ok
}

// Each calls f for every series of family name whose labels include
// match (pairs of name, value).
func (sm *Sample) Each(name string, f func(Series), match ...string) {
	if sm == nil {
		return
	}
	for _, s := range sm.families[name] {
		if matches(s.Labels, match) {
			f(s)
		}
	}
}

func matches(labels map[string]string, match []string) bool {
	for i := 0; i+1 < len(match); i += 2 {
		if labels[match[i]] != match[i+1] {
			return false
		}
	}
	return true
}

// Value is the sum of the values of family name's series that match
// (NaN when none does): a gauge, a counter, or a label's total.
func (sm *Sample) Value(name string, match ...string) float64 {
	v, n := 0.0, 0
	sm.Each(name, func(s Series) { v += s.Value; n++ }, match...)
	if n == 0 {
		return math.NaN()
	}
	return v
}

// Label is label's value on the first series of family name (build_info's
// version), or "".
func (sm *Sample) Label(name, label string) string {
	out := ""
	sm.Each(name, func(s Series) {
		if out == "" {
			out = s.Labels[label]
		}
	})
	return out
}

// LabelValues lists the values label takes on family name's series,
// sorted and unique.
func (sm *Sample) LabelValues(name, label string) []string {
	var out []string
	sm.Each(name, func(s Series) {
		if v, ok := s.Labels[label]; ok {
			out = append(out, v)
		}
	})
	sort.Strings(out)
	return slices.Compact(out)
}

// buckets sums the matching histograms' buckets (all of one family share
// bounds).
func (sm *Sample) buckets(name string, match []string) (out []Bucket) {
	sm.Each(name, func(s Series) {
		if out == nil {
			out = slices.Clone(s.Buckets)
			return
		}
		for i := range out {
			if i < len(s.Buckets) {
				out[i].Count += s.Buckets[i].Count
			}
		}
	}, match...)
	return out
}

// Window is two samples, From no later than To.
type Window struct{ From, To *Sample }

// Seconds is the window's length.
func (w Window) Seconds() float64 { return w.To.At.Sub(w.From.At).Seconds() }

// Increase is how much family name's matching series grew over the window
// (a counter's increase; a reset counts from zero).
func (w Window) Increase(name string, match ...string) float64 {
	to, from := w.To.Value(name, match...), w.From.Value(name, match...)
	if math.IsNaN(to) {
		return math.NaN()
	}
	if math.IsNaN(from) || w.From == w.To {
		return 0
	}
	if to < from {
		return to
	}
	return to - from
}

// Rate is Increase per second (NaN for a window of one sample).
func (w Window) Rate(name string, match ...string) float64 {
	if s := w.Seconds(); s > 0 {
		return w.Increase(name, match...) / s
	}
	return math.NaN()
}

// Quantile is the q-quantile (0..1) of the observations histogram name's
// matching series made during the window, interpolated within the bucket
// as Prometheus's histogram_quantile does; for a window of one sample,
// of every observation since the process started. NaN without any.
func (w Window) Quantile(q float64, name string, match ...string) float64 {
	to := w.To.buckets(name, match)
	if to == nil {
		return math.NaN()
	}
	if w.From != w.To {
		if from := w.From.buckets(name, match); len(from) == len(to) && from[len(from)-1].Count <= to[len(to)-1].Count {
			for i := range to {
				to[i].Count -= from[i].Count
			}
		}
	}
	return quantile(q, to)
}

// quantile interpolates within cumulative buckets: the bucket where the
// rank falls, linearly between its lower and upper bound; in the +Inf
// bucket, the last finite bound.
func quantile(q float64, b []Bucket) float64 {
	total := b[len(b)-1].Count
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	i := sort.Search(len(b), func(i int) bool { return b[i].Count >= rank })
	if i >= len(b)-1 {
		if len(b) >= 2 {
			return b[len(b)-2].UpperBound
		}
		return math.NaN()
	}
	lower, below := 0.0, 0.0
	if i > 0 {
		lower, below = b[i-1].UpperBound, b[i-1].Count
	}
	inBucket := b[i].Count - below
	if inBucket <= 0 {
		return b[i].UpperBound
	}
	return lower + (b[i].UpperBound-lower)*(rank-below)/inBucket
}
