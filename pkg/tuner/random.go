package tuner

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// Random readers beside a stream wait behind the bytes its window keeps
// queued, so a larger window is judged by their latency against their
// reference (their service with nothing readaheadd does in force): the goal
// is 95% of their rate and their p99 within 10% of the default's, the budgets
// inside it by the noise. The mean sizes steps and decides verdicts; the p99,
// noisier, is smoothed and watched (docs/tuner-rules.md).
const (
	// randMeanBudget, randTailBudget: a random reader's mean and p99 latency,
	// as a share of its reference, that a stream's window may cost it: inside
	// the goal's 0.95x rate and 1.1x p99 by the noise of a few intervals.
	randMeanBudget = 0.90
	randTailBudget = 1.05
	// randMeanBudgetUntrimmed: the mean budget of a reader no trim gives room:
	// the goal's own 5% (a margin below its reference would rule out any step).
	randMeanBudgetUntrimmed = 1.05
	// randMeanBudgetEstimated: against an estimated reference
	// (untouchedEstimate), whose account of the windows' cost is the margin.
	randMeanBudgetEstimated = 1.0
	// randMeanNear: a verdict whose random readers' mean is over budget by no
	// more than this (their p99 not far off) waits one more interval.
	randMeanNear = 1.03
	// randTailSevere: a p99 this many times the reference undoes a step
	// at its verdict; below it the smoothed p99 decides (watchRandom).
	randTailSevere = 1.6
	// randGrowth: a window step beside random readers is at most this
	// factor; randMinStep: a smaller one than this is not worth a trial.
	randGrowth  = 1.5
	randMinStep = 1.2
	// randSlopeFloor: the delay per KB is taken as at least this share of
	// the prior (a step that cost them nothing says little about the next).
	randSlopeFloor = 0.05
	// randStepKB: windows beside random readers are multiples of this.
	randStepKB = 16
	// watchSpan, watchOver: a kept window beside random readers comes down when
	// watchOver of the last watchSpan intervals went over budget (watchRandom).
	watchSpan = 5
	watchOver = 3
	// randMeanFar: a mean this many times its budget two intervals in a
	// row brings a kept window down at once.
	randMeanFar = 1.5
)

// add records one interval's cost r at now in the watch.
func (w *randWatch) add(r randCost, now time.Duration) {
	if w.tail == 0 {
		w.tail = 1 // the step was sized to fit
	}
	w.at, w.tail = now, (1-randTailAlpha)*w.tail+randTailAlpha*r.tail
	w.meanOver, w.meanFar = watchPush(w.meanOver, r.mean > 1), watchPush(w.meanFar, r.mean >= randMeanFar)
	w.tailOver = watchPush(w.tailOver, r.tail > randTailBudget)
}

// watchPush records one interval, over or not, in a watchSpan history.
func watchPush(h uint8, over bool) uint8 {
	h <<= 1
	if over {
		h |= 1
	}
	return h & (1<<watchSpan - 1)
}

// over reports whether the random readers are over their budget in one
// interval: their mean over its budget, or their p99 far off.
func (c randCost) over() bool { return c.n > 0 && (c.mean > 1 || c.tail >= randTailSevere) }

// randomCost: what dev's random readers (but except) get now against budget.
func (t judgeCtx) randomCost(dev probe.Dev, except probe.FileKey) randCost {
	var c randCost
	worst := -1.0
	for _, r := range t.randomsBeside(dev, except) {
		if !r.ok || r.ref == nil || r.ref.svc.mean <= 0 || r.ref.svc.tail <= 0 {
			continue
		}
		c.n++
		c.max = max(c.max, r.svc.mean)
		cm := float64(r.svc.mean) / (t.meanBudget(r) * float64(r.ref.svc.mean))
		refTail, sure, estimated := t.tailRef(r)
		tr := float64(r.svc.tail) / float64(refTail)
		if far := float64(r.svc.tail) / float64(r.ref.svc.tail); far >= randTailSevere && far > tr {
			// Far off its reference counts, whatever the floored account says.
			refTail, sure, estimated, tr = r.ref.svc.tail, true, false, far
		}
		if !sure && tr < randTailSevere {
			// An unsure p99 reference cannot hold a stream within 10%: its
			// p99 counts only far off; its mean still holds the reader's rate.
			tr = min(tr, 1)
		}
		c.mean, c.tail = max(c.mean, cm), max(c.tail, tr)
		if w := max(cm, tr/randTailBudget); w > worst {
			worst = w
			c.why = fmt.Sprintf("the random reader %s beside it: mean %v p99 %v against its reference %v / %v (budget %.2fx / %.2fx)",
				r.key, r.svc.mean.Round(10*time.Microsecond), r.svc.tail.Round(10*time.Microsecond),
				r.ref.svc.mean.Round(10*time.Microsecond), refTail.Round(10*time.Microsecond), t.meanBudget(r), randTailBudget)
			if estimated {
				c.why += fmt.Sprintf(", its p99 the device's window's by the account of the windows raised beside it (measured %v)",
					r.ref.svc.tail.Round(10*time.Microsecond))
			}
		}
	}
	return c
}

// meanBudget is a random reader's mean budget as a share of its reference:
// with a margin when its trim gives it room (trimmed, or reading around
// with the device's window, its trim not backed off), else the goal's own
// 5%. An estimated reference already errs on the reader's side: no margin.
func (t *Tuner) meanBudget(r randObs) float64 {
	if t.trims[r.key] != nil || t.trimMayCome(r.key, r.fs) {
		if r.ref != nil && !r.ref.clean {
			return randMeanBudgetEstimated
		}
		return randMeanBudget
	}
	return randMeanBudgetUntrimmed
}

// randomLimitKB is the largest value l (a file's window, or d's with except
// zero) may try given the random readers on d but except, with why: 0 when no
// step may be tried now, -1 with none. An untrimmed reader's trim comes with it.
func (t judgeCtx) randomLimitKB(d *devState, except probe.FileKey, l *ladder) (int, string) {
	rs := t.randomsBeside(d.dev, except)
	if len(rs) == 0 {
		if k, ok := t.knownRandomOn(d.dev, except); ok {
			return 0, fmt.Sprintf("the random reader %s beside it is not in this view: the Step sizes the step", k)
		}
		return -1, ""
	}
	capBPS := t.capacityOrBusy(d.dev)
	if capBPS <= 0 {
		return 0, "the device's capacity is not known yet"
	}
	perByte := randSlack / capBPS // seconds of delay per byte queued ahead
	learned := d.randSlope > 0
	if learned {
		// Twice what the last steps cost them (the delay grows faster
		// than the window near saturation), never more than the prior.
		perByte = min(perByte, max(2*d.randSlope, randSlopeFloor*perByte))
	}
	trimComes, trimmed := false, false
	room := time.Duration(1<<62 - 1)
	tailKB := math.MaxInt
	for _, r := range rs {
		if r.ref == nil {
			return 0, fmt.Sprintf("the random reader %s beside it has no reference yet", r.key)
		}
		if !r.ok {
			continue // too few requests now to measure; its reference stands for it
		}
		refTail, tailSure, _ := t.tailRef(r)
		if l.inForce() > l.base && r.svc.tail > time.Duration(randTailBudget*float64(refTail)) {
			// Its p99 is over budget already: no step further (its trim
			// lowers the mean, which sizes steps, far more than the p99).
			// Held back, not lowered: the watch lowers, over intervals.
			return 0, fmt.Sprintf("the random reader %s beside it is over its p99 budget now: %v against %.2fx its reference %v",
				r.key, r.svc.tail.Round(10*time.Microsecond), randTailBudget, refTail.Round(10*time.Microsecond))
		}
		// Sized by the mean, steady between intervals (the p99 is watched).
		cur := r.svc.mean
		trimmed = trimmed || t.trims[r.key] != nil
		spared := 0.0 // bytes per request its coming trim spares it
		if t.trimMayCome(r.key, r.fs) {
			// Its trim comes with the step: each request reads TrimKB.
			spared = max(0, r.svc.size-float64(t.cfg.TrimKB*1024))
			less := time.Duration(spared * randSlack / capBPS * float64(time.Second))
			cur = max(cur-less, cur/4)
			trimComes = true
		}
		room = min(room, time.Duration(float64(r.ref.svc.mean)*t.meanBudget(r))-cur)
		if tailSure && r.svc.requests >= refreshTailRequests {
			if r.ref.reopens {
				spared = 0 // its trim spares its re-opens' first faults nothing
			}
			tailKB = min(tailKB, t.tailLimitKB(d, l, r, refTail, spared, capBPS))
		}
	}
	// Steps under trial beside them are not in their measure yet: one budget
	// serves every step on the device.
	_, pending := t.raisedBytes(d, except)
	if room -= time.Duration(pending * perByte * float64(time.Second)); room <= 0 {
		return 0, "the random readers beside it have no budget left"
	}
	w := l.inForce()
	kb := w + int(room.Seconds()/perByte/1024)
	if tailKB < kb {
		if float64(tailKB) < randMinStep*float64(w) {
			return 0, fmt.Sprintf("the random readers' p99 budget allows %d KB", tailKB)
		}
		return budgetStep(tailKB, w), fmt.Sprintf("the random readers' p99 budget allows %d KB", tailKB)
	}
	settled := !trimmed || d.trimAt <= t.deps.Clock.Now()-t.cfg.Settle
	if !learned && !trimComes && settled && pending == 0 && float64(kb) < randMinStep*float64(w) {
		// What a KB costs them here is not known (the prior may be
		// several times it) and trims are settled: one small step shows
		// it, its verdict holding them to budget (learnRandomSlope).
		return minStepKB(w), "a small step shows what the stream's window costs the random readers on this device"
	}
	return budgetStep(kb, w), fmt.Sprintf("the random readers' budget allows %d KB", kb)
}

// budgetStep is the largest randStepKB-grid window a stream at w may try when
// the budget allows kb: the grid window at or below kb, or the smallest step
// worth a trial if within a grid step above (the verdict holds the budget).
func budgetStep(kb, w int) int {
	lim := kb / randStepKB * randStepKB
	if m := minStepKB(w); m <= kb+randStepKB {
		lim = max(lim, m)
	}
	return lim
}

// tailLimitKB is the largest value l may hold by what reader r's p99 may
// still take against refTail (tailRef): each KB costs tailPerByte;
// a coming trim spares each request spared bytes' transfer.
func (t *Tuner) tailLimitKB(d *devState, l *ladder, r randObs, refTail time.Duration, spared, capBPS float64) int {
	cur := r.svc.tail - time.Duration(spared/capBPS*float64(time.Second))
	room := time.Duration(randTailBudget*float64(refTail)) - cur
	return l.inForce() + int(room.Seconds()/tailPerByte(d, capBPS)/1024)
}

// minStepKB is the smallest step from w worth a trial, on the randStepKB grid.
func minStepKB(w int) int {
	return (int(randMinStep*float64(w)) + randStepKB - 1) / randStepKB * randStepKB
}

// budgetShare: the share of a step that met the random readers' budget by their
// mean and p99 (b before, a after; linear in the bytes queued); all of it if they
// were over before (the budget counts on a trim the before-measure did not have).
func budgetShare(b, a randCost) float64 {
	share := func(b, a, limit float64) float64 {
		if a <= limit || b >= limit {
			return 1
		}
		return (limit - b) / (a - b)
	}
	return min(share(b.mean, a.mean, 1), share(b.tail, a.tail, randTailBudget))
}

// learnRandomSlope learns from a step judged beside random readers what
// each byte queued costs them (their worst mean latency after against before,
// over the bytes added); not across a change of their trims.
func (t *Tuner) learnRandomSlope(d *devState, l *ladder, m measure) {
	b := l.trial.before
	if b.rand.max <= 0 || m.rand.max <= 0 || l.trial.to <= l.trial.from || d.trimAt > l.trial.at-t.cfg.Settle {
		return
	}
	slope := max(0, (m.rand.max-b.rand.max).Seconds()) / float64((l.trial.to-l.trial.from)*1024)
	if d.randSlope > 0 {
		slope = (d.randSlope + slope) / 2
	}
	if slope == 0 {
		slope = 1e-18 // learned: nothing
	}
	d.randSlope = slope
}

// deferBesideRandom puts off by a quarter interval the first step of a
// regime the detector's fast path entered beside random readers, so that
// fastOnset takes it on references refreshed in the new conditions.
// randomNow: the recent requests hold a random reader on dev, unknown to the
// tuner's view before its first Step. It reports whether it deferred.
func (t judgeCtx) deferBesideRandom(fd *fileDec, dev probe.Dev, now time.Duration, randomNow bool) bool {
	if !randomNow && !t.randomBesideDev(dev, fd.key) || !t.untouched(fd.dev) {
		return false
	}
	fd.deferUntil = now + t.cfg.Settle/freshSpanDiv
	t.log.Debug("tuner: a regime's first step beside random readers waits for their service in the new conditions", "file", fd.key.String(),
		"until", fd.deferUntil)
	return true
}

// watchRandom follows what a kept window costs the random readers beside
// it, once per interval (m: the Step's measure): when watchOver of the last
// watchSpan intervals went over budget (the p99 with its smoothed value) it
// lowers the window to the one kept before, with a ceiling for BackoffMax
// (one or two stray intervals prove nothing). It reports whether it did.
func (t judgeCtx) watchRandom(fd *fileDec, m measure) bool {
	l := &fd.win
	if m.rand.n == 0 || l.cur <= l.base {
		l.watch.reset()
		return false
	}
	now := t.deps.Clock.Now()
	if l.trial.to != 0 || l.reprobe.until != 0 || l.watch.at == now {
		return false // once per interval, on the window in force
	}
	l.watch.add(m.rand, now)
	tailOver := bits.OnesCount8(l.watch.tailOver) >= watchOver && l.watch.tail > randTailBudget
	// A mean far over budget two intervals in a row is no stray: a
	// window raised before the reader was known.
	meanFar := l.watch.meanFar&3 == 3
	if !tailOver && !meanFar && bits.OnesCount8(l.watch.meanOver) < watchOver {
		return false
	}
	from, to := l.cur, max(l.prev, l.base)
	if err := t.pinFile(fd, to, nil, true); err != nil {
		return false // tried again next interval
	}
	l.keepAt(to, max(l.base, to*2/3/randStepKB*randStepKB), now)
	l.watch.reset()
	if slices.ContainsFunc(t.randomsBeside(fd.dev.dev, fd.key), func(r randObs) bool { return t.trimMayCome(r.key, r.fs) }) {
		// A reader beside it still reads around untrimmed: its cost now
		// says nothing of its cost trimmed, so no ceiling.
		l.limit.setCeil(0, 0, 0)
		t.emit(fd.action(now, KindFileWindowUndo, from, to, ResultUndone,
			fmt.Sprintf("over budget over the last intervals: %s; the reader reads around untrimmed: no ceiling, its trim comes with the next step", m.rand.why)))
		return true
	}
	// A ceiling, not a knee: half way back to the window that went
	// over stays out of reach; the stream may still grow below it.
	l.limit.setCeil(max((from+to)/2/randStepKB*randStepKB, to+randStepKB), now+t.cfg.BackoffMax, m.tput/float64(from))
	t.emit(fd.action(now, KindFileWindowUndo, from, to, ResultUndone,
		fmt.Sprintf("over budget over the last intervals: %s; no window of %d KB or more for %v", m.rand.why, l.limit.ceil, t.cfg.BackoffMax)))
	return true
}
