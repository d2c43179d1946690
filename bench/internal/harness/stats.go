package harness

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method: the smallest value with at least p% of the values at
// or below it. sorted must be in ascending order; an empty slice yields 0.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// Median returns the median of xs (the mean of the two middle values when
// len(xs) is even), or NaN for an empty slice. xs is not modified.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Millis converts d to fractional milliseconds, the unit BENCH lines use
// for latency.
func Millis(d time.Duration) float64 {
	return float64(d) / float64(time.Millisecond)
}

// Baseline is what a "with load vs without" ratio is taken against, from
// the two control phases of each rep: before[i] ran before rep i's load,
// after[i] after it. Pooled is the median of all of them. Strict is the
// median over reps of each rep's lower one; it is kept for comparison
// only, because the lower of two noisy figures sits below either's
// typical value, so a load that costs nothing still shows a ratio above 1
// against it.
func Baseline(before, after []float64) (pooled, strict float64) {
	var lower []float64
	for i := range min(len(before), len(after)) {
		lower = append(lower, min(before[i], after[i]))
	}
	return Median(append(slices.Clone(before), after...)), Median(lower)
}

// BaselineNote is the "baseline:" line a benchmark prints beside its ratio
// BENCH line: what the pooled baseline is (what names the figure), and the
// strict one with the ratio loaded would have against it.
func BaselineNote(what string, pooled, strict, loaded float64) string {
	return fmt.Sprintf("baseline: %s is the median of both control phases of every rep, %sms; "+
		"the median of each rep's lower one would be %sms, a ratio of %s",
		what, FormatValue(pooled), FormatValue(strict), FormatValue(loaded/strict))
}
