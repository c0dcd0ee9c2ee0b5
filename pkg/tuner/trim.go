package tuner

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// Read-around trim: a random mmap reader's faults read the whole window around
// the page; beside a stream given a larger window its files get TrimKB (no one
// device-wide value does both). Kept while its requests shrank and stay random
// beside a raised window; ended a Settle after the last, at a decision of the
// file's own, or at shutdown (docs/tuner-rules.md).

// trimAll starts, judges and ends read-around trims.
func (t judgeCtx) trimAll() {
	if t.cfg.DisableTrim || t.scope.Empty() {
		return
	}
	now := t.deps.Clock.Now()
	helped := map[*devState]bool{}
	for _, d := range t.devs {
		helped[d] = t.helping(d)
	}
	// Bounded memory: scan times and back-offs of files long gone.
	maps.DeleteFunc(t.trimScanAt, func(_ probe.FileKey, at time.Duration) bool { return now-at >= trimScanEvery })
	maps.DeleteFunc(t.trimOffs, func(_ probe.FileKey, off *trimOff) bool { return now-off.until >= t.cfg.BackoffMax })
	for _, k := range sortedKeys(t.trims) {
		td := t.trims[k]
		if helped[td.dev] {
			td.lastNeed = now
		}
		// Forget processes the event path has not acted on lately.
		maps.DeleteFunc(td.opened, func(_ uint32, m openedMark) bool { return now-max(m.at, m.until) >= trimScanEvery })
		switch {
		case t.files[k] != nil:
			// A decision of the file's own sets its window now.
			delete(t.trims, k)
			t.unwatchAround(td)
		case td.trialAt != 0 && now-td.trialAt >= t.cfg.Settle:
			// Judged on its own requests (the stream's step lands in the
			// same interval); kept only beside a window still raised.
			t.judgeTrim(td, helped[td.dev])
		case now-td.lastNeed >= t.cfg.Settle:
			t.endTrim(td, fmt.Sprintf("no window raised on the device for %v", t.cfg.Settle))
		case td.trialAt == 0 && !td.dry:
			t.retrim(td)
		}
	}
	for _, d := range sortedDevs(t.devs) {
		if helped[d] {
			t.startTrims(d, false)
		}
	}
}

// startTrims trims the read-around random readers on d not trimmed yet: each
// Step a window is raised there, and at once with a stream's step between
// Steps, so both are in force together (the readers' budget counts on it).
// withStep: such a step was just taken and counts on the trim: search now.
func (t judgeCtx) startTrims(d *devState, withStep bool) {
	if t.cfg.DisableTrim || t.scope.Empty() || d == nil || !d.known {
		return
	}
	now := t.deps.Clock.Now()
	for _, fs := range t.snap.Files {
		k := fs.Key
		if fs.Device != d.dev || t.files[k] != nil || t.trims[k] != nil ||
			!t.readRandomly(fs) || !readAroundSized(fs, d.orig, t.cfg.TrimKB) || fs.P50 <= 0 {
			continue
		}
		if off := t.trimOffs[k]; off != nil && now < off.until {
			continue
		}
		if withStep {
			t.trimScanAt[k] = now
		} else if !t.scanDue(k, now) {
			continue
		}
		refs := t.trimRefs(k, d)
		if len(refs) == 0 {
			t.log.Debug("tuner: read-around trim: no descriptor of the random reader found in scope", "file", k.String(), "readers", len(t.readers[k]))
			continue
		}
		t.referAtTrim(fs)
		td := &trimDec{key: k, dev: d, path: refs[0].Path, refs: refs, kb: t.cfg.TrimKB, from: d.cur, beforeP: fs.P50, lastNeed: now, opened: map[uint32]openedMark{}}
		ev := fmt.Sprintf("read-around trim: random reads (sequential %.0f%%) averaging %.0f KB per request, median %v, while the device serves a raised window; the readers' open files get %d KB",
			100*fs.Sequentiality, fs.MeanSize/1024, fs.P50.Round(10*time.Microsecond), t.cfg.TrimKB)
		a := Action{Time: now, Device: d.name, Dev: d.dev, File: k, Path: td.path, Kind: KindTrim, FromKB: td.from, ToKB: td.kb, Result: ResultDryRun, Evidence: ev}
		if t.cfg.DryRun {
			td.dry = true
			t.trims[k] = td
			t.emit(a)
			continue
		}
		n, err := t.lowerFiles(d, td.kb, refs, true)
		if errors.Is(err, errRateLimited) {
			delete(t.trimScanAt, k) // next interval
			continue
		}
		if err != nil {
			t.log.Debug("tuner: read-around trim not applied", "file", k.String(), "err", err)
			continue
		}
		td.trialAt = now
		t.trims[k] = td
		d.trimAt = now
		t.watchAround(td)
		a.Result, a.Evidence = ResultTrial, fmt.Sprintf("%s (%d descriptors)", ev, n)
		t.emit(a)
	}
}

// retrim trims again every descriptor open on a kept trim's file (re-opens
// get the device's window, often under the same number); the trim's refs
// become those open now, else they would grow at each search.
func (t judgeCtx) retrim(td *trimDec) {
	now := t.deps.Clock.Now()
	fs, ok := t.fstats[td.key]
	if !ok || !t.readRandomly(fs) || !readAroundSized(fs, t.origOf(fs.Device), td.kb) || !t.scanDue(td.key, now) {
		return
	}
	open := t.trimRefs(td.key, td.dev)
	if len(open) == 0 {
		return
	}
	n, err := t.lowerFiles(td.dev, td.kb, open, true)
	if errors.Is(err, errRateLimited) {
		delete(t.trimScanAt, td.key)
		return
	}
	res, ev := ResultApplied, fmt.Sprintf("read-around trim: the trimmed file read %.0f KB per request again (descriptors opened since); its %d open descriptor(s) trimmed again", fs.MeanSize/1024, n)
	a := Action{Time: now, Device: td.dev.name, Dev: td.dev.dev, File: td.key, Path: td.path, Kind: KindTrim, FromKB: td.dev.cur, ToKB: td.kb, Result: res, Evidence: ev}
	if err != nil {
		a.Result, a.Evidence = ResultFailed, ev+": "+err.Error()
		t.emitFailed(a, err)
		return
	}
	td.refs = open
	td.dev.trimAt = now
	t.reopened(td.key)
	t.fails.ok(td.key, KindTrim)
	t.emit(a)
}

// scanDue reports whether a file's readers may be searched for now, and records it.
func (t *Tuner) scanDue(k probe.FileKey, now time.Duration) bool {
	if at, ok := t.trimScanAt[k]; ok && now-at < trimScanEvery {
		return false
	}
	t.trimScanAt[k] = now
	return true
}

// trimRefs finds the in-scope descriptors on file: those of readers seen
// in readahead events, else every process's.
func (t *Tuner) trimRefs(k probe.FileKey, d *devState) []actuate.FileRef {
	if len(t.readers[k]) > 0 {
		return t.refs(&fileDec{key: k, dev: d}, nil)
	}
	if !t.takeScan() {
		// Over the global budget of whole-system scans: try again later.
		t.count(EvTrimScanDeferred)
		delete(t.trimScanAt, k)
		return nil
	}
	all, err := t.deps.Files.FindAll(k)
	if err != nil {
		t.log.Debug("tuner: cannot search for a file's readers", "file", k.String(), "err", err)
		return nil
	}
	return t.inScope(all, k)
}

// inScope keeps the descriptors on file k the allow-paths cover, each with
// its resolved path; the others are counted as refused.
func (t *Tuner) inScope(refs []actuate.FileRef, k probe.FileKey) []actuate.FileRef {
	var in []actuate.FileRef
	for _, r := range refs {
		real, err := t.scope.Check(r.Tgid, r.FD, r.Path, k)
		if err != nil {
			t.refused++
			continue
		}
		r.Path = real
		in = append(in, r)
	}
	return in
}

// judgeTrim keeps a trim whose file's requests shrank and stay random beside
// a window still raised (helping), else undoes it.
func (t judgeCtx) judgeTrim(td *trimDec, helping bool) {
	now := t.deps.Clock.Now()
	td.trialAt = 0
	fs, ok := t.fstats[td.key]
	if !ok || t.snap.Now-fs.LastSeen > t.cfg.Settle || fs.P50 <= 0 {
		t.endTrim(td, "the file is no longer read: nothing to measure the trim by")
		return
	}
	// Its latency is no verdict (the stream's step lands in the same interval):
	// judge its requests, smaller and still scattered unless read-around was used.
	notReadAround := fs.MeanSize > float64(trimSizeFactor*td.kb*1024)/2
	if notReadAround || fs.Sequentiality > trimMaxSequentiality {
		why := fmt.Sprintf("its reads turned sequential (%.0f%%): the read-around was being used", 100*fs.Sequentiality)
		if notReadAround {
			// Buffered random reads of that size, never shaped by the window;
			// or the trimmed descriptors are closed and the reader re-opens.
			why = fmt.Sprintf("its requests still average %.0f KB: they are the reads it asks for, not read-around", fs.MeanSize/1024)
			// Every descriptor it trimmed is closed (or its process gone).
			if !td.dry && len(td.refs) > 0 && !slices.ContainsFunc(td.refs, t.deps.Files.Holds) {
				why = fmt.Sprintf("its requests still average %.0f KB, and every descriptor it trimmed is closed: the reader opens the file again, and each new descriptor reads around with the device's window", fs.MeanSize/1024)
			}
		}
		off := cmp.Or(t.trimOffs[td.key], &trimOff{})
		t.trimOffs[td.key] = off
		off.failures++
		off.until = now + max(t.backoff(off.failures), time.Minute)
		if notReadAround {
			off.until = now + t.cfg.BackoffMax
		}
		t.endTrim(td, "read-around trim did not pay: "+why)
		return
	}
	if !helping {
		t.endTrim(td, "the raised window beside it was taken back at its verdict: nothing for the trim to serve")
		return
	}
	t.emit(Action{Time: now, Device: td.dev.name, Dev: td.dev.dev, File: td.key, Path: td.path, Kind: KindTrim, FromKB: td.from, ToKB: td.kb, Result: ResultKept,
		Evidence: fmt.Sprintf("read-around trim: reads still random (sequential %.0f%%), %.0f KB per request, median %v -> %v",
			100*fs.Sequentiality, fs.MeanSize/1024, td.beforeP.Round(10*time.Microsecond), fs.P50.Round(10*time.Microsecond))})
}

// endTrim gives the trimmed open files the device's window again.
func (t *Tuner) endTrim(td *trimDec, why string) {
	now := t.deps.Clock.Now()
	delete(t.trims, td.key)
	td.dev.trimAt = now
	t.unwatchAround(td)
	res := ResultUndone
	if td.dry {
		res = ResultDryRun
	} else if _, err := t.raiseFiles(td.dev, td.dev.cur, td.refs, false); err != nil {
		if errors.Is(err, actuate.ErrProcessGone) || errors.Is(err, actuate.ErrFDGone) {
			why += "; readers gone (their open files closed)"
		} else {
			res = ResultFailed
			why += "; " + err.Error()
		}
	}
	t.emit(Action{Time: now, Device: td.dev.name, Dev: td.dev.dev, File: td.key, Path: td.path, Kind: KindTrimUndo, FromKB: td.kb, ToKB: td.dev.cur, Result: res, Evidence: why})
}

func sortedKeys[V any](m map[probe.FileKey]V) []probe.FileKey {
	return slices.SortedFunc(maps.Keys(m), compareKeys)
}

// scansPerSec bounds the walks of every process's descriptors (FindAll):
// each reads /proc/PID/fd of every process.
const scansPerSec = 2

// takeScan takes one whole-system scan from the budget.
func (t *Tuner) takeScan() bool {
	return t.scans.takeN(t.deps.Clock.Now(), 1, scansPerSec, scansPerSec)
}

// Trims between Steps: a window raised before the device's random readers
// are known costs their every fault until a Step; every Settle/4 the recent
// requests are searched and readers reading around are trimmed at once.

// trimStreams returns, at most every Settle/onsetEvery, the files with a
// window raised and one file read on each device raised device-wide, and the
// span to look back over; nothing when no window is raised or trims are off.
func (t *Tuner) trimStreams() ([]probe.FileKey, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.deps.Clock.Now()
	if t.cfg.DisableTrim || t.scope.Empty() || now-t.trimAskAt < t.cfg.Settle/onsetEvery {
		return nil, 0
	}
	var keys []probe.FileKey
	for _, fd := range t.files {
		if fd.win.raised() {
			keys = append(keys, fd.key)
		}
	}
	for _, d := range t.devs {
		// A device-wide raise: any file read there names the device.
		for k, fs := range t.fstats {
			if d.raisedWide() && fs.Device == d.dev {
				keys = append(keys, k)
				break
			}
		}
	}
	if len(keys) == 0 {
		return nil, 0
	}
	// Asked for at the first tick after a window is raised: the span
	// looks back over the random readers' requests from before it.
	t.trimAskAt = now
	slices.SortFunc(keys, compareKeys)
	return slices.Compact(keys), t.cfg.Settle / freshSpanDiv
}

// fastTrim trims the random readers reading around in the recent requests
// (snap over span) of devices with a window raised, as the next Step would.
func (t *Tuner) fastTrim(snap detector.Snapshot, span time.Duration) []Action {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out = nil
	if t.cfg.DisableTrim || t.scope.Empty() || span <= 0 || len(snap.Files) == 0 {
		return nil
	}
	j := t.on(snap, span, judgeStep)
	for _, d := range sortedDevs(t.devs) {
		if _, seen := j.dstats[d.dev]; seen && t.helping(d) {
			j.startTrims(d, false)
		}
	}
	return t.out
}

// Descriptors opened on a trimmed file get the device's window, faster than
// the trimScanEvery search follows. So the probe watches a trimmed file
// (ReadAroundWatch): a read-around above the trim is reported with its
// process, whose descriptors get the trim from the event path.

const (
	// openedQuiet: a reader whose report found no descriptor to trim (closed,
	// or outside the allow-paths) is looked for again after this long.
	openedQuiet = time.Second
	// openedMaxRefs bounds the descriptors a trim keeps to give back at
	// its end: past it, those closed meanwhile are dropped.
	openedMaxRefs = 64
	// openedPerSec and openedBurst bound the trims of opened descriptors per
	// device, a budget apart from SysfsWritesPerSec so that a re-opening reader
	// does not starve the stream's steps. Each takes two writes of read_ahead_kb.
	openedPerSec = 10
	openedBurst  = 4
)

// watchAround asks the probe to report read-arounds the trim has not reached.
func (t *Tuner) watchAround(td *trimDec) {
	if t.deps.Around == nil || td.dry || td.watched {
		return
	}
	if err := t.deps.Around.WatchReadAround(td.key, td.kb); err != nil {
		t.logOnce(td.dev.dev, "trim/watch", "tuner: read-arounds of trimmed files are not reported: descriptors opened after a trim keep the device's window until the next search for them",
			"file", td.key.String(), "err", err)
		return
	}
	td.watched = true
}

// unwatchAround ends watchAround.
func (t *Tuner) unwatchAround(td *trimDec) {
	if !td.watched {
		return
	}
	td.watched = false
	if err := t.deps.Around.UnwatchReadAround(td.key); err != nil {
		t.log.Debug("tuner: could not stop watching a trimmed file's read-arounds", "file", td.key.String(), "err", err)
	}
}

// trimOpened gives the trim to the descriptors process ev.Tgid holds on a
// trimmed file, on a report that one of them read around with a larger
// window. Called with t.mu held, from the event path.
func (t *Tuner) trimOpened(ev probe.ReadaheadEvent, now time.Duration) {
	td := t.trims[ev.File]
	if td == nil || !td.watched || int(ev.RaPages)*probe.PageSize/1024 <= td.kb || t.lowering[ev.File] > 0 {
		return
	}
	m := td.opened[ev.Tgid]
	if now < m.until || ev.Time != 0 && ev.Time < m.at {
		// Looked for lately with nothing found, or reported before its
		// descriptors were trimmed (still queued in the ring).
		return
	}
	found, err := t.deps.Files.Find(ev.Tgid, ev.File)
	if err != nil {
		t.fileFail++
		t.log.Debug("tuner: cannot list the descriptors of a trimmed file's reader", "pid", ev.Tgid, "file", ev.File.String(), "err", err)
	}
	refs := t.inScope(found, ev.File)
	if len(refs) == 0 {
		t.count(EvTrimOpenedMissed)
		td.opened[ev.Tgid] = openedMark{at: m.at, until: now + openedQuiet}
		return
	}
	if !td.dev.opened.takeN(now, 1, openedPerSec, openedBurst) {
		// The next report (every 10 ms while it reads around) takes the next token.
		t.count(EvTrimOpenedMissed)
		t.limited++
		td.opened[ev.Tgid] = openedMark{at: m.at, until: now + time.Second/openedPerSec}
		return
	}
	t.count(EvActuatorLower) // no break: the lock is held throughout
	n, err := t.pinWith(td.dev, td.kb, refs, false, true)
	if err != nil {
		t.count(EvTrimOpenedMissed)
		t.log.Debug("tuner: could not trim a descriptor opened on a trimmed file", "pid", ev.Tgid, "file", ev.File.String(), "err", err)
		td.opened[ev.Tgid] = openedMark{at: m.at, until: now + openedQuiet}
		return
	}
	t.events[EvTrimOpened] += uint64(n)
	td.opened[ev.Tgid] = openedMark{at: now, until: now}
	t.reopened(td.key)
	// Not a change of the trim (trimAt): the requests keep the trimmed size.
	t.keepRefs(td, refs)
}

// reopened marks a trimmed file's reader as one that opens it again.
func (t *Tuner) reopened(k probe.FileKey) {
	if ref := t.randRefs[k]; ref != nil {
		ref.reopens = true
	}
}

// keepRefs adds refs to the descriptors td gives back at its end, one per
// process and number, within openedMaxRefs.
func (t *Tuner) keepRefs(td *trimDec, refs []actuate.FileRef) {
	for _, r := range refs {
		if !slices.ContainsFunc(td.refs, func(o actuate.FileRef) bool { return o.Tgid == r.Tgid && o.FD == r.FD }) {
			td.refs = append(td.refs, r)
		}
	}
	if len(td.refs) <= openedMaxRefs {
		return
	}
	td.refs = slices.DeleteFunc(td.refs, func(r actuate.FileRef) bool { return !t.deps.Files.Holds(r) })
	if len(td.refs) > openedMaxRefs {
		// Still open: the oldest are given back by their readers' close.
		td.refs = td.refs[len(td.refs)-openedMaxRefs:]
	}
}

// trimScanEvery bounds how often one file's readers are searched for.
const trimScanEvery = 30 * time.Second
