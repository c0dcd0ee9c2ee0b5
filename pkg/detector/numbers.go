package detector

// Numbers: percentiles, busy time, confidence, and how figures are written
// in evidence.

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"
)

// percentile of sorted xs by nearest rank.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(xs)))) - 1
	return xs[max(0, min(i, len(xs)-1))]
}

// trimmedMean is the mean of sorted xs without its lowest and highest
// tenth: stable where a median flips between latency modes, yet blind to
// the few stalls that would swing a plain mean.
func trimmedMean(xs []float64) float64 {
	cut := len(xs) / 10
	xs = xs[cut : len(xs)-cut]
	if len(xs) == 0 {
		return 0
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

// selectPercentile returns what percentile(xs sorted, p) would, without
// sorting: it reorders xs only as far as the one element needs (quickselect,
// O(n) on average). The fast path asks the device's median several times a
// second over thousands of requests at high IOPS: a full sort each time was
// a third of the daemon's CPU there.
func selectPercentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	k := max(0, min(int(math.Ceil(p*float64(len(xs))))-1, len(xs)-1))
	lo, hi := 0, len(xs)-1
	for lo < hi {
		// Median of three as the pivot: sampled latencies arrive in
		// completion order, often nearly sorted in runs.
		mid := lo + (hi-lo)/2
		if xs[mid] < xs[lo] {
			xs[mid], xs[lo] = xs[lo], xs[mid]
		}
		if xs[hi] < xs[lo] {
			xs[hi], xs[lo] = xs[lo], xs[hi]
		}
		if xs[hi] < xs[mid] {
			xs[hi], xs[mid] = xs[mid], xs[hi]
		}
		pivot := xs[mid]
		i, j := lo, hi
		for i <= j {
			for xs[i] < pivot {
				i++
			}
			for xs[j] > pivot {
				j--
			}
			if i <= j {
				xs[i], xs[j] = xs[j], xs[i]
				i++
				j--
			}
		}
		switch {
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default:
			return xs[k]
		}
	}
	return xs[k]
}

// busyNS returns the time covered by the union of the intervals.
func busyNS(iv [][2]int64) int64 {
	if len(iv) == 0 {
		return 0
	}
	slices.SortFunc(iv, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	var total int64
	start, end := iv[0][0], iv[0][1]
	for _, x := range iv[1:] {
		if x[0] > end {
			total += end - start
			start, end = x[0], x[1]
		} else if x[1] > end {
			end = x[1]
		}
	}
	return total + end - start
}

func clamp01(x float64) float64 { return max(0, min(1, x)) }

// confidence grows with the margin over the threshold (margin 1 = at the
// threshold gives 0.5, twice the threshold gives 1) and with the sample
// count relative to the minimum.
func confidence(margin float64, n, minN int) float64 {
	c := clamp01(0.5 + 0.5*(margin-1))
	sf := clamp01(float64(n) / float64(2*minN))
	return c * (0.6 + 0.4*sf)
}

func fmtBytes(b float64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.1fMiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.0fKiB", b/(1<<10))
	default:
		return fmt.Sprintf("%.0fB", b)
	}
}

func fmtRate(bps float64) string { return fmt.Sprintf("%.1fMB/s", bps/1e6) }

func fmtDur(ns float64) string {
	return time.Duration(ns).Round(time.Microsecond).String()
}

func className(c uint8) string {
	if c == 0 {
		return "<=1B"
	}
	return "<=" + fmtBytes(math.Ldexp(1, int(c)))
}
