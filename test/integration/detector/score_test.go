package detector_test

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// Eval is the regimes the daemon would hold after one call: after an
// Evaluate, the regimes it reports; after a FastPath that entered
// something (Fast), those of the last Evaluate plus the newly entered ones,
// as the daemon logs them.
type Eval struct {
	Now     time.Duration
	Regimes []detector.Regime
	Fast    bool
}

// Cadence is how a run drives the detector.
type Cadence struct {
	Name     string
	Interval time.Duration // Evaluate every Interval
	Fast     time.Duration // FastPath every Fast; 0: never
	Config   func() detector.Config
}

// DaemonCadence is how cmd/readaheadd drives the detector at its default
// --interval: Evaluate every second, FastPath every 100 ms.
func DaemonCadence() Cadence {
	return Cadence{Name: "daemon", Interval: detector.DefaultInterval,
		Fast: detector.FastPathInterval(detector.DefaultInterval), Config: detector.DefaultConfig}
}

// driver calls the detector and keeps what the daemon would hold.
type driver struct {
	det    *detector.Detector
	evals  []Eval
	active []detector.Regime
	full   int // evaluations (not fast paths)
}

func (dr *driver) evaluate(now time.Duration) []detector.Regime {
	snap := dr.det.Evaluate(now)
	dr.active = snap.Regimes
	dr.evals = append(dr.evals, Eval{Now: now, Regimes: snap.Regimes})
	dr.full++
	var entered []detector.Regime
	for _, r := range snap.Regimes {
		if r.Since == now {
			entered = append(entered, r)
		}
	}
	return entered
}

// fast returns the regimes the fast path entered.
func (dr *driver) fast(now time.Duration) []detector.Regime {
	snap := dr.det.FastPath(now)
	if len(snap.Regimes) == 0 {
		return nil
	}
	dr.active = append(slices.Clone(dr.active), snap.Regimes...)
	dr.evals = append(dr.evals, Eval{Now: now, Regimes: dr.active, Fast: true})
	return snap.Regimes
}

// Replay feeds the recording through a new detector driven at cadence c
// in record time, as the daemon drives it live (on CLOCK_MONOTONIC
// tickers; when both are due, Evaluate first). A record is observed once
// it has completed; live, the probe delivers it up to its poll interval
// later.
func Replay(rec *Recording, c Cadence) []Eval {
	dr := &driver{det: detector.New(c.Config())}
	i := 0
	nextEval, nextFast := rec.Start+c.Interval, rec.Start+c.Fast
	for {
		now := nextEval
		if c.Fast > 0 {
			now = min(now, nextFast)
		}
		if now > rec.End {
			return dr.evals
		}
		for ; i < len(rec.Records) && rec.Records[i].Complete() <= now; i++ {
			dr.det.Observe(rec.Records[i])
		}
		if now == nextEval {
			dr.evaluate(now)
			nextEval += c.Interval
		}
		if c.Fast > 0 && now == nextFast {
			dr.fast(now)
			nextFast += c.Fast
		}
	}
}

// labKinds maps a detector regime to the lab regimes that explain it. A
// starved stream is not a lab regime but the consequence of a slowed file
// (permanent or intrinsic) that a larger window would help.
var labKinds = map[detector.RegimeKind][]string{
	detector.FileLatencyShift: {"permanent"},
	detector.ExtentStart:      {"intrinsic"},
	detector.TailInflation:    {"temporal"},
	detector.Contention:       {"contention"},
	detector.StarvedStream:    {"permanent", "intrinsic"},
}

// primary is the detector regime each lab regime must be recognised as.
var primary = map[string]detector.RegimeKind{
	"permanent":  detector.FileLatencyShift,
	"intrinsic":  detector.ExtentStart,
	"temporal":   detector.TailInflation,
	"contention": detector.Contention,
}

func matches(r detector.Regime, ep Episode) bool {
	if !slices.Contains(labKinds[r.Kind], ep.Kind) || r.Device != ep.Device {
		return false
	}
	return ep.File.IsZero() || r.File == ep.File
}

// KindScore is how well the detector recognised one lab regime.
type KindScore struct {
	Lab       string
	Kind      detector.RegimeKind
	Episodes  int
	Detected  int
	Delays    []time.Duration // onset to first evaluation reporting it, detected episodes
	Clears    []time.Duration // end to first evaluation no longer reporting it (detected episodes that ended)
	Uncleared int             // detected episodes still reported 10 s after their end
}

// InstanceScore counts reported regime instances (runs of consecutive
// evaluations reporting the same kind and target) of one detector kind.
type InstanceScore struct {
	Kind     detector.RegimeKind
	Correct  int // started during an episode of a lab regime that explains it
	False    int
	Evidence []string // of the first false ones
}

// Precision is correct over all reported instances (1 when none was reported).
func (s InstanceScore) Precision() float64 {
	if s.Correct+s.False == 0 {
		return 1
	}
	return float64(s.Correct) / float64(s.Correct+s.False)
}

// Score is the outcome of one run.
type Score struct {
	Interval  time.Duration
	Labs      []KindScore
	Instances []InstanceScore
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return -1
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func maxDur(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return -1
	}
	return slices.Max(ds)
}

type instKey struct {
	kind detector.RegimeKind
	dev  probe.Dev
	file probe.FileKey
}

// ScoreRun matches the evaluations against the episodes.
func ScoreRun(eps []Episode, evals []Eval, interval time.Duration) Score {
	sc := Score{Interval: interval}
	byLab := map[string]*KindScore{}
	for _, lk := range []string{"permanent", "temporal", "intrinsic", "contention"} {
		byLab[lk] = &KindScore{Lab: lk, Kind: primary[lk]}
	}
	active := func(e Eval, ep Episode) bool {
		for _, r := range e.Regimes {
			if r.Kind == primary[ep.Kind] && matches(r, ep) {
				return true
			}
		}
		return false
	}
	for _, ep := range eps {
		ks := byLab[ep.Kind]
		if ks == nil {
			continue
		}
		ks.Episodes++
		detected := false
		for _, e := range evals {
			if e.Now < ep.Onset {
				continue
			}
			if e.Now > ep.End+interval {
				break
			}
			if active(e, ep) {
				ks.Detected++
				ks.Delays = append(ks.Delays, e.Now-ep.Onset)
				detected = true
				break
			}
		}
		if !detected {
			continue
		}
		cleared := false
		for _, e := range evals {
			if e.Now < ep.End {
				continue
			}
			if e.Now > ep.End+10*time.Second {
				break
			}
			if !active(e, ep) {
				ks.Clears = append(ks.Clears, e.Now-ep.End)
				cleared = true
				break
			}
		}
		if !cleared && evals[len(evals)-1].Now > ep.End+10*time.Second {
			ks.Uncleared++
		}
	}
	for _, lk := range []string{"permanent", "temporal", "intrinsic", "contention"} {
		sc.Labs = append(sc.Labs, *byLab[lk])
	}

	byKind := map[detector.RegimeKind]*InstanceScore{}
	for _, k := range detector.Kinds {
		byKind[k] = &InstanceScore{Kind: k}
	}
	prev := map[instKey]bool{}
	for _, e := range evals {
		cur := map[instKey]bool{}
		for _, r := range e.Regimes {
			k := instKey{r.Kind, r.Device, r.File}
			cur[k] = true
			if prev[k] {
				continue
			}
			ok := false
			for _, ep := range eps {
				if matches(r, ep) && e.Now >= ep.Onset && e.Now <= ep.End+interval {
					ok = true
					break
				}
			}
			is := byKind[r.Kind]
			if ok {
				is.Correct++
			} else {
				is.False++
				if len(is.Evidence) < 3 {
					is.Evidence = append(is.Evidence, fmt.Sprintf("at %s: %s", e.Now, r.Evidence))
				}
			}
		}
		prev = cur
	}
	for _, k := range detector.Kinds {
		sc.Instances = append(sc.Instances, *byKind[k])
	}
	return sc
}

// targetsMissed lists the detector's acceptance targets a run missed: every
// episode of every lab regime entered as its kind, the median within 1 s of
// the onset, cleared within 3 s of its end (median) and none still reported
// 10 s after it.
func (s Score) targetsMissed() []string {
	var missed []string
	for _, k := range s.Labs {
		if k.Detected != k.Episodes {
			missed = append(missed, fmt.Sprintf("%s: %d of %d episodes detected as %s", k.Lab, k.Detected, k.Episodes, k.Kind))
		}
		if d := median(k.Delays); len(k.Delays) > 0 && d > time.Second {
			missed = append(missed, fmt.Sprintf("%s: median detection delay %v over 1s (all: %v)", k.Lab, d, k.Delays))
		}
		if c := median(k.Clears); len(k.Clears) > 0 && c > 3*time.Second {
			missed = append(missed, fmt.Sprintf("%s: median clear delay %v over 3s (all: %v)", k.Lab, c, k.Clears))
		}
		if k.Uncleared > 0 {
			missed = append(missed, fmt.Sprintf("%s: %d episodes still reported 10 s after their end", k.Lab, k.Uncleared))
		}
	}
	return missed
}

// Table formats the score as the figures docs/detector.md shows.
func (s Score) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "evaluation every %s\n", s.Interval)
	fmt.Fprintf(&b, "%-11s %-19s %8s %7s %13s %10s %13s %10s %9s\n", "lab regime", "detected as", "episodes", "recall", "median delay", "max delay", "median clear", "max clear", "uncleared")
	for _, k := range s.Labs {
		recall := 0.0
		if k.Episodes > 0 {
			recall = float64(k.Detected) / float64(k.Episodes)
		}
		fmt.Fprintf(&b, "%-11s %-19s %8d %7.2f %13s %10s %13s %10s %9d\n", k.Lab, k.Kind, k.Episodes, recall,
			fmtD(median(k.Delays)), fmtD(maxDur(k.Delays)), fmtD(median(k.Clears)), fmtD(maxDur(k.Clears)), k.Uncleared)
	}
	fmt.Fprintf(&b, "%-19s %9s %7s %9s\n", "reported regime", "correct", "false", "precision")
	for _, is := range s.Instances {
		fmt.Fprintf(&b, "%-19s %9d %7d %9.2f\n", is.Kind, is.Correct, is.False, is.Precision())
	}
	for _, is := range s.Instances {
		for _, ev := range is.Evidence {
			fmt.Fprintf(&b, "false %s %s\n", is.Kind, ev)
		}
	}
	return b.String()
}

func fmtD(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return d.Round(10 * time.Millisecond).String()
}
