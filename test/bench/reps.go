package bench

import (
	"slices"
	"sort"
)

// RunFigures are one run's figures of a row that was run several times.
type RunFigures struct {
	MBps              float64 `json:"mbps"`
	RandP99ms         float64 `json:"rand_p99_ms,omitempty"`
	RandTouchesPerSec float64 `json:"rand_touches_per_s,omitempty"`
}

// reps is how many times a case's rows run: a mixed device's random reader
// is judged on its p99 over a few seconds, which strays 30-40% from one run
// to the next at the same window on a shared host; its rows run
// MixedReps times, interleaved, and each figure is the median.
func (c Config) reps(workload string) int {
	if workload == WMixed && c.MixedReps > 1 {
		return c.MixedReps
	}
	return 1
}

// median is the median of xs (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// medianIndex is the index of the run whose MB/s is the median (the lower
// of the middle two): its timeline, actions and log stand for the row.
func medianIndex(mbps []float64) int {
	idx := make([]int, len(mbps))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return mbps[idx[a]] < mbps[idx[b]] })
	return idx[(len(idx)-1)/2]
}

// figures is one figure of each run.
func figures[T any](runs []T, f func(T) float64) []float64 {
	out := make([]float64, len(runs))
	for i, r := range runs {
		out[i] = f(r)
	}
	return out
}

// medianResult is one row from several runs of an arm: each figure the
// median over the runs, the rest from the run of median throughput, and
// every run's figures in Runs.
func medianResult(rs []Result) Result {
	if len(rs) == 1 {
		return rs[0]
	}
	pick := func(f func(Result) float64) []float64 { return figures(rs, f) }
	mbps := pick(func(r Result) float64 { return r.MBps })
	out := rs[medianIndex(mbps)]
	out.MBps = median(mbps)
	out.P50ms = median(pick(func(r Result) float64 { return r.P50ms }))
	out.P99ms = median(pick(func(r Result) float64 { return r.P99ms }))
	out.DevMB = median(pick(func(r Result) float64 { return r.DevMB }))
	out.ReaderMB = median(pick(func(r Result) float64 { return r.ReaderMB }))
	out.RandP50ms = median(pick(func(r Result) float64 { return r.RandP50ms }))
	out.RandP99ms = median(pick(func(r Result) float64 { return r.RandP99ms }))
	out.RandTouchesPerSec = median(pick(func(r Result) float64 { return r.RandTouchesPerSec }))
	out.RandMB = median(pick(func(r Result) float64 { return r.RandMB }))
	out.Runs = nil
	for _, r := range rs {
		out.Runs = append(out.Runs, RunFigures{MBps: r.MBps, RandP99ms: r.RandP99ms, RandTouchesPerSec: r.RandTouchesPerSec})
	}
	return out
}

// medianStart is medianResult for a start condition's runs.
func medianStart(ss []StartResult) StartResult {
	if len(ss) == 1 {
		return ss[0]
	}
	pick := func(f func(StartResult) float64) []float64 { return figures(ss, f) }
	mbps := pick(func(s StartResult) float64 { return s.MBps })
	out := ss[medianIndex(mbps)]
	out.MBps = median(mbps)
	out.RandP99ms = median(pick(func(s StartResult) float64 { return s.RandP99ms }))
	out.RandTouchesPerSec = median(pick(func(s StartResult) float64 { return s.RandTouchesPerSec }))
	out.Runs = nil
	for _, s := range ss {
		out.Runs = append(out.Runs, RunFigures{MBps: s.MBps, RandP99ms: s.RandP99ms, RandTouchesPerSec: s.RandTouchesPerSec})
	}
	return out
}
