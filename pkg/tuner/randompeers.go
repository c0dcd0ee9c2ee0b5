package tuner

// The random readers beside a stream and their reference service.

import (
	"maps"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// randomReaderBeside: another file on fd's device is read randomly now
// (or trimmed).
func (t judgeCtx) randomReaderBeside(fd *fileDec) bool {
	return t.trimmedOn(fd.dev) || t.randomBesideDev(fd.dev.dev, fd.key)
}

// randomOnDevice returns a file read randomly now on the device whose reads
// are read-around sized (an mmap reader: each fault reads the window around
// it, so a larger device window makes every fault larger), or one trimmed
// there, if any. A buffered random reader reads what it asks for whatever
// the window, and does not hold the device's window down.
func (t judgeCtx) randomOnDevice(dev probe.Dev) (probe.FileKey, bool) {
	for k, td := range t.trims {
		if td.dev != nil && td.dev.dev == dev {
			return k, true
		}
	}
	kb := t.origOf(dev)
	for k, fs := range t.fstats {
		if fs.Device == dev && t.readRandomly(fs) && readAroundSized(fs, kb, min(kb, t.cfg.TrimKB)) {
			return k, true
		}
	}
	return probe.FileKey{}, false
}

// randomsBeside: the random readers on dev but except, with their service now.
func (t judgeCtx) randomsBeside(dev probe.Dev, except probe.FileKey) []randObs {
	var out []randObs
	for k, fs := range t.fstats {
		if k == except || fs.Device != dev || !t.readRandomly(fs) {
			continue
		}
		svc, ok := serviceOf(fs)
		ref := t.randRefs[k]
		if td := t.trims[k]; ok && td != nil && ref != nil && ref.reopens && td.beforeP > fs.P50 {
			svc.tail += td.beforeP - fs.P50 // its untrimmed faults' (randRef.reopens)
		}
		out = append(out, randObs{key: k, fs: fs, svc: svc, ok: ok, ref: ref})
	}
	slices.SortFunc(out, func(a, b randObs) int { return compareKeys(a.key, b.key) })
	return out
}

type randObs struct {
	key probe.FileKey
	fs  detector.FileStats
	svc randService
	ok  bool
	ref *randRef
}

// randomBesideDev: a file other than except is read randomly on dev now.
func (t judgeCtx) randomBesideDev(dev probe.Dev, except probe.FileKey) bool {
	_, known := t.knownRandomOn(dev, except)
	return known || len(t.randomsBeside(dev, except)) > 0
}

// knownRandomOn returns a file other than except on dev whose random reader
// had a reference within the last Settle, if any: a view of a fresh stream's
// recent requests may hold too few of its reads to show it.
func (t judgeCtx) knownRandomOn(dev probe.Dev, except probe.FileKey) (probe.FileKey, bool) {
	for k, r := range t.randRefs {
		if k != except && r.dev == dev && t.snap.Now-r.seen <= t.cfg.Settle {
			return k, true
		}
	}
	return probe.FileKey{}, false
}

const (
	// trimMaxSequentiality: only files read this randomly are trimmed.
	trimMaxSequentiality = 0.2
	// trimMinRequests: the file's window must hold this many requests.
	trimMinRequests = 16
	// trimSizeFactor: its requests must average at least this multiple of
	// TrimKB, and readAroundShare of the device's window (read around each
	// fault with it, not reads the reader asked for, as a 64 KB pread's).
	trimSizeFactor  = 4
	readAroundShare = 0.75
)

// readRandomly: a file read now, randomly, with enough requests to tell.
func (t judgeCtx) readRandomly(fs detector.FileStats) bool {
	return t.snap.Now-fs.LastSeen <= t.cfg.Settle && fs.Sequentiality <= trimMaxSequentiality && fs.Requests >= trimMinRequests
}

// origOf is dev's window before readaheadd wrote it (0: not known).
func (t *Tuner) origOf(dev probe.Dev) int {
	if d := t.devs[dev]; d != nil {
		return d.orig
	}
	return 0
}

// readAroundSized reports whether a file's requests are the size the device's
// window (windowKB) reads around each fault, worth a trim to trimKB.
func readAroundSized(fs detector.FileStats, windowKB, trimKB int) bool {
	return fs.MeanSize >= 1024*max(float64(trimSizeFactor*trimKB), readAroundShare*float64(windowKB))
}

// trimMayCome: fs (k) reads around with the device's window, and a trim
// could reach it (none in force or backed off, trims enabled).
func (t *Tuner) trimMayCome(k probe.FileKey, fs detector.FileStats) bool {
	return !t.cfg.DisableTrim && t.trims[k] == nil && t.trimOffs[k] == nil && readAroundSized(fs, t.origOf(fs.Device), t.cfg.TrimKB)
}

// minBoundRequests: fewer requests in a window say too little.
const minBoundRequests = 8

// serviceOf is a random reader's service in fs; ok with enough requests.
func serviceOf(fs detector.FileStats) (randService, bool) {
	if fs.Requests < trimMinRequests || fs.BusyThroughput <= 0 || fs.MeanSize <= 0 || fs.Inflight <= 0 || fs.P95 <= 0 || fs.P99 <= 0 {
		return randService{}, false
	}
	// Little's law: mean latency = in flight x request size / busy rate.
	mean := time.Duration(fs.Inflight * fs.MeanSize / fs.BusyThroughput * float64(time.Second))
	return randService{mean: mean, tail: fs.P99, size: fs.MeanSize, requests: fs.Requests}, true
}

// A random reader's reference: its service at the device's default window.

// untouched: nothing readaheadd does is in force on d, and nothing changed
// there for a Settle (no request of the last measure predates a change).
func (t *Tuner) untouched(d *devState) bool {
	return d == nil || !t.helping(d) && (d.movedAt == 0 || t.deps.Clock.Now()-d.movedAt >= t.cfg.Settle) && !t.trimmedOn(d)
}

// observeRandom learns the Step's random readers' references (t.mu held).
func (t judgeCtx) observeRandom(now time.Duration) {
	for _, fs := range t.snap.Files {
		if !t.readRandomly(fs) {
			continue
		}
		svc, ok := serviceOf(fs)
		if !ok {
			continue
		}
		clean := t.untouched(t.devs[fs.Device])
		ref := t.randRefs[fs.Key]
		switch {
		case ref == nil:
			t.addRandRef(fs, svc, clean, now, "tuner: random reader's reference")
			continue
		case clean && (!ref.clean || !ref.tailSure):
			ref.svc, ref.clean, ref.tailSure = svc, true, true
			t.log.Debug("tuner: random reader's reference", "file", fs.Key.String(), "clean", true,
				"mean", svc.mean, "p99", svc.tail, "request_kb", int(svc.size/1024))
		case clean:
			ref.svc.mean = ewmaDur(ref.svc.mean, svc.mean, randRefAlpha)
			ref.svc.tail = ewmaDur(ref.svc.tail, svc.tail, randTailAlpha)
			ref.svc.size = (1-randRefAlpha)*ref.svc.size + randRefAlpha*svc.size
		}
		ref.seen = now
	}
	maps.DeleteFunc(t.randRefs, func(_ probe.FileKey, ref *randRef) bool { return now-ref.seen >= t.cfg.BackoffMax })
}

// untouchedEstimate is what a random reader first seen beside raised
// windows would get without them: each KB queued beyond the device's window
// costs randSlack KB transfers at capacity, less its trim's saving (mean only).
func (t judgeCtx) untouchedEstimate(fs detector.FileStats, svc randService) randService {
	d := t.devs[fs.Device]
	capBPS := t.capacityOrBusy(fs.Device)
	if d == nil || capBPS <= 0 {
		return svc
	}
	held, _ := t.raisedBytes(d, fs.Key)
	less := time.Duration((held - t.trimSaving(fs.Key, svc.size)) * randSlack / capBPS * float64(time.Second))
	svc.mean = max(svc.mean-less, svc.mean/4)
	// The p99 is left as measured: the account does not predict the
	// spread of the wait behind the queue (verdicts use tailAtDefault).
	return svc
}

// raisedBytes: the bytes d's raised file windows (but except's) keep queued
// beyond the device's window, each weighted by its share of the random
// readers' measure (held), and what the steps under trial add that the
// measure does not hold yet (pending: the share of its span since each began).
func (t judgeCtx) raisedBytes(d *devState, except probe.FileKey) (held, pending float64) {
	span, now := t.viewSpan(), t.deps.Clock.Now()
	for _, fd := range t.files {
		if l := &fd.win; fd.dev == d && fd.key != except {
			if moved := now - l.movedAt; l.inForce() > l.base {
				held += min(1, max(0, float64(moved)/float64(span))) * float64(l.inForce()-l.base) * 1024
			}
			if l.trial.to > l.trial.from {
				pending += max(0, 1-float64(now-l.trial.at)/float64(span)) * float64(l.trial.to-l.trial.from) * 1024
			}
		}
	}
	return held, pending
}

// trimSaving is the transfer a random reader's trim spares each of its
// requests (mean size bytes): the read-around it no longer reads.
func (t *Tuner) trimSaving(key probe.FileKey, size float64) float64 {
	if td := t.trims[key]; td != nil && td.from > td.kb {
		return max(0, float64(td.from)*1024-size)
	}
	return 0
}

// tailAtDefault is a random reader's p99 at the device's window by the
// account of what readaheadd does beside it: its p99 now, less each queued
// KB's cost (tailPerByte), plus the transfer its trim spares it; used only
// for an unsure reference until steps show a KB's cost. Not ok below
// refreshTailRequests requests or with a device-wide window raised.
func (t judgeCtx) tailAtDefault(r randObs) (time.Duration, bool) {
	d := t.devs[r.fs.Device]
	capBPS := t.capacityOrBusy(r.fs.Device)
	if !r.ok || r.ref == nil || r.svc.requests < refreshTailRequests || d == nil || d.raisedWide() || capBPS <= 0 ||
		d.randSlope <= 0 && r.ref.tailSure {
		return 0, false
	}
	held, _ := t.raisedBytes(d, r.key)
	more := held * tailPerByte(d, capBPS)
	if !r.ref.reopens {
		more -= t.trimSaving(r.key, r.svc.size) / capBPS
	}
	return r.svc.tail - time.Duration(more*float64(time.Second)), true
}

// tailPerByte is a queued byte's cost to a random reader's p99 on d in
// seconds: its transfer at capacity, or twice its cost to the mean where
// steps showed less.
func tailPerByte(d *devState, capBPS float64) float64 {
	if d.randSlope > 0 {
		return min(1/capBPS, 2*d.randSlope)
	}
	return 1 / capBPS
}

// tailRef is the p99 a random reader is held to: its reference, or the
// account's (tailAtDefault) where lower or the reference's is not sure,
// floored at tailEstFloor of the reference (of its p99 now if not sure),
// since the account errs low on many-channel devices or under a trim. It
// reports whether the p99 is sure, and whether it is the account's.
func (t judgeCtx) tailRef(r randObs) (tail time.Duration, sure, estimated bool) {
	tail, sure = r.ref.svc.tail, r.ref.tailSure
	if est, ok := t.tailAtDefault(r); ok {
		floor := tail
		if !sure {
			floor = r.svc.tail
		}
		est = max(est, time.Duration(tailEstFloor*float64(floor)))
		if est < tail || !sure {
			// An unsure p99 reference is replaced by the account either way.
			return est, true, true
		}
	}
	return tail, sure, false
}

// referAtTrim gives a random reader about to be trimmed a reference if none:
// trimmed between Steps (fastTrim), no Step measures it untrimmed.
func (t judgeCtx) referAtTrim(fs detector.FileStats) {
	if t.randRefs[fs.Key] != nil {
		return
	}
	if svc, ok := serviceOf(fs); ok {
		t.addRandRef(fs, svc, t.untouched(t.devs[fs.Device]), t.deps.Clock.Now(), "tuner: random reader's reference, before its trim")
	}
}

// addRandRef gives a random reader one reference from svc: as measured
// when clean (nothing readaheadd does in force), else untouchedEstimate.
func (t judgeCtx) addRandRef(fs detector.FileStats, svc randService, clean bool, now time.Duration, msg string) {
	if len(t.randRefs) >= maxRandRefs {
		return
	}
	tailSure := clean
	if !clean && t.raisedJustNow(fs.Device, fs.Key) {
		// Its requests came before the windows in force: a measure at the
		// device's window, its p99 too given refTailMinRequests of them.
		clean, tailSure = true, svc.requests >= refTailMinRequests
	}
	if !clean {
		svc = t.untouchedEstimate(fs, svc)
	}
	t.randRefs[fs.Key] = &randRef{dev: fs.Device, svc: svc, seen: now, clean: clean, tailSure: tailSure}
	t.log.Debug(msg, "file", fs.Key.String(), "clean", clean, "p99_sure", tailSure, "mean", svc.mean, "p99", svc.tail,
		"requests", svc.requests, "request_kb", int(svc.size/1024))
}

// raisedJustNow reports whether only file windows raised in the last
// justNowShare of except's measure are in force on dev (a prior for a
// fresh open), no device-wide window, trim or lowering: the measure is then
// the device's window's, not an estimate.
func (t judgeCtx) raisedJustNow(dev probe.Dev, except probe.FileKey) bool {
	d := t.devs[dev]
	if d == nil || d.raisedWide() || t.trimmedOn(d) {
		return false
	}
	span, now := t.viewSpan(), t.deps.Clock.Now()
	recent := func(at time.Duration) bool { return at != 0 && now-at < time.Duration(justNowShare*float64(span)) }
	within := func(at time.Duration) bool { return at != 0 && now-at < span }
	if within(d.movedAt) && !recent(d.movedAt) {
		return false
	}
	raised := false
	for _, fd := range t.files {
		if fd.dev != d || fd.key == except {
			continue
		}
		switch up := fd.win.raised(); {
		case up && !recent(fd.win.movedAt):
			return false
		case up:
			raised = true
		case within(fd.win.movedAt):
			return false // lowered within the measure: raised before it
		}
	}
	return raised
}

func ewmaDur(old, x time.Duration, alpha float64) time.Duration {
	return time.Duration((1-alpha)*float64(old) + alpha*float64(x))
}

// refreshRandom sets dev's random readers' references to their recent
// requests before a first step between Steps, if nothing is in force there.
func (t judgeCtx) refreshRandom(d *devState) {
	if !t.untouched(d) {
		return
	}
	for _, r := range t.randomsBeside(d.dev, probe.FileKey{}) {
		if !r.ok || r.ref == nil {
			continue
		}
		r.ref.svc.mean = r.svc.mean
		r.ref.svc.tail = ewmaDur(r.ref.svc.tail, r.svc.tail, refreshTailWeight(r.svc.requests))
		// Sure over refTailMinRequests only: a quarter interval's p99 is one
		// draw of a bimodal figure; the account stands for it (tailRef).
		r.ref.clean, r.ref.tailSure = true, r.svc.requests >= refTailMinRequests
		t.log.Debug("tuner: random reader's reference in the conditions of the moment", "file", r.key.String(),
			"mean", r.ref.svc.mean, "p99", r.ref.svc.tail, "p99_now", r.svc.tail, "requests", r.svc.requests)
	}
}

// refreshTailWeight: the weight of n recent requests' p99 against the old
// reference (other conditions): all from refreshTailRequests on, a share below.
func refreshTailWeight(n uint64) float64 {
	return min(1, float64(n)/refreshTailRequests)
}

const (
	// randTailAlpha: weight of the latest interval in a smoothed p99
	// (a reference's, and a kept window's watch).
	randTailAlpha = 0.2
	// randSlack: until a step beside random readers shows it, each KB the
	// stream queues delays them this many KB transfers at the device's
	// capacity (one channel measured 1.0-1.15 near saturation).
	randSlack = 1.25
	// randRefAlpha: weight of the latest clean interval in a reference: high,
	// since the reference is what the reader gets in the conditions of the moment.
	randRefAlpha = 0.6
	// justNowShare: windows raised within this last share of a measure
	// delayed too few requests for it to be an estimate (raisedJustNow).
	justNowShare = 0.1
	// refTailMinRequests: a reference's p99 is sure over this many
	// requests at least (its second largest or further in).
	refTailMinRequests = 200
	// refreshTailRequests: the recent requests whose p99 replaces a random
	// reader's p99 reference outright at a refresh (refreshTailWeight).
	refreshTailRequests = 100
	// tailEstFloor: the account's floor (tailRef), a share of the reference's p99
	// (of the p99 now when the reference's is not sure).
	tailEstFloor = 0.75
	// maxRandRefs bounds the references kept.
	maxRandRefs = 4096
)
