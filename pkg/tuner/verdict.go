package tuner

// Verdicts between Steps: a step that clearly pays on recent requests is kept
// early (trialStreams, fastVerdict, keepsEarly), and a step whose stream ended
// is judged at once (endedTrials, endedVerdict).

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// trialStreams returns the files whose window step fastVerdict may judge now,
// and the recent span to judge on; nothing within Settle/4 of the last call.
func (t *Tuner) trialStreams() ([]probe.FileKey, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.deps.Clock.Now()
	span := t.cfg.Settle / freshSpanDiv
	if t.scope.Empty() || now-t.verdictAt < t.cfg.Settle/onsetEvery {
		return nil, 0
	}
	t.verdictAt = now
	var keys []probe.FileKey
	for k, fd := range t.files {
		l := &fd.win
		if l.trial.to != 0 && now-l.trial.at >= t.cfg.Settle/2 && now-l.trial.at < t.cfg.Settle-t.cfg.Settle/10 && now-l.movedAt >= span {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, compareKeys)
	return keys, span
}

// fastVerdict keeps the steps of trialStreams that clearly pay on the recent
// requests (snap over span) and takes their next; the others wait for a Step.
func (t *Tuner) fastVerdict(snap detector.Snapshot, span time.Duration) []Action {
	return t.judgeOn(snap, span, judgeEarly, EvKeptEarly, func(f detector.FileStats, fd *fileDec) bool {
		return f.Requests >= onsetMinRequests
	})
}

// judgeOn drives, on a view of snap over span judged by mode, the file
// window steps under trial of the files that want accepts (the next step
// too, unless the stream ended), and counts those kept as counter.
func (t *Tuner) judgeOn(snap detector.Snapshot, span time.Duration, mode judgeMode, counter Event, want func(detector.FileStats, *fileDec) bool) []Action {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out = nil
	if t.scope.Empty() || span <= 0 {
		return nil
	}
	j := t.on(snap, span, mode)
	for _, f := range snap.Files {
		fd := t.files[f.Key]
		if fd == nil || fd.win.trial.to == 0 || !want(f, fd) {
			continue
		}
		n := len(t.out)
		j.driveFile(fd, mode != judgeEnded)
		for _, a := range t.out[n:] {
			if a.Kind == KindFileWindow && a.Result == ResultKept {
				t.count(counter)
			}
		}
	}
	return t.out
}

// Steps whose stream ended under trial. A block file often ends before the
// Step that would judge it, which would find nothing to judge by and set a
// knee on no evidence. So a stream that stops is judged at once on all it
// read since the step, or, if too little, the step ends unjudged.

// endedJudgeMin: a stream that read less than this after its step (its first
// readahead and requests take a few ms) says too little to keep or undo it.
const endedJudgeMin = 200 * time.Millisecond

// trialSpan is a step under trial and the span since it.
type trialSpan struct {
	Key  probe.FileKey
	Span time.Duration
}

// readaheadGap is how long a stream under trial may go without a readahead
// event and still be reading: endedGap, or two of its windows at its rate
// before the step if longer.
func (t *Tuner) readaheadGap(l *ladder) time.Duration {
	gap := endedGap
	if r := l.trial.before.rate; r > 0 {
		gap = max(gap, time.Duration(2*float64(l.trial.to)*1024/r*float64(time.Second)))
	}
	return gap
}

// endedTrials returns the file window steps whose stream stopped reading
// (readaheadGap) after reading long enough to judge, with the span since the
// step, for endedVerdict; steps whose stream stopped sooner end unjudged here.
func (t *Tuner) endedTrials() []trialSpan {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.deps.Clock.Now()
	// Steps ended unjudged are returned by the next Tick or Step.
	saved := t.out
	t.out = t.evOut
	defer func() { t.evOut, t.out = t.out, saved }()
	var out []trialSpan
	// Runs every 100 ms: look only at decisions with a step under trial.
	var keys []probe.FileKey
	for k, fd := range t.files {
		if fd.win.trial.to != 0 && fd.pf.trial.to == 0 && fd.win.reprobe.until == 0 {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, compareKeys)
	for _, k := range keys {
		fd := t.files[k]
		l := &fd.win
		var last time.Duration // when a reader of it last had a readahead event
		for _, r := range t.readers[k] {
			last = max(last, r.lastSeen)
		}
		if last == 0 || now-last < t.readaheadGap(l) {
			continue
		}
		if last-l.trial.at < endedJudgeMin {
			t.endUnjudged(fd, last-l.trial.at)
			continue
		}
		out = append(out, trialSpan{Key: k, Span: now - l.trial.at})
	}
	return out
}

// endUnjudged takes back a step whose stream read too little after it to
// judge: no knee, no back-off (the file's or directory's next reader steps).
func (t *Tuner) endUnjudged(fd *fileDec, read time.Duration) {
	now := t.deps.Clock.Now()
	l := &fd.win
	from := l.endStep(now)
	if err := t.pinFile(fd, l.cur, nil, true); err != nil && !errors.Is(err, errNoReaders) {
		t.log.Debug("tuner: ended step not taken back", "file", fd.key.String(), "err", err)
	}
	t.count(EvEndedUnjudged)
	if fd.climbFrom > 0 {
		t.mem.Unclimb(fd.prior, fd.key) // no knee: the next open climbs again
		fd.climbFrom = 0
	}
	t.emit(fd.action(now, KindFileWindowUndo, from, l.cur, ResultUndone,
		fmt.Sprintf("the stream stopped reading %v after the step (its file ended or was closed): too little to judge it by; no knee", read.Round(time.Millisecond))))
}

// endedVerdict judges a step of endedTrials on its stream's requests since
// the step (snap over span; detector.Recent also holds the device's other
// files, not judged here). No next step: the stream has stopped.
func (t *Tuner) endedVerdict(ts trialSpan, snap detector.Snapshot) []Action {
	return t.judgeOn(snap, ts.Span, judgeEnded, EvKeptEnded, func(f detector.FileStats, fd *fileDec) bool {
		return f.Key == ts.Key && fd.pf.trial.to == 0
	})
}
