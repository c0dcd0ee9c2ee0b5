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
	"github.com/readaheadd/readaheadd/pkg/state"
)

// errRateLimited defers a step to a later interval; it is not a failure.
var errRateLimited = errors.New("sysfs write rate limit reached")

// errNoReaders: no reader of the file is known to hold it open (yet).
var errNoReaders = errors.New("no known reader holds the file open")

// errOutOfScope: the readers' descriptors are outside the allow-paths.
var errOutOfScope = errors.New("the file is outside the allow-paths")

// ladder is one knob's closed-loop state: the value in force, a step under
// trial, the knee, and the back-off.
type ladder struct {
	kind      ActionKind
	base, cur int // value before the tuner; value kept
	first     int // first step when cur is 0 (prefetch)
	trial     int // value under trial, 0 if none
	trialFrom int
	trialAt   time.Duration
	before    measure
	knee      bool
	failures  int
	retryAt   time.Duration
	dryAt     int // value last reported in dry-run mode
	// hint is the window Little's law says the reader needs (KB, 0 if
	// unknown): the first step from base skips steps smaller than it.
	hint int
	// Re-probe of a kept file window: when cur last changed, when the
	// current probe (window back at base) ends, and the period.
	keptAt     time.Duration
	probeUntil time.Duration
	probeEvery time.Duration
	// baseM: the measure when the first step left base; keptM: when the
	// value in force was kept (what a re-probe and the memory compare with).
	baseM, keptM measure
}

func (l *ladder) inForce() int {
	if l.probeUntil != 0 {
		return l.base
	}
	if l.trial != 0 {
		return l.trial
	}
	return l.cur
}

func (l *ladder) next(growth, max int) (int, bool) {
	n := l.cur * growth
	if l.cur == 0 {
		n = l.first
	}
	// From base, skip steps that cannot hide the reader's latency: each
	// would cost an interval of slow reading to learn only that.
	for l.cur == l.base && l.cur > 0 && n < l.hint && n < max {
		n *= growth
	}
	if n > max {
		n = max
	}
	return n, n > l.cur
}

// exhausted: more of this knob alone will not help now.
func (l *ladder) exhausted(max int) bool {
	return l.trial == 0 && (l.knee || l.cur >= max)
}

type measure struct {
	ok   bool
	tput float64 // bytes/s judged: busy throughput, or rate for decisions judged by rate
	p50  time.Duration
	// rate: the file's bytes per second over the detector's window (what
	// the stream's reader gets, unlike busy throughput, which a larger
	// window raises even for a reader limited by its application).
	rate float64
	// dev: the device's bytes per second over the same window, 0 if unknown.
	dev float64
}

func (m measure) String() string {
	if !m.ok {
		return "no data"
	}
	return fmt.Sprintf("%.1f MB/s p50 %v", m.tput/1e6, m.p50)
}

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
}

type fileDec struct {
	key        probe.FileKey
	dev        *devState
	path       string
	win        ladder
	pf         ladder
	pfEnd      uint64 // end of the last prefetched range
	regimes    []detector.RegimeKind
	lastNeeded time.Duration
	outOfScope bool
	scopeAt    time.Duration
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
	dstats   map[probe.Dev]detector.DeviceStats
	out      []Action
	recent   []Action
	counts   map[string]uint64
	logged   map[string]time.Duration // logOnce: last time per topic
	fileFail uint64
	refused  uint64
	limited  uint64
	// Read-around trims (trim.go).
	trims      map[probe.FileKey]*trimDec
	trimOffs   map[probe.FileKey]*trimOff
	trimScanAt map[probe.FileKey]time.Duration
	// Memory of windows that paid (memory.go, fresh.go) and its file.
	mem           *memory
	priorsPath    string
	priorsSavedAt time.Duration
	// nReaders bounds the readers table (file x process).
	nReaders int
	evOut    []Action // actions taken from the event path, not yet returned
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
		trimOffs:   map[probe.FileKey]*trimOff{},
		trimScanAt: map[probe.FileKey]time.Duration{},
		counts:     map[string]uint64{},
		logged:     map[string]time.Duration{},
		mem:        newMemory(),
	}
	if deps.Store != nil {
		t.priorsPath = deps.Store.PriorsPath()
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
		reset, gone, err := RestorePins(deps.Store, deps.Files)
		t.log.Warn("tuner: per-file windows of an earlier run were left (crash?); reset them to their devices' windows",
			"file", deps.Store.PinsPath(), "reset", reset, "readers_gone", gone, "err", err)
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
		return
	}
	// Events emitted before the last pin (still queued in the ring
	// buffer) show the old window of a descriptor already pinned.
	stale := ev.Time != 0 && ev.Time < r.appliedAt
	if w := fd.win.inForce(); w > fd.win.base && r.raKB < w && !stale {
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
				if byRate[key] && !t.outcomeDue(d) {
					continue // the device's outcome trials are backing off
				}
				fd = &fileDec{key: key, dev: d, byRate: byRate[key],
					win: ladder{kind: KindFileWindow, base: d.orig, cur: d.orig},
					pf:  ladder{kind: KindPrefetch, first: t.cfg.PrefetchStartKB}}
				t.files[key] = fd
			}
			fd.regimes = kinds
			fd.lastNeeded = now
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
			if fd.byRate {
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
		if needed {
			if !t.reprobeStart(fd) {
				t.driveFile(fd, true)
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

	// Device-wide decisions.
	for dev, why := range devWide {
		d := t.device(dev)
		if d == nil {
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

// streamShareMin: when at least this share of a contended device's bytes
// goes to the sequential readers that a contention step would reach, the
// contention is among them.
const streamShareMin = 0.8

// contentionAmongStreams reports whether a device's contention comes from
// the sequential readers the tuner would give larger windows to: two or
// more of them, taking at least streamShareMin of the device's bytes. A
// larger window wins a reader share from the others; when the others are
// the same kind of reader, each step takes from another's (the device stays
// saturated) and only adds queueing.
func (t *Tuner) contentionAmongStreams(snap detector.Snapshot, dev probe.Dev) (string, bool) {
	var devBytes float64
	for _, d := range snap.Devices {
		if d.Device == dev {
			devBytes = float64(d.Bytes)
		}
	}
	var n int
	var streamBytes float64
	for _, f := range snap.Files {
		if f.Device != dev || f.Sequentiality < t.cfg.MinSequentiality || snap.Now-f.LastSeen > t.cfg.Settle {
			continue
		}
		n++
		streamBytes += float64(f.Bytes)
	}
	if n < 2 || devBytes <= 0 {
		return "", false
	}
	share := streamBytes / devBytes
	return fmt.Sprintf("%d sequential readers take %.0f%% of the device's bytes", n, 100*share), share >= streamShareMin
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
		if t.files[key] != nil {
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
		t.driveFile(fd, true)
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

func (t *Tuner) take(d *devState, n int) bool {
	now := t.deps.Clock.Now()
	d.tokens += (now - d.tokenAt).Seconds() * t.cfg.SysfsWritesPerSec
	d.tokenAt = now
	if b := float64(t.cfg.SysfsBurst); d.tokens > b {
		d.tokens = b
	}
	if d.tokens < float64(n) {
		t.limited++
		return false
	}
	d.tokens -= float64(n)
	return true
}

// record makes sure the device's original is on disk before a write.
func (t *Tuner) record(d *devState) error {
	if t.deps.Store == nil {
		return errors.New("no state store")
	}
	return t.deps.Store.Record(d.name, d.dev.String(), d.orig)
}

// writeDevice sets read_ahead_kb, recording the original first.
func (t *Tuner) writeDevice(d *devState, kb int) error {
	if err := t.record(d); err != nil {
		return fmt.Errorf("record original of %s before writing it: %w", d.name, err)
	}
	return t.deps.Sysfs.SetReadAheadKB(d.name, kb)
}

// setDevice moves the device's own window (a device-wide decision).
func (t *Tuner) setDevice(d *devState, kb int, limit bool) error {
	kb = t.clamp(d, kb)
	if kb == d.cur && !d.dirty {
		return nil
	}
	if limit && !t.take(d, 1) {
		return errRateLimited
	}
	if err := t.writeDevice(d, kb); err != nil {
		return err
	}
	d.cur = kb
	d.dirty = false
	return nil
}

func (t *Tuner) clamp(d *devState, kb int) int {
	if kb > t.cfg.MaxKB {
		kb = t.cfg.MaxKB
	}
	if kb < d.orig {
		kb = d.orig
	}
	return kb
}

// repairDevices retries a write back that failed after a raise.
func (t *Tuner) repairDevices() {
	for _, d := range t.devs {
		if d.known && d.dirty {
			if err := t.writeDevice(d, d.cur); err != nil {
				t.log.Error("tuner: read_ahead_kb is still not back at its intended value", "device", d.name, "want_kb", d.cur, "err", err)
				continue
			}
			d.dirty = false
			t.log.Info("tuner: read_ahead_kb put back", "device", d.name, "kb", d.cur)
		}
	}
}

// refs finds the in-scope descriptors of the file's readers (only those in
// tgids when given).
func (t *Tuner) refs(fd *fileDec, tgids map[uint32]bool) []FileRef {
	now := t.deps.Clock.Now()
	var out []FileRef
	tg := make([]uint32, 0, len(t.readers[fd.key]))
	for tgid, r := range t.readers[fd.key] {
		// Readers the tuner pinned stay reachable for the undo however
		// long ago they were seen.
		if (now-r.lastSeen > t.cfg.Grace && r.appliedKB == 0) || (tgids != nil && !tgids[tgid]) {
			continue
		}
		tg = append(tg, tgid)
	}
	slices.Sort(tg)
	for _, tgid := range tg {
		found, err := t.deps.Files.Find(tgid, fd.key)
		if err != nil {
			t.fileFail++
			t.log.Debug("tuner: cannot list a reader's descriptors", "pid", tgid, "file", fd.key.String(), "err", err)
			continue
		}
		for _, ref := range found {
			real, err := t.scope.Check(ref.Path, fd.key)
			if err != nil {
				t.refused++
				if !fd.outOfScope {
					t.log.Warn("tuner: file is outside the allow-paths; no per-file action", "pid", tgid, "fd", ref.FD, "path", ref.Path, "reason", err)
				}
				fd.outOfScope = true
				fd.scopeAt = now
				continue
			}
			fd.outOfScope = false
			fd.path = real
			out = append(out, ref)
		}
	}
	return out
}

// pin gives each ref's open file the window kb: with fadvise alone when kb
// is the device's window (NORMAL) or twice it (SEQUENTIAL), otherwise by
// raise, pin, restore. Descriptors are taken before the raise so the device
// holds kb for as short a time as possible.
func (t *Tuner) pin(d *devState, kb int, refs []FileRef, limit bool) (int, error) {
	return t.pinExact(d, t.clamp(d, kb), refs, limit)
}

// pinExact is pin without the clamp to the device's original: a
// read-around trim pins below it.
func (t *Tuner) pinExact(d *devState, kb int, refs []FileRef, limit bool) (int, error) {
	if len(refs) == 0 {
		return 0, errNoReaders
	}
	advice, raise := AdviceNormal, false
	switch {
	case kb == d.cur:
	case kb == 2*d.cur:
		advice = AdviceSequential
	default:
		raise = true
	}
	if raise && limit && !t.take(d, 2) {
		return 0, errRateLimited
	}
	var hs []Handle
	var hrefs []FileRef
	var errs []error
	var set, clear []state.Pin
	for _, r := range refs {
		h, err := t.deps.Files.Dup(r)
		if err != nil {
			t.fileFail++
			errs = append(errs, err)
			if errors.Is(err, ErrProcessGone) || errors.Is(err, ErrFDGone) {
				clear = append(clear, pinOf(d, r, 0))
			}
			continue
		}
		hs = append(hs, h)
		hrefs = append(hrefs, r)
	}
	defer t.recordPins(&set, &clear)
	defer func() {
		for _, h := range hs {
			h.Close()
		}
	}()
	if len(hs) == 0 {
		return 0, fmt.Errorf("take descriptors: %w", errors.Join(errs...))
	}
	if raise {
		if err := t.writeDevice(d, kb); err != nil {
			return 0, fmt.Errorf("set read_ahead_kb of %s to %d for a pin: %w", d.name, kb, err)
		}
	}
	n := 0
	for i, h := range hs {
		if err := h.Fadvise(0, 0, advice); err != nil {
			t.fileFail++
			errs = append(errs, err)
			continue
		}
		n++
		// What outlives a crash of the daemon is recorded: a window other
		// than the device's original (the device is put back first).
		if kb != d.orig {
			set = append(set, pinOf(d, hrefs[i], kb))
		} else {
			clear = append(clear, pinOf(d, hrefs[i], 0))
		}
	}
	if raise {
		if err := t.deps.Sysfs.SetReadAheadKB(d.name, d.cur); err != nil {
			d.dirty = true
			t.log.Error("tuner: could not put read_ahead_kb back after pinning a file window; retrying next interval",
				"device", d.name, "left_at_kb", kb, "want_kb", d.cur, "err", err)
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("fadvise: %w", errors.Join(errs...))
	}
	return n, nil
}

func pinOf(d *devState, r FileRef, kb int) state.Pin {
	return state.Pin{PID: r.Tgid, FD: r.FD, Dev: uint32(r.Key.Dev), Ino: r.Key.Ino, Device: d.name, WindowKB: kb, Path: r.Path}
}

// recordPins writes what pin changed into the state directory's record of
// per-file windows (best effort: a window left behind ends when its reader
// closes the file).
func (t *Tuner) recordPins(set, clear *[]state.Pin) {
	if t.deps.Store == nil || len(*set)+len(*clear) == 0 {
		return
	}
	if err := t.deps.Store.UpdatePins(*set, *clear); err != nil {
		t.log.Warn("tuner: could not record per-file windows; after a crash they would stay until their files are closed", "err", err)
	}
}

// RestorePins gives every open file that an earlier run recorded as pinned
// (state.Store.Pins) its device's window again, with POSIX_FADV_NORMAL: the
// device is expected at its original value by then. Descriptors whose
// process exited, or that were closed or now name another file, need
// nothing. Entries that could not be reached for another reason stay
// recorded. It returns how many windows were reset and how many readers
// were gone.
func RestorePins(st *state.Store, files FileOps) (reset, gone int, err error) {
	var done []state.Pin
	var errs []error
	for _, p := range st.Pins() {
		h, derr := files.Dup(FileRef{Tgid: p.PID, FD: p.FD, Key: probe.FileKey{Dev: probe.Dev(p.Dev), Ino: p.Ino}, Path: p.Path})
		if errors.Is(derr, ErrProcessGone) || errors.Is(derr, ErrFDGone) {
			gone++
			done = append(done, p)
			continue
		}
		if derr != nil {
			errs = append(errs, fmt.Errorf("pid %d fd %d (%s): %w", p.PID, p.FD, p.Path, derr))
			continue
		}
		ferr := h.Fadvise(0, 0, AdviceNormal)
		h.Close()
		if ferr != nil {
			errs = append(errs, fmt.Errorf("pid %d fd %d (%s): fadvise: %w", p.PID, p.FD, p.Path, ferr))
			continue
		}
		reset++
		done = append(done, p)
	}
	if uerr := st.UpdatePins(nil, done); uerr != nil {
		errs = append(errs, uerr)
	}
	return reset, gone, errors.Join(errs...)
}

func (t *Tuner) pinFile(fd *fileDec, kb int, tgids map[uint32]bool, limit bool) error {
	refs := t.refs(fd, tgids)
	if len(refs) == 0 && fd.outOfScope {
		return errOutOfScope
	}
	n, err := t.pin(fd.dev, kb, refs, limit)
	if err != nil {
		return err
	}
	seen := map[uint32]bool{}
	for _, r := range refs {
		seen[r.Tgid] = true
	}
	for tgid := range seen {
		if r := t.readers[fd.key][tgid]; r != nil {
			r.appliedKB, r.pending, r.appliedAt = kb, false, t.deps.Clock.Now()
		}
	}
	_ = n
	return nil
}

func (t *Tuner) fileMeasure(k probe.FileKey) measure {
	fs, ok := t.fstats[k]
	if !ok || fs.BusyThroughput <= 0 || t.snap.Now-fs.LastSeen > t.cfg.Settle {
		return measure{}
	}
	// The detector's window is the tuner's Settle (the daemon sets both to
	// its interval).
	m := measure{ok: true, tput: fs.BusyThroughput, p50: fs.P50, rate: float64(fs.Bytes) / t.cfg.Settle.Seconds()}
	if ds, ok := t.dstats[fs.Device]; ok {
		m.dev = float64(ds.Bytes) / t.cfg.Settle.Seconds()
	}
	return m
}

// measureFor is the measure a decision is judged by: the stream's rate for
// decisions no regime started, its busy throughput otherwise.
func (t *Tuner) measureFor(fd *fileDec) measure {
	m := t.fileMeasure(fd.key)
	if fd.byRate {
		m.tput = m.rate
	}
	return m
}

// reprobeStart drops a file window kept for long enough back to the
// device's window, to learn whether its regime is over: under a window
// that keeps the device bandwidth-saturated the detector cannot tell and
// holds the regime. It reports whether it started a probe.
func (t *Tuner) reprobeStart(fd *fileDec) bool {
	now := t.deps.Clock.Now()
	l := &fd.win
	if t.cfg.DryRun || l.trial != 0 || fd.pf.inForce() != 0 || l.cur <= l.base ||
		slices.Contains(fd.regimes, detector.StarvedStream) { // starved: the window is visibly needed
		return false
	}
	if l.probeEvery == 0 {
		l.probeEvery = t.cfg.ReprobeAfter
	}
	if now-l.keptAt < l.probeEvery {
		return false
	}
	if err := t.pinFile(fd, l.base, nil, true); err != nil {
		if !errors.Is(err, errRateLimited) {
			l.keptAt = now // try again a period later
			t.log.Debug("tuner: re-probe not started", "file", fd.key.String(), "err", err)
		}
		return false
	}
	l.probeUntil = now + t.cfg.ReprobeHold
	t.emit(Action{Time: now, Device: fd.dev.name, Dev: fd.dev.dev, File: fd.key, Path: fd.path, Kind: KindFileWindowUndo,
		FromKB: l.cur, ToKB: l.base, Result: ResultTrial,
		Evidence: fmt.Sprintf("re-probe: window kept for %v under regimes %v; back to the device's window for %v to see whether the regime is over", (now - l.keptAt).Round(time.Second), fd.regimes, t.cfg.ReprobeHold)})
	return true
}

// reprobeJudge ends a re-probe: the regime cleared at the device's window
// (the decision ends), or it persisted for ReprobeHold (the kept window is
// put back and the next probe waits twice as long).
func (t *Tuner) reprobeJudge(fd *fileDec, needed bool) {
	now := t.deps.Clock.Now()
	l := &fd.win
	if !needed {
		kept := l.cur
		l.probeUntil, l.cur = 0, l.base
		t.emit(Action{Time: now, Device: fd.dev.name, Dev: fd.dev.dev, File: fd.key, Path: fd.path, Kind: KindFileWindowUndo,
			FromKB: kept, ToKB: l.base, Result: ResultUndone,
			Evidence: fmt.Sprintf("re-probe: no regime at the device's window (was %v): the %d KB window is no longer needed", fd.regimes, kept)})
		t.undoFile(fd, "re-probe ended the decision") // stops prefetch; the window is already back
		delete(t.files, fd.key)
		return
	}
	fd.lastNeeded = now
	if now < l.probeUntil {
		return
	}
	if err := t.pinFile(fd, l.cur, nil, true); err != nil && !errors.Is(err, errNoReaders) {
		if errors.Is(err, errRateLimited) {
			return // next interval
		}
		t.emit(Action{Time: now, Device: fd.dev.name, Dev: fd.dev.dev, File: fd.key, Path: fd.path, Kind: KindFileWindow,
			FromKB: l.base, ToKB: l.cur, Result: ResultFailed, Evidence: "re-probe: putting the kept window back failed: " + err.Error()})
	} else {
		t.emit(Action{Time: now, Device: fd.dev.name, Dev: fd.dev.dev, File: fd.key, Path: fd.path, Kind: KindFileWindow,
			FromKB: l.base, ToKB: l.cur, Result: ResultKept,
			Evidence: fmt.Sprintf("re-probe: regimes %v persist at the device's window after %v; the kept window is back, next re-probe in %v", fd.regimes, t.cfg.ReprobeHold, min(2*l.probeEvery, t.cfg.BackoffMax))})
	}
	l.probeUntil, l.keptAt = 0, now
	l.probeEvery = min(2*l.probeEvery, t.cfg.BackoffMax)
}

// randomReaderBeside reports whether another file on fd's device is read
// randomly now (or its read-around is trimmed).
func (t *Tuner) randomReaderBeside(fd *fileDec) bool {
	for _, td := range t.trims {
		if td.dev == fd.dev {
			return true
		}
	}
	for k, fs := range t.fstats {
		if k != fd.key && fs.Device == fd.dev.dev && t.readRandomly(fs) {
			return true
		}
	}
	return false
}

// windowHint is the window (KB) that keeps enough bytes in flight to hide
// the file's p95 latency at the device's learned capacity (Little's law),
// 0 when the detector has not measured both. The p95, not the median: a
// sequential reader stalls on the slowest request of its window.
func (t *Tuner) windowHint(k probe.FileKey) int {
	fs, ok := t.fstats[k]
	if !ok {
		return 0
	}
	lat := fs.P95
	if lat <= 0 {
		lat = fs.P50
	}
	ds, ok := t.dstats[fs.Device]
	if !ok || ds.CapacityBPS <= 0 || lat <= 0 {
		return 0
	}
	return int(lat.Seconds() * ds.CapacityBPS / 1024)
}

// tailHint is the device window (KB) that keeps a stall of the device's
// p99 latency hidden at its capacity, when the need is tail inflation and
// the device is below CapacityFrac of its capacity (0 otherwise): a reader stalls on the slowest request of its window, and
// under tail inflation that is the p99. Steps below it would each cost an
// interval to learn only that they are too small (and under a periodic
// stall, one interval's throughput says little).
func (t *Tuner) tailHint(snap detector.Snapshot, dev probe.Dev) int {
	tail := false
	for _, r := range snap.Regimes {
		if r.Kind == detector.TailInflation && r.Device == dev && r.File.IsZero() {
			tail = true
		}
	}
	ds, ok := t.dstats[dev]
	if !tail || !ok || ds.CapacityBPS <= 0 || ds.P99 <= 0 {
		return 0
	}
	// A device already near its capacity has no bandwidth for the stalled
	// readers to take back, and its p99 is its queue: steps one at a time,
	// each judged.
	if ds.BusyThroughput >= t.cfg.CapacityFrac*ds.CapacityBPS {
		return 0
	}
	return int(ds.P99.Seconds() * ds.CapacityBPS / 1024)
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
	if fd.outOfScope && t.deps.Clock.Now()-fd.scopeAt < t.cfg.BackoffMax {
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
	if t.randomReaderBeside(fd) {
		// Each window of transfers queued for the stream is waiting time
		// for the random reader's faults: grow one step at a time, each
		// paying its margin, rather than straight to the window that
		// fills the device.
		fd.win.hint = 0
	}
	// A decision no regime started skips this at its first step: a device
	// slow from the start learned its slow rate as its capacity, and only
	// the trial tells.
	if capBPS := t.dstats[fd.dev.dev].CapacityBPS; escalate && m.ok && capBPS > 0 && m.tput >= t.cfg.CapacityFrac*capBPS &&
		!(fd.byRate && fd.win.cur == fd.win.base) {
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
	if escalate && fd.byRate && fd.win.cur == fd.win.base && fd.win.trial == 0 && !t.outcomeDue(fd.dev) {
		escalate = false // the device's outcome trials are backing off
	}
	applyWin := func(kb int) error { return t.pinFile(fd, kb, nil, true) }
	if fd.pf.trial == 0 {
		hadTrial := fd.win.trial != 0
		did := t.drive(&fd.win, fd.dev, fd.key, fd.path, m, why, escalate, applyWin)
		t.remember(fd, hadTrial)
		if did || fd.win.trial != 0 {
			return
		}
	}
	// Prefetch when the window alone is not enough.
	if fd.win.exhausted(t.cfg.MaxKB) && !t.cfg.DisablePrefetch && (escalate || fd.pf.trial != 0) {
		if fs, ok := t.fstats[fd.key]; ok && fs.Sequentiality >= t.cfg.MinSequentiality || fd.pf.trial != 0 {
			t.drive(&fd.pf, fd.dev, fd.key, fd.path, m, why+", window at its knee or maximum", escalate, func(kb int) error {
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
			if fs.Device != d.dev || t.files[k] != nil || fs.Sequentiality < t.cfg.MinSequentiality || t.snap.Now-fs.LastSeen > t.cfg.Settle {
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
		if t.files[k] != nil {
			delete(d.reached, k) // a decision of its own took over
			continue
		}
		fd := &fileDec{key: k, dev: d}
		refs := t.refs(fd, nil)
		n, err := t.pin(d, d.cur, refs, false)
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

// drive advances one knob's closed loop: it judges a step under trial and,
// if escalate, takes the next one. It reports whether it did anything.
func (t *Tuner) drive(l *ladder, d *devState, file probe.FileKey, path string, m measure, why string, escalate bool, apply func(int) error) bool {
	now := t.deps.Clock.Now()
	max := t.cfg.MaxKB
	if l.kind == KindPrefetch {
		max = t.cfg.PrefetchMaxKB
	}
	act := func(kind ActionKind, from, to int, res Result, ev string) {
		t.emit(Action{Time: now, Device: d.name, Dev: d.dev, File: file, Path: path, Kind: kind, FromKB: from, ToKB: to, Result: res, Evidence: ev})
	}
	did := false
	if l.trial != 0 {
		// Steps are taken on interval ticks: the tick one Settle after the
		// step may read the clock a little early, and must still judge it
		// (otherwise every step would take two intervals).
		if now-l.trialAt < t.cfg.Settle-t.cfg.Settle/10 {
			return false
		}
		if !m.ok && now-l.trialAt < 4*t.cfg.Settle {
			return false // no reads yet to judge by
		}
		gain := 0.0
		if m.ok && l.before.tput > 0 {
			gain = m.tput/l.before.tput - 1
		}
		margin := t.cfg.Margin
		if l.kind == KindDeviceWindow {
			margin = t.cfg.DeviceMargin
		}
		ev := fmt.Sprintf("%s; before %s, after %s (%+.0f%%, keep margin %+.0f%%)", why, l.before, m, gain*100, margin*100)
		if !m.ok || gain < margin {
			return t.undoStep(l, now, ev, apply, act)
		}
		// The device's other readers must not pay for the gain: its total
		// must not fall (a larger window that only queues ahead of others
		// wins a stream nothing the device did not lose elsewhere).
		if l.kind == KindFileWindow && l.before.dev > 0 && m.dev > 0 && m.dev < (1-devLossMax)*l.before.dev {
			return t.undoStep(l, now, ev+fmt.Sprintf("; the device's total fell %.1f -> %.1f MB/s: its other readers lost more", l.before.dev/1e6, m.dev/1e6), apply, act)
		}
		act(l.kind, l.trialFrom, l.trial, ResultKept, ev)
		l.cur, l.trial, l.failures, l.keptAt, l.keptM = l.trial, 0, 0, now, m
		// The next step follows at once, measured against this one: a
		// slowed reader regains its throughput one interval per step,
		// not two.
		did = true
	}
	if !escalate || now < l.retryAt {
		return did
	}
	l.knee = false
	next, ok := l.next(t.cfg.Growth, max)
	if !ok || !m.ok {
		return did
	}
	ev := fmt.Sprintf("%s; now %s", why, m)
	if t.cfg.DryRun {
		if l.dryAt != next {
			l.dryAt = next
			act(l.kind, l.cur, next, ResultDryRun, ev)
		}
		return false
	}
	if err := apply(next); err != nil {
		if errors.Is(err, errRateLimited) || errors.Is(err, errNoReaders) || errors.Is(err, errOutOfScope) {
			return did // deferred, or not ours to act on: no action
		}
		l.failures++
		l.retryAt = now + t.backoff(l.failures)
		act(l.kind, l.cur, next, ResultFailed, fmt.Sprintf("%s; %v; retry in %v", ev, err, t.backoff(l.failures)))
		return true
	}
	l.trial, l.trialFrom, l.trialAt, l.before = next, l.cur, now, m
	if l.cur == l.base {
		l.baseM = m
	}
	act(l.kind, l.cur, next, ResultTrial, ev)
	return true
}

// undoStep takes back a step that did not pay: back-off if it was the
// first, the knee if an earlier step had paid.
func (t *Tuner) undoStep(l *ladder, now time.Duration, ev string, apply func(int) error, act func(ActionKind, int, int, Result, string)) bool {
	from := l.trial
	l.trial = 0
	if err := apply(l.cur); err != nil && !errors.Is(err, errNoReaders) {
		// The step stays in force until an undo succeeds.
		l.trial = from
		act(undoOf(l.kind), from, l.cur, ResultFailed, ev+"; undo failed: "+err.Error())
		return true
	}
	if l.cur == l.base {
		l.failures++
		l.retryAt = now + t.backoff(l.failures)
		ev += fmt.Sprintf("; backing off %v", t.backoff(l.failures))
	} else {
		// A knee found by one noisy interval would hold the window short
		// for BackoffMax: confirm it once, BackoffBase later.
		l.knee = true
		l.failures++
		wait := t.cfg.BackoffMax
		if l.failures == 1 {
			wait = t.cfg.BackoffBase
		}
		l.retryAt = now + wait
		ev += fmt.Sprintf("; knee at %d KB, probing further in %v", l.cur, wait)
	}
	act(undoOf(l.kind), from, l.cur, ResultUndone, ev)
	return true
}

// devLossMax: a file window step whose device total falls by more than this
// share is not kept.
const devLossMax = 0.05

func (t *Tuner) backoff(failures int) time.Duration {
	b := t.cfg.BackoffBase
	for i := 1; i < failures && b < t.cfg.BackoffMax; i++ {
		b *= 2
	}
	if b > t.cfg.BackoffMax {
		b = t.cfg.BackoffMax
	}
	return b
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

// prefetchAll issues WILLNEED ahead of each prefetched reader, within each
// device's byte budget.
func (t *Tuner) prefetchAll() {
	if t.cfg.DryRun {
		return
	}
	now := t.deps.Clock.Now()
	for _, fd := range t.files {
		depth := fd.pf.inForce()
		if depth == 0 {
			continue
		}
		fs, ok := t.fstats[fd.key]
		if !ok {
			continue
		}
		d := fd.dev
		d.pfBytes += (now - d.pfAt).Seconds() * t.cfg.PrefetchBytesPerSec
		d.pfAt = now
		if d.pfBytes > t.cfg.PrefetchBytesPerSec {
			d.pfBytes = t.cfg.PrefetchBytesPerSec
		}
		start := fs.NextOffset
		if fd.pfEnd > start && fd.pfEnd < start+uint64(depth)*1024 {
			start = fd.pfEnd
		}
		end := fs.NextOffset + uint64(depth)*1024
		if end <= start {
			continue
		}
		n := end - start
		if float64(n) > d.pfBytes {
			n = uint64(d.pfBytes)
		}
		if n < 4096 {
			continue
		}
		refs := t.refs(fd, nil)
		if len(refs) == 0 {
			continue
		}
		h, err := t.deps.Files.Dup(refs[0])
		if err != nil {
			t.fileFail++
			t.log.Debug("tuner: prefetch: cannot take a descriptor", "file", fd.key.String(), "err", err)
			continue
		}
		err = h.Fadvise(int64(start), int64(n), AdviceWillNeed)
		h.Close()
		if err != nil {
			t.fileFail++
			t.log.Warn("tuner: prefetch failed", "file", fd.key.String(), "path", fd.path, "err", err)
			continue
		}
		d.pfBytes -= float64(n)
		fd.pfEnd = start + n
	}
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
		if len(tg) == 0 {
			return
		}
		err := t.pinFile(fd, w, tg, true)
		if errors.Is(err, errRateLimited) {
			return
		}
		res, ev := ResultApplied, fmt.Sprintf("new reader(s) of a file with a %d KB decision", w)
		if err != nil {
			res, ev = ResultFailed, ev+": "+err.Error()
			for tgid := range tg {
				t.readers[fd.key][tgid].pending = false // try again on its next event
			}
		}
		t.emit(Action{Time: now, Device: fd.dev.name, Dev: fd.dev.dev, File: fd.key, Path: fd.path, Kind: KindFileWindow, FromKB: fd.win.base, ToKB: w, Result: res, Evidence: ev})
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
			if _, _, err := RestorePins(t.deps.Store, t.deps.Files); err != nil {
				errs = append(errs, fmt.Errorf("reset per-file windows: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}
