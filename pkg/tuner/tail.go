package tuner

import (
	"fmt"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// A stream whose latency comes and goes (periodic internal work of the
// device, bursts of contention) reads fast between stalls and slowly
// through them, so one interval's rate depends on the phase it fell in: a
// step judged on one interval against another compares a stall with its
// absence, and a step that masks the stalls is undone whenever its interval
// missed one. Such a stream shows it in its own requests: a tail, a p99
// several times its median. With a tail the window that hides it is sized
// by the p99 (Little's law: the reader waits on the slowest request of its
// window), and a step that cost the stream nothing is kept while the
// window it left could not cover the tail: it is what the stalls need, and
// the re-probe takes it back when they are over.

// tailRatio: a stream's p99 at least this many times its median is a tail.
// A steady stream's p99 is within 1.1-1.2x its median at any window on the
// lab (its requests queue alike); a stall of a share of its requests stands
// out, less so at a larger window, whose queue the stalled requests wait in
// too (+10 ms on 10% of reads: p99/p50 6.7 at 128 KB, about 2 at 512 KB).
const tailRatio = 1.5

// tailRatioBase is tailRatio at the device's window: there a healthy
// stream's p99 is about twice its median (its requests queue behind the
// window's others) and strays to 2.3x on a busy two-CPU host, so a span
// below this is no evidence of a stall (CI kept a healthy stream's
// 1024 KB step on "p99 3.8ms at p50 1.7ms", seen in two spans). A stall
// stands far above it (+10 ms on 10% of reads: 6.7x).
const tailRatioBase = 2.5

// tailMinRequests: fewer requests make the p99 one request's latency.
const tailMinRequests = 64

// tailFresh: a tail is evidence for this many Settle intervals after it
// was seen (the larger window hides it: the stalls do not go away).
const tailFresh = 4

// tailStrong: a p99 this many times the median is a tail in one span at a
// window above the device's; tailStrongBase at the device's own window. A
// larger window's queue lifts the median of every request, a stall's and a
// scheduling hiccup's ratio alike shrink with it (a +10 ms stall on 10% of
// reads: 6.7x at 128 KB, 2.5x at 512 KB). At the device's window a healthy
// stream on a busy two-CPU host strays to 2.3x in one span (a hiccup of
// about 2 ms, measured in CI), a stall stands at 4-7x: below tailStrongBase
// it takes a second span to be a tail.
const (
	tailStrong     = 2.0
	tailStrongBase = 3.0
)

// noteTails records the files whose requests show a tail now, and forgets
// stale ones (the table stays as small as the streams with a tail).
func (t judgeCtx) noteTails(files []detector.FileStats, now time.Duration) {
	if t.tails == nil {
		t.tails = map[probe.FileKey]tailSeen{}
	}
	t.tailSpan++
	for _, f := range files {
		if f.Requests < tailMinRequests || f.P50 <= 0 || f.Sequentiality < t.cfg.MinSequentiality {
			continue
		}
		ratio := tailRatio
		if t.tailStrongFor(f.Key) == tailStrongBase {
			ratio = tailRatioBase
		}
		tail := f.P99 >= time.Duration(ratio*float64(f.P50))
		if capBPS, _ := t.capacity(f.Device); tail && capBPS > 0 && f.BusyThroughput >= (1-devLossMax)*capBPS &&
			f.P99 < time.Duration(tailStrongBase*float64(f.P50)) {
			// A stream at the device's bandwidth (within 5%) whose p99 is
			// within three medians: the spread of its own queue (a healthy
			// device's p99 at the default window is about twice its
			// median), which costs it nothing. No step is sized, deferred
			// or kept for it; a stall (many medians) still counts at any
			// rate.
			continue
		}
		if tail && t.windowMoved(f.Key, f.Device, now) {
			// A span across a window change mixes two windows' latencies.
			t.log.Debug("tuner: latency spread across a window change, not a tail", "file", f.Key.String(), "p50", f.P50, "p99", f.P99)
			continue
		}
		if tail {
			prev, ok := t.tails[f.Key]
			if !ok {
				t.log.Debug("tuner: stream latency has a tail", "file", f.Key.String(), "p50", f.P50, "p99", f.P99, "requests", f.Requests)
			}
			seen := 1
			if ok {
				seen = prev.seen + 1
			}
			if f.P99 >= time.Duration(t.tailStrongFor(f.Key)*float64(f.P50)) {
				seen = max(seen, 2)
			}
			t.tails[f.Key] = tailSeen{at: now, p50: f.P50, p99: f.P99, span: t.tailSpan, seen: seen}
		}
	}
	for k, s := range t.tails {
		if now-s.at > tailFresh*t.cfg.Settle {
			delete(t.tails, k)
		}
	}
}

// tailStrongFor is the one-span tail ratio for a file at the window it
// reads with now: tailStrong above the device's window, tailStrongBase at
// it (no decision yet, or one at its base).
func (t *Tuner) tailStrongFor(k probe.FileKey) float64 {
	fd := t.files[k]
	if fd == nil {
		return tailStrongBase
	}
	if fd.win.inForce() <= fd.win.base {
		return tailStrongBase
	}
	return tailStrong
}

// tailOf is the file's tail if one was seen recently.
func (t *Tuner) tailOf(k probe.FileKey) (tailSeen, bool) {
	s, ok := t.tails[k]
	return s, ok && s.seen >= 2 && t.deps.Clock.Now()-s.at <= tailFresh*t.cfg.Settle
}

// tailNeedKB is the window (KB) that keeps a stream reading at rateBPS
// through its tail, 0 without one.
func (t *Tuner) tailNeedKB(k probe.FileKey, rateBPS float64) int {
	s, ok := t.tailOf(k)
	if !ok || rateBPS <= 0 {
		return 0
	}
	return int(rateBPS * s.p99.Seconds() / 1024)
}

// tailKeep says why a file window step that did not pay its margin is
// kept anyway, "" if not: prior, its directory's prior confirmed; tail, the
// stream has a tail its former window could not cover, and the step cost
// it nothing (its rate held, or it reads at the device's capacity). Never
// beside a random reader, whose faults wait behind every window of the
// stream's queued transfers: there each step must pay.
func (t judgeCtx) tailKeep(file probe.FileKey, l *ladder, m measure) (prior, tail string) {
	fd := t.files[file]
	if fd == nil || !m.ok || l.kind != KindFileWindow || t.randomReaderBeside(fd) {
		return "", ""
	}
	if p := fd.prior; p != nil && l.trial.from == l.base && p.KeptBPS > 0 && m.tput*(1+t.cfg.Margin) >= p.KeptBPS {
		// A prior's window is confirmed when the fresh stream reads as
		// its neighbours did with it: the gain they measured (perhaps
		// between stalls, perhaps kept on a tail) is theirs, not a
		// margin this stream must show again over their base.
		prior = fmt.Sprintf("the prior's window is confirmed: %.1f MB/s, its streams read %.1f MB/s with it", m.tput/1e6, p.KeptBPS/1e6)
	}
	s, ok := t.tailOf(file)
	if !ok {
		return prior, ""
	}
	if l.trial.young && s.at <= l.trial.beforeAt {
		// A tail seen only in the stream's start (its open, its first
		// synchronous reads: a healthy lab stream's first span showed p99
		// 5 ms at p50 1.7 ms) says nothing of its steady reads. A stall
		// that recurs shows again in the step's own spans.
		return prior, ""
	}
	need := t.tailNeedKB(file, max(m.tput, l.trial.before.tput))
	if need <= l.trial.from {
		return prior, ""
	}
	capBPS, _ := t.capacity(fd.dev.dev)
	held := m.tput >= (1-devLossMax)*l.trial.before.tput
	atCap := capBPS > 0 && m.tput >= t.cfg.CapacityFrac*capBPS
	if !held && !atCap {
		return prior, ""
	}
	return prior, fmt.Sprintf("kept without its margin: the stream's latency has a tail (p99 %v at p50 %v) that needs about %d KB, more than the %d KB it left, and the step cost it nothing",
		s.p99.Round(100*time.Microsecond), s.p50.Round(100*time.Microsecond), need, l.trial.from)
}

// windowMoved reports whether the span of requests the detector just
// reported mixes two windows' latencies (a larger window queues more): the
// file's own window or its device's changed within it, or one of its
// readers was given a window then, or a reader opened it beside a decision
// (it reads at the device's window until the event path pins it). Requests
// in flight across a change are a few out of hundreds: a change about one
// span ago (the tick that judges a step) leaves the span clean. The span is
// the one the requests came from: a Settle, or the recent view a check
// between Steps looks at (a change 0.6 s before a 250 ms view is not in it).
func (t judgeCtx) windowMoved(k probe.FileKey, dev probe.Dev, now time.Duration) bool {
	span := t.viewSpan()
	span -= span / 10
	within := func(at time.Duration) bool { return at != 0 && now-at < span }
	fd := t.files[k]
	if fd != nil && within(fd.win.movedAt) {
		return true
	}
	if d := t.devs[dev]; d != nil && within(d.win.movedAt) {
		return true
	}
	for _, r := range t.readers[k] {
		if within(r.appliedAt) || fd != nil && within(r.firstSeen) {
			return true
		}
	}
	return false
}

// tailMaxLater bounds how many intervals a step's verdict is put off.
const tailMaxLater = 2

// tailNow reports whether the span the detector just reported showed the
// file's tail (not the clock: it moves on while a Step runs).
func (t *Tuner) tailNow(k probe.FileKey) bool {
	s, ok := t.tailOf(k)
	return ok && !k.IsZero() && s.span == t.tailSpan
}

// tailResize is the window a file window step grows to if the span it is
// judged on stalled (the stream's tail is in it) and the span its
// before-measure came from did not (the rule tail_resized, judge.go), 0 if
// none: the tail needs more than the step (rate x p99). A stall-free
// before-measure cannot be matched by a window too small for the stall;
// one large enough for it reads at the stall-free rate through it.
func (t judgeCtx) tailResize(file probe.FileKey, l *ladder, m measure, maxKB int) int {
	if fd := t.files[file]; fd == nil || l.trial.to >= maxKB || t.randomReaderBeside(fd) {
		return 0
	}
	need := t.tailNeedKB(file, max(m.tput, l.trial.before.tput))
	next := l.trial.to
	for next < need && next < maxKB {
		next *= t.cfg.Growth
	}
	next = min(next, maxKB)
	if next <= l.trial.to {
		return 0
	}
	return next
}
