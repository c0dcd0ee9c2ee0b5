package bench

import (
	"fmt"
	"math"
)

// The matrix's goals, as ratios to the default window measured in the same
// run.
const (
	// HelpGain: a static window "helps" when its streams beat the
	// default's by this much.
	HelpGain = 1.05
	// StreamsOfBest: where a static window helps, readaheadd's streams
	// reach this share of the best admissible static window's.
	StreamsOfBest = 0.9
	// StreamsOfDefault: where none helps, readaheadd's streams keep this
	// share of the default's.
	StreamsOfDefault = 0.97
	// RandomRate and RandomP99: a random reader keeps at least RandomRate
	// of its touches/s and at most RandomP99 of its p99 (also what makes a
	// static window admissible).
	RandomRate = 0.9
	RandomP99  = 1.10
	// AmpOfDefault bounds the device's read amplification.
	AmpOfDefault = 1.10
	// BucketP99: no second of readaheadd's arm has a random reader's p99
	// above this multiple of the default's p99 (trials included), or above
	// the default's own worst second if that is higher: a second the
	// default's own runs reach is noise, not a cost.
	BucketP99 = 2.0
)

// Met and NotMet are the verdict column's only values.
const (
	Met    = "met"
	NotMet = "not met"
)

// VerdictResult is one scenario's verdict and the figures it rests on.
type VerdictResult struct {
	Verdict string `json:"verdict"`
	// Helps: some static window beats the default by HelpGain.
	Helps bool `json:"helps"`
	// DefaultMBps: the default's streams (mean of its runs); Spread: the
	// two runs' difference over their mean (0 with one run).
	DefaultMBps float64 `json:"default_mbps"`
	Spread      float64 `json:"default_spread"`
	// SpreadP99 is the largest spread of a random reader's p99 between
	// the default's runs.
	SpreadP99 float64 `json:"default_spread_p99,omitempty"`
	BestKB    int     `json:"best_kb"`
	BestMBps  float64 `json:"best_mbps"`
	// BestAdm: the best admissible static window (every random reader at
	// >= RandomRate of its touches/s and <= RandomP99 of its p99).
	BestAdmKB   int     `json:"best_adm_kb"`
	BestAdmMBps float64 `json:"best_adm_mbps"`
	DaemonMBps  float64 `json:"daemon_mbps"`
	// Rate and P99 ratios of each random reader under readaheadd.
	RandRate []float64 `json:"rand_rate"`
	RandP99  []float64 `json:"rand_p99"`
	// WorstBucket: the largest 1 s p99 of a random reader under
	// readaheadd over the default's p99.
	WorstBucket float64 `json:"worst_bucket"`
	// DefaultWorstBucket is the same for the default's own runs: how far
	// its seconds stray from its whole-arm p99 (the noise floor of the
	// bucket rule).
	DefaultWorstBucket float64  `json:"default_worst_bucket"`
	AmpRatio           float64  `json:"amp_ratio"`
	Reasons            []string `json:"reasons,omitempty"`
}

// defaultFigures averages the default's runs: streams, each random
// reader's touches/s and p99, amplification.
func defaultFigures(arms []MatrixArm) (MatrixArm, float64, float64, bool) {
	var runs []MatrixArm
	for _, a := range arms {
		if !a.Daemon && a.KB == DefaultKB {
			runs = append(runs, a)
		}
	}
	if len(runs) == 0 {
		return MatrixArm{}, 0, 0, false
	}
	m := runs[0]
	m.Randoms = append([]RandomFig(nil), runs[0].Randoms...)
	spread, spreadP99 := 0.0, 0.0
	if len(runs) == 2 {
		b := runs[1]
		mean := func(x, y float64) float64 { return (x + y) / 2 }
		rel := func(x, y float64) float64 {
			if x+y == 0 {
				return 0
			}
			return math.Abs(x-y) / mean(x, y)
		}
		spread = rel(m.StreamsMBps, b.StreamsMBps)
		m.StreamsMBps = mean(m.StreamsMBps, b.StreamsMBps)
		m.Amp = mean(m.Amp, b.Amp)
		for i := range m.Randoms {
			if i >= len(b.Randoms) {
				break
			}
			spreadP99 = math.Max(spreadP99, rel(m.Randoms[i].P99ms, b.Randoms[i].P99ms))
			m.Randoms[i].TouchesPerSec = mean(m.Randoms[i].TouchesPerSec, b.Randoms[i].TouchesPerSec)
			m.Randoms[i].P99ms = mean(m.Randoms[i].P99ms, b.Randoms[i].P99ms)
		}
	}
	return m, spread, spreadP99, true
}

// admissible reports whether every random reader of a keeps its rate and
// p99 against base's.
func admissible(a, base MatrixArm) bool {
	for i, r := range a.Randoms {
		b := base.Randoms[i]
		if r.TouchesPerSec < RandomRate*b.TouchesPerSec || r.P99ms > RandomP99*b.P99ms {
			return false
		}
	}
	return true
}

// Verdict judges one scenario's arms (pure: the figures decide).
func Verdict(arms []MatrixArm) VerdictResult {
	v := VerdictResult{Verdict: NotMet}
	base, spread, spreadP99, ok := defaultFigures(arms)
	if !ok {
		v.Reasons = append(v.Reasons, "no default arm")
		return v
	}
	v.DefaultMBps, v.Spread, v.SpreadP99 = base.StreamsMBps, spread, spreadP99
	v.BestKB, v.BestMBps = DefaultKB, base.StreamsMBps
	v.BestAdmKB, v.BestAdmMBps = DefaultKB, base.StreamsMBps
	var dm *MatrixArm
	for i := range arms {
		a := &arms[i]
		if a.Daemon {
			dm = a
			continue
		}
		if a.KB == DefaultKB {
			continue
		}
		if a.StreamsMBps > v.BestMBps {
			v.BestKB, v.BestMBps = a.KB, a.StreamsMBps
		}
		if admissible(*a, base) && a.StreamsMBps > v.BestAdmMBps {
			v.BestAdmKB, v.BestAdmMBps = a.KB, a.StreamsMBps
		}
	}
	if dm == nil {
		v.Reasons = append(v.Reasons, "no readaheadd arm")
		return v
	}
	v.DaemonMBps = dm.StreamsMBps
	for _, a := range arms {
		if a.Daemon || a.KB != DefaultKB {
			continue
		}
		for i, r := range a.Randoms {
			for _, q := range r.P99PerSec {
				v.DefaultWorstBucket = math.Max(v.DefaultWorstBucket, ratio(q, base.Randoms[i].P99ms))
			}
		}
	}
	v.Helps = base.StreamsMBps > 0 && v.BestMBps >= HelpGain*base.StreamsMBps
	fail := func(f string, args ...any) { v.Reasons = append(v.Reasons, fmt.Sprintf(f, args...)) }
	for i, r := range dm.Randoms {
		b := base.Randoms[i]
		rate, p99 := ratio(r.TouchesPerSec, b.TouchesPerSec), ratio(r.P99ms, b.P99ms)
		v.RandRate, v.RandP99 = append(v.RandRate, rate), append(v.RandP99, p99)
		if p99 > RandomP99 {
			fail("random reader %d: p99 %.2fx the default's (max %.2f)", i, p99, RandomP99)
		}
		if v.Helps && rate < RandomRate {
			fail("random reader %d: %.2fx its touches/s (min %.2f)", i, rate, RandomRate)
		}
		worst, at, over := 0.0, 0, 0
		bound := math.Max(BucketP99, v.DefaultWorstBucket)
		for s, q := range r.P99PerSec {
			w := ratio(q, b.P99ms)
			if w > bound {
				over++
			}
			if w > worst {
				worst, at = w, s
			}
		}
		v.WorstBucket = math.Max(v.WorstBucket, worst)
		if over > 0 {
			fail("random reader %d: %d second(s) with p99 above %.2fx the default's p99, the worst %.2fx (second %d)", i, over, bound, worst, at)
		}
	}
	if v.Helps {
		if dm.StreamsMBps < StreamsOfBest*v.BestAdmMBps {
			fail("streams %.2f of the best admissible static window (%d KB; min %.2f)", ratio(dm.StreamsMBps, v.BestAdmMBps), v.BestAdmKB, StreamsOfBest)
		}
		v.AmpRatio = ratio(dm.Amp, base.Amp)
		if v.AmpRatio > AmpOfDefault {
			fail("read amplification %.2fx the default's (max %.2f)", v.AmpRatio, AmpOfDefault)
		}
	} else {
		v.AmpRatio = ratio(dm.Amp, base.Amp)
		if base.StreamsMBps > 0 && dm.StreamsMBps < StreamsOfDefault*base.StreamsMBps {
			fail("streams %.2f of the default (min %.2f) where no static window helps", ratio(dm.StreamsMBps, base.StreamsMBps), StreamsOfDefault)
		}
		// A window kept is a cost unless it paid: a per-file window can gain
		// where no device-wide value does (beside a read-around reader every
		// static window also widens its faults).
		if dm.Kept > 0 && dm.StreamsMBps < HelpGain*base.StreamsMBps {
			fail("%d window(s) kept where no static window helps, the streams %.2f of the default (under %.2f)", dm.Kept, ratio(dm.StreamsMBps, base.StreamsMBps), HelpGain)
		}
	}
	if len(v.Reasons) == 0 {
		v.Verdict = Met
	}
	return v
}

// ratio is a/b; 0 when b is 0 and a is too, and 999 when only b is (a
// reader that got nothing under the default: finite, so that it prints
// and encodes as JSON, and fails every bound).
func ratio(a, b float64) float64 {
	if b == 0 {
		if a == 0 {
			return 0
		}
		return 999
	}
	return a / b
}
