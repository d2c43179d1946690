package gateway

import "time"

// pick chooses a pool among cands by the power of two choices on in-flight
// requests: two distinct available origins drawn at random, the less busy
// one wins. An origin is available unless it is ejected (at now, unix
// nanos), at its concurrency limit, or in exclude (the origins a retried
// request already failed on). pick takes the winner's in-flight slot; the
// caller must release it. nil means no candidate is available.
//
// rnd(n) returns a uniform int in [0, n); tests pass a seeded source. pick
// is a plain function: it never blocks or sleeps.
func pick(cands []*pool, now int64, exclude []*origin, rnd func(int) int) *pool {
	n := len(cands)
	if n == 0 {
		return nil
	}
	// A lost race for the last slot of an origin is retried a few times.
	for range 3 {
		var a, b *pool
		for tries := 0; tries < 4 && b == nil; tries++ {
			p := cands[rnd(n)]
			if excluded(exclude, p.origin) || !p.origin.available(now) {
				continue
			}
			if a == nil {
				a = p
			} else if p.origin != a.origin {
				b = p
			}
		}
		if a == nil {
			// The random draws found nothing (most origins are out): scan
			// once from a random start so an available one is always found.
			start := rnd(n)
			for i := range n {
				p := cands[(start+i)%n]
				if !excluded(exclude, p.origin) && p.origin.available(now) {
					a = p
					break
				}
			}
			if a == nil {
				return nil
			}
		}
		c := a
		if b != nil && b.origin.inflight.Load() < a.origin.inflight.Load() {
			c = b
		}
		if c.origin.acquire() {
			return c
		}
	}
	return nil
}

func excluded(xs []*origin, o *origin) bool {
	for _, x := range xs {
		if x == o {
			return true
		}
	}
	return false
}

// choose picks a pool for one attempt of a request on shard: first within
// the shard's subset, then (when every origin there is out) among all of
// the service's origins, and only as a last resort one the request already
// failed on.
func (s *service) choose(shard int, now int64, exclude []*origin, rnd func(int) int) *pool {
	if p := pick(s.shards[shard], now, exclude, rnd); p != nil {
		return p
	}
	if p := pick(s.fallback, now, exclude, rnd); p != nil {
		return p
	}
	if len(exclude) > 0 {
		return pick(s.fallback, now, nil, rnd)
	}
	return nil
}

// ejectedCount counts the service's origins ejected at now.
func (s *service) ejectedCount(now int64) int {
	n := 0
	for _, m := range s.members {
		if u := m.origin.ejectedUntil.Load(); u != 0 && now < u {
			n++
		}
	}
	return n
}

// outcome is what one attempt did to its origin's outlier state.
type outcome int

const (
	outcomeNone    outcome = iota // nothing changed (success without a failure run)
	outcomeIgnored                // a failure that says nothing new (ejected already, or ejection off)
	outcomeCounted                // the failure was counted
	outcomeEjected                // the origin was ejected
	outcomeCapped                 // it would be ejected, but the service is at its cap
)

// recordResult feeds one attempt's result into o's outlier state and ejects
// o when its failure run reaches the threshold and the service's cap
// allows. It returns the ejection time when it ejected. svc is the service
// version the request used (for the cap). Successes take no lock unless a
// failure run is in progress.
func recordResult(cfg OutlierConfig, svc *service, o *origin, failed bool, now time.Time) (outcome, time.Duration) {
	if !failed {
		if o.failing.Load() {
			o.mu.Lock()
			o.out.success()
			o.failing.Store(false)
			o.mu.Unlock()
		}
		return outcomeNone, 0
	}
	o.mu.Lock()
	o.failing.Store(true)
	counted, want := o.out.failure(cfg, now)
	o.mu.Unlock()
	switch {
	case !counted:
		return outcomeIgnored, 0
	case !want:
		return outcomeCounted, 0
	}
	st := o.state
	st.ejectMu.Lock()
	defer st.ejectMu.Unlock()
	if svc.ejectedCount(now.UnixNano()) >= maxEjected(len(svc.members), cfg.MaxEjectedPercent) {
		return outcomeCapped, 0
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.out.ejected(now) {
		return outcomeIgnored, 0 // another request ejected it meanwhile
	}
	d := o.out.eject(cfg, now)
	o.ejectedUntil.Store(o.out.ejectedUntil.UnixNano())
	return outcomeEjected, d
}
