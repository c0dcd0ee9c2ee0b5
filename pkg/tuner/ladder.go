package tuner

// One knob's closed-loop state (ladder) and the measure its steps are
// judged by: data only, read and moved by the parts above.

import (
	"fmt"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// ladder is one knob's closed-loop state: the value in force, a step under
// trial, the knee, and the back-off.
type ladder struct {
	kind      ActionKind
	base, cur int // value before the tuner; value kept
	prev      int // the value kept before cur
	first     int // first step when cur is 0 (prefetch)
	dryAt     int // value last reported in dry-run mode
	// hint is the window Little's law says the reader needs (KB, 0 if
	// unknown): the first step from base skips steps smaller than it.
	hint int
	// rejump: the next step may skip to the Little's-law hint from the
	// window in force (a regime began after it was kept).
	rejump bool
	// tried: the value of the last step taken.
	tried int
	// keptAt: when cur last changed (a re-probe waits a period from it).
	keptAt time.Duration
	// baseM: the measure when the first step left base; keptM: when the
	// value in force was kept (what a re-probe and the memory compare with).
	baseM, keptM measure
	// movedAt: when the value in force last changed (a span of requests
	// across it mixes two windows' latencies).
	movedAt time.Duration
	// steadyBefore: a step's gain is judged against the mean of the last
	// two intervals' throughput at the window in force (trial.steady), not
	// the last one alone (set for decisions that rest on the stream's
	// outcome alone: with no regime to confirm it, one interval's dip on a
	// busy host made a step that gained nothing look like +14%).
	steadyBefore bool
	// capKept: the last step was kept on half the margin (marginFor): it
	// took the stream to the device's capacity, so the capacity holds
	// further steps even for a decision judged by rate.
	capKept bool
	// judged: the measure the last verdict was taken on.
	judged measure

	trial   trialStep
	back    backOff
	reprobe reprobeState
	limit   randLimit
	watch   randWatch
	young   youngUndo
	last    lastMeasure
}

// trialStep is the step under trial and what its verdict reads.
type trialStep struct {
	to   int // value under trial, 0 if none
	from int
	at   time.Duration
	// before: the measure the step is judged against, taken at beforeAt;
	// beforeTail: its span showed the stream's tail; later: how many
	// intervals the verdict was put off (tail.go); randLater: put off one
	// interval on the random readers' p99 alone.
	before     measure
	beforeAt   time.Duration
	beforeTail bool
	later      int
	randLater  bool
	// steady: the mean of the last two intervals' throughput at the value
	// left (0 for none, see steadyBefore); high: the higher of the two
	// (the before-measure's alone otherwise): a gain over it is no dip's.
	steady, high float64
	// young: the before-measure took in the stream's start (youngMargin).
	young bool
}

// backOff is the knee and the back-off of the next step.
type backOff struct {
	knee     bool
	failures int
	retryAt  time.Duration
	// The knee's own record (kneeStale, trial.go): the measure at the
	// knee's window when it was found, whether the random readers' loss
	// set it, and the re-probes that found it stale.
	kneeM      measure
	kneeRandom bool
	staleAt    time.Duration
	staleN     int
}

// reprobeState: when the current re-probe of a kept file window (window
// back at base) ends, and the period between re-probes.
type reprobeState struct{ until, every time.Duration }

// randLimit bounds a step beside random readers (random.go): kb, the
// largest window a step may take now (0 for no limit), computed by fn when
// the next step is taken (a verdict just before may have taught what a
// step costs them); no step to ceil or more before ceilUntil.
type randLimit struct {
	kb        int
	fn        func() int
	ceil      int
	ceilUntil time.Duration
}

// randWatch is the watch of what the value in force costs the random
// readers (random.go): the smoothed p99, and which of the last watchSpan
// intervals had the mean over budget, the mean far over it, the p99 over
// budget (a bit each, the latest lowest); at: the interval last watched.
type randWatch struct {
	tail                        float64
	meanOver, meanFar, tailOver uint8
	at                          time.Duration
}

// youngUndo: retry, the step just undone paid the ordinary margin against a
// before-measure that took in the stream's start: tried again once the
// stream is measured whole, with no back-off (policy.go counts it as no
// unpaid trial); undoneAt, when that step was undone, until it is taken
// again (onset.go takes it between Steps once a quarter interval has
// measured the stream whole at the device's window).
type youngUndo struct {
	retry    bool
	undoneAt time.Duration
}

// lastMeasure: the measure of the previous interval with no step under
// trial, when, and at which value.
type lastMeasure struct {
	m   measure
	at  time.Duration
	val int
}

func (l *ladder) inForce() int {
	if l.reprobe.until != 0 {
		return l.base
	}
	if l.trial.to != 0 {
		return l.trial.to
	}
	return l.cur
}

// exhausted: more of this knob alone will not help now.
func (l *ladder) exhausted(max int) bool {
	return l.trial.to == 0 && (l.back.knee || l.cur >= max)
}

type measure struct {
	ok   bool
	tput float64 // bytes/s judged: busy throughput, or rate for decisions judged by rate
	p50  time.Duration
	// rate: the file's bytes per second over the detector's window (what
	// the stream's reader gets, unlike busy throughput, which a larger
	// window raises even for a reader limited by its application).
	rate float64
	// dev: the device's bytes per second over the same window, 0 if unknown;
	// devBusy: its busy throughput (a rate however far back the detector
	// extended its window).
	dev, devBusy float64
	// others: bytes per second of the device's other readers whose share
	// is protected (protectedStream: the other sequential streams
	// readaheadd serves), over the same window.
	others float64
	// streams: the device's other non-random readers, one by one
	// (lossBase leaves out those that ended).
	streams []otherStream
	// othersMustNotLose: judge the step also by those other readers, not
	// only by the device's total.
	othersMustNotLose bool
	// young: tput is the busy throughput of a stream that began inside
	// the measure's span (its start is in it).
	young bool
	// ended: the stream stopped reading inside the span (rate is over
	// the part it read).
	ended bool
	// rand: what the random readers beside the stream get against their
	// budgets (random.go).
	rand randCost
}

func (m measure) String() string {
	if !m.ok {
		return "no data"
	}
	return fmt.Sprintf("%.1f MB/s p50 %v", m.tput/1e6, m.p50)
}

// raised reports whether a file's window is raised (in dry-run mode:
// would be).
func (l *ladder) raised() bool { return l.inForce() > l.base || l.dryAt > l.base }

// otherStream is one of the device's other (not random) readers in a
// measure: what it read, and whether its share is protected.
type otherStream struct {
	key       probe.FileKey
	bps       float64
	protected bool
	// ended: it read nothing over the span's last endedGap.
	ended bool
}

// randCost is what the random readers beside a stream get now against
// their budgets.
type randCost struct {
	n    int           // random readers measured
	mean float64       // the largest share of a mean budget used (above 1: over it)
	tail float64       // the largest p99 against its reference
	max  time.Duration // the largest mean latency
	why  string        // which reader and how, for the evidence
}
