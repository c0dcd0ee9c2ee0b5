// Package tuner turns the detector's regimes into readahead actions, least
// invasive first: a larger window on the open files of the readers of a
// slowed file (pidfd_getfd + posix_fadvise), prefetch ahead of a
// sequential reader when the window alone is not enough, and a device-wide
// read_ahead_kb only when many files on a device need it or the regime is
// device-wide. Every step is measured (busy throughput over the next
// interval), kept only if it paid, otherwise undone with exponential
// back-off; everything is undone when its regime ends, and the devices'
// original settings are recorded durably before the first write.
package tuner

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/readaheadd/readaheadd/pkg/actuate"
	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/scope"
	"github.com/readaheadd/readaheadd/pkg/tuner/prior"
)

// errRateLimited defers a step to a later interval; it is not a failure.
var errRateLimited = errors.New("sysfs write rate limit reached")

// errNoReaders: no reader of the file is known to hold it open (yet).
var errNoReaders = errors.New("no known reader holds the file open")

// errOutOfScope: the readers' descriptors are outside the allow-paths.
var errOutOfScope = errors.New("the file is outside the allow-paths")

// pauseGaps: a reader paused when no event came for this many of its
// usual gaps between events (and at least endedGap).
const pauseGaps = 8

// evTime is when a readahead event happened: the kernel's timestamp (its
// delivery can come tens of milliseconds later), else now.
func evTime(ev probe.ReadaheadEvent, now time.Duration) time.Duration {
	if ev.Time > 0 && ev.Time < now {
		return ev.Time
	}
	return now
}

type readerInfo struct {
	lastSeen  time.Duration
	raKB      int // the open file's window as the last event saw it
	appliedKB int // window the tuner last pinned on its descriptors
	appliedAt time.Duration
	pending   bool
	priorAt   time.Duration // when freshOpen last looked at this reader
	firstSeen time.Duration
	// pausedAt, resumedAt: its last pause of more than endedGap (a
	// reader that finished the file, dropped its cache and opened it
	// again): a rate over a span that holds it counts only the time it
	// read (pauseIn).
	pausedAt, resumedAt time.Duration
	// evGap: the usual time between its events (smoothed), so that a
	// reader whose events are that sparse anyway (one slow by its
	// application) is not taken to pause between them.
	evGap time.Duration
	// lastIndex: the page index of its last event (indexed: there was
	// one); follows: the current event is a stream's next window after it
	// (followsStream).
	lastIndex uint64
	indexed   bool
	follows   bool
}

type devState struct {
	name   string
	dev    probe.Dev
	orig   int // value found before the first write (floor of every window)
	cur    int // value the device should have now
	known  bool
	dirty  bool   // the last write back failed: retry
	writes bucket // sysfs writes (Tuner.take)
	// opened: the budget of trims of descriptors opened on trimmed files
	// (trimopen.go).
	opened bucket
	// prefetch: the prefetch budget in bytes, empty when the device is
	// first seen.
	prefetch bucket

	win        ladder // device-wide window
	winActive  bool
	lastNeeded time.Duration
	// reached: open files given the device-wide window (reachOpenFiles)
	reached map[probe.FileKey]bool
	// Back-off of outcome-driven trials on the device (policy.go): a
	// healthy device whose streams are at its bandwidth sees them rarely.
	outcomeFails   int
	outcomeRetryAt time.Duration
	outcomeFailP50 time.Duration // the stream's median latency at the last trial that did not pay
	outcomeFailKB  int           // the window that trial tried
	// outcomeFailTail: that trial's stream showed a tail (tail.go) before
	// or at its verdict; a tail seen since, where it showed none, is new.
	outcomeFailTail bool
	// outcomeFailTput: that trial's stream's throughput at the device's
	// window. outcomeSlow: per file, the first and the last interval in
	// which it read well below that since (outcomeDue).
	outcomeFailTput float64
	outcomeSlow     map[probe.FileKey][2]time.Duration
	// movedAt: when a window on the device last changed (the device's, a
	// file's, a trim): a random reader's measure since is not its
	// reference (random.go). trimAt: when a trim there last changed.
	movedAt, trimAt time.Duration
	// randSlope: seconds of delay each byte a stream keeps queued costs
	// the device's random readers, learned from steps (0: not yet).
	randSlope float64
}

func sortedDevs(m map[probe.Dev]*devState) []*devState {
	return slices.SortedFunc(maps.Values(m), func(a, b *devState) int { return cmp.Compare(a.dev, b.dev) })
}

type fileDec struct {
	key probe.FileKey
	// deferUntil: a regime's first step beside random readers waits
	// until then (random.go: their service in the new conditions).
	deferUntil time.Duration
	dev        *devState
	path       string
	win        ladder
	pf         ladder
	pfEnd      uint64 // end of the last prefetched range
	regimes    []detector.RegimeKind
	lastNeeded time.Duration
	outOfScope bool
	scopeAt    time.Duration
	// scopeWarned: a regime's action on the file was refused by the
	// allow-paths (logged once; a stream tried on its outcome alone is
	// refused silently).
	scopeWarned bool
	// notSeqLogged: the file was found not sequential (logged once).
	notSeqLogged bool
	// atCapLogged: the file was found at the device's capacity (logged once).
	atCapLogged bool
	// byRate: judged by the stream's rate, not its busy throughput (an
	// outcome-driven or prior decision: no regime says the file is slow,
	// so only what the reader gets counts).
	byRate bool
	// prior: the directory prior this decision started from (decayed if
	// it does not pay); learnedKB: window last taught to the memory.
	prior     *prior.Dir
	learnedKB int
	// climbFrom: the prior's window when this fresh open was given the
	// step above it instead (prior.Memory.Climb); 0 otherwise.
	climbFrom int
}

// action is an action on fd's file at now.
func (fd *fileDec) action(now time.Duration, kind ActionKind, from, to int, res Result, ev string) Action {
	return Action{Time: now, Device: fd.dev.name, Dev: fd.dev.dev, File: fd.key, Path: fd.path, Kind: kind, FromKB: from, ToKB: to, Result: res, Evidence: ev}
}

// Tuner is the closed-loop actuator. Its methods are safe for concurrent use.
type Tuner struct {
	cfg   Config
	deps  Deps
	log   *slog.Logger
	scope *scope.Scope

	mu   sync.Mutex
	devs map[probe.Dev]*devState
	// watchedAt: the first Step whose snapshot held each device (its
	// readers, random ones among them, are known a Settle after it).
	watchedAt map[probe.Dev]time.Duration
	files     map[probe.FileKey]*fileDec
	readers   map[probe.FileKey]map[uint32]*readerInfo
	// view: the last Step's (Step writes it; the fast path's files join
	// it, between.go); a call between Steps judges on its own (judgeCtx).
	view
	tails    map[probe.FileKey]tailSeen // streams whose latency has a tail (tail.go)
	tailSpan uint64                     // spans noteTails has looked at
	out      []Action
	recent   []Action
	counts   map[string]uint64 // actions by kind/result
	events   [numEvents]uint64
	logged   map[string]time.Duration // logOnce: last time per topic
	fileFail uint64
	refused  uint64
	limited  uint64
	fails    failMemo // failmemo.go
	// Read-around trims (trim.go).
	trims map[probe.FileKey]*trimDec
	// randRefs: random readers' reference service (random.go).
	randRefs   map[probe.FileKey]*randRef
	trimOffs   map[probe.FileKey]*trimOff
	trimScanAt map[probe.FileKey]time.Duration
	// lower changes per-file windows; its States is nil when the kernel's
	// per-file state is not readable (no Deps.States, or dry run).
	lower *actuate.Lowerer
	// Global budget of whole-system descriptor scans (trim.go).
	scans bucket
	// Memory of windows that paid (pkg/tuner/prior, fresh.go) and its file.
	mem        *prior.Memory
	priorsPath string
	// nReaders bounds the readers table (file x process).
	nReaders int
	evOut    []Action // actions taken from the event path, not yet returned
	// fresh: files with no decision whose first reader was seen within the
	// last Settle, by when (freshStreams, fastOutcome).
	fresh map[probe.FileKey]time.Duration
	// onsetAt: when onsetStreams last asked for the streams' recent
	// requests (onset.go).
	onsetAt time.Duration
	// onsetMild: streams whose last check between Steps found them
	// mildly slower, and when (onset.go).
	onsetMild map[probe.FileKey]time.Duration
	// verdictAt: when trialStreams last asked for the recent requests of
	// steps under trial (verdict.go).
	verdictAt time.Duration
	// trimAskAt: when trimStreams last asked for the recent requests of
	// devices with a window raised (fasttrim.go).
	trimAskAt time.Duration
	// scopeOf: cached scope verdicts of other readers' files (outsideScope).
	scopeOf map[probe.FileKey]scopeVerdict
	// capSeen: when a stream was last seen at its device's learned
	// capacity (atCapacity).
	capSeen map[probe.FileKey]time.Duration
	// lowering: files whose window a break is setting (the lock is
	// released while it waits: actuator.go); closing: RestoreAll runs,
	// and the event path takes no new action.
	lowering map[probe.FileKey]int
	closing  bool
	left     []actuate.Unconfirmed // files the shutdown's lowerings could not confirm
}

// New builds a tuner. If the store holds originals from an earlier run that
// did not restore them (a crash), they are restored first.
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
	}
	if deps.Store != nil {
		t.priorsPath = deps.Store.PriorsPath()
	}
	t.lower = &actuate.Lowerer{Sysfs: deps.Sysfs, Files: deps.Files}
	if !cfg.DryRun {
		t.lower.States = deps.States
	}
	if deps.Store != nil && len(deps.Store.Entries()) > 0 {
		t.log.Warn("tuner: originals of an earlier run were not restored (crash?); restoring them before anything else",
			"file", deps.Store.Path(), "devices", len(deps.Store.Entries()))
		if err := deps.Store.Restore(deps.Sysfs); err != nil {
			return nil, fmt.Errorf("tuner: restore originals recorded in %s: %w", deps.Store.Path(), err)
		}
	}
	if deps.Store != nil && len(deps.Store.Pins()) > 0 {
		// After the devices: a reset open file takes its device's window.
		res, err := actuate.RestorePins(deps.Store, deps.Files, scope, cfg.Devices, t.pinsLowerer())
		t.log.Warn("tuner: per-file windows of an earlier run were left (crash?); reset them to their devices' windows",
			"file", deps.Store.PinsPath(), "reset", res.Reset, "not_confirmed", len(res.Unconfirmed), "readers_gone", res.Gone, "refused_out_of_scope", res.Refused, "err", err)
		for _, u := range res.Unconfirmed {
			t.log.Warn("tuner: open file not confirmed at its device's window; its record is kept", "file", u.String())
		}
	}
	t.loadPriors()
	return t, nil
}

// ObserveReadahead notes which process reads which file, and whether its
// open file has the window a decision wants. Cheap: called per event.
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
		// An mmap fault on a trimmed file, not a stream's readahead: its
		// reader is no stream reader, and its file no fresh open.
		t.trimOpened(ev, now)
		return
	}
	rs := t.readers[ev.File]
	if rs == nil {
		rs = map[uint32]*readerInfo{}
		t.readers[ev.File] = rs
	}
	r := rs[ev.Tgid]
	if r == nil {
		if t.nReaders >= MaxReaders {
			// Bounded: a flood of short-lived readers must not grow the
			// table without end. Counted; the readers already known
			// are still served.
			t.count(EvReadersDropped)
			if len(rs) == 0 {
				delete(t.readers, ev.File)
			}
			return
		}
		// When the reader began: the kernel's timestamp of its first
		// event (a stream's rate is measured from it, and its delivery
		// can come tens of milliseconds later), else now.
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
	// Actions taken from the event path are returned by the next
	// Tick or Step.
	saved := t.out
	t.out = t.evOut
	defer func() { t.evOut, t.out = t.out, saved }()
	fd := t.files[ev.File]
	if fd == nil {
		// A fresh open (or a file the memory knows): the window that paid
		// for its neighbours, now, from the event path.
		t.atStep().freshOpen(ev, r, now)
		if t.files[ev.File] == nil {
			t.noteFresh(ev.File, r.firstSeen, now)
		}
		return
	}
	if ev.Index == 0 && !ev.Async && !t.ownWindow(ev.File) {
		// A read from the file's head: a new stream (HDFS opens the block
		// file for every read, in the same process) on a file whose
		// decision holds no window of its own (its trials did not pay, in
		// the conditions of an earlier read). It is judged as a fresh one.
		t.noteFresh(ev.File, now, now)
	}
	if ev.Index == 0 && !ev.Async {
		t.atStep().catchUp(fd, now)
	}
	// Events emitted before the last pin (still queued in the ring
	// buffer) show the old window of a descriptor already pinned.
	stale := ev.Time != 0 && ev.Time < r.appliedAt
	if w := fd.win.inForce(); w > fd.win.base && r.raKB < w && !stale && t.lowering[ev.File] == 0 {
		// A descriptor opened after the decision (HDFS opens the block
		// file per read): apply now rather than at the next tick.
		r.pending = true
		t.applyPendingFile(fd, now)
	}
}

// maxWatched bounds watchedAt (devices ever seen).
const maxWatched = 4096

// MaxReaders bounds the tuner's table of readers (file x process).
const MaxReaders = 65536

// Step runs one interval of the closed loop on the detector's snapshot and
// returns what was done.
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
	}
	j.noteTails(snap.Files, now)
	j.observeRandom(now)

	// What needs help now.
	fileNeeds, fileDev, devWide := j.needs(snap)

	t.repairDevices()

	// Control by outcome: streams bound by their window, whatever the
	// detector saw (policy.go). Not counted towards a device-wide need.
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
			// A kept window no regime asked for stays while its stream
			// reads; the re-probe tells whether it still pays.
			if fs, ok := t.fstats[k]; ok && now-fs.LastSeen <= t.cfg.Settle {
				needed = true
				fd.lastNeeded = now
			}
		}
		if fd.win.probeUntil != 0 {
			// A stream at the device's window is bound by it whatever
			// its speed (a healthy one too): when that is all that
			// asks for the window now, the stream's rate judges.
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
				// A regime that began while an outcome step was under
				// trial takes over once that step is judged: in the
				// same Step, not an interval later.
				if len(fileNeeds[k]) > 0 && !onlyOutcome(fileNeeds[k]) && fd.win.trial == 0 && fd.pf.trial == 0 && t.regimeTakesOver(fd) {
					j.driveFile(fd, true)
				}
			}
			continue
		}
		// StarvedStream clearing while the file is still read with the
		// larger window is success; otherwise wait out the grace period.
		if fs, ok := t.fstats[k]; ok && fd.win.cur > fd.win.base && now-fs.LastSeen < t.cfg.Grace &&
			slices.Contains(fd.regimes, detector.StarvedStream) {
			fd.lastNeeded = now
		}
		if now-fd.lastNeeded >= t.cfg.Grace {
			t.undoFile(fd, fmt.Sprintf("no regime applies to the file for %v", t.cfg.Grace))
			delete(t.files, k)
		} else if fd.win.trial != 0 || fd.pf.trial != 0 {
			j.driveFile(fd, false) // finish judging a step under trial
		}
	}

	// Device-wide decisions. Not where a random reader is active: every
	// file opened on the device after the write takes the larger window,
	// and a reader that opens, faults a few pages and closes is reached by
	// no trim. One that appears takes the device's window back.
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
		d.win.hint = j.tailHint(snap, dev)
		j.driveDevice(d, why, true)
	}
	for dev, d := range t.devs {
		if !d.winActive {
			continue
		}
		if _, ok := devWide[dev]; ok {
			continue
		}
		if d.win.trial != 0 {
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
	t.pruneReaders(now)
	t.savePriors(false)
	return t.out
}

// logOnce logs msg once per device and topic until the topic's condition
// is logged again after a gap (it is cheap to call every interval).
func (t *Tuner) logOnce(dev probe.Dev, topic, msg string, args ...any) {
	k := dev.String() + "/" + topic
	now := t.deps.Clock.Now()
	if last, ok := t.logged[k]; ok && now-last <= 2*t.cfg.Grace {
		t.logged[k] = now
		return
	}
	t.logged[k] = now
	t.log.Info(msg, args...)
}

// device returns the state of the whole disk dev, nil if the tuner may not
// act on it.
func (t *Tuner) device(dev probe.Dev) *devState {
	if d, ok := t.devs[dev]; ok {
		if !d.known {
			return nil
		}
		return d
	}
	d := &devState{dev: dev}
	t.devs[dev] = d
	disk, err := t.deps.Sysfs.ByDev(dev)
	if err != nil {
		t.log.Warn("tuner: device of a regime not found in sysfs; not acting on it", "dev", dev.String(), "err", err)
		return nil
	}
	d.name = disk.Name
	if len(t.cfg.Devices) > 0 && !slices.Contains(t.cfg.Devices, d.name) {
		t.log.Info("tuner: device is not among the configured devices; not acting on it", "device", d.name)
		return nil
	}
	kb, err := t.deps.Sysfs.ReadAheadKB(d.name)
	if err != nil {
		t.log.Warn("tuner: cannot read read_ahead_kb; not acting on the device", "device", d.name, "err", err)
		return nil
	}
	d.orig, d.cur, d.known = kb, kb, true
	d.prefetch = bucket{at: t.deps.Clock.Now(), used: true}
	return d
}
