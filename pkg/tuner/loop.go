package tuner

// The loop's entry points: New, ObserveReadahead, Step and Tick. Each takes
// the tuner's lock; the state is in tuner.go.

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/scope"
	"github.com/readaheadd/readaheadd/pkg/tuner/prior"
)

// pauseGaps: no event for this many usual gaps (at least endedGap): paused.
const pauseGaps = 8

// evTime is ev's kernel timestamp (delivery may lag tens of ms), else now.
func evTime(ev probe.ReadaheadEvent, now time.Duration) time.Duration {
	if ev.Time > 0 && ev.Time < now {
		return ev.Time
	}
	return now
}

// New builds a tuner, first restoring originals a crashed run left.
func New(cfg Config, deps Deps) (*Tuner, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if deps.Sysfs == nil || deps.Files == nil || deps.Clock == nil {
		return nil, errors.New("tuner: Sysfs, Files and Clock are required")
	}
	if deps.Store == nil && !cfg.DryRun {
		return nil, errors.New("tuner: a state store is required unless in dry-run mode (give --state-dir)")
	}
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	scope, err := scope.New(cfg.AllowPaths)
	if err != nil {
		return nil, fmt.Errorf("tuner: %w", err)
	}
	t := &Tuner{
		cfg: cfg, deps: deps, log: deps.Logger.With("component", "tuner"), scope: scope,
		view:       *newView(detector.Snapshot{}, 0, nil),
		devs:       map[probe.Dev]*devState{},
		watchedAt:  map[probe.Dev]time.Duration{},
		capFits:    map[probe.Dev]*capFit{},
		files:      map[probe.FileKey]*fileDec{},
		readers:    map[probe.FileKey]map[uint32]*readerInfo{},
		trims:      map[probe.FileKey]*trimDec{},
		randRefs:   map[probe.FileKey]*randRef{},
		trimOffs:   map[probe.FileKey]*trimOff{},
		trimScanAt: map[probe.FileKey]time.Duration{},
		counts:     map[string]uint64{},
		logged:     map[string]time.Duration{},
		mem:        prior.New(),
		fresh:      map[probe.FileKey]time.Duration{},
		onsetMild:  map[probe.FileKey]time.Duration{},
		scopeOf:    map[probe.FileKey]scopeVerdict{},
		capSeen:    map[probe.FileKey]time.Duration{},
		lowering:   map[probe.FileKey]int{},
		lower:      &actuate.Lowerer{Sysfs: deps.Sysfs, Files: deps.Files},
	}
	if !cfg.DryRun {
		t.lower.States = deps.States
	}
	if deps.Store != nil {
		t.priorsPath = deps.Store.PriorsPath()
		if len(deps.Store.Entries()) > 0 {
			t.log.Warn("tuner: originals of an earlier run were not restored (crash?); restoring them before anything else",
				"file", deps.Store.Path(), "devices", len(deps.Store.Entries()))
			if err := deps.Store.Restore(deps.Sysfs); err != nil {
				return nil, fmt.Errorf("tuner: restore originals recorded in %s: %w", deps.Store.Path(), err)
			}
		}
		if len(deps.Store.Pins()) > 0 {
			// After the devices: a reset open file takes its device's window.
			res, err := actuate.RestorePins(deps.Store, deps.Files, scope, cfg.Devices, t.pinsLowerer())
			t.log.Warn("tuner: per-file windows of an earlier run were left (crash?); reset them to their devices' windows",
				"file", deps.Store.PinsPath(), "reset", res.Reset, "not_confirmed", len(res.Unconfirmed), "readers_gone", res.Gone, "refused_out_of_scope", res.Refused, "err", err)
			for _, u := range res.Unconfirmed {
				t.log.Warn("tuner: open file not confirmed at its device's window; its record is kept", "file", u.String())
			}
		}
	}
	t.loadPriors()
	return t, nil
}

// ObserveReadahead tracks readers and pins decisions on new descriptors
// (per event: keep it cheap).
func (t *Tuner) ObserveReadahead(ev probe.ReadaheadEvent) {
	if ev.File.IsZero() || ev.Tgid == 0 {
		return
	}
	now := t.deps.Clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closing {
		return // shutting down: everything is being put back
	}
	if ev.ReadAround {
		// An mmap fault on a trimmed file: neither a stream nor a fresh open.
		t.trimOpened(ev, now)
		return
	}
	rs := t.readers[ev.File]
	r := rs[ev.Tgid]
	if r == nil {
		if t.nReaders >= MaxReaders {
			// Bounded against floods of short-lived readers.
			t.count(EvReadersDropped)
			return
		}
		if rs == nil {
			rs = map[uint32]*readerInfo{}
			t.readers[ev.File] = rs
		}
		// A stream's rate is measured from its first event's timestamp.
		r = &readerInfo{firstSeen: evTime(ev, now)}
		rs[ev.Tgid] = r
		t.nReaders++
	} else if gap := now - r.lastSeen; r.evGap > 0 && gap > max(endedGap, pauseGaps*r.evGap) {
		r.pausedAt, r.resumedAt = r.lastSeen, evTime(ev, now)
	} else if r.evGap == 0 {
		r.evGap = gap
	} else {
		r.evGap += (gap - r.evGap) / 4
	}
	r.lastSeen = now
	r.raKB = int(ev.RaPages) * probe.PageSize / 1024
	r.follows = r.indexed && followsStream(r.lastIndex, ev)
	r.lastIndex, r.indexed = ev.Index, true
	// Actions from the event path are returned by the next Tick or Step.
	saved := t.out
	t.out = t.evOut
	defer func() { t.evOut, t.out = t.out, saved }()
	fd := t.files[ev.File]
	if fd == nil {
		// A fresh open (or a file the memory knows): its neighbours' window.
		t.atStep().freshOpen(ev, r, now)
		if t.files[ev.File] == nil {
			t.noteFresh(ev.File, r.firstSeen, now)
		}
		return
	}
	if ev.Index == 0 && !ev.Async {
		if !t.ownWindow(ev.File) {
			// A head read on a file with no window of its own: a new stream
			// (HDFS reopens per read), judged as fresh.
			t.noteFresh(ev.File, now, now)
		}
		t.atStep().catchUp(fd, now)
	}
	// Events queued before the last pin show the old window.
	stale := ev.Time != 0 && ev.Time < r.appliedAt
	if w := fd.win.inForce(); w > fd.win.base && r.raKB < w && !stale && t.lowering[ev.File] == 0 {
		// Opened after the decision: pin now, not at the next tick.
		r.pending = true
		t.applyPendingFile(fd, now)
	}
}

// maxWatched bounds watchedAt (devices ever seen).
const maxWatched = 4096

// MaxReaders bounds the tuner's table of readers (file x process).
const MaxReaders = 65536

// Step runs one interval of the closed loop and returns what was done.
func (t *Tuner) Step(snap detector.Snapshot) []Action {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.deps.Clock.Now()
	t.out, t.evOut = t.evOut, nil
	t.view = *newView(snap, 0, nil)
	j := t.atStep()
	for _, d := range snap.Devices {
		if _, ok := t.watchedAt[d.Device]; !ok && len(t.watchedAt) < maxWatched {
			t.watchedAt[d.Device] = now
		}
		t.fitCapacity(d, now)
		j.logCapacity(d.Device)
	}
	j.noteTails(snap.Files, now)
	j.observeRandom(now)

	// What needs help now.
	fileNeeds, fileDev, devWide := j.needs(snap)

	t.repairDevices()

	// Control by outcome (policy.go); not counted towards a device-wide need.
	byRate := j.outcomeNeeds(snap, fileNeeds, fileDev)

	// Per-file decisions, only under allow-paths.
	if !t.scope.Empty() {
		for key, kinds := range fileNeeds {
			d := t.device(fileDev[key])
			if d == nil {
				continue
			}
			fd := t.files[key]
			if fd == nil {
				if byRate[key] && !j.outcomeDue(d, key) {
					continue // the device's outcome trials are backing off
				}
				fd = t.newDec(key, d, byRate[key], now)
			}
			fd.regimes = kinds
			fd.lastNeeded = now
			if !byRate[key] {
				t.regimeTakesOver(fd)
			}
		}
	}
	for _, k := range sortedKeys(t.files) {
		fd := t.files[k]
		_, needed := fileNeeds[k]
		if fd.byRate && !needed && fd.win.cur > fd.win.base {
			// A kept window stays while its stream reads; the re-probe judges it.
			if fs, ok := t.fstats[k]; ok && now-fs.LastSeen <= t.cfg.Settle {
				needed = true
				fd.lastNeeded = now
			}
		}
		if fd.win.reprobe.until != 0 {
			// At the device's window even a healthy stream is bound by it:
			// when that alone asks, its rate judges.
			var why string
			if fd.byRate || needed && onlyOutcome(fileNeeds[k]) {
				needed, why = j.stillPays(fd)
			}
			t.reprobeJudge(fd, needed, why)
			if t.files[k] == nil && fd.byRate {
				t.mem.ForgetFile(k)
				if p := t.mem.Dir(k.Dev, fd.path); p != nil {
					t.mem.Decay(p, false)
				}
			}
			continue
		}
		fd.deferUntil = 0 // a whole interval's view: the step is taken now
		if needed {
			if !t.reprobeStart(fd) {
				j.driveFile(fd, true)
				// A regime begun during an outcome trial takes over now.
				if len(fileNeeds[k]) > 0 && !onlyOutcome(fileNeeds[k]) && fd.win.trial.to == 0 && fd.pf.trial.to == 0 && t.regimeTakesOver(fd) {
					j.driveFile(fd, true)
				}
			}
			continue
		}
		// StarvedStream clearing while the larger window is read is success.
		if fs, ok := t.fstats[k]; ok && fd.win.cur > fd.win.base && now-fs.LastSeen < t.cfg.Grace &&
			slices.Contains(fd.regimes, detector.StarvedStream) {
			fd.lastNeeded = now
		}
		if now-fd.lastNeeded >= t.cfg.Grace {
			t.undoFile(fd, fmt.Sprintf("no regime applies to the file for %v", t.cfg.Grace))
			delete(t.files, k)
		} else if fd.win.trial.to != 0 || fd.pf.trial.to != 0 {
			j.driveFile(fd, false) // finish judging a step under trial
		}
	}

	// Device-wide: never beside a read-around random reader (every later open
	// takes the window, and short mmap readers escape trims). See driveDevice.
	for dev, why := range devWide {
		d := t.device(dev)
		if d == nil {
			continue
		}
		if rk, ok := j.randomOnDevice(dev); ok {
			t.logOnce(dev, "device-window-random", "tuner: a random reader is active on the device; no device-wide window (per-file windows only)",
				"device", d.name, "random_file", rk.String(), "need", why)
			if d.winActive && d.cur > d.orig {
				j.undoDevice(d, fmt.Sprintf("a random reader (%s) is active on the device", rk))
			}
			continue
		}
		if !d.winActive {
			d.winActive = true
			d.win = ladder{kind: KindDeviceWindow, base: d.orig, cur: d.cur}
		}
		d.lastNeeded = now
		d.win.aim(j.tailHint(snap, dev), false)
		j.driveDevice(d, why, true)
	}
	for dev, d := range t.devs {
		if _, wide := devWide[dev]; wide || !d.winActive {
			continue
		}
		if d.win.trial.to != 0 {
			j.driveDevice(d, "judging the last step", false)
		}
		if now-d.lastNeeded >= t.cfg.Grace {
			j.undoDevice(d, fmt.Sprintf("no device-wide regime for %v", t.cfg.Grace))
		}
	}

	j.trimAll()
	t.prefetchAll()
	t.applyPendingLocked()
	j.judgePriorChecks(now)
	// Readers gone for two Graces, holding nothing of ours.
	for k, rs := range t.readers {
		for tgid, r := range rs {
			if now-r.lastSeen > 2*t.cfg.Grace && (r.appliedKB == 0 || t.files[k] == nil) {
				delete(rs, tgid)
				t.nReaders--
			}
		}
		if len(rs) == 0 {
			delete(t.readers, k)
		}
	}
	t.savePriors(false)
	return t.out
}

// RecentFunc is detector.Recent: keys' and their devices' recent requests.
type RecentFunc func(span time.Duration, keys []probe.FileKey) detector.Snapshot

// Tick runs between Steps (~100 ms): fast-path first steps, fresh streams,
// onsets, early keeps, trims, ended trials, then new descriptors. recent
// is called outside the lock.
func (t *Tuner) Tick(fast detector.Snapshot, recent RecentFunc) []Action {
	var out []Action
	if len(fast.Regimes) > 0 {
		// Measured since about the onset, not over the whole interval.
		span := t.cfg.Settle / freshSpanDiv
		keys := make([]probe.FileKey, 0, len(fast.Files))
		for _, f := range fast.Files {
			keys = append(keys, f.Key)
		}
		out = append(out, t.fastOn(fast, recent(span, keys), span)...)
	}
	for _, c := range []struct {
		streams func() ([]probe.FileKey, time.Duration)
		judge   func(detector.Snapshot, time.Duration) []Action
	}{{t.freshStreams, t.fastOutcome}, {t.onsetStreams, t.fastOnset}, {t.trialStreams, t.fastVerdict}, {t.trimStreams, t.fastTrim}} {
		if keys, span := c.streams(); len(keys) > 0 {
			out = append(out, c.judge(recent(span, keys), span)...)
		}
	}
	for _, ts := range t.endedTrials() {
		out = append(out, t.endedVerdict(ts, recent(ts.Span, []probe.FileKey{ts.Key}))...)
	}
	return append(out, t.applyPending()...)
}

// fastOn takes the first step on regimes the fast path just entered,
// judged at a Step one Settle later. A file with a decision is measured on
// recent (over span): the snapshot's Settle reaches back before the onset.
func (t *Tuner) fastOn(snap, recent detector.Snapshot, span time.Duration) []Action {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out = nil
	if len(snap.Regimes) == 0 || t.scope.Empty() {
		return nil
	}
	now := t.deps.Clock.Now()
	for _, f := range snap.Files {
		t.fstats[f.Key] = f
	}
	for _, d := range snap.Devices {
		if ds, ok := t.dstats[d.Device]; ok { // the last Step's, with the fast path's peak rate
			ds.CapacityBPS = d.CapacityBPS
			d = ds
		}
		t.dstats[d.Device] = d
	}
	// The last Step's view joined by the fast path's files.
	j := judgeCtx{Tuner: t, view: &t.view, justIn: true}
	// Before the first Step the view holds no random readers, and a lone
	// stream's step would be paid by them.
	randomNow := map[probe.Dev]bool{}
	for _, f := range recent.Files {
		if j.readRandomly(f) {
			randomNow[f.Device] = true
		}
	}
	start := func(key probe.FileKey, dev probe.Dev, kind detector.RegimeKind) {
		if fd := t.files[key]; fd != nil {
			if t.regimeTakesOver(fd) {
				fd.regimes = append(fd.regimes, kind)
				fd.lastNeeded = now
				if l := &fd.win; l.trial.to == 0 && l.movedAt != 0 && now-l.movedAt < t.cfg.Settle/freshSpanDiv {
					// Its window just moved: the recent requests hold the old
					// one's. retryYoung or the next Step takes it.
					return
				}
				if !j.deferBesideRandom(fd, dev, now, randomNow[dev]) {
					t.onRecent(j, key, recent, span).driveFile(fd, true)
				}
			}
			return
		}
		d := t.device(dev)
		if d == nil {
			return
		}
		fd := t.newDec(key, d, false, now, kind)
		if !j.deferBesideRandom(fd, dev, now, randomNow[dev]) {
			j.driveFile(fd, true)
		}
	}
	for _, r := range snap.Regimes {
		switch {
		case !r.File.IsZero():
			start(r.File, r.Device, r.Kind)
		case r.Kind == detector.Contention:
			// As Step: each sequential file, unless contention is among them.
			if _, zeroSum := t.contentionAmongStreams(t.snap, r.Device); zeroSum {
				continue
			}
			for _, f := range snap.Files {
				if f.Device == r.Device && f.Sequentiality >= t.cfg.MinSequentiality && snap.Now-f.LastSeen <= t.cfg.Settle {
					start(f.Key, r.Device, detector.Contention)
				}
			}
		}
	}
	return t.out
}

// onRecent is j on recent (over span) if it holds enough of key's.
func (t *Tuner) onRecent(j judgeCtx, key probe.FileKey, recent detector.Snapshot, span time.Duration) judgeCtx {
	i := slices.IndexFunc(recent.Files, func(fs detector.FileStats) bool { return fs.Key == key })
	if span <= 0 || i < 0 || recent.Files[i].Requests < freshMinRequests || recent.Files[i].BusyThroughput <= 0 {
		return j
	}
	j.view = newView(recent, span, t.dstats)
	return j
}

// applyPending pins decisions on descriptors opened since and returns the
// event path's actions.
func (t *Tuner) applyPending() []Action {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out, t.evOut = t.evOut, nil
	t.applyPendingLocked()
	return t.out
}

func (t *Tuner) applyPendingLocked() {
	now := t.deps.Clock.Now()
	for _, fd := range t.files {
		t.applyPendingFile(fd, now)
	}
}

// applyPendingFile pins the window in force on pending readers.
func (t *Tuner) applyPendingFile(fd *fileDec, now time.Duration) {
	w := fd.win.inForce()
	if t.cfg.DryRun || w <= fd.win.base {
		return
	}
	tg := map[uint32]bool{}
	for tgid, r := range t.readers[fd.key] {
		if r.pending {
			tg[tgid] = true
		}
	}
	if len(tg) == 0 || !t.fails.due(fd.key, KindFileWindow, now) {
		return
	}
	err := t.pinFile(fd, w, tg, true)
	if errors.Is(err, errRateLimited) {
		return
	}
	res, ev := ResultApplied, fmt.Sprintf("new reader(s) of a file with a %d KB decision", w)
	a := fd.action(now, KindFileWindow, fd.win.base, w, res, ev)
	if err != nil {
		for tgid := range tg {
			t.readers[fd.key][tgid].pending = false // try again on its next event
		}
		a.Result, a.Evidence = ResultFailed, ev+": "+err.Error()
		t.emitFailed(a, err)
		return
	}
	t.fails.ok(fd.key, KindFileWindow)
	t.emit(a)
}
