package tuner

// What a step is judged by: a stream's measure over the detector's window,
// and which other readers' share a step must not take.

import (
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

func (t judgeCtx) fileMeasure(k probe.FileKey) measure {
	fs, ok := t.fstats[k]
	if !ok || fs.BusyThroughput <= 0 || t.snap.Now-fs.LastSeen > t.cfg.Settle {
		return measure{}
	}
	// The detector's window: the Settle, or a fresh stream's recent span.
	span := t.viewSpan().Seconds()
	// A stream that stopped inside the span: only its active part counts
	// (in endedVerdict the span is the step's).
	active, ended := span, false
	if gap := (t.snap.Now - fs.LastSeen).Seconds(); gap > endedGap.Seconds() || t.mode == judgeEnded {
		active, ended = span-gap, true
		if active < endedMinActive.Seconds() {
			return measure{}
		}
	}
	// Likewise one that began inside it (a fresh open).
	start := t.snap.Now - time.Duration(span*float64(time.Second))
	if late := (t.firstRead(k) - start).Seconds(); late > 0 && active-late >= endedMinActive.Seconds() {
		active -= late
	}
	// And one that paused inside it (a reader reopening the file).
	if p := t.pauseIn(k, start).Seconds(); p > 0 && active-p >= endedMinActive.Seconds() {
		active -= p
	}
	m := measure{ok: true, tput: fs.BusyThroughput, p50: fs.P50, rate: float64(fs.Bytes) / active, ended: ended}
	m.rand = t.randomCost(fs.Device, k)
	t.deviceSide(&m, k, fs.Device, float64(fs.Bytes)/span, span)
	return m
}

// deviceSide fills m's device figures over span (a prior's before-measure too):
// its total with k's own share (own) at m.rate, its busy rate, the other streams.
func (t judgeCtx) deviceSide(m *measure, k probe.FileKey, dev probe.Dev, own, span float64) {
	ds, ok := t.dstats[dev]
	if !ok {
		return
	}
	m.dev, m.devBusy = float64(ds.Bytes)/span-own+m.rate, ds.BusyThroughput
	// Random readers' bytes say nothing of their service: left out
	// before and after alike; their budget protects them.
	for ok2, ofs := range t.fstats {
		if ok2 == k || ofs.Device != dev {
			continue
		}
		if t.readRandomly(ofs) {
			m.dev -= float64(ofs.Bytes) / span
			m.random += float64(ofs.Bytes) / span
			continue
		}
		bps := float64(ofs.Bytes) / span
		prot := t.protectedStream(ok2, ofs)
		if prot {
			m.others += bps
		}
		m.streams = append(m.streams, otherStream{key: ok2, bps: bps, protected: prot, ended: t.snap.Now-ofs.LastSeen > endedGap})
	}
}

// protectedStream: a sequential in-scope stream whose share an outcome step
// must not take. O_DIRECT and out-of-scope readers are contenders; random
// readers are protected by trims and no device window.
func (t judgeCtx) protectedStream(k probe.FileKey, fs detector.FileStats) bool {
	if fs.Sequentiality < t.cfg.MinSequentiality || t.snap.Now-fs.LastSeen > t.cfg.Settle {
		return false
	}
	if fd := t.files[k]; fd != nil {
		return !fd.outOfScope
	}
	return !t.outsideScope(k)
}

// maxScopeVerdicts bounds the cache of scope verdicts.
const maxScopeVerdicts = 4096

// outsideScope: every found descriptor of the file's readers is outside
// the allow-paths (unknown files are protected). Cached for BackoffMax.
func (t *Tuner) outsideScope(k probe.FileKey) bool {
	now := t.deps.Clock.Now()
	if v, ok := t.scopeOf[k]; ok && now-v.at < t.cfg.BackoffMax {
		return v.outside
	}
	found, inside := 0, 0
	for tgid, r := range t.readers[k] {
		if now-r.lastSeen > t.cfg.Grace {
			continue
		}
		refs, err := t.deps.Files.Find(tgid, k)
		if err != nil {
			continue
		}
		for _, ref := range refs {
			found++
			if _, err := t.scope.Check(ref.Tgid, ref.FD, ref.Path, k); err == nil {
				inside++
			}
		}
	}
	outside := found > 0 && inside == 0
	if len(t.scopeOf) >= maxScopeVerdicts {
		for k2, v := range t.scopeOf {
			if now-v.at >= t.cfg.BackoffMax {
				delete(t.scopeOf, k2)
			}
		}
	}
	if len(t.scopeOf) < maxScopeVerdicts {
		t.scopeOf[k] = scopeVerdict{outside: outside, at: now}
	}
	return outside
}

// measureFor is a decision's measure: rate for decisions no regime
// started, busy throughput otherwise.
func (t judgeCtx) measureFor(fd *fileDec) measure {
	m := t.fileMeasure(fd.key)
	m.othersMustNotLose = fd.byRate
	if fd.byRate {
		// A stream begun inside the window looks paid by any step:
		// busy throughput until measured whole.
		if _, whole := t.windowKB(fd.key); whole || fd.win.trial.to != 0 {
			m.tput = m.rate
		} else {
			m.young = true
		}
	}
	return m
}

// endedGap: no request completed for this long: not reading now (a
// window-bound stream completes one every few ms, even slowed).
const endedGap = 250 * time.Millisecond

// firstRead is the earliest current reader's first event (0: none).
func (t *Tuner) firstRead(k probe.FileKey) time.Duration {
	var first time.Duration
	for _, r := range t.readers[k] {
		if first == 0 || r.firstSeen < first {
			first = r.firstSeen
		}
	}
	return first
}

// pauseIn is the shortest pause in the span from start among its readers.
func (t *Tuner) pauseIn(k probe.FileKey, start time.Duration) time.Duration {
	var least time.Duration = -1
	for _, r := range t.readers[k] {
		if r.lastSeen < start {
			continue
		}
		var p time.Duration
		if r.resumedAt > start {
			p = r.resumedAt - max(r.pausedAt, start)
		}
		if least < 0 || p < least {
			least = p
		}
	}
	return max(least, 0)
}

// peerGain: what the device's other file window steps taken since l's
// before-measure (half a span before its step on) added to their streams
// over the span judged: held still, or undone within its last half (judged
// first in the same Step). Steps taken together are paid for by one device:
// its busy rate bounds what they won together (device_at_capacity).
func (t judgeCtx) peerGain(l *ladder, d *devState, file probe.FileKey) float64 {
	span, now := t.viewSpan(), t.deps.Clock.Now()
	var g float64
	for k, fd := range t.files {
		p := &fd.win
		if fd.dev != d || k == file || p.trial.at <= l.trial.at-span/2 || p.inForce() <= p.trial.from && now-p.movedAt > span/2 || !p.trial.before.ok {
			continue
		}
		g += max(0, float64(t.fstats[k].Bytes)/span.Seconds()-p.trial.before.rate) // 0 if not read
	}
	return g
}

// endedMinActive: a stream that read less than this before ending is not judged.
const endedMinActive = 100 * time.Millisecond

// lossBase is before's device total and protected share less the streams
// that stopped since: a larger window slows others, it does not stop them.
func lossBase(b, m measure) (dev, others float64) {
	dev, others = b.dev, b.others
	for _, o := range b.streams {
		if o.bps <= 0 || slices.ContainsFunc(m.streams, func(a otherStream) bool { return a.key == o.key && a.bps > 0 && !a.ended }) {
			continue
		}
		dev -= o.bps
		if o.protected {
			others -= o.bps
		}
	}
	return max(dev, 0), max(others, 0)
}

// devLossMax: a file window step losing more of the device total is not kept.
const devLossMax = 0.05

// windowKB is the largest window (ra_pages in events) seen in two Settles,
// and whether a reader read for a whole measurement.
func (t judgeCtx) windowKB(k probe.FileKey) (int, bool) {
	now := t.deps.Clock.Now()
	w, whole := 0, false
	// Whole: read since the view's span began, by half again.
	span := t.viewSpan()
	for _, r := range t.readers[k] {
		if now-r.lastSeen <= 2*t.cfg.Settle && r.raKB > w {
			w = r.raKB
		}
		if now-r.firstSeen >= span+span/2 {
			whole = true
		}
	}
	return w, whole
}
