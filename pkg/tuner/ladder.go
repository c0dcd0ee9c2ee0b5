package tuner

// One knob's closed-loop state (ladder), its transitions, and its measure.

import (
	"fmt"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// ladder is one knob's closed-loop state: the value in force, a step under
// trial, the knee, and the back-off.
type ladder struct {
	kind ActionKind
	// base, cur, prev: the value before the tuner, kept, kept before cur;
	// first: the first step when cur is 0 (prefetch); dryAt: the value last
	// reported in dry-run mode; tried: the value of the last step taken.
	base, cur, prev, first, dryAt, tried int
	// hint: the window Little's law says the reader needs (KB, 0: unknown); a
	// step from base, or from the value in force when rejump, skips smaller ones.
	hint   int
	rejump bool
	// keptAt: when cur last changed; movedAt: when the value in force did
	// (spans across it mix two windows); baseM, keptM: the measures when the
	// first step left base and when the value in force was kept; judged: the
	// last verdict's.
	keptAt, movedAt      time.Duration
	baseM, keptM, judged measure
	// steadyBefore: judge a gain against the mean of the last two intervals
	// (trial.steady): an outcome-only decision's one-interval dip fakes gains.
	// capKept: the last step was kept on half the margin (marginFor): the
	// capacity holds further steps, even for a decision judged by rate.
	steadyBefore, capKept bool

	trial trialStep
	back  backOff
	// reprobe: when the current re-probe ends, and the period between them.
	reprobe struct{ until, every time.Duration }
	limit   randLimit
	watch   randWatch
	// young: retry, the step just undone paid the ordinary margin but not the
	// start's: retried once the stream is measured whole, with no back-off;
	// undoneAt: when, until taken again (onset.go may take it between Steps).
	young struct {
		retry    bool
		undoneAt time.Duration
	}
	last lastMeasure
}

// trialStep is the step under trial (to, 0 if none, from from since at) and
// what its verdict reads: before, put-offs, steady and high (the mean and the
// higher of the last two intervals at the value left). A step ends with to
// alone zeroed (a knee keeps before); the next step sets every field.
type trialStep struct {
	to, from, later   int
	at, beforeAt      time.Duration
	before            measure
	beforeTail, young bool
	randLater         bool
	steady, high      float64
}

// backOff: the knee, and the failures holding the next step until retryAt;
// for kneeStale: the measure at the knee, whether the random readers' loss
// set it, and the re-probes that found it stale.
type backOff struct {
	knee, kneeRandom bool
	failures, staleN int
	retryAt, staleAt time.Duration
	kneeM            measure
}

// randLimit bounds a step beside random readers (random.go): kb, the largest
// window a step may take now (0: no limit), from fn at each next step; no
// step to ceil or more before ceilUntil, ceil taken at perKB bytes/s of the
// stream per KB of its window.
type randLimit struct {
	kb, ceil  int
	fn        func() int
	ceilUntil time.Duration
	perKB     float64
}

// randWatch watches what the value in force costs the random readers
// (random.go): the smoothed p99, and bits (latest lowest) of the last
// watchSpan intervals with the mean over, far over, the p99 over budget.
type randWatch struct {
	tail                        float64
	meanOver, meanFar, tailOver uint8
	at                          time.Duration
}

// lastMeasure: the last measure with no step under trial, when, at which value.
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

type measure struct {
	ok   bool
	tput float64 // bytes/s judged: busy throughput, or rate for decisions judged by rate
	p50  time.Duration
	// rate: the file's bytes/s over the detector's window: what its reader
	// gets (busy throughput rises with the window even for an app-bound reader).
	rate float64
	// dev: the device's bytes/s over the same window, 0 if unknown; devBusy:
	// its busy throughput (a rate however far back the detector's window goes).
	dev, devBusy float64
	// others: bytes/s of the device's other readers whose share is protected
	// (protectedStream), over the same window; random: its random readers'.
	others, random float64
	// streams: the device's other non-random readers (lossBase drops ended ones).
	streams []otherStream
	// othersMustNotLose: judge the step by those readers too, not only the total.
	othersMustNotLose bool
	// young: tput is that of a stream that began inside the measure's span.
	young bool
	// ended: the stream stopped inside the span (rate covers the part it read).
	ended bool
	// rand: what the random readers beside it get against budgets (random.go).
	rand randCost
}

func (m measure) String() string {
	if !m.ok {
		return "no data"
	}
	return fmt.Sprintf("%.1f MB/s p50 %v", m.tput/1e6, m.p50)
}

// raised reports whether a file's window is raised (dry run: would be).
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

// randCost is what the random readers beside a stream get against budgets.
type randCost struct {
	n    int           // random readers measured
	mean float64       // the largest share of a mean budget used (above 1: over it)
	tail float64       // the largest p99 against its reference
	max  time.Duration // the largest mean latency
	why  string        // which reader and how, for the evidence
}

// The ladder's transitions; when to take each is the callers'. startStep from
// base measures the base too (s.before); begin takes a prior's step; putOff
// with rand defers on the random readers' p99; keepStep resets the back-off
// (atCap: kept on half the margin); keepAt's prev is the watch's fallback;
// backToBase also clears the knee; endStep returns the step's value, and
// resume puts it back when taking it back failed.
func (l *ladder) startStep(s trialStep, now time.Duration) {
	baseM := l.baseM
	if s.from == l.base {
		baseM = s.before
	}
	l.begin(s, baseM, now)
	l.rejump, l.tried = false, s.to
}
func (l *ladder) begin(s trialStep, baseM measure, now time.Duration) {
	l.trial, l.baseM, l.movedAt = s, baseM, now
}
func (l *ladder) resize(kb int, now time.Duration) {
	l.trial.to, l.trial.at, l.movedAt, l.tried = kb, now, now, kb
}
func (l *ladder) putOff(rand bool) {
	if rand {
		l.trial.randLater = true
	} else {
		l.trial.later++
	}
}
func (l *ladder) keepStep(m measure, atCap bool, now time.Duration) {
	l.prev, l.cur, l.trial.to, l.keptAt, l.keptM = l.cur, l.trial.to, 0, now, m
	l.back.failures, l.back.staleN, l.capKept = 0, 0, atCap
}
func (l *ladder) keepAt(kb, prev int, now time.Duration) {
	l.prev, l.cur, l.keptAt, l.movedAt = prev, kb, now, now
}
func (l *ladder) endStep(now time.Duration) (to int) {
	to, l.trial.to, l.movedAt = l.trial.to, 0, now
	return to
}

// The knee and the back-off: failedStep waits wait(failures); atKnee confirms
// a first knee after first, then holds it for hold (the wait returned);
// randomKnee holds at once (the random readers' loss undid it); retryNow ends
// the wait (with knee, the knee); staleKnee counts (the next such re-probe
// waits longer).
func (l *ladder) failedStep(now time.Duration, wait func(int) time.Duration) {
	l.back.failures, l.back.retryAt = l.back.failures+1, now+wait(l.back.failures+1)
}
func (l *ladder) atKnee(now, first, hold time.Duration) time.Duration {
	l.back.knee, l.back.kneeM = true, l.trial.before
	l.back.failures++
	wait := hold
	if l.back.failures == 1 {
		wait = first
	}
	l.back.retryAt = now + wait
	return wait
}
func (l *ladder) randomKnee() {
	if l.cur != l.base {
		l.back.failures = max(l.back.failures, 1)
	}
	l.back.kneeRandom = true
}
func (l *ladder) retryNow(knee bool) { l.back.retryAt, l.back.knee = 0, l.back.knee && !knee }
func (l *ladder) clearBack() {
	l.back.knee, l.back.kneeRandom, l.back.retryAt, l.back.failures = false, false, 0, 0
}
func (l *ladder) staleKnee(now time.Duration) {
	l.clearBack()
	l.back.staleAt, l.back.staleN = now, l.back.staleN+1
}
func (l *ladder) regimeBegan() { l.rejump = true }

// The young retry: the step undone is tried again at retryAt, or sooner
// between Steps; youngRetried reports whether the step just judged was one.
func (l *ladder) youngUndone(now, retryAt time.Duration) {
	l.young.retry, l.back.retryAt, l.young.undoneAt = true, retryAt, now
}
func (l *ladder) youngTaken() { l.young.undoneAt = 0 }
func (l *ladder) youngRetried() (r bool) {
	r, l.young.retry = l.young.retry, false
	return r
}

// The re-probe: due a period after the window was kept (first, until one
// ran). It holds the base until until (holdTill: the prefetch off with it);
// at its end, if needed, the kept window is back and the next waits twice as
// long, up to most; else the base stays.
func (l *ladder) reprobeDue(now, first time.Duration) bool {
	if l.reprobe.every == 0 {
		l.reprobe.every = first
	}
	return now-l.keptAt >= l.reprobe.every
}
func (l *ladder) reprobeLater(now time.Duration)        { l.keptAt = now }
func (l *ladder) startReprobe(now, until time.Duration) { l.reprobe.until, l.movedAt = until, now }
func (l *ladder) holdTill(until time.Duration)          { l.reprobe.until = until }
func (l *ladder) endReprobe(now time.Duration, needed bool, most time.Duration) {
	l.reprobe.until, l.movedAt = 0, now
	if !needed {
		l.cur = l.base
		return
	}
	l.keptAt, l.reprobe.every = now, min(2*l.reprobe.every, most)
}

// aim sets hint and steadyBefore; noteLast records the next step's reference
// (the last measure with no step under trial).
func (l *ladder) aim(hint int, steady bool) { l.hint, l.steadyBefore = hint, steady }
func (l *ladder) noteLast(m measure, now time.Duration) {
	if l.trial.to == 0 && l.reprobe.until == 0 && m.ok {
		l.last = lastMeasure{m, now, l.cur}
	}
}
func (l *ladder) forgetLast() { l.last.m = measure{} }

// The watch starts afresh; the limit is computed by fn (nil: none), now
// and again on refresh; no step to ceil or more before until.
func (w *randWatch) reset()              { *w = randWatch{at: w.at} }
func (r *randLimit) setFn(fn func() int) { r.kb, r.fn = 0, fn; r.refresh() }
func (r *randLimit) refresh() {
	if r.fn != nil {
		r.kb = r.fn()
	}
}
func (r *randLimit) setCeil(kb int, until time.Duration, perKB float64) {
	r.ceil, r.ceilUntil, r.perKB = kb, until, perKB
}
