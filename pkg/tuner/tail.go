package tuner

import (
	"fmt"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// A stream whose latency comes and goes has a rate that depends on the
// phase an interval fell in. It shows as a tail (p99 several times the
// median): the window is then sized by the p99 (Little's law), and a step
// that cost nothing is kept while the window it left could not cover it.

// tailRatio: a p99 this many times the median is a tail (a steady stream
// stays within 1.1-1.2x; a larger window's queue shrinks a stall's ratio).
const tailRatio = 1.5

// tailRatioBase is tailRatio at the device's window, where a healthy
// stream's p99 is ~2x its median and strays to 2.3x on a busy host.
const tailRatioBase = 2.5

// tailMinRequests: fewer requests make the p99 one request's latency.
const tailMinRequests = 64

// tailFresh: a tail is evidence for this many Settles (hidden, not gone).
const tailFresh = 4

// tailStrong: a p99 this many times the median is a tail in one span above
// the device's window; tailStrongBase at it (healthy up to 2.3x, stalls
// 4-7x). Below these a second span is needed.
const (
	tailStrong     = 2.0
	tailStrongBase = 3.0
)

// noteTails records files showing a tail now and forgets stale ones.
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
			// At the device's bandwidth with p99 within three medians: its
			// own queue's spread, costing nothing. Stalls still count.
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

// tailStrongFor is the one-span tail ratio at the file's window in force.
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

// tailNeedKB is the window (KB) keeping rateBPS through the tail (0: none).
func (t *Tuner) tailNeedKB(k probe.FileKey, rateBPS float64) int {
	s, ok := t.tailOf(k)
	if !ok || rateBPS <= 0 {
		return 0
	}
	return int(rateBPS * s.p99.Seconds() / 1024)
}

// tailKeep says why a step short of its margin is kept ("" if not): prior,
// its directory's prior confirmed; tail, the former window could not cover
// the tail and the step cost nothing. Never beside a random reader (its
// faults wait behind the stream's queue: there every step must pay).
func (t judgeCtx) tailKeep(file probe.FileKey, l *ladder, m measure) (prior, tail string) {
	fd := t.files[file]
	if fd == nil || !m.ok || l.kind != KindFileWindow || t.randomReaderBeside(fd) {
		return "", ""
	}
	if p := fd.prior; p != nil && l.trial.from == l.base && p.KeptBPS > 0 && m.tput*(1+t.cfg.Margin) >= p.KeptBPS {
		// Confirmed when it reads as its neighbours did with it.
		prior = fmt.Sprintf("the prior's window is confirmed: %.1f MB/s, its streams read %.1f MB/s with it", m.tput/1e6, p.KeptBPS/1e6)
	}
	s, ok := t.tailOf(file)
	if !ok {
		return prior, ""
	}
	if l.trial.young && s.at <= l.trial.beforeAt {
		// A tail seen only in the stream's start says nothing.
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

// windowMoved reports whether the view's span mixes two windows' latencies:
// the file's or device's window changed, a reader was pinned, or one opened
// beside a decision (unpinned yet). A change one span ago leaves it clean.
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

// tailNow: the span just reported showed the tail (by span: the clock
// moves on during a Step).
func (t *Tuner) tailNow(k probe.FileKey) bool {
	s, ok := t.tailOf(k)
	return ok && !k.IsZero() && s.span == t.tailSpan
}

// tailResize is the window a step grows to (rule tail_resized, judge.go)
// when its judged span stalled and its before-measure's did not; 0 if none.
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
