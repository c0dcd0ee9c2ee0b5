package tuner

import (
	"errors"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// A stream that was reading well at the last Step can slow down a moment
// after it (contention begins, the device's latency rises): the next Step
// sees it up to a whole interval later, and unless the detector's fast
// path enters a regime on it, every step waits for that Step. Between
// Steps Tick asks for the recent requests of the streams the last
// Step saw (onsetStreams, every Settle/4) and hands them to fastOnset: a
// stream whose recent rate fell well below its rate at the last Step while
// its requests got slower (or fell less, with its requests slower, on two
// checks running), and that is bound by its window there, takes
// its step at once (a back-off or knee learned before does not hold it), measured on
// the recent requests, with the Step's bounds (allow-paths, the device's
// back-off, no step under trial or re-probe), and judged by the first
// Step one Settle later.
const (
	// onsetDrop: the recent rate must be below this share of the rate
	// at the last Step (a 250 ms span of a healthy stream varies less).
	onsetDrop = 0.7
	// onsetMinRequests: the fewest recent requests a slowed stream is judged
	// on. Fewer than a fresh stream needs (freshMinRequests): the slowdown
	// itself thins them out (a 128 KB window two requests deep at 16 ms
	// gives 32 in a 250 ms span, and one fewer would put the step off to
	// the next Step), and the evidence asked here is strong (a rate below
	// onsetDrop of the last Step's with a median half again as long).
	onsetMinRequests = 16
	// onsetMildDrop, onsetMildSlower: a milder slowdown, a rate below
	// onsetMildDrop of the Step's with the median onsetMildSlower times
	// as long (Little's law: the window binds, and its requests take
	// longer), is taken on the second check running: on the lab at +1 ms
	// a stream at 149 MB/s read 115 with its median 1.29x, under the
	// strong rule, and a block read by HDFS waited 1.4 s for its Step.
	// One quarter interval's rate strays that far on this host; two in a
	// row, with the latency risen in both, do not.
	onsetMildDrop   = 0.85
	onsetMildSlower = 1.2
)

// slowerNow reports whether a stream's recent requests are slower than at
// the last Step: their median half again as long, or a tail (p99 at least
// twice the median) the last Step did not show. A rate that fell with its
// latency unchanged is the reader's, not the device's.
func slowerNow(last, recent detector.FileStats) bool {
	if last.P50 <= 0 || recent.P50 <= 0 {
		return false
	}
	if recent.P50 >= last.P50*3/2 {
		return true
	}
	return recent.P99 >= 2*recent.P50 && last.P99 < 2*last.P50
}

// onsetStreams returns the streams the last Step saw read sequentially
// under the allow-paths with no step under trial, and the span of recent
// requests to check them on; nothing when the last check was less than
// Settle/4 ago.
func (t *Tuner) onsetStreams() ([]probe.FileKey, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.deps.Clock.Now()
	if t.scope.Empty() || now-t.onsetAt < t.cfg.Settle/onsetEvery {
		return nil, 0
	}
	t.onsetAt = now
	for k, at := range t.onsetMild {
		if now-at > t.cfg.Settle {
			delete(t.onsetMild, k)
		}
	}
	var keys []probe.FileKey
	for k, fs := range t.fstats {
		if t.onsetCandidate(k, fs) {
			keys = append(keys, k)
		}
	}
	for k, fd := range t.files {
		if (fd.deferUntil != 0 || fd.win.young.undoneAt != 0) && !slices.Contains(keys, k) {
			// A first step put off beside random readers, or undone to
			// be measured whole (retryYoung).
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, compareKeys)
	return keys, t.cfg.Settle / freshSpanDiv
}

// onsetCandidate: a stream read at the last Step that a step may be taken
// for now.
func (t *Tuner) onsetCandidate(k probe.FileKey, fs detector.FileStats) bool {
	if fs.Sequentiality < t.cfg.MinSequentiality || fs.Bytes == 0 || t.snap.Now-fs.LastSeen > t.cfg.Settle {
		return false
	}
	if t.trims[k] != nil || t.mem.Checking(k) {
		return false
	}
	if first, fresh := t.fresh[k]; fresh && t.deps.Clock.Now()-first <= t.cfg.Settle {
		// fastOutcome's, unless the last Step saw it read at least a
		// quarter interval with no step of its own since: a slowdown that
		// began after that is this check's (fastOutcome judges a fresh
		// stream on as much of its life as it has had, which averages the
		// onset away; HDFS reads a block in two seconds).
		fd := t.files[k]
		if t.snap.Now-first < t.cfg.Settle/onsetEvery || fd != nil && (fd.win.trial.to != 0 || fd.win.movedAt > first) {
			return false
		}
	}
	// A step under trial is no bar: an onset in its span spoils its
	// verdict (fastOnset ends it unjudged). On a stream at its knee a
	// prefetch trial runs one interval in three or four.
	if fd := t.files[k]; fd != nil && (fd.win.reprobe.until != 0 || fd.outOfScope) {
		return false
	}
	return true
}

// readSince is when the file's stream began reading without a break: its
// open (HDFS opens a block file afresh for each read, in the same
// process), or its readers' first read or last resumption.
func (t *Tuner) readSince(k probe.FileKey) time.Duration {
	since := max(t.fresh[k], t.firstRead(k))
	for _, r := range t.readers[k] {
		since = max(since, r.resumedAt)
	}
	return since
}

// abandonTrial ends a step under trial that an onset fell in, unjudged:
// its span mixes the conditions before and after the onset, so its verdict
// would say nothing about either (a trial that paid before the onset would
// be undone by it, and backed off). The value kept is back in the ladder
// with no back-off and no knee; the caller puts it in force unless the
// onset's own step, taken at once, replaces it.
func (t *Tuner) abandonTrial(fd *fileDec, l *ladder, now time.Duration) {
	from := l.endStep(now)
	t.emit(fd.action(now, undoOf(l.kind), from, l.cur, ResultUndone,
		"the stream slowed during the trial: ended unjudged, a step for the new conditions follows"))
	t.count(EvOnsetInTrial)
}

// fastOnset takes a step for the streams of onsetStreams whose recent rate
// (snap, over span; detector.Recent) fell below onsetDrop of their rate at
// the last Step while they are bound by their window.
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
		if first := t.readSince(f.Key); first > t.snap.Now-t.cfg.Settle && last.BusyThroughput > 0 {
			// Read for part of the Step's interval only: its rate while
			// it read (a window-bound stream is busy all along).
			stepRate = last.BusyThroughput
		}
		slower := slowerNow(last, f)
		refP50 := last.P50
		if fd := t.files[f.Key]; fd != nil && (fd.win.trial.to != 0 || fd.win.movedAt != 0 && now-fd.win.movedAt < t.cfg.Settle) {
			// The last Step's requests were read at another window (the
			// step it judged was undone, or the one under trial began):
			// its rate and latency are no reference for this one. The
			// measure taken at the window in force before that step is (a
			// larger window under trial reads no slower than it unless
			// the conditions changed); it has no p99, so a tail counts
			// only if it stands out at any window (tailStrongBase).
			b := fd.win.trial.before
			if !b.ok || b.rate <= 0 || fd.win.trial.to == 0 && fd.win.inForce() != fd.win.trial.from {
				continue
			}
			stepRate, refP50 = b.rate, b.p50
			slower = f.P50 > 0 && b.p50 > 0 && (f.P50 >= b.p50*3/2 || f.P99 >= time.Duration(tailStrongBase*float64(f.P50)))
		}
		rate := float64(f.Bytes) / span.Seconds()
		if rate < onsetDrop*stepRate && slower {
			delete(t.onsetMild, f.Key)
			cands = append(cands, cand{f.Key, stepRate})
			continue
		}
		if !(rate < onsetMildDrop*stepRate && refP50 > 0 && float64(f.P50) >= onsetMildSlower*float64(refP50)) {
			delete(t.onsetMild, f.Key)
			continue
		}
		if at, ok := t.onsetMild[f.Key]; !ok || now-at > 2*span {
			t.onsetMild[f.Key] = now // the first check: the next one decides
			continue
		}
		delete(t.onsetMild, f.Key)
		cands = append(cands, cand{f.Key, stepRate})
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
		// At the device's window the device's outcome back-off holds, unless
		// the latency says the conditions changed (outcomeDue).
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
		// The window under trial stays in force until the step below
		// replaces it: lowering it first would hold the stream in a break
		// for nothing. Put back only if no step follows.
		winAbandoned := fd.win.trial.to != 0
		if winAbandoned {
			t.abandonTrial(fd, &fd.win, now)
		}
		t.log.Debug("tuner: stream slowed since the last interval", "file", c.key.String(), "span", span,
			"step_mbps", c.step/1e6, "recent_mbps", float64(f.Bytes)/span.Seconds()/1e6)
		// New conditions: a back-off or knee learned before them does
		// not hold the step up (as when a regime takes a decision over).
		if !fd.win.back.kneeRandom { // what a step costs random readers did not change
			fd.win.retryNow(true)
		}
		if fd.win.cur > fd.win.base {
			fd.win.regimeBegan()
		}
		// The interval before the slowdown is no reference for the step.
		fd.win.forgetLast()
		n := len(t.out)
		j.driveFile(fd, true)
		if winAbandoned && fd.win.trial.to == 0 {
			if err := t.pinFile(fd, fd.win.cur, nil, true); err != nil && !errors.Is(err, errNoReaders) {
				t.log.Warn("tuner: could not put back the window kept before a trial the stream slowed in",
					"file", c.key.String(), "window_kb", fd.win.cur, "err", err)
			}
		}
		if len(t.out) == n {
			if created && !fd.outOfScope {
				delete(t.files, c.key) // nothing done: the Step decides, as it would have
			}
		} else if fd.win.trial.to != 0 || fd.pf.trial.to != 0 {
			t.count(EvOnset)
		}
	}
	return t.out
}

// retryYoung takes again, on the recent requests (t's view), the
// first steps undone because they were judged against a stream's start
// (trial.go): once a quarter interval has measured the stream whole at the
// device's window, not at the next Step. A block HDFS reads in two seconds
// at +1 ms spent one of them at the default window waiting for that Step
// (0.87 of the best static window).
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
		n := len(t.out)
		t.driveFile(fd, true)
		if len(t.out) > n && fd.win.trial.to != 0 {
			t.count(EvYoungRetry)
		}
	}
}

// stepDeferred takes the first steps put off beside random readers
// (deferBesideRandom) that are due, on the recent requests (t's view):
// the random readers' references are first lowered to what they
// get since the slowdown began.
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
		n := len(t.out)
		t.driveFile(fd, true)
		if len(t.out) > n {
			t.count(EvDeferred)
		}
	}
}
