package ui

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/promwin"
)

// Sampling the members' metrics.
const (
	// scrapeTimeout bounds one member's scrape; a member that does not
	// answer within it is shown unreachable.
	scrapeTimeout = 2 * time.Second
	// staleAfter marks a member unreachable when its newest sample is
	// older than this, even while a scrape hangs.
	staleAfter = 3 * time.Second
	// window is what rates and percentiles are computed over.
	window = time.Minute
)

// fleet samples every member's metrics while a metrics page is open: this
// member's registry directly, the others' /metrics over HTTP.
type fleet struct {
	b  Backend
	mu sync.Mutex
	by map[uint64]*memberSampler
}

type memberSampler struct {
	addr string
	s    *promwin.Sampler
}

func newFleet(b Backend) *fleet { return &fleet{b: b, by: map[uint64]*memberSampler{}} }

// keepFamily keeps Lodestone's own series: the pages read no others.
func keepFamily(name string) bool { return strings.HasPrefix(name, "lodestone_") }

// memberStat is one member as its newest sample shows it.
type memberStat struct {
	m       *lodestonepb.Member
	self    bool
	sampler *promwin.Sampler
	sample  *promwin.Sample // nil: never sampled
	win     promwin.Window
	err     error // the newest scrape's, or staleness
}

func (ms memberStat) reachable() bool { return ms.err == nil && ms.sample != nil }

// refresh samples every member, waiting at most until ctx ends: scrapes
// run on under their own timeout, so a page that stops waiting does not
// make a slow member look dead.
func (f *fleet) refresh(ctx context.Context) []memberStat {
	_, selfID := f.b.Self()
	members := slices.Clone(f.b.Members())
	if len(members) == 0 {
		name, id := f.b.Self()
		members = []*lodestonepb.Member{{Id: id, Name: name}}
	}
	slices.SortFunc(members, func(a, b *lodestonepb.Member) int { return strings.Compare(a.Name, b.Name) })
	stats := make([]memberStat, len(members))
	done := make(chan struct{}, len(members))
	for i, m := range members {
		ms := memberStat{m: m, self: m.Id == selfID}
		ms.sampler = f.sampler(m, ms.self)
		stats[i] = ms
		go func() {
			sctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
			defer cancel()
			ms.sampler.Refresh(sctx)
			done <- struct{}{}
		}()
	}
	for range members {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
	now := time.Now()
	for i := range stats {
		ms := &stats[i]
		ms.sample, ms.err = ms.sampler.Latest()
		if ms.sample != nil {
			ms.win, _ = ms.sampler.Window(window)
			if ms.err == nil && now.Sub(ms.sample.At) > staleAfter {
				ms.err = errors.New("no answer to the last scrape yet")
			}
		} else if ms.err == nil {
			ms.err = errors.New("not sampled yet")
		}
	}
	f.forget(members)
	return stats
}

// sampler returns member m's sampler, made anew when its address changed.
func (f *fleet) sampler(m *lodestonepb.Member, self bool) *promwin.Sampler {
	f.mu.Lock()
	defer f.mu.Unlock()
	addr := m.HttpAddr
	if self {
		addr = "self"
	}
	if cur, ok := f.by[m.Id]; ok && cur.addr == addr {
		return cur.s
	}
	var src promwin.Source
	switch {
	case self:
		src = f.b.Metrics
	case addr == "":
		src = func(context.Context) ([]*dto.MetricFamily, error) {
			return nil, errors.New("the member has published no HTTP address yet")
		}
	default:
		src = func(ctx context.Context) ([]*dto.MetricFamily, error) { return f.b.MemberMetrics(ctx, addr) }
	}
	s := promwin.New(src, promwin.Config{Filter: keepFamily})
	f.by[m.Id] = &memberSampler{addr: addr, s: s}
	return s
}

// forget drops the samplers of members that left.
func (f *fleet) forget(members []*lodestonepb.Member) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.by) <= len(members) {
		return
	}
	keep := map[uint64]bool{}
	for _, m := range members {
		keep[m.Id] = true
	}
	for id := range f.by {
		if !keep[id] {
			delete(f.by, id)
		}
	}
}

// self is this member's sampler, for the pages' local history.
func (f *fleet) self(stats []memberStat) memberStat {
	for _, ms := range stats {
		if ms.self {
			return ms
		}
	}
	return memberStat{}
}

// tick is the metrics pages' wait: the next sample, or a leader change.
func (u *UI) tick(ctx context.Context) error {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-u.b.LeaderChanged():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
