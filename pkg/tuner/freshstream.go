package tuner

import (
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// Fresh streams: a stream slow from its first read is judged on the
// detector's recent requests (a fraction of a Settle), not after a whole
// measurement: Little's law needs only its bytes in flight, its window
// (from its readahead events) and its latency, and a whole Settle at the
// default's rate costs a stream slowed 3 ms per request about 5% of an 8 s
// read. The step is the same bounded outcome step, judged one Settle later
// by rate like any other, and held back by the device's outcome back-off.
const (
	// freshMinAge: a reader seen for less than this has not yet ramped its
	// window (the first reads of an open file are synchronous).
	freshMinAgeDiv = 10 // Settle / 10: 100 ms at 1 s
	// freshMinRequests: fewer requests in the recent span say too little
	// about a stream's bytes in flight.
	freshMinRequests = 32
	// maxFresh bounds the fresh streams waiting for their first judgement.
	maxFresh = 4096
)

// noteFresh records a file with no decision whose reader was first seen at
// firstSeen (called on its readahead events, t.mu held).
func (t *Tuner) noteFresh(k probe.FileKey, firstSeen, now time.Duration) {
	if t.scope.Empty() || now-firstSeen > t.cfg.Settle {
		return
	}
	if at, ok := t.fresh[k]; ok {
		if firstSeen < at {
			t.fresh[k] = firstSeen
		}
		return
	}
	if len(t.fresh) >= maxFresh {
		return
	}
	t.fresh[k] = firstSeen
}

// freshStreams returns the files first read within the last Settle that
// have no decision and have been read for long enough to judge, and the
// span of recent requests to judge them on: Tick asks the detector
// for those (detector.Recent) and hands them to fastOutcome. Empty when
// there is nothing to judge (the detector is then not asked).
func (t *Tuner) freshStreams() ([]probe.FileKey, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.deps.Clock.Now()
	var keys []probe.FileKey
	for k, first := range t.fresh {
		if now-first > t.cfg.Settle || t.ownWindow(k) {
			delete(t.fresh, k)
			continue
		}
		if now-first >= t.cfg.Settle/freshMinAgeDiv {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, compareKeys)
	// A slow stream (a few hundred requests a second, as under
	// contention) has too few requests in the last Settle/4 to judge: it
	// is judged on as much of its life as it has had, up to 3/4 Settle.
	span := t.cfg.Settle / freshSpanDiv
	for _, k := range keys {
		span = max(span, min(now-t.fresh[k], 3*t.cfg.Settle/4))
	}
	return keys, span
}

// recentSpan is the span of recent requests a step taken between Steps
// is measured on (fastOn's recent snapshot).
func (t *Tuner) recentSpan() time.Duration { return t.cfg.Settle / freshSpanDiv }

// newDec records a decision on k, at the device's window, needed now;
// byRate with WindowBound for a stream bound by its window with no regime.
func (t *Tuner) newDec(k probe.FileKey, d *devState, byRate bool, now time.Duration, regimes ...detector.RegimeKind) *fileDec {
	fd := &fileDec{key: k, dev: d, byRate: byRate, regimes: regimes, lastNeeded: now,
		win: ladder{kind: KindFileWindow, base: d.orig, cur: d.orig},
		pf:  ladder{kind: KindPrefetch, first: t.cfg.PrefetchStartKB}}
	t.files[k] = fd
	return fd
}

// fastOutcome takes the first outcome step on fresh streams bound by their
// window, judged on the detector's recent requests (snap, over span; from
// detector.Recent): the same step Step would take a whole Settle later,
// with the same bounds (allow-paths, device back-off, no trim, no prior
// re-check), judged by the next Step one Settle after it.
func (t *Tuner) fastOutcome(snap detector.Snapshot, span time.Duration) []Action {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out = nil
	if t.scope.Empty() || len(t.fresh) == 0 || span <= 0 {
		return nil
	}
	now := t.deps.Clock.Now()
	// The first step is measured on the recent span.
	j := t.on(snap, span, judgeStep)
	j.noteTails(snap.Files, now)
	for _, f := range snap.Files {
		if _, ok := t.fresh[f.Key]; !ok || t.ownWindow(f.Key) || t.trims[f.Key] != nil || t.mem.Checking(f.Key) {
			continue
		}
		if f.Requests < freshMinRequests {
			continue
		}
		ok, why := j.windowBound(f, snap.Now)
		if !ok {
			continue
		}
		d := t.device(f.Device)
		if d == nil || !j.outcomeDue(d, f.Key) {
			continue
		}
		delete(t.fresh, f.Key)
		j.refreshRandom(d)
		fd := t.files[f.Key]
		created := fd == nil
		if created {
			fd = t.newDec(f.Key, d, true, now, WindowBound)
		} else {
			// A new stream on a file whose earlier reads' trials did not
			// pay: their back-off and knee were learned in other
			// conditions; the device's outcome back-off (outcomeDue,
			// above) still holds a stream whose latency did not change.
			fd.win.retryAt, fd.win.knee, fd.lastNeeded = 0, false, now
		}
		t.log.Debug("tuner: fresh stream bound by its window", "file", f.Key.String(), "span", span, "why", why, "reopened", !created)
		n := len(t.out)
		j.driveFile(fd, true)
		if len(t.out) == n {
			// No step and nothing to report (no reader's descriptor found
			// yet, the sysfs budget spent): the next Step decides, as it
			// would have without this path.
			if created && !fd.outOfScope {
				delete(t.files, f.Key)
			}
		} else if fd.win.trial != 0 {
			t.count(EvFresh)
		}
	}
	return t.out
}
