package tuner

// What a step is judged by: a stream's measure over the detector's window (its
// rate or busy throughput, the device's total, the other streams' share, the
// random readers' service beside it), and whether another reader's share is
// one a step must not take.

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
	// The detector's window is the tuner's Settle (the daemon sets both to
	// its interval), or the recent span of a fresh stream's first step.
	span := t.viewSpan().Seconds()
	// A stream that stopped reading inside the span (its reader reached
	// the end of its file, or closed it) read for only part of it: over
	// the whole span its rate would understate what it got. A 256 MB
	// file read at 200 MB/s ends within a second of a step, and its
	// verdict read -64% for a step that paid.
	// Judging a stream that stopped (endedVerdict), the span is the
	// step's: it ends at the stream's last request.
	active, ended := span, false
	if gap := (t.snap.Now - fs.LastSeen).Seconds(); gap > endedGap.Seconds() || t.mode == judgeEnded {
		active, ended = span-gap, true
		if active < endedMinActive.Seconds() {
			return measure{}
		}
	}
	// Likewise a stream that began inside the span (a fresh open, read
	// whole within a second) read only from its first readahead on.
	start := t.snap.Now - time.Duration(span*float64(time.Second))
	if late := (t.firstRead(k) - start).Seconds(); late > 0 && active-late >= endedMinActive.Seconds() {
		active -= late
	}
	// And a stream that paused inside it (its reader finished the file
	// and opened it again) read only around the pause: a healthy lab
	// stream re-read after half a second's pause read "77 MB/s", and a
	// step against that "paid" +96%.
	if p := t.pauseIn(k, start).Seconds(); p > 0 && active-p >= endedMinActive.Seconds() {
		active -= p
	}
	m := measure{ok: true, tput: fs.BusyThroughput, p50: fs.P50, rate: float64(fs.Bytes) / active, ended: ended}
	m.rand = t.randomCost(fs.Device, k)
	if ds, ok := t.dstats[fs.Device]; ok {
		// The stream's own share counts at its rate while it read, as
		// the device's before-measure counted it.
		m.dev = float64(ds.Bytes)/span - float64(fs.Bytes)/span + m.rate
		m.devBusy = ds.BusyThroughput
		// Random readers' bytes say nothing of what they get (a trimmed
		// mmap reader reads fewer bytes by design, and touches more
		// pages): they are left out of the total a step is judged by,
		// before and after alike; their budget protects them (random.go).
		for ok2, ofs := range t.fstats {
			if ok2 == k || ofs.Device != fs.Device {
				continue
			}
			if t.readRandomly(ofs) {
				m.dev -= float64(ofs.Bytes) / span
				continue
			}
			bps := float64(ofs.Bytes) / span
			prot := t.protectedStream(ok2, ofs)
			if prot {
				m.others += bps
			}
			ended := t.snap.Now-ofs.LastSeen > endedGap
			m.streams = append(m.streams, otherStream{key: ok2, bps: bps, protected: prot, ended: ended})
		}
	}
	return m
}

// protectedStream reports whether another file's reader is one whose share
// of the device a step no regime asked for must not take: a sequential
// stream readaheadd serves (read now, and not found outside the
// allow-paths; several HDFS clients on one device are each other's
// others). Reads the probe cannot name (O_DIRECT) and files found outside
// the allow-paths are contenders whose share a larger window legitimately
// wins back, as it does under a contention regime; random and mmap readers
// are protected by the trim and the no-device-window rule instead, and
// left out of every total.
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

// outsideScope reports whether every descriptor of a file's known readers
// is outside the allow-paths (false when none is found: unknown files are
// protected). Cached for BackoffMax: the files of a device's other readers
// are looked up once, not at every verdict.
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

// measureFor is the measure a decision is judged by: the stream's rate for
// decisions no regime started, its busy throughput otherwise.
func (t judgeCtx) measureFor(fd *fileDec) measure {
	m := t.fileMeasure(fd.key)
	m.othersMustNotLose = fd.byRate
	if fd.byRate {
		// A stream that began inside the detector's window read only part
		// of it: its rate there understates it, and any step would look
		// paid. Its busy throughput is its rate while it read (a
		// window-bound stream is busy all along); the step's own verdict,
		// a window later, is by rate.
		if _, whole := t.windowKB(fd.key); whole || fd.win.trial.to != 0 {
			m.tput = m.rate
		} else {
			m.young = true
		}
	}
	return m
}

func (t judgeCtx) devMeasure(dev probe.Dev) measure {
	ds, ok := t.dstats[dev]
	if !ok || ds.BusyThroughput <= 0 {
		return measure{}
	}
	return measure{ok: true, tput: ds.BusyThroughput, p50: ds.P50}
}

// endedGap: a stream that completed no request for this long is not
// reading now (its reader finished or closed its file). A window-bound
// stream completes a request every few milliseconds, even slowed by +8 ms;
// a larger window elsewhere delays it by a queue of milliseconds, never
// this long.
const endedGap = 250 * time.Millisecond

// firstRead is when the file's earliest current reader had its first
// readahead event (0 if none is known).
func (t *Tuner) firstRead(k probe.FileKey) time.Duration {
	var first time.Duration
	for _, r := range t.readers[k] {
		if first == 0 || r.firstSeen < first {
			first = r.firstSeen
		}
	}
	return first
}

// pauseIn is how much of the span from start the file's stream was paused:
// the shortest pause within it of the readers that read in it (one reader
// that read all along leaves none).
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

// endedMinActive: a stream that read for less of the span than this before
// it ended says too little of a step to judge it by.
const endedMinActive = 100 * time.Millisecond

// lossBase is what a step's verdict compares the device's total and its
// protected streams' share after it against: before's, less the streams
// that read nothing since, or stopped reading since (a last few requests,
// then nothing for endedGap). A stream that stopped ended (its reader
// closed or paused): a larger window elsewhere slows another stream, it
// does not stop it, and a reader that finished as the step began is no
// loss of it.
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

// devLossMax: a file window step whose device total falls by more than this
// share is not kept.
const devLossMax = 0.05

// windowKB is the largest window a reader of the file was seen with in the
// last Settle (readahead events carry the open file's ra_pages), 0 if none,
// and whether a reader has been reading it for a whole measurement (a
// stream that started within the detector's window reads at a fraction of
// its rate there: a step judged against that would be kept for nothing).
func (t judgeCtx) windowKB(k probe.FileKey) (int, bool) {
	now := t.deps.Clock.Now()
	w, whole := 0, false
	// Whole: read since before the span the tuner's view covers (a
	// Settle, or the recent span of a check between Steps), by half again.
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
