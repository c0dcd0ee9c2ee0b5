package tuner

// Trials: a step is measured one Settle later against the measure before it,
// kept if it paid its margin (judge.go's rules), else undone (back-off, or
// the knee). A kept file window is re-probed now and then.

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

func (l *ladder) next(growth, max int) (int, bool) {
	n := l.cur * growth
	if l.cur == 0 {
		n = l.first
	}
	// From base, or a window kept before a regime began, skip steps too small
	// to hide the reader's latency. Not from a window kept under the same
	// conditions: its latency holds the queue of its own window.
	for (l.cur == l.base || l.rejump) && l.cur > 0 && n < l.hint && n < max {
		n *= growth
	}
	n = min(n, max)
	if l.limit.kb > 0 && l.cur > 0 {
		// Beside random readers: a smaller step, within their budget.
		n = min(n, int(float64(l.cur)*randGrowth), l.limit.kb) / randStepKB * randStepKB
		if float64(n) < randMinStep*float64(l.cur) {
			return l.cur, false
		}
	}
	return n, n > l.cur
}

// drive advances one knob's closed loop: it judges a step under trial and,
// if escalate, takes the next one. It reports whether it did anything.
func (t judgeCtx) drive(l *ladder, d *devState, file probe.FileKey, path string, m measure, why string, escalate bool, apply func(int) error) bool {
	now := t.deps.Clock.Now()
	max := t.cfg.MaxKB
	if l.kind == KindPrefetch {
		max = t.cfg.PrefetchMaxKB
	}
	act := func(kind ActionKind, from, to int, res Result, ev string) {
		t.emit(Action{Time: now, Device: d.name, Dev: d.dev, File: file, Path: path, Kind: kind, FromKB: from, ToKB: to, Result: res, Evidence: ev})
	}
	did := false
	prev := l.last
	l.noteLast(m, now)
	if l.trial.to != 0 {
		e := t.evidenceFor(l, d, file, m, now, max)
		v := judgeTrial(e)
		if v.rule.out == outWait {
			return false
		}
		l.judged = m
		if l.kind == KindFileWindow {
			t.learnCapacity(d, l.trial.from, l.trial.to, l.trial.before, m, d.trimAt > l.trial.at-t.cfg.Settle)
		}
		ev := fmt.Sprintf("%s; before %s, after %s (%+.0f%%, keep margin %+.0f%%)", why, e.before, m, e.gain*100, e.margin*100)
		if e.atCap && e.margin == e.ordinary {
			c, src := t.capacity(d.dev)
			ev += fmt.Sprintf(" (half the margin: the stream alone reads at the device's capacity, %.1f MB/s by its %s)", c/1e6, src)
		}
		if v.rule.out == outResize {
			l.putOff(false)
			t.count(v.rule.event)
			if err := apply(e.resizeTo); err == nil {
				act(l.kind, l.trial.from, e.resizeTo, ResultTrial, fmt.Sprintf("%s; resized to the stream's tail (p99 %v): %s",
					why, t.tails[file].p99.Round(100*time.Microsecond), m))
				l.resize(e.resizeTo, now)
				return true
			}
			// Not resized: the put-off stands; the rules below judge the step as is.
			e.resizeTo, e.later = 0, l.trial.later
			v = judgeTrial(e)
		}
		t.log.Debug("tuner: verdict", "file", file.String(), "kind", l.kind, "rule", v.rule.reason, "gain", e.gain, "margin", e.margin,
			"tail_now", e.tailNow, "tail_before", e.beforeTail, "later", e.later, "cap_mbps", e.capBPS/1e6, "busy_before_mbps", e.before.devBusy/1e6, "busy_mbps", e.m.devBusy/1e6, "rate_before_mbps", e.before.rate/1e6, "rate_mbps", e.m.rate/1e6, "peer_gain_mbps", e.peerGain/1e6, "loss_dev_mbps", e.lossDev/1e6, "loss_others_mbps", e.lossOthers/1e6)
		if w := v.waiver; w != nil {
			ev += "; " + w.clause(&e)
			if w.event != evNone {
				t.count(w.event)
			}
		}
		if v.rule.event != evNone {
			t.count(v.rule.event)
		}
		if r := v.rule.reason; r == rRandomOver || r > rOthersLost {
			// Judged on the random readers, or past the loss rules: learn what a step costs them.
			l.back.kneeRandom = false
			if l.kind != KindPrefetch && l.limit.kb > 0 {
				t.learnRandomSlope(d, l, m)
			}
		}
		var clause string
		if v.rule.clause != nil {
			clause = sep(v.rule.clause(&e))
		}
		switch v.rule.out {
		case outLater, outRandLater:
			l.putOff(v.rule.out == outRandLater)
			return false
		case outRetry:
			from, ok := takeBack(l, now, ev, apply, act)
			if ok {
				l.youngUndone(now, now+t.cfg.Settle-t.cfg.Settle/10)
				act(undoOf(l.kind), from, l.cur, ResultUndone, ev+clause)
			}
			return true
		case outUndoRandom:
			// The knee holds for BackoffMax at once: the step was sized to the random
			// readers' budget, so missing it is no noise; from the base, it bounds it
			// where what the step measured to cost them meets it.
			if l.randomKnee(); l.cur == l.base {
				fit := l.trial.from + int(budgetShare(l.trial.before.rand, m.rand)*float64(l.trial.to-l.trial.from))
				ceil := min(l.trial.to, fit/randStepKB*randStepKB+randStepKB)
				l.limit.setCeil(ceil, now+t.cfg.BackoffMax, l.trial.before.tput/float64(l.trial.from))
				clause += fmt.Sprintf("; no step to %d KB or more for %v", ceil, t.cfg.BackoffMax)
			}
			return t.undoStep(l, now, ev+clause, apply, act)
		case outUndo:
			return t.undoStep(l, now, ev+clause, apply, act)
		}
		if l.kind == KindFileWindow && m.rand.n > 0 {
			l.watch.reset() // beside random readers the watch starts afresh
		}
		act(l.kind, l.trial.from, l.trial.to, ResultKept, ev+clause)
		// A step kept on half the margin reached the device's capacity: no step
		// is left to gain, and each undone one breaks the stream's readahead.
		l.keepStep(m, e.atCap && e.gain < t.cfg.Margin, now)
		did = true
		if l.capKept {
			return did
		}
		// The next step follows at once, measured against this one.
	}
	if !escalate || now < l.back.retryAt {
		return did
	}
	l.back.knee = false // the next step tries past it
	l.limit.refresh()
	next, ok := l.next(t.cfg.Growth, max)
	if !ok || !m.ok {
		return did
	}
	ev := fmt.Sprintf("%s; now %s", why, m)
	if t.cfg.DryRun {
		if l.dryAt != next { // once per value
			l.dryAt = next
			act(l.kind, l.cur, next, ResultDryRun, ev)
		}
		return false
	}
	if err := apply(next); err != nil {
		if errors.Is(err, errRateLimited) || errors.Is(err, errNoReaders) || errors.Is(err, errOutOfScope) {
			return did // deferred, or not ours to act on: no action
		}
		l.failedStep(now, t.backoff)
		act(l.kind, l.cur, next, ResultFailed, fmt.Sprintf("%s; %v; retry in %v", ev, err, t.backoff(l.back.failures)))
		return true
	}
	s := trialStep{to: next, from: l.cur, at: now, before: m, beforeAt: now, beforeTail: t.tailNow(file), high: m.tput}
	if l.steadyBefore && prev.m.ok && !prev.m.young && prev.val == l.cur && now-prev.at <= 2*t.cfg.Settle {
		// Not a measure of the stream's start: that is no part of its steady rate.
		s.steady, s.high = (prev.m.tput+m.tput)/2, math.Max(prev.m.tput, m.tput)
		ev = fmt.Sprintf("%s; judged against %.1f MB/s (this and the last interval's mean)", ev, s.steady/1e6)
	}
	s.young = m.young && s.steady == 0
	l.startStep(s, now)
	act(l.kind, l.cur, next, ResultTrial, ev)
	return true
}

// evidenceFor gathers the facts the verdict on l's step depends on; it changes nothing.
func (t judgeCtx) evidenceFor(l *ladder, d *devState, file probe.FileKey, m measure, now time.Duration, max int) facts {
	e := facts{kind: l.kind, m: m, before: l.trial.before, since: now - l.trial.at, settle: t.cfg.Settle, ended: t.mode == judgeEnded,
		tailNow: t.tailNow(file), beforeTail: l.trial.beforeTail, later: l.trial.later, youngBefore: l.trial.young, atBase: l.cur == l.base, randLater: l.trial.randLater}
	e.keepsEarly = e.beforeSettle() && t.keepsEarly(d, l, m, now)
	if l.trial.steady > 0 {
		e.before.tput = l.trial.steady
	}
	if m.ok && e.before.tput > 0 {
		e.gain = m.tput/e.before.tput - 1
	}
	e.margin, e.atCap = t.marginFor(l, d, file, m)
	e.ordinary = e.margin
	if l.trial.young && e.margin < youngMargin {
		e.margin = youngMargin
	}
	e.resizeTo = t.tailResize(file, l, m, max)
	e.prior, e.tail = t.tailKeep(file, l, m)
	e.shift = t.shiftKeep(file, l, m)
	e.lossDev, e.lossOthers = lossBase(l.trial.before, m)
	if e.before.dev <= 0 && e.before.devBusy <= 0 { // no before of the device: no rise shown; the protected streams reading at the step and now
		e.before.devBusy, e.lossDev, e.lossOthers = m.devBusy, m.dev, 0
		for _, o := range m.streams {
			if f := t.firstRead(o.key); o.protected && !o.ended && f > 0 && f <= l.trial.at {
				e.lossOthers += o.bps
			}
		}
	}
	if e.capBPS, _ = t.capacity(d.dev); e.capBPS <= 0 { // nothing learned yet: the busier rate in hand bounds it from below
		e.capBPS = math.Max(e.before.devBusy, e.m.devBusy)
	}
	e.capFrac = t.cfg.CapacityFrac
	e.peerGain = t.peerGain(l, d, file)
	return e
}

// youngMargin: the keep margin of a step whose before-measure took in the
// stream's start (5-23% below its steady rate): a smaller one kept steps that
// gained only that start.
const youngMargin = 0.4

// capacityReach: a stream reading at least this share of its device's
// learned capacity reads at the device's bandwidth.
const capacityReach = 0.97

// marginFor is the gain a step must bring and whether it was halved: a file
// window step taking a lone stream to capacity (over the better of its
// before-intervals) pays at half, as noise cannot lift a reading past that
// ceiling and the slowdown it masks can be smaller. Beside random readers: full.
func (t judgeCtx) marginFor(l *ladder, d *devState, file probe.FileKey, m measure) (float64, bool) {
	if l.kind == KindDeviceWindow {
		return t.cfg.DeviceMargin, false
	}
	half := t.halfMargin()
	if l.kind == KindFileWindow && t.loneAtCapacity(d, file, m) && l.trial.high > 0 && m.tput >= (1+half)*l.trial.high {
		return half, true
	}
	return t.cfg.Margin, false
}

// loneAtCapacity: a stream with no random reader beside it reads m at capacity.
func (t judgeCtx) loneAtCapacity(d *devState, file probe.FileKey, m measure) bool {
	capBPS, _ := t.capacity(d.dev)
	fd := t.files[file]
	return m.ok && capBPS > 0 && m.tput >= capacityReach*capBPS && fd != nil && !t.randomReaderBeside(fd)
}

// undoStep takes back a step that did not pay: back-off if it was the
// first, the knee if an earlier step had paid.
func (t *Tuner) undoStep(l *ladder, now time.Duration, ev string, apply func(int) error, act func(ActionKind, int, int, Result, string)) bool {
	from, ok := takeBack(l, now, ev, apply, act)
	if !ok {
		return true
	}
	if l.cur == l.base {
		l.failedStep(now, t.backoff)
		ev += fmt.Sprintf("; backing off %v", t.backoff(l.back.failures))
	} else {
		// A knee found by one noisy interval would hold the window short
		// for BackoffMax: confirm it once, BackoffBase later.
		wait := l.atKnee(now, t.cfg.BackoffBase, t.cfg.BackoffMax)
		ev += fmt.Sprintf("; knee at %d KB, probing further in %v", l.cur, wait)
	}
	act(undoOf(l.kind), from, l.cur, ResultUndone, ev)
	return true
}

// takeBack puts back the value before the step and ends the trial; it returns
// the step's value and whether it could (else the step stays, reported failed).
func takeBack(l *ladder, now time.Duration, ev string, apply func(int) error, act func(ActionKind, int, int, Result, string)) (int, bool) {
	from := l.endStep(now)
	if err := apply(l.cur); err != nil && !errors.Is(err, errNoReaders) {
		l.trial.to = from
		act(undoOf(l.kind), from, l.cur, ResultFailed, ev+"; undo failed: "+err.Error())
		return from, false
	}
	return from, true
}

// reprobeStart drops a file window kept long enough back to the device's
// window: under a window that keeps the device saturated the detector cannot
// tell whether the regime is over. It reports whether it started a probe.
func (t *Tuner) reprobeStart(fd *fileDec) bool {
	now := t.deps.Clock.Now()
	l := &fd.win
	// A kept prefetch is taken back too: held, it keeps the stream ahead of
	// the device and the regime would never be seen to end.
	if t.cfg.DryRun || l.trial.to != 0 || fd.pf.trial.to != 0 || (l.cur <= l.base && fd.pf.cur == 0) ||
		slices.Contains(fd.regimes, detector.StarvedStream) || // starved: the window is visibly needed
		!l.reprobeDue(now, t.cfg.ReprobeAfter) {
		return false
	}
	if err := t.pinFile(fd, l.base, nil, true); err != nil {
		if !errors.Is(err, errRateLimited) {
			l.reprobeLater(now) // try again a period later
			t.log.Debug("tuner: re-probe not started", "file", fd.key.String(), "err", err)
		}
		return false
	}
	l.startReprobe(now, now+t.cfg.ReprobeHold)
	if fd.pf.cur > 0 {
		fd.pf.holdTill(l.reprobe.until) // inForce reports no prefetch while the probe holds
		t.emit(fd.action(now, KindPrefetchUndo, fd.pf.cur, 0, ResultTrial,
			fmt.Sprintf("re-probe: prefetch held off for %v with the window", t.cfg.ReprobeHold)))
	}
	if l.cur > l.base {
		t.emit(fd.action(now, KindFileWindowUndo, l.cur, l.base, ResultTrial,
			fmt.Sprintf("re-probe: window kept for %v under regimes %v; back to the device's window for %v to see whether the regime is over", (now-l.keptAt).Round(time.Second), fd.regimes, t.cfg.ReprobeHold)))
	}
	return true
}

// sep prefixes a non-empty clause with "; ".
func sep(s string) string {
	if s == "" {
		return ""
	}
	return "; " + s
}

// reprobeJudge ends a re-probe: the regime cleared at the device's window
// (the decision ends), or it persisted for ReprobeHold (the kept window is
// put back and the next probe waits twice as long).
func (t *Tuner) reprobeJudge(fd *fileDec, needed bool, why string) {
	now := t.deps.Clock.Now()
	l := &fd.win
	if !needed {
		kept := l.cur
		l.endReprobe(now, false, 0)
		fd.pf.holdTill(0) // undoFile reports the prefetch it stops
		if kept > l.base {
			t.emit(fd.action(now, KindFileWindowUndo, kept, l.base, ResultUndone,
				fmt.Sprintf("re-probe: no regime at the device's window (was %v): the %d KB window is no longer needed%s", fd.regimes, kept, sep(why))))
		}
		t.undoFile(fd, "re-probe ended the decision") // stops prefetch; the window is already back
		delete(t.files, fd.key)
		return
	}
	fd.lastNeeded = now
	if now < l.reprobe.until {
		return
	}
	if err := t.pinFile(fd, l.cur, nil, true); err != nil && !errors.Is(err, errNoReaders) {
		if errors.Is(err, errRateLimited) {
			return // next interval
		}
		t.emit(fd.action(now, KindFileWindow, l.base, l.cur, ResultFailed,
			"re-probe: putting the kept window back failed: "+err.Error()))
	} else {
		t.emit(fd.action(now, KindFileWindow, l.base, l.cur, ResultKept,
			fmt.Sprintf("re-probe: regimes %v persist at the device's window after %v%s; the kept window is back, next re-probe in %v", fd.regimes, t.cfg.ReprobeHold, sep(why), min(2*l.reprobe.every, t.cfg.BackoffMax))))
	}
	l.endReprobe(now, true, t.cfg.BackoffMax)
	fd.pf.holdTill(0) // a held prefetch is issued again
}

func (t *Tuner) undoFile(fd *fileDec, why string) {
	now := t.deps.Clock.Now()
	res := ResultUndone
	if t.cfg.DryRun {
		res = ResultDryRun
	}
	if p := fd.pf.inForce(); p > 0 {
		t.emit(fd.action(now, KindPrefetchUndo, p, 0, res, why))
	}
	fd.pf = ladder{}
	w := fd.win.inForce()
	if t.cfg.DryRun {
		if fd.win.dryAt != 0 {
			t.emit(fd.action(now, KindFileWindowUndo, fd.win.dryAt, fd.win.base, res, why))
		}
		return
	}
	if w <= fd.win.base {
		return
	}
	if err := t.pinFile(fd, fd.win.base, nil, false); errors.Is(err, errNoReaders) {
		why += "; readers gone (their open files closed)"
	} else if err != nil {
		res = ResultFailed
		why += "; " + err.Error()
	}
	t.emit(fd.action(now, KindFileWindowUndo, w, fd.win.base, res, why))
}

// A step that clearly pays need not wait for its Step: from half a Settle on,
// every Settle/4 fastVerdict keeps a step whose recent span, all at its
// window, reads earlyKeepGain above its before-measure. Only keeps come early
// (a quarter interval says too little of a loss); beside random readers only
// if each was measured, their trims unchanged, their mean and p99 in budget.
const (
	// earlyKeepGain: three keep margins at the default Margin.
	earlyKeepGain = 0.3
	// earlyRandMean: the random readers' mean/budget under which to keep early.
	earlyRandMean = 0.9
)

// keepsEarly reports whether a file window step may be kept before its Settle:
// half a Settle run, a span of its window only, earlyKeepGain, nothing lost.
func (t judgeCtx) keepsEarly(d *devState, l *ladder, m measure, now time.Duration) bool {
	// A verdict put off (randLater) waits for a whole interval.
	if t.mode != judgeEarly || l.kind != KindFileWindow || l.trial.randLater || now-l.trial.at < t.cfg.Settle/2 || now-l.movedAt < t.span {
		return false
	}
	b := l.trial.before // no before of the device (a prior in the daemon's first interval): nothing lost is unknowable
	if !m.ok || !b.ok || b.tput <= 0 || b.dev <= 0 || m.tput < (1+earlyKeepGain)*b.tput {
		return false
	}
	// Beside random readers: each measured, their trims unchanged, within budget.
	if (m.rand.n > 0 || b.rand.n > 0) && (d == nil || d.trimAt > now-t.span || m.rand.n == 0 ||
		m.rand.n < len(t.randomsBeside(d.dev, probe.FileKey{})) || !(m.rand.mean <= earlyRandMean && m.rand.tail <= randTailBudget)) {
		return false
	}
	bdev, bo := lossBase(b, m)
	devLost := bdev > 0 && m.dev > 0 && m.dev < (1-devLossMax)*bdev
	return !devLost && !(m.othersMustNotLose && bo > 0 && m.others < (1-devLossMax)*bo)
}

// A knee is what the next step did not win when tried. A stream reading
// below kneeStaleDrop of its rate then at the same window (one interval of a
// steady stream varies less) reads under other conditions (host stalls,
// latency short of a regime): the held-back step may pay now.
const kneeStaleDrop = 0.85

// kneeStale ends a file window's knee when the stream, at its window, reads
// below kneeStaleDrop of its rate then; not a random readers' knee (that does
// not depend on the stream's rate). Its re-probes back off like trials.
func (t *Tuner) kneeStale(fd *fileDec, m measure) {
	l := &fd.win
	now := t.deps.Clock.Now()
	if !l.back.knee || l.back.kneeRandom || l.trial.to != 0 || l.reprobe.until != 0 || now >= l.back.retryAt {
		return
	}
	// The measure must come from the knee's window alone; re-probes back off.
	if !m.ok || !l.back.kneeM.ok || l.back.kneeM.rate <= 0 || m.rate >= kneeStaleDrop*l.back.kneeM.rate ||
		now-l.movedAt < t.cfg.Settle || l.back.staleAt != 0 && now-l.back.staleAt < t.backoff(l.back.staleN) {
		return
	}
	t.log.Debug("tuner: stream reads below its rate at the knee", "file", fd.key.String(), "window_kb", l.cur,
		"knee_mbps", l.back.kneeM.rate/1e6, "now_mbps", m.rate/1e6, "p50", m.p50.Round(10*time.Microsecond))
	l.staleKnee(now)
	t.count(EvKneeStale)
}

// slowedFrac: a stream reading below this share of its device's capacity at
// the device's window, with bandwidth to spare, is slowed by its file.
const slowedFrac = 0.8

// shiftKeep says why a file window step short of its margin is kept anyway,
// "" if not: a stream slowed by its file needs a window larger in proportion
// (in flight = rate x latency), and its last steps gain less than noise. Kept
// if it cost nothing and rate x p50 exceeds the window it left. Slowed: the
// FileLatencyShift regime, or at base below slowedFrac of capacity with
// bandwidth to spare. Never beside a random reader; losses are judged after.
func (t judgeCtx) shiftKeep(file probe.FileKey, l *ladder, m measure) string {
	fd := t.files[file]
	// Beside a random reader every step pays in full: its faults wait behind
	// the stream's queue, and a step across a trim change has no reference.
	if fd == nil || !m.ok || l.kind != KindFileWindow || t.randomReaderBeside(fd) ||
		l.trial.before.tput <= 0 || m.tput < l.trial.before.tput || m.p50 <= 0 {
		return ""
	}
	var slowed string
	capBPS, _ := t.capacity(fd.dev.dev)
	switch {
	case slices.Contains(fd.regimes, detector.FileLatencyShift):
		slowed = fmt.Sprintf("the file's requests are slower than the device's (%s)", detector.FileLatencyShift)
	case l.baseM.ok && !l.baseM.young && capBPS > 0 && l.baseM.tput < slowedFrac*capBPS && l.baseM.dev > 0 && l.baseM.dev < t.cfg.CapacityFrac*capBPS:
		slowed = fmt.Sprintf("at its base window it read %.1f MB/s (the device %.1f MB/s), below %.0f%% of the device's %.1f MB/s",
			l.baseM.tput/1e6, l.baseM.dev/1e6, 100*slowedFrac, capBPS/1e6)
	default:
		return ""
	}
	inflightKB := int(m.tput * m.p50.Seconds() / 1024)
	if inflightKB <= l.trial.from {
		return ""
	}
	return fmt.Sprintf("kept without its margin: %s and the step cost it nothing; it keeps about %d KB in flight (p50 %v), more than the %d KB it left",
		slowed, inflightKB, m.p50.Round(100*time.Microsecond), l.trial.from)
}
