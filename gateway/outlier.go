package gateway

import (
	"time"
)

// outlierState is one origin's outlier-ejection state machine. It is plain
// data with methods: no goroutines, no clock of its own (every method takes
// now), so tests step it by hand. The origin guards it with its mutex.
//
//	success            ends the failure run
//	failure            extends the run; at cfg.Consecutive it asks for an
//	                   ejection (wantEject), which the caller grants only if
//	                   the service's cap allows (then eject)
//	eject              ejected for BaseEjection × multiplier (capped at
//	                   MaxEjection); the multiplier grows by one per
//	                   ejection and decays by one per Decay spent un-ejected
//
// Failures that finish while the origin is ejected (requests sent before
// the ejection) are ignored: they say nothing new.
type outlierState struct {
	consecutive  int       // failures since the last success
	multiplier   int       // ejections that still count toward the next length
	ejectedUntil time.Time // zero: never ejected
	decayFrom    time.Time // when the multiplier last decayed or the last ejection ended
}

// success records a successful attempt.
func (s *outlierState) success() { s.consecutive = 0 }

// failure records a failed attempt at now: counted is false when it was
// ignored (ejection disabled, or the origin is ejected already); wantEject
// reports that the run reached the threshold (the caller then checks the
// cap and calls eject).
func (s *outlierState) failure(cfg OutlierConfig, now time.Time) (counted, wantEject bool) {
	if cfg.Consecutive <= 0 || s.ejected(now) {
		return false, false
	}
	s.consecutive++
	return true, s.consecutive >= cfg.Consecutive
}

// ejected reports whether the origin is ejected at now.
func (s *outlierState) ejected(now time.Time) bool {
	return now.Before(s.ejectedUntil)
}

// eject takes the origin out until now + its ejection time, which it
// returns.
func (s *outlierState) eject(cfg OutlierConfig, now time.Time) time.Duration {
	s.decay(cfg, now)
	s.multiplier++
	d := cfg.BaseEjection * time.Duration(s.multiplier)
	if cfg.MaxEjection > 0 && (d > cfg.MaxEjection || d/time.Duration(s.multiplier) != cfg.BaseEjection) {
		d = cfg.MaxEjection
	}
	s.ejectedUntil = now.Add(d)
	s.decayFrom = s.ejectedUntil
	s.consecutive = 0
	return d
}

// decay lowers the multiplier by one for each full Decay since decayFrom.
func (s *outlierState) decay(cfg OutlierConfig, now time.Time) {
	if s.multiplier == 0 || cfg.Decay <= 0 || !now.After(s.decayFrom) {
		return
	}
	steps := int(now.Sub(s.decayFrom) / cfg.Decay)
	if steps >= s.multiplier {
		s.multiplier = 0
		s.decayFrom = now
		return
	}
	s.multiplier -= steps
	s.decayFrom = s.decayFrom.Add(time.Duration(steps) * cfg.Decay)
}

// maxEjected returns how many of n origins may be ejected at once.
func maxEjected(n, percent int) int {
	if n < 2 || percent <= 0 {
		return 0
	}
	return max(1, n*percent/100)
}
