package tuner

import (
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// A step is judged by the first Step at least most of a Settle after it.
// One taken between Steps (a fresh stream, an onset) is then judged up to
// two intervals later, and a stream that needs several steps gains one
// window every one or two seconds: an HDFS block (2 s of reading) is read
// almost whole at its first step. A step that clearly pays need not wait:
// from half a Settle on, every Settle/4 Tick asks for the recent
// requests of the steps under trial (trialStreams) and fastVerdict keeps
// those whose recent span, all of it at the step's window, reads at least
// earlyKeepGain above the step's before-measure, and takes the next step.
// Only a keep comes early, never an undo (a quarter interval says less
// than a whole one about a loss). Beside random readers only when each of
// them was measured over the span (enough requests), their trims unchanged
// in it, their mean clearly within its budget and their p99 not far off:
// a quarter interval's mean is a few hundred of their faults, its p99 a
// handful, which the watch of the kept window then follows interval by
// interval. (At +3 ms beside an mmap reader, each step judged a whole
// Settle after it took the stream 3.5-4 s to reach 288 KB, and it read
// 0.84-0.87 of the best static window over 8 s.)
const (
	// earlyKeepGain: three keep margins at the default Margin.
	earlyKeepGain = 0.3
	// earlyRandMean: the random readers' mean, as a share of its budget,
	// under which a step beside them may be kept early.
	earlyRandMean = 0.9
)

// keepsEarly reports whether a file window step under trial may be judged
// now, before its Settle: it is judged early (fastVerdict), has run half a
// Settle, the measure's span holds only its window, and the measure says it
// pays by earlyKeepGain with nothing lost elsewhere.
func (t judgeCtx) keepsEarly(d *devState, l *ladder, m measure, now time.Duration) bool {
	// A verdict put off (randLater) waits for a whole interval.
	if t.mode != judgeEarly || l.kind != KindFileWindow || l.randLater || now-l.trialAt < t.cfg.Settle/2 || now-l.movedAt < t.span {
		return false
	}
	b := l.before
	if !m.ok || !b.ok || b.tput <= 0 || m.tput < (1+earlyKeepGain)*b.tput {
		return false
	}
	if (m.rand.n > 0 || b.rand.n > 0) && !t.randomWithinEarly(d, m, now) {
		return false
	}
	bdev, bo := lossBase(b, m)
	if bdev > 0 && m.dev > 0 && m.dev < (1-devLossMax)*bdev {
		return false
	}
	if m.othersMustNotLose && bo > 0 && m.others < (1-devLossMax)*bo {
		return false
	}
	return true
}

// randomWithinEarly reports whether the random readers beside a step, as
// measured on the recent span, allow keeping it early (see above).
func (t judgeCtx) randomWithinEarly(d *devState, m measure, now time.Duration) bool {
	if d == nil || d.trimAt > now-t.span || m.rand.n == 0 || m.rand.n < len(t.randomsBeside(d.dev, probe.FileKey{})) {
		return false
	}
	return m.rand.mean <= earlyRandMean && m.rand.tail < randTailSevere
}

// trialStreams returns the files with a window step under trial that
// fastVerdict may judge now, and the span of recent requests to judge them
// on; nothing when the last call was less than Settle/4 ago.
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
		if l.trial != 0 && now-l.trialAt >= t.cfg.Settle/2 && now-l.trialAt < t.cfg.Settle-t.cfg.Settle/10 && now-l.movedAt >= span {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, compareKeys)
	return keys, span
}

// fastVerdict keeps the steps of trialStreams that clearly pay on the
// recent requests (snap, over span; detector.Recent) and takes their next
// step; the others wait for their Step.
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
		if fd == nil || fd.win.trial == 0 || !want(f, fd) {
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
