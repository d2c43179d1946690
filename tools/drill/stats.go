package main

import (
	"math"
	"slices"
	"sort"
)

// p99 of the observations between two cumulative histograms, interpolated
// linearly within the bucket that holds it (as Prometheus'
// histogram_quantile does).
func p99(before, after map[float64]float64) float64 {
	return quantile(0.99, before, after)
}

func quantile(q float64, before, after map[float64]float64) float64 {
	var bounds []float64
	for b := range after {
		bounds = append(bounds, b)
	}
	sort.Float64s(bounds)
	total := after[math.Inf(1)] - before[math.Inf(1)]
	if total <= 0 {
		return 0
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range bounds {
		n := after[b] - before[b]
		if n >= rank {
			if math.IsInf(b, 1) {
				return lower
			}
			if n == below {
				return b
			}
			return lower + (b-lower)*(rank-below)/(n-below)
		}
		lower, below = b, n
	}
	return lower
}

// count is the number of observations between two cumulative histograms.
func count(before, after map[float64]float64) float64 {
	return after[math.Inf(1)] - before[math.Inf(1)]
}

// above is the number of observations between two cumulative histograms
// greater than the bucket bound nearest at or above min.
func above(min float64, before, after map[float64]float64) float64 {
	le := math.Inf(1)
	for b := range after {
		if b >= min && b < le {
			le = b
		}
	}
	return count(before, after) - (after[le] - before[le])
}

// spread is the median, least and greatest of xs.
type spread struct{ median, min, max float64 }

func spreadOf(xs []float64) spread {
	if len(xs) == 0 {
		return spread{math.NaN(), math.NaN(), math.NaN()}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return spread{med, s[0], s[n-1]}
}
