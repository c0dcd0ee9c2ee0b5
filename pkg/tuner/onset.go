package tuner

import (
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// A stream can slow just after a Step; the next Step sees it an interval
// later. So every Settle/4 fastOnset checks the last Step's streams: one
// whose recent rate fell well below its Step rate with slower requests (or
// fell less, on two checks running) and is window-bound takes its step at
// once, within the Step's bounds, judged by the Step one Settle later.
const (
	// onsetDrop: the recent rate must be below this share of the Step's
	// (a 250 ms span of a healthy stream varies less).
	onsetDrop = 0.7
	// onsetMinRequests: the fewest recent requests a slowed stream is judged
	// on; below freshMinRequests as a slowdown thins them out.
	onsetMinRequests = 16
	// onsetMildDrop, onsetMildSlower: a milder slowdown, taken on the second
	// check running (one quarter interval strays that far, two don't).
	onsetMildDrop   = 0.85
	onsetMildSlower = 1.2
)

// slowerNow: recent requests slower than at the last Step (median 1.5x, or
// a new tail). A rate that fell at unchanged latency is the reader's.
func slowerNow(last, recent detector.FileStats) bool {
	return last.P50 > 0 && recent.P50 > 0 && (recent.P50 >= last.P50*3/2 || recent.P99 >= 2*recent.P50 && last.P99 < 2*last.P50)
}

// onsetStreams returns the candidates and span, at most every Settle/4.
func (t *Tuner) onsetStreams() ([]probe.FileKey, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.deps.Clock.Now()
	if t.scope.Empty() || now-t.onsetAt < t.cfg.Settle/onsetEvery {
		return nil, 0
	}
	t.onsetAt = now
	maps.DeleteFunc(t.onsetMild, func(_ probe.FileKey, at time.Duration) bool { return now-at > t.cfg.Settle })
	var keys []probe.FileKey
	for k, fs := range t.fstats {
		if t.onsetCandidate(k, fs) {
			keys = append(keys, k)
		}
	}
	for k, fd := range t.files {
		if (fd.deferUntil != 0 || fd.win.young.undoneAt != 0) && !slices.Contains(keys, k) {
			// Put off beside random readers, or undone to be measured whole.
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, compareKeys)
	return keys, t.cfg.Settle / freshSpanDiv
}

// onsetCandidate: a stream read at the last Step that may be stepped now.
func (t *Tuner) onsetCandidate(k probe.FileKey, fs detector.FileStats) bool {
	if fs.Sequentiality < t.cfg.MinSequentiality || fs.Bytes == 0 || t.snap.Now-fs.LastSeen > t.cfg.Settle || t.trims[k] != nil || t.mem.Checking(k) {
		return false
	}
	fd := t.files[k]
	if first, fresh := t.fresh[k]; fresh && t.deps.Clock.Now()-first <= t.cfg.Settle {
		// fastOutcome's, unless read a quarter interval with no step since
		// (fastOutcome averages the whole life, hiding an onset).
		if t.snap.Now-first < t.cfg.Settle/onsetEvery || fd != nil && (fd.win.trial.to != 0 || fd.win.movedAt > first) {
			return false
		}
	}
	// A step under trial is no bar: fastOnset ends it unjudged.
	return fd == nil || fd.win.reprobe.until == 0 && !fd.outOfScope
}

// abandonTrial ends unjudged a trial an onset fell in (its span mixes both
// conditions); the kept value returns with no back-off or knee.
func (t *Tuner) abandonTrial(fd *fileDec, l *ladder, now time.Duration) {
	from := l.endStep(now)
	t.emit(fd.action(now, undoOf(l.kind), from, l.cur, ResultUndone,
		"the stream slowed during the trial: ended unjudged, a step for the new conditions follows"))
	t.count(EvOnsetInTrial)
}

// fastOnset steps onsetStreams whose recent rate fell while window-bound.
func (t *Tuner) fastOnset(snap detector.Snapshot, span time.Duration) []Action {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out = nil
	if t.scope.Empty() || span <= 0 {
		return nil
	}
	now := t.deps.Clock.Now()
	j := t.on(snap, span, judgeStep)
	j.stepDeferred(now)
	j.retryYoung(now)
	type cand struct {
		key  probe.FileKey
		step float64 // bytes/s at the last Step
	}
	var cands []cand
	for _, f := range snap.Files {
		last, ok := t.fstats[f.Key]
		if !ok || !t.onsetCandidate(f.Key, last) || f.Requests < onsetMinRequests {
			continue
		}
		if t.peerStepIn(snap.Files, f, now, span) {
			delete(t.onsetMild, f.Key)
			continue
		}
		stepRate := float64(last.Bytes) / t.cfg.Settle.Seconds()
		// Read unbroken (since its open, first read or last resumption) for
		// part of the interval: its busy rate.
		since := max(t.fresh[f.Key], t.firstRead(f.Key))
		for _, r := range t.readers[f.Key] {
			since = max(since, r.resumedAt)
		}
		if since > t.snap.Now-t.cfg.Settle && last.BusyThroughput > 0 {
			stepRate = last.BusyThroughput
		}
		slower := slowerNow(last, f)
		refP50 := last.P50
		if fd := t.files[f.Key]; fd != nil && (fd.win.trial.to != 0 || fd.win.movedAt != 0 && now-fd.win.movedAt < t.cfg.Settle) {
			// Measured at another window: use the trial's before-measure;
			// lacking a p99, only a strong tail counts.
			b := fd.win.trial.before
			if !b.ok || b.rate <= 0 || fd.win.trial.to == 0 && fd.win.inForce() != fd.win.trial.from {
				continue
			}
			stepRate, refP50 = b.rate, b.p50
			slower = f.P50 > 0 && b.p50 > 0 && (f.P50 >= b.p50*3/2 || f.P99 >= time.Duration(tailStrongBase*float64(f.P50)))
		}
		rate := float64(f.Bytes) / span.Seconds()
		strong := rate < onsetDrop*stepRate && slower
		mild := rate < onsetMildDrop*stepRate && refP50 > 0 && float64(f.P50) >= onsetMildSlower*float64(refP50)
		if mild && !strong {
			if at, ok := t.onsetMild[f.Key]; !ok || now-at > 2*span {
				t.onsetMild[f.Key] = now // the first check: the next one decides
				continue
			}
		}
		delete(t.onsetMild, f.Key)
		if strong || mild {
			cands = append(cands, cand{f.Key, stepRate})
		}
	}
	if len(cands) == 0 {
		return t.out // the deferred steps'
	}
	j.noteTails(snap.Files, now)
	for _, c := range cands {
		f := j.fstats[c.key]
		if ok, why := j.windowBound(f, snap.Now); !ok {
			t.log.Debug("tuner: stream slowed, not bound by its window", "file", c.key.String(), "why", why)
			continue
		}
		d := t.device(f.Device)
		if d == nil {
			continue
		}
		fd := t.files[c.key]
		created := fd == nil
		// At the device's window its outcome back-off holds (outcomeDue).
		if (created || fd.win.cur == fd.win.base) && !j.outcomeDue(d, c.key) {
			t.log.Debug("tuner: stream slowed, device's outcome trials backed off", "file", c.key.String(),
				"retry_in", d.outcomeRetryAt-now, "fail_p50", d.outcomeFailP50, "p50", f.P50)
			continue
		}
		if created {
			fd = t.newDec(c.key, d, true, now, WindowBound)
		}
		if fd.pf.trial.to != 0 {
			// prefetchAll issues the value in force each interval.
			t.abandonTrial(fd, &fd.pf, now)
		}
		// The trial's window stays until replaced (lowering first would
		// stall the stream); put back if no step follows.
		winAbandoned := fd.win.trial.to != 0
		if winAbandoned {
			t.abandonTrial(fd, &fd.win, now)
		}
		t.log.Debug("tuner: stream slowed since the last interval", "file", c.key.String(), "span", span,
			"step_mbps", c.step/1e6, "recent_mbps", float64(f.Bytes)/span.Seconds()/1e6)
		// New conditions: earlier back-offs and knees do not hold the step.
		if !fd.win.back.kneeRandom { // what a step costs random readers did not change
			fd.win.retryNow(true)
		}
		if fd.win.cur > fd.win.base {
			fd.win.regimeBegan()
		}
		// The interval before the slowdown is no reference for the step.
		fd.win.forgetLast()
		acted := j.firstStep(fd, created)
		if winAbandoned && fd.win.trial.to == 0 {
			if err := t.pinFile(fd, fd.win.cur, nil, true); err != nil && !errors.Is(err, errNoReaders) {
				t.log.Warn("tuner: could not put back the window kept before a trial the stream slowed in",
					"file", c.key.String(), "window_kb", fd.win.cur, "err", err)
			}
		}
		if acted && (fd.win.trial.to != 0 || fd.pf.trial.to != 0) {
			t.count(EvOnset)
		}
	}
	return t.out
}

// firstStep drives fd's step between Steps and reports whether it acted. A
// decision created for it that did nothing (no descriptor yet, budget
// spent) is dropped: the Step decides, as it would have.
func (t judgeCtx) firstStep(fd *fileDec, created bool) bool {
	n := len(t.out)
	t.driveFile(fd, true)
	acted := len(t.out) > n
	if !acted && created && !fd.outOfScope {
		delete(t.files, fd.key)
	}
	return acted
}

// retryYoung retakes first steps undone for being judged against a
// stream's start (trial.go), once a quarter interval measured it whole.
func (t judgeCtx) retryYoung(now time.Duration) {
	var due []*fileDec
	for _, k := range sortedKeys(t.files) {
		fd := t.files[k]
		l := &fd.win
		if l.young.undoneAt == 0 {
			continue
		}
		if l.trial.to != 0 || l.cur != l.base || now-l.young.undoneAt >= t.cfg.Settle {
			l.youngTaken() // taken again, or the Step's to take
			continue
		}
		if now-l.young.undoneAt >= t.span {
			due = append(due, fd)
		}
	}
	for _, fd := range due {
		f, ok := t.fstats[fd.key]
		if !ok || f.Requests < onsetMinRequests {
			continue // not read enough in the span: the next check or Step
		}
		fd.win.youngTaken()
		if ok, why := t.windowBound(f, t.snap.Now); !ok {
			t.log.Debug("tuner: step undone on a stream's start not taken again: not bound by its window", "file", fd.key.String(), "why", why)
			continue
		}
		fd.win.retryNow(false)
		fd.win.forgetLast()
		if t.firstStep(fd, false) && fd.win.trial.to != 0 {
			t.count(EvYoungRetry)
		}
	}
}

// stepDeferred takes due first steps put off beside random readers
// (deferBesideRandom), refreshing those readers' references.
func (t judgeCtx) stepDeferred(now time.Duration) {
	var due []*fileDec
	for _, k := range sortedKeys(t.files) {
		if fd := t.files[k]; fd.deferUntil != 0 && now >= fd.deferUntil {
			due = append(due, fd)
		}
	}
	for _, fd := range due {
		fd.deferUntil = 0
		if _, ok := t.fstats[fd.key]; !ok {
			continue // not read in the span: the next Step decides
		}
		t.refreshRandom(fd.dev)
		if t.firstStep(fd, false) {
			t.count(EvDeferred)
		}
	}
}
