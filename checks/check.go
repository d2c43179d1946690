package checks

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

const critical = lodestonepb.HealthStatus_HEALTH_CRITICAL

// ErrNotTTL refuses a report on a check that is not a TTL check.
var ErrNotTTL = errors.New("check is not a TTL check")

// Check is one check's state and, once started, the goroutine that runs
// it. Every method is safe to call concurrently.
type Check struct {
	spec *Spec
	kick chan struct{} // a TTL report moved the deadline; capacity one

	mu     sync.Mutex
	status lodestonepb.HealthStatus
	output string
	// probed: a probe has run, so the status is a result, not the initial
	// one (TTL checks never probe).
	probed bool
	// ttlDeadline: a TTL check turns critical when now reaches it;
	// expired: it did, and no report came since.
	ttlDeadline time.Time
	expired     bool
	// criticalSince is when the status last became critical (zero while
	// it is not), for DeregisterCriticalServiceAfter.
	criticalSince time.Time
	run           *running
}

type running struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a check in its initial state at now; Start runs it.
func New(spec *Spec, now time.Time) *Check {
	c := &Check{spec: spec, kick: make(chan struct{}, 1), status: spec.Initial}
	if spec.Kind == KindTTL {
		c.ttlDeadline = now.Add(spec.TTL)
	}
	if c.status == critical {
		c.criticalSince = now
	}
	return c
}

// Spec is how the check runs.
func (c *Check) Spec() *Spec { return c.spec }

// Status returns the current status and output.
func (c *Check) Status() (lodestonepb.HealthStatus, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status, c.output
}

// Probed reports whether a probe has run.
func (c *Check) Probed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.probed
}

// Record sets the result of a probe at now and reports whether the
// status changed.
func (c *Check) Record(st lodestonepb.HealthStatus, output string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.probed = true
	return c.set(st, output, now)
}

// Assume sets the status the registry already holds (a check restored
// after a restart starts from it, so an unchanged result writes
// nothing). It is not a probe.
func (c *Check) Assume(st lodestonepb.HealthStatus, output string, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set(st, output, now)
}

// set changes status and output, keeping criticalSince; c.mu is held.
func (c *Check) set(st lodestonepb.HealthStatus, output string, now time.Time) bool {
	c.output = capOutput(output)
	if st == c.status {
		return false
	}
	switch {
	case st == critical:
		c.criticalSince = now
	case c.status == critical:
		c.criticalSince = time.Time{}
	}
	c.status = st
	return true
}

// UpdateTTL records an application's report on a TTL check at now,
// re-arms its TTL and reports whether the status changed.
func (c *Check) UpdateTTL(st lodestonepb.HealthStatus, output string, now time.Time) (bool, error) {
	if c.spec.Kind != KindTTL {
		return false, ErrNotTTL
	}
	c.mu.Lock()
	c.ttlDeadline, c.expired = now.Add(c.spec.TTL), false
	changed := c.set(st, output, now)
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return changed, nil
}

// ExpireTTL turns a TTL check critical once now reaches its deadline,
// once per deadline, and reports whether the status changed.
func (c *Check) ExpireTTL(now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.spec.Kind != KindTTL || c.expired || now.Before(c.ttlDeadline) {
		return false
	}
	c.expired = true
	return c.set(critical, "TTL expired (last output before timeout follows): "+c.output, now)
}

// CriticalFor is how long the check has been critical at now (0 while it
// is not).
func (c *Check) CriticalFor(now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status != critical {
		return 0
	}
	return now.Sub(c.criticalSince)
}

// Reapable reports whether the check's service is due for deregistration
// at now: it has a DeregisterCriticalServiceAfter and has been critical
// longer than that.
func (c *Check) Reapable(now time.Time) bool {
	return c.spec.DeregisterAfter > 0 && c.CriticalFor(now) > c.spec.DeregisterAfter
}

// Result is one run's outcome, as Hooks.Result receives it.
type Result struct {
	Status lodestonepb.HealthStatus
	Output string
	// Changed: the status differs from the one before.
	Changed bool
	// First: the check's first probe.
	First bool
}

// Hooks connect a running check to its owner.
type Hooks struct {
	// Now is the clock results are stamped with; nil is time.Now.
	Now func() time.Time
	// Result, if set, is called after every probe and every TTL expiry,
	// from the check's goroutine, without the check's lock held.
	Result func(*Check, Result)
	// Logger receives probe problems; nil discards them.
	Logger *slog.Logger
}

func (h Hooks) now() time.Time {
	if h.Now == nil {
		return time.Now()
	}
	return h.Now()
}

func (h Hooks) result(c *Check, r Result) {
	if h.Result != nil {
		h.Result(c, r)
	}
}

// Start runs the check until ctx ends or Stop: a probe at once and then
// every interval, or for a TTL check a timer at its deadline. A check
// starts at most once.
func (c *Check) Start(ctx context.Context, h Hooks) {
	ctx, cancel := context.WithCancel(ctx)
	r := &running{cancel: cancel, done: make(chan struct{})}
	c.mu.Lock()
	if c.run != nil {
		c.mu.Unlock()
		cancel()
		panic("checks: " + c.spec.String() + " started twice")
	}
	c.run = r
	c.mu.Unlock()
	if h.Logger == nil {
		h.Logger = slog.New(slog.DiscardHandler)
	}
	go func() {
		defer close(r.done)
		if c.spec.Kind == KindTTL {
			c.runTTL(ctx, h)
		} else {
			c.runProbe(ctx, h)
		}
	}()
}

// Stop ends the check's goroutine and waits for it; a check never started
// stops at once. Hooks.Result is not called after Stop returns.
func (c *Check) Stop() {
	c.mu.Lock()
	r := c.run
	c.mu.Unlock()
	if r == nil {
		return
	}
	r.cancel()
	<-r.done
}

func (c *Check) runProbe(ctx context.Context, h Hooks) {
	p := newProber(c.spec, h.Logger)
	defer p.close()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st, out := p.probe(ctx)
		if ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		first := !c.probed
		c.probed = true
		changed := c.set(st, out, h.now())
		out = c.output
		c.mu.Unlock()
		h.result(c, Result{Status: st, Output: out, Changed: changed, First: first})
		t.Reset(c.spec.Interval)
	}
}

func (c *Check) runTTL(ctx context.Context, h Hooks) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		case <-t.C:
		}
		now := h.now()
		changed := c.ExpireTTL(now)
		c.mu.Lock()
		wait := c.ttlDeadline.Sub(now)
		expired := c.expired
		st, out := c.status, c.output
		c.mu.Unlock()
		if changed {
			h.result(c, Result{Status: st, Output: out, Changed: true})
		}
		t.Stop()
		if !expired {
			// NB: a clock behind the timer wakes it early; it sleeps again.
			t.Reset(max(wait, time.Millisecond))
		} // expired: only a report (kick) re-arms it
	}
}

// capOutput keeps the first MaxOutput bytes of out.
func capOutput(out string) string {
	if len(out) <= MaxOutput {
		return out
	}
	return out[:MaxOutput]
}
