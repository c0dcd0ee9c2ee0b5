// Package tuner turns the detector's regimes into readahead actions, least
// invasive first: a slowed file's window (pidfd_getfd + posix_fadvise), then
// prefetch, then a device-wide read_ahead_kb. Each step is kept only if it
// paid, else undone with back-off; all is undone when its regime ends, and
// the devices' original settings are recorded durably before the first write.
package tuner

import (
	"cmp"
	"context"
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

type readerInfo struct {
	lastSeen  time.Duration
	raKB      int // the open file's window as the last event saw it
	appliedKB int // window the tuner last pinned on its descriptors
	appliedAt time.Duration
	pending   bool
	priorAt   time.Duration // when freshOpen last looked at this reader
	firstSeen time.Duration
	// pausedAt, resumedAt: its last pause over endedGap (pauseIn skips it).
	pausedAt, resumedAt time.Duration
	// evGap: its usual (smoothed) time between events: gaps that long are no pause.
	evGap time.Duration
	// lastIndex: the page index of its last event (indexed: there was one);
	// follows: the current event is a stream's next window (followsStream).
	lastIndex        uint64
	indexed, follows bool
}

type devState struct {
	name  string
	dev   probe.Dev
	orig  int // value found before the first write (floor of every window)
	cur   int // value the device should have now
	known bool
	dirty bool // the last write back failed: retry
	// Budgets: sysfs writes (Tuner.take), trims of descriptors opened on
	// trimmed files (opened, trim.go), prefetch bytes (empty when first seen).
	writes, opened, prefetch bucket

	win        ladder // device-wide window
	winActive  bool
	lastNeeded time.Duration
	// reached: open files given the device-wide window (reachOpenFiles)
	reached map[probe.FileKey]bool
	// Back-off of outcome-driven trials on the device (policy.go).
	outcomeFails   int
	outcomeRetryAt time.Duration
	outcomeFailP50 time.Duration // the stream's median latency at the last trial that did not pay
	outcomeFailKB  int           // the window that trial tried
	// outcomeFailTail: that stream had a tail by its verdict (else one since is new).
	outcomeFailTail bool
	// outcomeFailTput: that stream's throughput at the device's window;
	// outcomeSlow: per file, first and last interval it read well below it since.
	outcomeFailTput float64
	outcomeSlow     map[probe.FileKey][2]time.Duration
	// movedAt: when a window on the device last changed (random readers'
	// measures since are no reference); trimAt: when a trim there did;
	// satAt: when a step last taught its saturation point (satSeen: this run).
	movedAt, trimAt, satAt time.Duration
	satSeen                bool
	// randSlope: seconds of delay each byte a stream keeps queued costs
	// the device's random readers, learned from steps (0: not yet).
	randSlope float64
}

func sortedDevs(m map[probe.Dev]*devState) []*devState {
	return slices.SortedFunc(maps.Values(m), func(a, b *devState) int { return cmp.Compare(a.dev, b.dev) })
}

type fileDec struct {
	key probe.FileKey
	// deferUntil: a regime's first step beside random readers waits till then.
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
	// Logged once: a regime's action refused by the allow-paths, the file
	// found not sequential, found at the device's capacity.
	scopeWarned, notSeqLogged, atCapLogged bool
	// byRate: judged by the reader's rate, not busy throughput: no regime says it is slow.
	byRate bool
	// prior: the directory prior this decision started from (decayed if
	// it does not pay); learnedKB: window last taught to the memory.
	prior     *prior.Dir
	learnedKB int
	// climbFrom: the prior's window when this open got the step above it; else 0.
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
	// watchedAt: each device's first Step (its readers are known a Settle later).
	watchedAt map[probe.Dev]time.Duration
	// capFits: each watched device's capacity fitted on its latencies.
	capFits map[probe.Dev]*capFit
	files   map[probe.FileKey]*fileDec
	readers map[probe.FileKey]map[uint32]*readerInfo
	// view: the last Step's (Step writes it; the fast path's files join
	// it, fastOn); a call between Steps judges on its own (judgeCtx).
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
	// lower changes per-file windows; States nil: kernel state unreadable, or dry run.
	lower *actuate.Lowerer
	// Global budget of whole-system descriptor scans (trim.go).
	scans bucket
	// Memory of windows that paid (pkg/tuner/prior, fresh.go) and its file.
	mem        *prior.Memory
	priorsPath string
	// nReaders bounds the readers table (file x process).
	nReaders int
	evOut    []Action // actions taken from the event path, not yet returned
	// fresh: files with no decision whose first reader came in the last Settle, and when.
	fresh map[probe.FileKey]time.Duration
	// onsetAt: when onsetStreams last asked for recent requests (onset.go).
	onsetAt time.Duration
	// onsetMild: streams last found mildly slower between Steps, and when.
	onsetMild map[probe.FileKey]time.Duration
	// verdictAt: when trialStreams last asked for recent requests (verdict.go).
	verdictAt time.Duration
	// trimAskAt: when trimStreams last asked for recent requests (trim.go).
	trimAskAt time.Duration
	// scopeOf: cached scope verdicts of other readers' files (outsideScope).
	scopeOf map[probe.FileKey]scopeVerdict
	// capSeen: when a stream was last seen at its device's capacity.
	capSeen map[probe.FileKey]time.Duration
	// lowering: files whose window a break is setting (the lock is
	// released while it waits: actuator.go); closing: RestoreAll runs,
	// and the event path takes no new action.
	lowering map[probe.FileKey]int
	closing  bool
	left     []actuate.Unconfirmed // files the shutdown's lowerings could not confirm
}

// logOnce logs msg once per device and topic, again only after a gap.
func (t *Tuner) logOnce(dev probe.Dev, topic, msg string, args ...any) {
	k := dev.String() + "/" + topic
	now := t.deps.Clock.Now()
	last, seen := t.logged[k]
	t.logged[k] = now
	if !seen || now-last > 2*t.cfg.Grace {
		t.log.Info(msg, args...)
	}
}

// device returns the state of disk dev, nil if the tuner may not act on it.
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

func (t *Tuner) emit(a Action) {
	t.out = append(t.out, a)
	// A kept decision re-applied to a new descriptor (HDFS opens a block file
	// per read) is counted, not listed: it would push decisions out of recent.
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

// count adds one to the event's counter.
func (t *Tuner) count(e Event) { t.events[e]++ }

// emitFailed emits a failed per-file action the first time its cause is
// seen for that file and kind; repeats are only counted.
func (t *Tuner) emitFailed(a Action, err error) {
	if t.fails.failed(a.File, a.Kind, failCause(err), t.deps.Clock.Now(), t.backoff) {
		a.Evidence += "; repeats of this failure are counted in readaheadd_repeated_failures_total, not logged"
		t.emit(a)
	}
}

func (t *Tuner) backoff(failures int) time.Duration {
	b := t.cfg.BackoffBase
	for i := 1; i < failures && b < t.cfg.BackoffMax; i++ {
		b *= 2
	}
	return min(b, t.cfg.BackoffMax)
}

// view is what steps are judged on: a detector snapshot, its files and
// devices by key, and its stats' span (0: a Step's Settle; else a recent one).
type view struct {
	snap   detector.Snapshot
	fstats map[probe.FileKey]detector.FileStats
	dstats map[probe.Dev]detector.DeviceStats
	span   time.Duration
}

// newView indexes snap, over span. A device's peak rate missing from snap is
// carry's (the last Step's): the capacity's last resort (capacity.go).
func newView(snap detector.Snapshot, span time.Duration, carry map[probe.Dev]detector.DeviceStats) *view {
	v := &view{snap: snap, span: span, fstats: make(map[probe.FileKey]detector.FileStats, len(snap.Files)),
		dstats: make(map[probe.Dev]detector.DeviceStats, len(snap.Devices))}
	for _, f := range snap.Files {
		v.fstats[f.Key] = f
	}
	for _, d := range snap.Devices {
		if old, ok := carry[d.Device]; ok && d.CapacityBPS <= 0 {
			d.CapacityBPS = old.CapacityBPS
		}
		v.dstats[d.Device] = d
	}
	return v
}

// scopeVerdict caches whether a file without a decision is read only
// through descriptors outside the allow-paths (protectedStream).
type scopeVerdict struct {
	outside bool
	at      time.Duration
}

// randService is what a random reader gets over one measure.
type randService struct {
	mean, tail time.Duration // mean and p99 latency
	size       float64       // bytes per request
	requests   uint64
}

// randRef is a random reader's reference service.
type randRef struct {
	dev  probe.Dev
	svc  randService
	seen time.Duration
	// clean: learned with nothing of readaheadd's in force on the device (else
	// referred to what it got beside the raised window, until clean again).
	clean bool
	// tailSure: its p99 is a measure the reader's p99 can be held to
	// within 10% of: clean, and over enough requests (refTailMinRequests).
	tailSure bool
	// reopens: its trim had to reach descriptors opened after it. Each open's
	// first faults read around untrimmed, behind the stream's queue: its p99.
	reopens bool
}

// tailSeen is the last tail seen in a file's requests.
type tailSeen struct {
	at       time.Duration
	p50, p99 time.Duration
	span     uint64 // the noteTails call that saw it (tailNow)
	// seen: spans that showed it since it was last stale: a healthy stream's
	// p99 strays past tailStrong now and then, a stall recurs.
	seen int
}

type trimDec struct {
	key      probe.FileKey
	dev      *devState
	path     string
	refs     []actuate.FileRef
	kb       int           // window pinned on refs
	from     int           // the window they had (the device's at the time)
	trialAt  time.Duration // set while the trim is under trial
	beforeP  time.Duration // the file's median latency before
	lastNeed time.Duration
	dry      bool
	// watched: the probe reports read-arounds of descriptors opened on the
	// file since (trim.go); opened: what the event path did per process.
	watched bool
	opened  map[uint32]openedMark
}

type trimOff struct {
	until    time.Duration
	failures int
}

// bucket is a token bucket, full at its first use.
type bucket struct {
	tokens float64
	at     time.Duration
	used   bool
}

// takeN takes n tokens, refilled at rate per second up to burst, or none
// when fewer are left.
func (b *bucket) takeN(now time.Duration, n, rate, burst float64) bool {
	if b.fill(now, rate, burst) < n {
		return false
	}
	b.tokens -= n
	return true
}

// fill refills at rate per second up to burst and returns the tokens held.
func (b *bucket) fill(now time.Duration, rate, burst float64) float64 {
	if !b.used {
		b.tokens, b.used = burst, true
	} else {
		b.tokens = min(burst, b.tokens+(now-b.at).Seconds()*rate)
	}
	b.at = now
	return b.tokens
}

// judgeMode is how a step under trial is judged.
type judgeMode int

const (
	judgeStep  judgeMode = iota // at its Settle (a Step; a step taken between Steps)
	judgeEarly                  // before it, kept only if it clearly pays (fastVerdict)
	judgeEnded                  // at once, on the span since it: its stream stopped (endedVerdict)
)

// judgeCtx is what one call measures and judges by: a view (shadowing the
// Tuner's), the mode, and justIn (the fast path entered the regime a moment
// ago). A verdict is a function of these, whichever entry point called.
type judgeCtx struct {
	*Tuner
	*view
	mode   judgeMode
	justIn bool
}

// on is the context of a call on snap (over span, a check between Steps).
func (t *Tuner) on(snap detector.Snapshot, span time.Duration, mode judgeMode) judgeCtx {
	return judgeCtx{Tuner: t, view: newView(snap, span, t.dstats), mode: mode}
}

// atStep is the context of a call on the last Step's view.
func (t *Tuner) atStep() judgeCtx { return judgeCtx{Tuner: t, view: &t.view} }

// viewSpan is the span the view's stats cover.
func (t judgeCtx) viewSpan() time.Duration { return cmp.Or(t.span, t.cfg.Settle) }

const (
	// freshSpanDiv: the recent requests judged are the last Settle / 4.
	freshSpanDiv = 4
	// onsetEvery: Settle / onsetEvery between two checks of a kind between Steps.
	onsetEvery = 4
)

// helping reports whether the tuner has a window raised on the device:
// its own (device-wide) or an open file's (in dry-run mode: would have).
func (t *Tuner) helping(d *devState) bool {
	if d.raisedWide() {
		return true
	}
	for _, fd := range t.files {
		// A kept window in a re-probe still counts: it is back unless
		// the regime ended, and its trims with it.
		if fd.dev == d && (fd.win.raised() || fd.win.cur > fd.win.base) {
			return true
		}
	}
	return false
}

// raisedWide reports whether the device's own window is raised (dry run: would be).
func (d *devState) raisedWide() bool {
	return d.cur != d.orig || d.winActive && d.win.dryAt > d.orig
}

// trimmedOn reports whether a read-around trim is in force on d.
func (t *Tuner) trimmedOn(d *devState) bool {
	for _, td := range t.trims {
		if td.dev == d {
			return true
		}
	}
	return false
}
