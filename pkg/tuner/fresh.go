package tuner

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/state"
)

// freshOpen is called on a readahead event of a reader of a file with no
// decision: if the memory holds a window for the file or its directory, it
// is pinned on the reader's open file now, from the event path, as a trial
// judged like any other one Settle later against the throughput the prior's
// streams had at the device's window. Called with t.mu held.
func (t judgeCtx) freshOpen(ev probe.ReadaheadEvent, r *readerInfo, now time.Duration) {
	key, disk, tgid, evAt := ev.File, ev.Device, ev.Tgid, ev.Time
	if disk == 0 || t.cfg.DryRun || t.scope.Empty() || !t.mem.Has(key.Dev) || now-r.priorAt < t.cfg.Grace && r.priorAt != 0 {
		return
	}
	// Only a stream: a read from the head of the file, or asynchronous
	// readahead that follows the reader's previous window (a stream the
	// daemon meets mid-file, begun before it started). A page fault of a
	// random mmap reader reads around its page, mid-file, with no event;
	// when it lands on the marker a read-around left, the fault's
	// asynchronous readahead is an event at a random place, after no window
	// of its own: a larger window there is read amplification on every
	// fault. A file the detector sees read randomly, or trimmed, is left
	// alone too (before the first Step the detector has seen nothing).
	if ev.Index != 0 && (!ev.Async || !r.follows) {
		return
	}
	if fs, ok := t.fstats[key]; ok && t.readRandomly(fs) || t.trims[key] != nil {
		return
	}
	r.priorAt = now
	d := t.device(disk)
	if d == nil {
		return
	}
	fd := &fileDec{key: key, dev: d, byRate: true,
		win: ladder{kind: KindFileWindow, base: d.orig, cur: d.orig},
		pf:  ladder{kind: KindPrefetch, first: t.cfg.PrefetchStartKB}}
	refs := t.refs(fd, map[uint32]bool{tgid: true})
	if len(refs) == 0 {
		return
	}
	kb, p := t.mem.Lookup(key, fd.path)
	// A prior names its disk: one learned (or loaded) for another disk
	// than the one holding the file now is not used.
	if p == nil || p.Device != d.name || p.BaseBPS <= 0 || kb <= d.orig || r.raKB >= kb {
		return
	}
	if p.Check(key, now) {
		// Re-check: this stream reads at the device's window for one
		// Settle; judgePriorChecks compares it with the prior's streams.
		t.count(EvPriorRecheck)
		return
	}
	kb = t.clamp(d, kb)
	climbFrom := 0
	if lim, why := t.randomLimitKB(fd); lim >= 0 {
		// Random readers beside it: the prior's window only as far as
		// their budget allows (random.go); the Step takes it from there.
		if lim = lim / randStepKB * randStepKB; float64(lim) < randMinStep*float64(d.orig) {
			t.log.Debug("tuner: prior not applied beside random readers", "file", key.String(), "why", why)
			r.priorAt = 0
			return
		}
		kb = min(kb, lim)
	} else if w, ok := t.watchedAt[d.dev]; ok && now-w >= t.cfg.Settle && kb == p.Window {
		// The prior's own ladder: this open tries the step above it, once
		// the device's readers are known (a daemon that has just started
		// does not know the random readers a climb would cost).
		if next := t.clamp(d, t.mem.Climb(p, key, now, t.cfg.Growth, t.cfg.MaxKB, 4*t.cfg.Settle)); next > kb {
			climbFrom, kb = kb, next
		}
	}
	n, err := t.pin(d, kb, refs, true)
	if err != nil {
		if !errors.Is(err, errRateLimited) {
			t.log.Debug("tuner: prior not applied to a fresh open", "file", key.String(), "path", fd.path, "err", err)
		}
		r.priorAt = 0 // try again on its next event
		if climbFrom > 0 {
			t.mem.Unclimb(p, key) // not tried: no knee
		}
		return
	}
	r.appliedKB, r.appliedAt, r.pending = kb, now, false
	// From the kernel's timestamp of the event to the pin: ring buffer
	// polling, decoding and the pin itself.
	lag := time.Duration(0)
	if evAt > 0 && t.deps.Clock.Now() > evAt {
		lag = t.deps.Clock.Now() - evAt
	}
	fd.prior = p
	fd.regimes = []detector.RegimeKind{FromPrior}
	fd.lastNeeded = now
	base := measure{ok: true, tput: p.BaseBPS, rate: p.BaseBPS}
	s := trialStep{to: kb, from: d.orig, at: now, before: base}
	why := fmt.Sprintf("prior: %d KB paid for %d recent stream(s) in this directory (%.1f -> %.1f MB/s); given to %d descriptor(s) %v after the file's first readahead event",
		p.Window, p.Streams, p.BaseBPS/1e6, p.KeptBPS/1e6, n, lag.Round(100*time.Microsecond))
	if climbFrom > 0 {
		// Judged against what the prior's window gave its streams; not
		// paying, it falls back to that window (and the prior holds it).
		fd.climbFrom, s.from = climbFrom, climbFrom
		fd.win.keepAt(climbFrom, 0, now)
		s.before = measure{ok: true, tput: p.KeptBPS, rate: p.KeptBPS}
		t.count(EvPriorClimb)
		why = fmt.Sprintf("prior climbs: %d KB paid for %d recent stream(s) in this directory (%.1f -> %.1f MB/s); this one tries %d KB, given to %d descriptor(s) %v after the file's first readahead event",
			p.Window, p.Streams, p.BaseBPS/1e6, p.KeptBPS/1e6, kb, n, lag.Round(100*time.Microsecond))
	}
	fd.win.begin(s, base, now)
	t.files[key] = fd
	t.count(EvPriorApplied)
	t.emit(Action{Time: now, Device: d.name, Dev: d.dev, File: key, Path: fd.path, Kind: KindFileWindow, FromKB: s.from, ToKB: kb,
		Result: ResultTrial, Evidence: why})
}

// followsStream reports whether ev, a reader's readahead event, is a
// stream's next window after its event at page prev: ahead of it by no
// more than two of the largest windows the event shows. A stream's
// asynchronous readahead comes at the marker of the window before, a
// window ahead; a random reader's lands anywhere in the file.
func followsStream(prev uint64, ev probe.ReadaheadEvent) bool {
	span := 2 * uint64(max(ev.Size, ev.RaPages, 32))
	return ev.Index > prev && ev.Index-prev <= span
}

// judgePriorChecks ends the re-checks of priors whose stream has read at
// the device's window for a Settle: a stream at least as fast as the
// prior's streams were at their kept window, less the margin, means the
// window no longer pays there (the device recovered): the prior is
// dropped. Otherwise the prior stands and the next re-check waits twice as
// long. Called from Step with t.mu held.
func (t judgeCtx) judgePriorChecks(now time.Duration) {
	for p := range t.mem.Dirs() {
		key, age := p.Checked(now)
		if key.IsZero() || age < t.cfg.Settle-t.cfg.Settle/10 {
			continue
		}
		m := t.fileMeasure(key)
		if !m.ok {
			if age > 4*t.cfg.Settle {
				p.EndCheck(false, now, 0) // no reads to judge by: the next open re-checks
			}
			continue
		}
		recovered := m.rate >= p.KeptBPS/(1+t.cfg.Margin)
		p.EndCheck(!recovered, now, t.cfg.BackoffMax)
		if recovered {
			t.count(EvPriorDropped)
			t.log.Info("tuner: a stream read as fast at the device's window as the prior's window made its neighbours; prior dropped",
				"device", p.Device, "window_kb", p.Window, "rate_mbps", m.rate/1e6, "prior_kept_mbps", p.KeptBPS/1e6)
			t.mem.Decay(p, true)
			t.mem.ForgetFile(key)
			continue
		}
		t.count(EvPriorConfirmed)
	}
}

// loadPriors reads the priors file of the state directory. Anything wrong
// with it is one warning and no priors; entries outside the configuration
// are refused.
func (t *Tuner) loadPriors() {
	if t.priorsPath == "" || t.scope.Empty() {
		return
	}
	p, err := state.LoadPriors(t.priorsPath)
	if err != nil {
		t.log.Warn("tuner: ignoring the saved priors; windows are learned afresh (the file is replaced at the next save)", "err", err)
		return
	}
	refused := t.mem.Load(p, func(device string) bool {
		if blockdev.ValidName(device) != nil || len(t.cfg.Devices) > 0 && !slices.Contains(t.cfg.Devices, device) {
			return false
		}
		// The disk must exist; a fresh open uses the prior only if its
		// file is on that very disk (freshOpen).
		_, err := t.deps.Sysfs.ReadAheadKB(device)
		return err == nil
	}, t.scope.Covers, t.cfg.MaxKB, t.deps.Clock.Now())
	if refused > 0 {
		t.log.Warn("tuner: saved priors outside the configured devices and allow-paths were ignored", "file", t.priorsPath, "refused", refused)
	}
	if dirs, files, caps := t.mem.Len(); dirs+files+caps > 0 {
		t.log.Info("tuner: loaded saved priors", "file", t.priorsPath, "dirs", dirs, "files", files, "capacities", caps)
	}
}

// savePriors writes the memory when it changed (prior.Memory.Save).
func (t *Tuner) savePriors(force bool) {
	if t.priorsPath == "" || t.cfg.DryRun {
		return
	}
	if err := t.mem.Save(t.priorsPath, t.deps.Clock.Now(), force); err != nil {
		t.log.Warn("tuner: could not save priors; a restart would learn them again", "err", err)
	}
}

// catchUp raises the window a file's decision keeps to its directory's
// prior when a new stream starts on the file (a read from its head) and the
// prior has climbed above it since (HDFS reads a block file again with a
// fresh open; its decision is from an earlier stream). Not over a knee the
// file's own steps found, nor beside random readers (their budget sizes
// every step there), nor while a step or re-probe is under way.
func (t judgeCtx) catchUp(fd *fileDec, now time.Duration) {
	l := &fd.win
	if t.cfg.DryRun || l.trial.to != 0 || l.reprobe.until != 0 || l.back.knee || fd.pf.trial.to != 0 || l.cur <= l.base || t.randomReaderBeside(fd) {
		return
	}
	p := t.mem.Dir(fd.key.Dev, fd.path)
	if p == nil || p.Device != fd.dev.name {
		return
	}
	kb := t.clamp(fd.dev, p.Window)
	if kb <= l.cur {
		return
	}
	from := l.cur
	l.keepAt(kb, l.cur, now)
	t.count(EvPriorCaughtUp)
	t.log.Debug("tuner: a file's kept window raised to its directory's prior", "file", fd.key.String(), "path", fd.path,
		"from_kb", from, "to_kb", kb)
}

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
			fd.win.retryNow(true)
			fd.lastNeeded = now
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
		} else if fd.win.trial.to != 0 {
			t.count(EvFresh)
		}
	}
	return t.out
}
