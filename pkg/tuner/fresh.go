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

// freshOpen pins the memory's window on a new reader of a file with no
// decision, as a trial judged a Settle later. t.mu held.
func (t judgeCtx) freshOpen(ev probe.ReadaheadEvent, r *readerInfo, now time.Duration) {
	key, disk, tgid, evAt := ev.File, ev.Device, ev.Tgid, ev.Time
	if disk == 0 || t.cfg.DryRun || t.scope.Empty() || !t.mem.Has(key.Dev) || now-r.priorAt < t.cfg.Grace && r.priorAt != 0 {
		return
	}
	// Only a stream: a head read, or async readahead following the reader's
	// previous window. A random mmap fault on a read-around marker raises an
	// async event mid-file, where a larger window amplifies every fault.
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
	// A prior learned for another disk is not used.
	if p == nil || p.Device != d.name || p.BaseBPS <= 0 || kb <= d.orig || r.raKB >= kb {
		return
	}
	if p.Check(key, now) {
		// Re-check: this stream reads at the device's window for a Settle.
		t.count(EvPriorRecheck)
		return
	}
	kb = t.clamp(d, kb)
	climbFrom := 0
	if lim, why := t.randomLimitKB(fd.dev, fd.key, &fd.win); lim >= 0 {
		// Beside random readers: only as far as their budget allows.
		if lim = lim / randStepKB * randStepKB; float64(lim) < randMinStep*float64(d.orig) {
			t.log.Debug("tuner: prior not applied beside random readers", "file", key.String(), "why", why)
			r.priorAt = 0
			return
		}
		kb = min(kb, lim)
	} else if w, ok := t.watchedAt[d.dev]; ok && now-w >= t.cfg.Settle && kb == p.Window {
		// The prior's own ladder: try the step above, once the
		// device's random readers are known.
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
	// Event timestamp to pin: polling, decoding and the pin.
	lag := time.Duration(0)
	if evAt > 0 && t.deps.Clock.Now() > evAt {
		lag = t.deps.Clock.Now() - evAt
	}
	fd.prior = p
	fd.regimes = []detector.RegimeKind{FromPrior}
	fd.lastNeeded = now
	base := measure{ok: true, tput: p.BaseBPS, rate: p.BaseBPS}
	t.deviceSide(&base, key, d.dev, base.rate, t.viewSpan().Seconds()) // the device as it reads now: the loss rules judge a prior too
	s := trialStep{to: kb, from: d.orig, at: now, before: base}
	why := fmt.Sprintf("prior: %d KB paid for %d recent stream(s) in this directory (%.1f -> %.1f MB/s); given to %d descriptor(s) %v after the file's first readahead event",
		p.Window, p.Streams, p.BaseBPS/1e6, p.KeptBPS/1e6, n, lag.Round(100*time.Microsecond))
	if climbFrom > 0 {
		// Judged against the prior's kept rate; falls back to it.
		fd.climbFrom, s.from = climbFrom, climbFrom
		fd.win.keepAt(climbFrom, 0, now)
		s.before.tput, s.before.rate = p.KeptBPS, p.KeptBPS
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

// followsStream: ev is a stream's next window after page prev (ahead by at
// most two of the largest windows shown); a random reader's lands anywhere.
func followsStream(prev uint64, ev probe.ReadaheadEvent) bool {
	span := 2 * uint64(max(ev.Size, ev.RaPages, 32))
	return ev.Index > prev && ev.Index-prev <= span
}

// judgePriorChecks ends re-checks whose stream read a Settle at the
// device's window: as fast as the prior's kept rate (less the margin) drops
// it; else the next re-check waits twice as long. t.mu held.
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

// loadPriors reads the priors file; a fault is one warning and no priors.
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
		// The disk must exist.
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

// catchUp raises a kept window to its directory's prior when a new stream
// starts (HDFS reopens per read); not over a knee, beside random readers,
// or during a step.
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

// Fresh streams are judged on the recent requests: Little's law needs only
// bytes in flight, window and latency, and waiting a whole Settle costs a
// slowed stream much of its read. Judged one Settle later as any step.
const (
	// freshMinAge: a younger reader has not ramped its window yet.
	freshMinAgeDiv = 10 // Settle / 10: 100 ms at 1 s
	// freshMinRequests: fewer say too little about bytes in flight.
	freshMinRequests = 32
	// maxFresh bounds the fresh streams waiting for their first judgement.
	maxFresh = 4096
)

// noteFresh records a decision-less file first read at firstSeen. t.mu held.
func (t *Tuner) noteFresh(k probe.FileKey, firstSeen, now time.Duration) {
	if t.scope.Empty() || now-firstSeen > t.cfg.Settle {
		return
	}
	// Kept: the earliest first read; a new file only within maxFresh.
	if at, ok := t.fresh[k]; ok && at <= firstSeen || !ok && len(t.fresh) >= maxFresh {
		return
	}
	t.fresh[k] = firstSeen
}

// freshStreams returns the fresh files old enough to judge and the span.
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
	// Slow streams need up to 3/4 Settle of their life.
	span := t.cfg.Settle / freshSpanDiv
	for _, k := range keys {
		span = max(span, min(now-t.fresh[k], 3*t.cfg.Settle/4))
	}
	return keys, span
}

// newDec records a decision on k at the device's window (byRate: outcome).
func (t *Tuner) newDec(k probe.FileKey, d *devState, byRate bool, now time.Duration, regimes ...detector.RegimeKind) *fileDec {
	fd := &fileDec{key: k, dev: d, byRate: byRate, regimes: regimes, lastNeeded: now,
		win: ladder{kind: KindFileWindow, base: d.orig, cur: d.orig},
		pf:  ladder{kind: KindPrefetch, first: t.cfg.PrefetchStartKB}}
	t.files[k] = fd
	return fd
}

// fastOutcome takes the first outcome step on fresh window-bound streams,
// on the recent requests (snap, over span), judged a Settle later.
func (t *Tuner) fastOutcome(snap detector.Snapshot, span time.Duration) []Action {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out = nil
	if t.scope.Empty() || len(t.fresh) == 0 || span <= 0 {
		return nil
	}
	now := t.deps.Clock.Now()
	// Measured on the recent span.
	j := t.on(snap, span, judgeStep)
	j.noteTails(snap.Files, now)
	for _, f := range snap.Files {
		if _, ok := t.fresh[f.Key]; !ok || f.Requests < freshMinRequests || t.ownWindow(f.Key) || t.trims[f.Key] != nil || t.mem.Checking(f.Key) {
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
			// Earlier trials' back-off and knee no longer hold; outcomeDue does.
			fd.win.retryNow(true)
			fd.lastNeeded = now
		}
		t.log.Debug("tuner: fresh stream bound by its window", "file", f.Key.String(), "span", span, "why", why, "reopened", !created)
		if j.firstStep(fd, created) && fd.win.trial.to != 0 {
			t.count(EvFresh)
		}
	}
	return t.out
}
