package tuner

// Driving the knobs: a file's window and prefetch, a device's window, and
// their undo; the device's window given to the files already open on it.

import (
	"errors"
	"fmt"
	"slices"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// driveFile advances the file's knobs; with escalate false it only judges
// a step under trial (the regime ended: no new step).
func (t judgeCtx) driveFile(fd *fileDec, escalate bool) {
	// A file refused by the allow-paths waits BackoffMax; one refused
	// silently on its outcome alone is tried once more when a regime asks,
	// so that refusal is logged and counted.
	if fd.outOfScope && (fd.scopeWarned || onlyOutcome(fd.regimes)) && t.deps.Clock.Now()-fd.scopeAt < t.cfg.BackoffMax {
		return
	}
	why := fmt.Sprintf("regimes %v", fd.regimes)
	// A larger window only helps a sequential reader: on a random (mmap)
	// reader every fault reads the whole window, its busy throughput rises
	// while its reads slow down, and the loop would keep the step.
	if fs, ok := t.fstats[fd.key]; ok && fs.Sequentiality < t.cfg.MinSequentiality && fd.win.trial.to == 0 && fd.pf.trial.to == 0 {
		if !fd.notSeqLogged {
			fd.notSeqLogged = true
			t.log.Info("tuner: file is not read sequentially; no window action", "file", fd.key.String(), "regimes", fd.regimes,
				"sequentiality", fs.Sequentiality, "min_sequentiality", t.cfg.MinSequentiality)
		}
		return
	}
	m := t.measureFor(fd)
	if m.ended {
		escalate = false // its reader stopped: no next step to judge
	}
	hint := t.windowHint(fd.key)
	if fd.byRate && t.knownCapacity(fd.dev.dev) == 0 {
		// Without a known capacity the hint rests on the detector's best rate,
		// a slow device's slow rate, and undershoots: start at FirstStepFactor
		// x base (one trial; at bandwidth it is undone and teaches the capacity).
		hint = max(hint, t.cfg.FirstStepFactor*fd.win.base)
	}
	if m.ok {
		// A stream with a tail waits on its slowest requests: the window
		// that hides them is sized by the p99.
		hint = max(hint, t.tailNeedKB(fd.key, m.tput))
	}
	fd.win.limit.setFn(nil)
	beside := t.randomReaderBeside(fd)
	if fd.win.back.knee && fd.win.back.kneeRandom && !beside {
		// The random readers whose budget set the knee are gone.
		fd.win.clearBack()
	}
	if beside {
		// Each window queued for the stream delays the random readers' faults:
		// small steps within their budget, each paying its margin (random.go).
		hint = 0
		t.sizeByRandom(fd.dev, fd.key, &fd.win, m, escalate)
	}
	// A rate-driven decision needs a learned capacity (the best rate seen
	// may be a slow drive's); any stops at a device at it (atCapacity): a
	// window there moves bytes between readers. A regime the fast path just
	// entered (justIn) skips both: its measure reads the old rate.
	capFrac := t.cfg.CapacityFrac
	if !beside {
		// A step that takes a lone stream to the capacity pays at half the
		// margin (marginFor): it is tried up to where that half is left.
		capFrac = max(capFrac, t.shortOfCapacity())
	}
	capBPS, _ := t.capacity(fd.dev.dev)
	learnedAt, _ := t.atCapacity(t.fstats[fd.key])
	if escalate && m.ok && (capBPS > 0 && m.tput >= capFrac*capBPS && (!fd.byRate || fd.win.capKept) || learnedAt) && !t.justIn {
		// The file already reads at (nearly) the device's capacity: no
		// further step can gain. Judge a trial, take none.
		escalate = false
		if !fd.atCapLogged {
			fd.atCapLogged = true
			t.log.Info("tuner: file reads at the device's capacity; no further step", "file", fd.key.String(), "path", fd.path,
				"window_kb", fd.win.inForce(), "busy_mbps", m.tput/1e6, "capacity_mbps", capBPS/1e6, "regimes", fd.regimes)
		}
	} else if escalate {
		fd.atCapLogged = false
	}
	if escalate && !beside && fd.win.cur == fd.win.base && fd.win.trial.to == 0 && t.randomUnmeasured(fd.dev.dev, fd.key) {
		// Random reads too few yet to price: a first step now is blind of
		// their budget (a DataNode's preads over ten files: 8x, p99 3.6x).
		escalate = false
		t.log.Debug("tuner: random reads on the device not measured yet; the first step waits for their interval", "file", fd.key.String())
	}
	if escalate && fd.byRate && fd.win.cur == fd.win.base && fd.win.trial.to == 0 {
		if !t.outcomeDue(fd.dev, fd.key) {
			escalate = false // the device's outcome trials are backing off
		} else if t.outcomeEvidence(fd.dev, fd.key) {
			fd.win.retryNow(false) // new evidence: the file's own back-off ends too
		}
	}
	if escalate && fd.pf.trial.to == 0 {
		t.kneeStale(fd, m)
	}
	if t.span == 0 && fd.pf.trial.to == 0 && t.watchRandom(fd, m) {
		return // the kept window cost the random readers beside it too much: lowered
	}
	applyWin := func(kb int) error { return t.pinFile(fd, kb, nil, true) }
	fd.win.aim(hint, onlyOutcome(fd.regimes))
	if fd.pf.trial.to == 0 {
		hadTrial := fd.win.trial.to != 0
		did := t.drive(&fd.win, fd.dev, fd.key, fd.path, m, why, escalate, applyWin)
		t.remember(fd, hadTrial)
		if fd.win.trial.to > fd.win.base && fd.win.limit.kb > 0 {
			// A step beside random readers: their read-around trim comes
			// with it, not at the next Step (their budget counts on it).
			t.startTrims(fd.dev, true)
		}
		if did || fd.win.trial.to != 0 {
			return
		}
	}
	// Prefetch when the window alone is not enough. Not beside a random
	// reader: prefetched ranges queue ahead of its faults as a larger window
	// would, and the window's knee already says what the device can take.
	pfEscalate := escalate && !t.randomReaderBeside(fd)
	winDone := fd.win.trial.to == 0 && (fd.win.back.knee || fd.win.cur >= t.cfg.MaxKB) // no more from it alone
	if winDone && !t.cfg.DisablePrefetch && (pfEscalate || fd.pf.trial.to != 0) {
		if fs, ok := t.fstats[fd.key]; ok && fs.Sequentiality >= t.cfg.MinSequentiality || fd.pf.trial.to != 0 {
			t.drive(&fd.pf, fd.dev, fd.key, fd.path, m, why+", window at its knee or maximum", pfEscalate, func(kb int) error {
				if len(t.refs(fd, nil)) == 0 {
					return errNoReaders
				}
				return nil // prefetchAll issues it each interval
			})
		}
	}
}

// sizeByRandom sizes l's steps (a file's window, or d's with except zero) by
// the budget of the random readers on d but except (randomLimitKB). Before a
// first step their reference is what they get now, at the device's window.
func (t judgeCtx) sizeByRandom(d *devState, except probe.FileKey, l *ladder, m measure, escalate bool) {
	if escalate && l.cur == l.base && l.trial.to == 0 {
		t.refreshRandom(d)
	}
	ceil := l.limit.ceil
	if m.ok && m.tput > 0 && l.limit.perKB > 0 {
		// What a window costs the random readers is the stream's share of the
		// device, its rate: the ceiling moves with the rate a KB reads now.
		ceil = int(float64(ceil) * l.limit.perKB * float64(l.inForce()) / m.tput)
	}
	l.limit.setFn(func() int {
		lim, why := t.randomLimitKB(d, except, l)
		if lim < 0 {
			return 0
		}
		if ceil > 0 && t.deps.Clock.Now() < l.limit.ceilUntil {
			lim = min(lim, ceil/randStepKB*randStepKB-randStepKB)
		}
		t.log.Debug("tuner: step beside random readers", "device", d.name, "file", except.String(), "kind", l.kind, "value_kb", l.cur, "limit_kb", lim, "why", why)
		return max(lim, l.cur)
	})
}

// driveDevice advances d's window; beside (pread) random readers each step
// is sized by their budget as a file window's is (read-around ones keep it off).
func (t judgeCtx) driveDevice(d *devState, why string, escalate bool) {
	var m measure
	if ds, ok := t.dstats[d.dev]; ok && ds.BusyThroughput > 0 {
		// Every random reader on the device pays for its window (s1-16: 1.55x).
		m = measure{ok: true, tput: ds.BusyThroughput, p50: ds.P50, rand: t.randomCost(d.dev, probe.FileKey{})}
	}
	t.sizeByRandom(d, probe.FileKey{}, &d.win, m, escalate)
	t.drive(&d.win, d, probe.FileKey{}, "", m, why, escalate, func(kb int) error {
		if err := t.setDevice(d, kb, true); err != nil {
			return err
		}
		t.reachOpenFiles(d)
		return nil
	})
}

// ownWindow: a file's decision holds a window of its own (kept or under
// trial); an outcome decision backing off at base leaves it the device's.
func (t *Tuner) ownWindow(k probe.FileKey) bool {
	fd := t.files[k]
	return fd != nil && !(fd.byRate && fd.win.cur == fd.win.base && fd.win.trial.to == 0 && fd.win.reprobe.until == 0)
}

// reachOpenFiles gives the device's window to the files read on it now, but
// those with a decision (read_ahead_kb reaches only later opens, and a
// device-wide regime slows open ones too); back at its original, they get it back.
func (t judgeCtx) reachOpenFiles(d *devState) {
	if t.cfg.DryRun || t.scope.Empty() {
		return
	}
	now := t.deps.Clock.Now()
	var keys []probe.FileKey
	if d.cur != d.orig {
		for k, fs := range t.fstats {
			if fs.Device == d.dev && !t.ownWindow(k) && fs.Sequentiality >= t.cfg.MinSequentiality && t.snap.Now-fs.LastSeen <= t.cfg.Settle {
				keys = append(keys, k)
			}
		}
	}
	for k := range d.reached {
		if _, ok := t.fstats[k]; !ok || d.cur == d.orig {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, compareKeys)
	keys = slices.Compact(keys)
	for _, k := range keys {
		if t.ownWindow(k) {
			delete(d.reached, k) // a decision of its own took over
			continue
		}
		fd := &fileDec{key: k, dev: d}
		refs := t.refs(fd, nil)
		move := t.raiseFiles
		if d.cur == d.orig {
			move = t.lowerFiles // the device window taken back from the files it reached
		}
		n, err := move(d, d.cur, refs, false)
		if err != nil && !errors.Is(err, errNoReaders) {
			t.log.Debug("tuner: device window not given to an open file", "file", k.String(), "err", err)
		}
		for _, ref := range refs {
			// Pinned readers stay reachable for the way back (refs).
			if r := t.readers[k][ref.Tgid]; r != nil && n > 0 {
				r.appliedKB, r.appliedAt = d.cur, now
			}
		}
		switch {
		case d.cur == d.orig:
			delete(d.reached, k)
		case n > 0:
			if d.reached == nil {
				d.reached = map[probe.FileKey]bool{}
			}
			d.reached[k] = true
			t.emit(Action{Time: now, Device: d.name, Dev: d.dev, File: k, Path: fd.path, Kind: KindFileWindow, FromKB: d.orig, ToKB: d.cur,
				Result: ResultApplied, Evidence: fmt.Sprintf("device window %d KB given to an open file read on the device", d.cur)})
		}
	}
}

func (t judgeCtx) undoDevice(d *devState, why string) {
	now := t.deps.Clock.Now()
	d.winActive = false
	if t.cfg.DryRun {
		if d.win.dryAt != 0 {
			t.emit(Action{Time: now, Device: d.name, Dev: d.dev, Kind: KindDeviceWindowUndo, FromKB: d.win.dryAt, ToKB: d.orig, Result: ResultDryRun, Evidence: why})
		}
		return
	}
	if d.cur == d.orig {
		return
	}
	from := d.cur
	res := ResultUndone
	if err := t.setDevice(d, d.orig, false); err != nil {
		res = ResultFailed
		why += "; " + err.Error()
		d.winActive = true // try again next interval
	} else {
		t.reachOpenFiles(d)
	}
	t.emit(Action{Time: now, Device: d.name, Dev: d.dev, Kind: KindDeviceWindowUndo, FromKB: from, ToKB: d.orig, Result: res, Evidence: why})
}

// randomUnmeasured reports whether dev, watched for less than a Settle,
// shows random reads (another file read at random, with fewer requests
// than a reference needs): its random readers' budget is not known yet.
func (t judgeCtx) randomUnmeasured(dev probe.Dev, except probe.FileKey) bool {
	if w, ok := t.watchedAt[dev]; ok && t.deps.Clock.Now()-w >= t.cfg.Settle {
		return false
	}
	for k, fs := range t.fstats {
		if k != except && fs.Device == dev && fs.Sequentiality <= trimMaxSequentiality && fs.Requests >= 2 && t.snap.Now-fs.LastSeen <= t.cfg.Settle {
			return true
		}
	}
	return false
}
