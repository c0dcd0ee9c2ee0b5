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
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// errRateLimited defers a step to a later interval; it is not a failure.
var errRateLimited = errors.New("sysfs write rate limit reached")

// errNoReaders: no reader of the file is known to hold it open (yet).
var errNoReaders = errors.New("no known reader holds the file open")

// errOutOfScope: the readers' descriptors are outside the allow-paths.
var errOutOfScope = errors.New("the file is outside the allow-paths")

type readerInfo struct {
	lastSeen  time.Duration
	raKB      int // the open file's window as the last event saw it
	appliedKB int // window the tuner last pinned on its descriptors
	appliedAt time.Duration
	pending   bool
	priorAt   time.Duration // when freshOpen last looked at this reader
	firstSeen time.Duration
}

type devState struct {
	name    string
	dev     probe.Dev
	orig    int // value found before the first write (floor of every window)
	cur     int // value the device should have now
	known   bool
	dirty   bool // the last write back failed: retry
	tokens  float64
	tokenAt time.Duration
	pfBytes float64 // prefetch budget left
	pfAt    time.Duration

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
	// movedAt: when a window on the device last changed (the device's, a
	// file's, a trim): a random reader's measure since is not its
	// reference (random.go). trimAt: when a trim there last changed.
	movedAt, trimAt time.Duration
	// randSlope: seconds of delay each byte a stream keeps queued costs
	// the device's random readers, learned from steps (0: not yet);
	// randExplored: the one small step that learns it was given.
	randSlope    float64
	randExplored bool
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
	prior     *dirPrior
	learnedKB int
}

// Tuner is the closed-loop actuator. Its methods are safe for concurrent use.
type Tuner struct {
	cfg   Config
	deps  Deps
	log   *slog.Logger
	scope *Scope

	mu       sync.Mutex
	devs     map[probe.Dev]*devState
	files    map[probe.FileKey]*fileDec
	readers  map[probe.FileKey]map[uint32]*readerInfo
	snap     detector.Snapshot
	fstats   map[probe.FileKey]detector.FileStats
	tails    map[probe.FileKey]tailSeen // streams whose latency has a tail (tail.go)
	tailSpan uint64                     // spans noteTails has looked at
	dstats   map[probe.Dev]detector.DeviceStats
	out      []Action
	recent   []Action
	counts   map[string]uint64
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
	// lower changes per-file windows when the kernel's per-file state is
	// readable (Deps.States); nil otherwise.
	lower *Lowerer
	// Global budget of whole-system descriptor scans (trim.go).
	scanTokens float64
	scanAt     time.Duration
	// Memory of windows that paid (memory.go, fresh.go) and its file.
	mem           *memory
	priorsPath    string
	priorsSavedAt time.Duration
	// nReaders bounds the readers table (file x process).
	nReaders int
	evOut    []Action // actions taken from the event path, not yet returned
	// fresh: files with no decision whose first reader was seen within the
	// last Settle, by when (FreshStreams, FastOutcome); measSpan: the span
	// the stats in force cover when it is not Settle (0: Settle).
	fresh    map[probe.FileKey]time.Duration
	measSpan time.Duration
	// onsetAt: when OnsetStreams last asked for the streams' recent
	// requests (onset.go).
	onsetAt time.Duration
	// verdictAt: when TrialStreams last asked for the recent requests of
	// steps under trial; earlyKeep: FastVerdict is judging (verdict.go).
	verdictAt time.Duration
	earlyKeep bool
	// scopeOf: cached scope verdicts of other readers' files (outsideScope).
	scopeOf map[probe.FileKey]scopeVerdict
	// lowering: files whose window a break is setting (the lock is
	// released while it waits: actuator.go); closing: RestoreAll runs,
	// and the event path takes no new action.
	lowering map[probe.FileKey]int
	closing  bool
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
	scope, err := NewScope(cfg.AllowPaths)
	if err != nil {
		return nil, fmt.Errorf("tuner: %w", err)
	}
	t := &Tuner{
		cfg: cfg, deps: deps, log: deps.Logger.With("component", "tuner"), scope: scope,
		devs:       map[probe.Dev]*devState{},
		files:      map[probe.FileKey]*fileDec{},
		readers:    map[probe.FileKey]map[uint32]*readerInfo{},
		trims:      map[probe.FileKey]*trimDec{},
		randRefs:   map[probe.FileKey]*randRef{},
		trimOffs:   map[probe.FileKey]*trimOff{},
		trimScanAt: map[probe.FileKey]time.Duration{},
		counts:     map[string]uint64{},
		logged:     map[string]time.Duration{},
		mem:        newMemory(),
		fresh:      map[probe.FileKey]time.Duration{},
		scopeOf:    map[probe.FileKey]scopeVerdict{},
		lowering:   map[probe.FileKey]int{},
	}
	if deps.Store != nil {
		t.priorsPath = deps.Store.PriorsPath()
	}
	if deps.States != nil && !cfg.DryRun {
		t.lower = &Lowerer{Sysfs: deps.Sysfs, Files: deps.Files, States: deps.States}
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
		res, err := RestorePins(deps.Store, deps.Files, scope, cfg.Devices, t.lower)
		t.log.Warn("tuner: per-file windows of an earlier run were left (crash?); reset them to their devices' windows",
			"file", deps.Store.PinsPath(), "reset", res.Reset, "readers_gone", res.Gone, "refused_out_of_scope", res.Refused, "err", err)
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
			t.counts["readers/dropped"]++
			if len(rs) == 0 {
				delete(t.readers, ev.File)
			}
			return
		}
		r = &readerInfo{firstSeen: now}
		rs[ev.Tgid] = r
		t.nReaders++
	}
	r.lastSeen = now
	r.raKB = int(ev.RaPages) * probe.PageSize / 1024
	// Actions taken from the event path are returned by the next
	// ApplyPending or Step.
	saved := t.out
	t.out = t.evOut
	defer func() { t.evOut, t.out = t.out, saved }()
	fd := t.files[ev.File]
	if fd == nil {
		// A fresh open (or a file the memory knows): the window that paid
		// for its neighbours, now, from the event path.
		t.freshOpen(ev, r, now)
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

// MaxReaders bounds the tuner's table of readers (file x process).
const MaxReaders = 65536

// Step runs one interval of the closed loop on the detector's snapshot and
// returns what was done.
func (t *Tuner) Step(snap detector.Snapshot) []Action {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.deps.Clock.Now()
	t.out, t.evOut = t.evOut, nil
	t.snap = snap
	t.fstats = make(map[probe.FileKey]detector.FileStats, len(snap.Files))
	for _, f := range snap.Files {
		t.fstats[f.Key] = f
	}
	t.dstats = make(map[probe.Dev]detector.DeviceStats, len(snap.Devices))
	for _, d := range snap.Devices {
		t.dstats[d.Device] = d
	}
	t.noteTails(snap.Files, now)
	t.observeRandom(now)

	// What needs help now.
	fileNeeds := map[probe.FileKey][]detector.RegimeKind{}
	fileDev := map[probe.FileKey]probe.Dev{}
	devWide := map[probe.Dev]string{}
	for _, r := range snap.Regimes {
		switch {
		case !r.File.IsZero() && (r.Kind == detector.FileLatencyShift || r.Kind == detector.StarvedStream || r.Kind == detector.ExtentStart):
			fileNeeds[r.File] = append(fileNeeds[r.File], r.Kind)
			fileDev[r.File] = r.Device
		case r.File.IsZero() && r.Kind == detector.TailInflation:
			devWide[r.Device] = fmt.Sprintf("%s: %s", r.Kind, r.Evidence)
			if _, ok := t.randomOnDevice(r.Device); ok && !t.scope.Empty() {
				// No device-wide window beside a random mmap reader
				// (below): the device's streams get windows of their own,
				// within the random readers' budget.
				for _, f := range snap.Files {
					if f.Device == r.Device && f.Sequentiality >= t.cfg.MinSequentiality && snap.Now-f.LastSeen <= t.cfg.Settle &&
						!slices.Contains(fileNeeds[f.Key], detector.TailInflation) {
						fileNeeds[f.Key] = append(fileNeeds[f.Key], detector.TailInflation)
						fileDev[f.Key] = r.Device
					}
				}
			}
		}
	}
	// Device-wide need from many files (contention's per-file needs below
	// do not count: a device-wide window does not outbid other readers).
	perDev := map[probe.Dev]int{}
	for k := range fileNeeds {
		perDev[fileDev[k]]++
	}
	// Contention: other readers take the device; a larger window on a
	// sequential reader's open file keeps more of its requests queued and
	// wins back its share. Each such file gets the closed loop (kept only
	// if its own throughput improves by the margin).
	for _, r := range snap.Regimes {
		if r.Kind != detector.Contention || !r.File.IsZero() {
			continue
		}
		if why, zeroSum := t.contentionAmongStreams(snap, r.Device); zeroSum {
			t.logOnce(r.Device, "contention-zero-sum", "tuner: contention is among the sequential readers themselves; no per-file step (one would only take share from the others)",
				"device", r.Device.String(), "why", why)
			continue
		}
		for _, f := range snap.Files {
			if f.Device != r.Device || f.Sequentiality < t.cfg.MinSequentiality || snap.Now-f.LastSeen > t.cfg.Settle {
				continue
			}
			if !slices.Contains(fileNeeds[f.Key], detector.Contention) {
				fileNeeds[f.Key] = append(fileNeeds[f.Key], detector.Contention)
				fileDev[f.Key] = r.Device
			}
		}
	}
	active := map[probe.Dev]int{}
	for _, f := range snap.Files {
		active[f.Device]++
	}
	for dev, n := range perDev {
		if n >= t.cfg.DeviceMinFiles && float64(n) >= t.cfg.DeviceFileFraction*float64(active[dev]) {
			if _, ok := devWide[dev]; !ok {
				devWide[dev] = fmt.Sprintf("%d of %d files read on the device need a larger window", n, active[dev])
			}
		}
	}

	t.repairDevices()

	// Control by outcome: streams bound by their window, whatever the
	// detector saw (policy.go). Not counted towards a device-wide need.
	byRate := t.outcomeNeeds(snap, fileNeeds, fileDev)

	// Per-file decisions, only under allow-paths.
	if !t.scope.Empty() {
		for key, kinds := range fileNeeds {
			d := t.device(fileDev[key])
			if d == nil {
				continue
			}
			fd := t.files[key]
			if fd == nil {
				if byRate[key] && !t.outcomeDue(d, key) {
					continue // the device's outcome trials are backing off
				}
				fd = &fileDec{key: key, dev: d, byRate: byRate[key],
					win: ladder{kind: KindFileWindow, base: d.orig, cur: d.orig},
					pf:  ladder{kind: KindPrefetch, first: t.cfg.PrefetchStartKB}}
				t.files[key] = fd
			}
			fd.regimes = kinds
			fd.lastNeeded = now
			if !byRate[key] {
				t.regimeTakesOver(fd)
			}
		}
	}
	keys := make([]probe.FileKey, 0, len(t.files))
	for k := range t.files {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Dev != keys[j].Dev {
			return keys[i].Dev < keys[j].Dev
		}
		return keys[i].Ino < keys[j].Ino
	})
	for _, k := range keys {
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
			if fd.byRate || needed && onlyOutcome(fileNeeds[k]) {
				needed = t.stillPays(fd)
			}
			t.reprobeJudge(fd, needed)
			if t.files[k] == nil && fd.byRate {
				t.mem.forgetFile(k)
				if p := t.mem.dirPrior(k.Dev, fd.path); p != nil {
					t.mem.decay(p, false)
				}
			}
			continue
		}
		fd.deferUntil = 0 // a whole interval's view: the step is taken now
		if needed {
			if !t.reprobeStart(fd) {
				t.driveFile(fd, true)
				// A regime that began while an outcome step was under
				// trial takes over once that step is judged: in the
				// same Step, not an interval later.
				if len(fileNeeds[k]) > 0 && !onlyOutcome(fileNeeds[k]) && fd.win.trial == 0 && fd.pf.trial == 0 && t.regimeTakesOver(fd) {
					t.driveFile(fd, true)
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
			t.driveFile(fd, false) // finish judging a step under trial
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
		if rk, ok := t.randomOnDevice(dev); ok {
			t.logOnce(dev, "device-window-random", "tuner: a random reader is active on the device; no device-wide window (per-file windows only)",
				"device", d.name, "random_file", rk.String(), "need", why)
			if d.winActive && d.cur > d.orig {
				t.undoDevice(d, fmt.Sprintf("a random reader (%s) is active on the device", rk))
			}
			continue
		}
		if !d.winActive {
			d.winActive = true
			d.win = ladder{kind: KindDeviceWindow, base: d.orig, cur: d.cur}
		}
		d.lastNeeded = now
		d.win.hint = t.tailHint(snap, dev)
		t.driveDevice(d, why, true)
	}
	for dev, d := range t.devs {
		if !d.winActive {
			continue
		}
		if _, ok := devWide[dev]; ok {
			continue
		}
		if d.win.trial != 0 {
			t.driveDevice(d, "judging the last step", false)
		}
		if now-d.lastNeeded >= t.cfg.Grace {
			t.undoDevice(d, fmt.Sprintf("no device-wide regime for %v", t.cfg.Grace))
		}
	}

	t.trimAll()
	t.prefetchAll()
	t.applyPendingLocked()
	t.judgePriorChecks(now)
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

// Fast acts at once on the regimes the detector's fast path entered
// (detector.FastPath, between Steps): each file that has no decision yet
// (for contention, each sequential file read on the device) gets one and
// its first step, sized by Little's law from the snapshot's
// file p95 and device capacity, without waiting for the next Step. The step
// is judged at the first Step one Settle later, as any other. The snapshot
// holds only the fast path's files and devices; the rest of the tuner's
// view is left as the last Step saw it.
func (t *Tuner) Fast(snap detector.Snapshot) []Action {
	return t.FastOn(snap, detector.Snapshot{}, 0)
}

// FastOn is Fast with the detector's recent requests (recent, over span;
// detector.Recent) of the regimes' files: a regime entered between Steps
// on a stream that already has a decision takes its step measured on
// them. The snapshot's window reaches back a whole Settle, mostly before
// the onset, and a step measured against the stream's rate from before it
// (a contended stream against its free self) looks as if it did not pay.
func (t *Tuner) FastOn(snap, recent detector.Snapshot, span time.Duration) []Action {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out = nil
	if len(snap.Regimes) == 0 || t.scope.Empty() {
		return nil
	}
	now := t.deps.Clock.Now()
	if t.fstats == nil {
		t.fstats = map[probe.FileKey]detector.FileStats{}
	}
	if t.dstats == nil {
		t.dstats = map[probe.Dev]detector.DeviceStats{}
	}
	for _, f := range snap.Files {
		t.fstats[f.Key] = f
	}
	for _, d := range snap.Devices {
		ds, ok := t.dstats[d.Device]
		if !ok {
			ds = d
		}
		ds.CapacityBPS = d.CapacityBPS
		t.dstats[d.Device] = ds
	}
	start := func(key probe.FileKey, dev probe.Dev, kind detector.RegimeKind) {
		if fd := t.files[key]; fd != nil {
			if t.regimeTakesOver(fd) {
				fd.regimes = append(fd.regimes, kind)
				fd.lastNeeded = now
				if !t.deferBesideRandom(fd, dev, now) {
					t.onRecent(key, recent, span, func() { t.driveFile(fd, true) })
				}
			}
			return
		}
		d := t.device(dev)
		if d == nil {
			return
		}
		fd := &fileDec{key: key, dev: d,
			win: ladder{kind: KindFileWindow, base: d.orig, cur: d.orig},
			pf:  ladder{kind: KindPrefetch, first: t.cfg.PrefetchStartKB}}
		t.files[key] = fd
		fd.regimes = []detector.RegimeKind{kind}
		fd.lastNeeded = now
		if !t.deferBesideRandom(fd, dev, now) {
			t.driveFile(fd, true)
		}
	}
	for _, r := range snap.Regimes {
		switch {
		case !r.File.IsZero():
			start(r.File, r.Device, r.Kind)
		case r.Kind == detector.Contention:
			// As Step does: each sequential file read on the device gets
			// the closed loop, unless the contention is among them.
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

// onRecent runs f with the tuner's view switched to recent (over span) if
// it holds enough of key's requests to measure it by, and back after.
func (t *Tuner) onRecent(key probe.FileKey, recent detector.Snapshot, span time.Duration, f func()) {
	i := slices.IndexFunc(recent.Files, func(fs detector.FileStats) bool { return fs.Key == key })
	if span <= 0 || i < 0 || recent.Files[i].Requests < freshMinRequests || recent.Files[i].BusyThroughput <= 0 {
		f()
		return
	}
	defer t.useView(recent, span)()
	f()
}

// ApplyPending gives readers that opened a file after its decision the
// decision's window, between Steps. The daemon may call it more often than
// Step (for example every 100 ms) so HDFS's per-read opens are reached fast.
func (t *Tuner) ApplyPending() []Action {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out, t.evOut = t.evOut, nil
	t.applyPendingLocked()
	return t.out
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
	d.tokens = float64(t.cfg.SysfsBurst)
	d.tokenAt = t.deps.Clock.Now()
	d.pfAt = d.tokenAt
	return d
}

func (t *Tuner) fileMeasure(k probe.FileKey) measure {
	fs, ok := t.fstats[k]
	if !ok || fs.BusyThroughput <= 0 || t.snap.Now-fs.LastSeen > t.cfg.Settle {
		return measure{}
	}
	// The detector's window is the tuner's Settle (the daemon sets both to
	// its interval), or the recent span of a fresh stream's first step.
	span := t.cfg.Settle.Seconds()
	if t.measSpan > 0 {
		span = t.measSpan.Seconds()
	}
	m := measure{ok: true, tput: fs.BusyThroughput, p50: fs.P50, rate: float64(fs.Bytes) / span}
	m.rand = t.randomCost(fs.Device, k)
	if ds, ok := t.dstats[fs.Device]; ok {
		m.dev = float64(ds.Bytes) / span
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
			if t.protectedStream(ok2, ofs) {
				m.others += float64(ofs.Bytes) / span
			}
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
func (t *Tuner) protectedStream(k probe.FileKey, fs detector.FileStats) bool {
	if fs.Sequentiality < t.cfg.MinSequentiality || t.snap.Now-fs.LastSeen > t.cfg.Settle {
		return false
	}
	if fd := t.files[k]; fd != nil {
		return !fd.outOfScope
	}
	return !t.outsideScope(k)
}

// scopeVerdict caches whether a file without a decision is read only
// through descriptors outside the allow-paths (protectedStream).
type scopeVerdict struct {
	outside bool
	at      time.Duration
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
func (t *Tuner) measureFor(fd *fileDec) measure {
	m := t.fileMeasure(fd.key)
	m.othersMustNotLose = fd.byRate
	if fd.byRate {
		// A stream that began inside the detector's window read only part
		// of it: its rate there understates it, and any step would look
		// paid. Its busy throughput is its rate while it read (a
		// window-bound stream is busy all along); the step's own verdict,
		// a window later, is by rate.
		if _, whole := t.windowKB(fd.key); whole || fd.win.trial != 0 {
			m.tput = m.rate
		}
	}
	return m
}

func (t *Tuner) devMeasure(dev probe.Dev) measure {
	ds, ok := t.dstats[dev]
	if !ok || ds.BusyThroughput <= 0 {
		return measure{}
	}
	return measure{ok: true, tput: ds.BusyThroughput, p50: ds.P50}
}

// driveFile advances the file's knobs; with escalate false it only judges
// a step under trial (the regime ended: no new step).
func (t *Tuner) driveFile(fd *fileDec, escalate bool) {
	// A file refused by the allow-paths is not retried for BackoffMax;
	// but one refused silently while it was tried on its outcome alone is
	// tried once more when a regime asks for it, so the refusal of a
	// regime's action is logged and counted.
	if fd.outOfScope && (fd.scopeWarned || onlyOutcome(fd.regimes)) && t.deps.Clock.Now()-fd.scopeAt < t.cfg.BackoffMax {
		return
	}
	why := fmt.Sprintf("regimes %v", fd.regimes)
	// A larger window only helps a sequential reader. On a random (mmap)
	// reader every fault reads the whole window: its busy throughput
	// rises while the reads it needs become slower, so the closed loop
	// would keep the step. No new step for such a file.
	if fs, ok := t.fstats[fd.key]; ok && fs.Sequentiality < t.cfg.MinSequentiality && fd.win.trial == 0 && fd.pf.trial == 0 {
		if !fd.notSeqLogged {
			fd.notSeqLogged = true
			t.log.Info("tuner: file is not read sequentially; no window action", "file", fd.key.String(), "regimes", fd.regimes,
				"sequentiality", fs.Sequentiality, "min_sequentiality", t.cfg.MinSequentiality)
		}
		return
	}
	m := t.measureFor(fd)
	fd.win.hint = t.windowHint(fd.key)
	if fd.byRate {
		// The learned capacity of a device slow from the start is its slow
		// rate, so the Little's-law hint undershoots: a stream bound by its
		// window starts at four times it (one trial, judged like any other;
		// at bandwidth it does not pay and is undone).
		fd.win.hint = max(fd.win.hint, outcomeFirstFactor*fd.win.base)
	}
	if m.ok {
		// A stream with a tail waits on its slowest requests: the window
		// that hides them is sized by the p99.
		fd.win.hint = max(fd.win.hint, t.tailNeedKB(fd.key, m.tput))
	}
	fd.win.limit, fd.win.limitFn = 0, nil
	if fd.win.knee && fd.win.kneeRandom && !t.randomReaderBeside(fd) {
		// The random readers whose budget set the knee are gone.
		fd.win.knee, fd.win.kneeRandom, fd.win.retryAt, fd.win.failures = false, false, 0, 0
	}
	if t.randomReaderBeside(fd) {
		// Each window of transfers queued for the stream is waiting time
		// for the random reader's faults: grow in small steps, each within
		// their budget and paying its margin, rather than straight to the
		// window that fills the device (random.go).
		fd.win.hint = 0
		if escalate && fd.win.cur == fd.win.base && fd.win.trial == 0 {
			// A first step: the random readers' reference is what they
			// get now, at the device's window, in the conditions of the
			// moment (a stream that just slowed or opened changed them).
			t.refreshRandom(fd.dev)
		}
		fd.win.limitFn = func() int {
			lim, why := t.randomLimitKB(fd)
			if lim < 0 {
				return 0
			}
			if l := &fd.win; l.ceil > 0 && t.deps.Clock.Now() < l.ceilUntil {
				lim = min(lim, l.ceil-randStepKB)
			}
			if lim < int(randMinStep*float64(fd.win.cur)) {
				t.log.Debug("tuner: no step beside random readers", "file", fd.key.String(), "window_kb", fd.win.cur, "why", why)
			}
			return max(lim, fd.win.cur)
		}
		fd.win.limit = fd.win.limitFn()
	}
	// A decision no regime started skips this: a device slow from the start
	// learned its slow rate (then each kept step's) as its capacity, and
	// only the trial tells.
	if capBPS := t.dstats[fd.dev.dev].CapacityBPS; escalate && m.ok && capBPS > 0 && m.tput >= t.cfg.CapacityFrac*capBPS && !fd.byRate {
		// The file already reads at (nearly) the device's capacity: a
		// further window step or prefetch has nothing left to gain and
		// costs a trial interval to learn that. Judge a trial, take none.
		escalate = false
		if !fd.atCapLogged {
			fd.atCapLogged = true
			t.log.Info("tuner: file reads at the device's capacity; no further step", "file", fd.key.String(), "path", fd.path,
				"window_kb", fd.win.inForce(), "busy_mbps", m.tput/1e6, "capacity_mbps", capBPS/1e6, "regimes", fd.regimes)
		}
	} else if escalate {
		fd.atCapLogged = false
	}
	if escalate && fd.byRate && fd.win.cur == fd.win.base && fd.win.trial == 0 {
		if !t.outcomeDue(fd.dev, fd.key) {
			escalate = false // the device's outcome trials are backing off
		} else if t.tailDue(fd.dev, fd.key) {
			fd.win.retryAt = 0 // new evidence: the file's own back-off ends too
		}
	}
	if escalate && fd.pf.trial == 0 {
		t.kneeStale(fd, m)
	}
	if t.measSpan == 0 && fd.pf.trial == 0 && t.watchRandom(fd, m) {
		return // the kept window cost the random readers beside it too much: lowered
	}
	applyWin := func(kb int) error { return t.pinFile(fd, kb, nil, true) }
	if fd.pf.trial == 0 {
		hadTrial := fd.win.trial != 0
		did := t.drive(&fd.win, fd.dev, fd.key, fd.path, m, why, escalate, applyWin)
		t.remember(fd, hadTrial)
		if fd.win.trial > fd.win.base && fd.win.limit > 0 {
			// A step beside random readers: their read-around trim comes
			// with it, not at the next Step (their budget counts on it).
			t.startTrims(fd.dev)
		}
		if did || fd.win.trial != 0 {
			return
		}
	}
	// Prefetch when the window alone is not enough. Not beside a random
	// reader: the prefetched ranges queue ahead of its faults as a larger
	// window would, where the window's knee already says how much the
	// device can take (measured: its trials cost the stream 10-15% a
	// second each on a busy host, and kept, they are unjudged by the
	// random readers' rule).
	pfEscalate := escalate && !t.randomReaderBeside(fd)
	if fd.win.exhausted(t.cfg.MaxKB) && !t.cfg.DisablePrefetch && (pfEscalate || fd.pf.trial != 0) {
		if fs, ok := t.fstats[fd.key]; ok && fs.Sequentiality >= t.cfg.MinSequentiality || fd.pf.trial != 0 {
			t.drive(&fd.pf, fd.dev, fd.key, fd.path, m, why+", window at its knee or maximum", pfEscalate, func(kb int) error {
				if len(t.refs(fd, nil)) == 0 {
					return errNoReaders
				}
				return nil // prefetchAll issues it each interval
			})
		}
	}
}

func (t *Tuner) driveDevice(d *devState, why string, escalate bool) {
	t.drive(&d.win, d, probe.FileKey{}, "", t.devMeasure(d.dev), why, escalate, func(kb int) error {
		if err := t.setDevice(d, kb, true); err != nil {
			return err
		}
		t.reachOpenFiles(d)
		return nil
	})
}

// ownWindow reports whether a file's decision holds a window of its own (a
// step kept or under trial): an outcome decision that holds none (backing
// off after trials that did not pay) leaves the file to the device's window.
func (t *Tuner) ownWindow(k probe.FileKey) bool {
	fd := t.files[k]
	return fd != nil && !(fd.byRate && fd.win.cur == fd.win.base && fd.win.trial == 0 && fd.win.probeUntil == 0)
}

// reachOpenFiles gives the device's window to the files being read on it
// now: a device's read_ahead_kb reaches only files opened after the write
// (the kernel copies it into each open file), and a device-wide regime
// (tail inflation) slows the readers that already hold their files open
// too. Files with a decision of their own keep their window. With the
// device back at its original, the files reached earlier get it back.
func (t *Tuner) reachOpenFiles(d *devState) {
	if t.cfg.DryRun || t.scope.Empty() {
		return
	}
	now := t.deps.Clock.Now()
	var keys []probe.FileKey
	if d.cur != d.orig {
		for k, fs := range t.fstats {
			if fs.Device != d.dev || t.ownWindow(k) || fs.Sequentiality < t.cfg.MinSequentiality || t.snap.Now-fs.LastSeen > t.cfg.Settle {
				continue
			}
			keys = append(keys, k)
		}
	}
	for k := range d.reached {
		if _, ok := t.fstats[k]; !ok || d.cur == d.orig {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b probe.FileKey) int { return cmp.Or(cmp.Compare(a.Dev, b.Dev), cmp.Compare(a.Ino, b.Ino)) })
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
		if d.cur == d.orig {
			delete(d.reached, k)
			continue
		}
		if n > 0 {
			if d.reached == nil {
				d.reached = map[probe.FileKey]bool{}
			}
			d.reached[k] = true
			t.emit(Action{Time: now, Device: d.name, Dev: d.dev, File: k, Path: fd.path, Kind: KindFileWindow, FromKB: d.orig, ToKB: d.cur,
				Result: ResultApplied, Evidence: fmt.Sprintf("device window %d KB given to an open file read on the device", d.cur)})
		}
	}
}

func (t *Tuner) undoFile(fd *fileDec, why string) {
	now := t.deps.Clock.Now()
	if p := fd.pf.inForce(); p > 0 {
		res := ResultUndone
		if t.cfg.DryRun {
			res = ResultDryRun
		}
		t.emit(Action{Time: now, Device: fd.dev.name, Dev: fd.dev.dev, File: fd.key, Path: fd.path, Kind: KindPrefetchUndo, FromKB: p, Result: res, Evidence: why})
	}
	fd.pf = ladder{}
	w := fd.win.inForce()
	if t.cfg.DryRun {
		if fd.win.dryAt != 0 {
			t.emit(Action{Time: now, Device: fd.dev.name, Dev: fd.dev.dev, File: fd.key, Path: fd.path, Kind: KindFileWindowUndo, FromKB: fd.win.dryAt, ToKB: fd.win.base, Result: ResultDryRun, Evidence: why})
		}
		return
	}
	if w <= fd.win.base {
		return
	}
	res := ResultUndone
	err := t.pinFile(fd, fd.win.base, nil, false)
	if err != nil {
		if errors.Is(err, errNoReaders) {
			why += "; readers gone (their open files closed)"
		} else {
			res = ResultFailed
			why += "; " + err.Error()
		}
	}
	t.emit(Action{Time: now, Device: fd.dev.name, Dev: fd.dev.dev, File: fd.key, Path: fd.path, Kind: KindFileWindowUndo, FromKB: w, ToKB: fd.win.base, Result: res, Evidence: why})
}

func (t *Tuner) undoDevice(d *devState, why string) {
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

func (t *Tuner) applyPendingLocked() {
	if t.cfg.DryRun {
		return
	}
	now := t.deps.Clock.Now()
	for _, fd := range t.files {
		t.applyPendingFile(fd, now)
	}
}

// applyPendingFile pins the window in force on the descriptors of the
// file's readers marked pending.
func (t *Tuner) applyPendingFile(fd *fileDec, now time.Duration) {
	if t.cfg.DryRun {
		return
	}
	{
		w := fd.win.inForce()
		if w <= fd.win.base {
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
		a := Action{Time: now, Device: fd.dev.name, Dev: fd.dev.dev, File: fd.key, Path: fd.path, Kind: KindFileWindow, FromKB: fd.win.base, ToKB: w, Result: res, Evidence: ev}
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
}

func (t *Tuner) pruneReaders(now time.Duration) {
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
}

func (t *Tuner) emit(a Action) {
	t.out = append(t.out, a)
	// A kept decision re-applied to a newly opened descriptor (HDFS opens
	// a block file per read) is counted, not listed: dozens of them would
	// push the decisions out of the recent list.
	if a.Result != ResultApplied {
		t.recent = append(t.recent, a)
		if over := len(t.recent) - t.cfg.RecentActions; over > 0 {
			t.recent = append(t.recent[:0:0], t.recent[over:]...)
		}
	}
	t.counts[string(a.Kind)+"/"+string(a.Result)]++
	lvl := slog.LevelInfo
	if a.Result == ResultFailed {
		lvl = slog.LevelWarn
	}
	attrs := []any{"kind", a.Kind, "result", a.Result, "device", a.Device, "from_kb", a.FromKB, "to_kb", a.ToKB, "evidence", a.Evidence}
	if !a.File.IsZero() {
		attrs = append(attrs, "file", a.File.String(), "path", a.Path)
	}
	if t.cfg.DryRun {
		attrs = append(attrs, "dry_run", true)
	}
	t.log.Log(context.Background(), lvl, "tuner: action", attrs...)
}

// Status reports the tuner's state.
func (t *Tuner) Status() Status {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := Status{DryRun: t.cfg.DryRun, Counts: map[string]uint64{}, FileOpFailures: t.fileFail, OutOfScope: t.refused, RateLimited: t.limited}
	st.Repeated = t.fails.counts()
	for k, v := range t.counts {
		st.Counts[k] = v
	}
	st.Recent = append([]Action(nil), t.recent...)
	for _, d := range t.devs {
		if !d.known {
			continue
		}
		ds := DeviceStatus{Device: d.name, Dev: d.dev, CurrentKB: d.cur, OriginalKB: d.orig}
		for _, fd := range t.files {
			if fd.dev == d && fd.win.inForce() != d.cur {
				ds.FilesAdjusted++
			}
			if fd.dev == d && fd.pf.inForce() > 0 {
				ds.Prefetching++
			}
		}
		for _, td := range t.trims {
			if td.dev == d && !td.dry {
				ds.FilesAdjusted++
			}
		}
		st.Devices = append(st.Devices, ds)
	}
	sort.Slice(st.Devices, func(i, j int) bool { return st.Devices[i].Device < st.Devices[j].Device })
	for _, fd := range t.files {
		s := "watching"
		switch {
		case fd.outOfScope:
			s = "out_of_scope"
		case fd.win.trial != 0 || fd.pf.trial != 0:
			s = "trial"
		case fd.win.knee:
			s = "knee"
		case fd.win.failures > 0 && fd.win.cur == fd.win.base:
			s = "backing_off"
		case fd.win.cur > fd.win.base:
			s = "kept"
		}
		st.Files = append(st.Files, FileStatus{Device: fd.dev.name, File: fd.key, Path: fd.path, WindowKB: fd.win.inForce(),
			BaseKB: fd.win.base, PrefetchKB: fd.pf.inForce(), Readers: len(t.readers[fd.key]), State: s})
	}
	for _, td := range t.trims {
		s := "trimmed"
		if td.trialAt != 0 {
			s = "trial"
		}
		if td.dry {
			s = "dry_run"
		}
		st.Files = append(st.Files, FileStatus{Device: td.dev.name, File: td.key, Path: td.path, WindowKB: td.kb,
			BaseKB: td.from, Readers: len(td.refs), State: s})
	}
	sort.Slice(st.Files, func(i, j int) bool { return st.Files[i].File.String() < st.Files[j].File.String() })
	return st
}

// RestoreAll undoes everything: each touched device back to its original,
// each adjusted open file back to the device's window, prefetch stopped,
// and the durable record cleared. Used on SIGTERM/SIGINT.
func (t *Tuner) RestoreAll() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closing = true
	t.out = nil
	if t.cfg.DryRun {
		return nil
	}
	// What was learned outlives the run: a restart during a slowdown
	// serves the first open at once.
	t.savePriors(true)
	var errs []error
	for _, d := range t.devs {
		if !d.known {
			continue
		}
		d.winActive = false
		if d.cur != d.orig || d.dirty {
			from := d.cur
			if err := t.setDevice(d, d.orig, false); err != nil {
				errs = append(errs, fmt.Errorf("restore %s to %d KB: %w", d.name, d.orig, err))
				continue
			}
			t.emit(Action{Time: t.deps.Clock.Now(), Device: d.name, Dev: d.dev, Kind: KindDeviceWindowUndo, FromKB: from, ToKB: d.orig, Result: ResultUndone, Evidence: "shutting down"})
		}
		if len(d.reached) > 0 {
			t.reachOpenFiles(d)
		}
	}
	for k, fd := range t.files {
		t.undoFile(fd, "shutting down")
		delete(t.files, k)
	}
	for _, k := range sortedKeys(t.trims) {
		t.endTrim(t.trims[k], "shutting down")
	}
	if t.deps.Store != nil {
		// An original recorded before a write that failed (sysfs read-only)
		// is still in force: writing it back would only fail again and
		// make a clean shutdown look like a failed restore.
		for _, e := range t.deps.Store.Entries() {
			if kb, err := t.deps.Sysfs.ReadAheadKB(e.Device); err == nil && kb == e.ReadAheadKB {
				if err := t.deps.Store.Forget(e.Device); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if err := t.deps.Store.Restore(t.deps.Sysfs); err != nil {
			errs = append(errs, err)
		}
		// Windows the undos above did not reach (a reader not found
		// this time) are reset from the record.
		if len(t.deps.Store.Pins()) > 0 {
			if _, err := RestorePins(t.deps.Store, t.deps.Files, t.scope, t.cfg.Devices, t.lower); err != nil {
				errs = append(errs, fmt.Errorf("reset per-file windows: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}
