package tuner

// The random readers beside a stream: who they are, whether the stream is
// slower than them, and their reference service.

import (
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// randomReaderBeside reports whether another file on fd's device is read
// randomly now (or its read-around is trimmed).
func (t judgeCtx) randomReaderBeside(fd *fileDec) bool {
	return t.trimmedOn(fd.dev) || t.randomBesideDev(fd.dev.dev, fd.key)
}

// randomOnDevice returns a file read randomly now on the device, or one
// trimmed there, if any. A device-wide window is held to no reader's
// budget: every byte a stream keeps queued delays the random reads behind
// it, whether they fault read-around windows or ask for 4 KB (on the lab a
// device window raised beside DataNode preads left their p99 3.8x the
// default's), so beside any random reader the streams get windows of their
// own, which are (randomLimitKB).
func (t judgeCtx) randomOnDevice(dev probe.Dev) (probe.FileKey, bool) {
	for k, td := range t.trims {
		if td.dev != nil && td.dev.dev == dev {
			return k, true
		}
	}
	for k, fs := range t.fstats {
		if fs.Device == dev && t.readRandomly(fs) {
			return k, true
		}
	}
	return probe.FileKey{}, false
}

// randomsBeside returns the random readers on dev in the tuner's view,
// other than except, with their service now.
func (t judgeCtx) randomsBeside(dev probe.Dev, except probe.FileKey) []randObs {
	var out []randObs
	for k, fs := range t.fstats {
		if k == except || fs.Device != dev || !t.readRandomly(fs) {
			continue
		}
		svc, ok := serviceOf(fs)
		out = append(out, randObs{key: k, fs: fs, svc: svc, ok: ok, ref: t.randRefs[k]})
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

// randomBesideDev reports whether a file other than except is read
// randomly on dev in the tuner's view.
func (t judgeCtx) randomBesideDev(dev probe.Dev, except probe.FileKey) bool {
	for k, fs := range t.fstats {
		if k != except && fs.Device == dev && t.readRandomly(fs) {
			return true
		}
	}
	return false
}

const (
	// trimMaxSequentiality: only files read this randomly are trimmed.
	trimMaxSequentiality = 0.2
	// trimMinRequests: the file's window must hold this many requests.
	trimMinRequests = 16
	// trimSizeFactor: its requests must average at least this multiple
	// of TrimKB (read-around sized, not reads the reader asked for).
	trimSizeFactor = 4
)

// readRandomly reports whether a file is read now, and randomly, with
// enough requests in the window to tell.
func (t judgeCtx) readRandomly(fs detector.FileStats) bool {
	return t.snap.Now-fs.LastSeen <= t.cfg.Settle && fs.Sequentiality <= trimMaxSequentiality && fs.Requests >= trimMinRequests
}

// readAroundSized reports whether a file's requests are the size a window
// of trimSizeFactor x kb reads around each fault, not what a reader asks.
func readAroundSized(fs detector.FileStats, kb int) bool {
	return fs.MeanSize >= float64(trimSizeFactor*kb*1024)
}

const (
	// minBoundRequests: fewer requests in a window say too little.
	minBoundRequests = 8
)

// serviceOf is a random reader's service in fs, ok if it has enough
// requests to say.
func serviceOf(fs detector.FileStats) (randService, bool) {
	if fs.Requests < trimMinRequests || fs.BusyThroughput <= 0 || fs.MeanSize <= 0 || fs.Inflight <= 0 || fs.P95 <= 0 || fs.P99 <= 0 {
		return randService{}, false
	}
	// Little's law: the mean latency is the requests in flight while busy
	// times the bytes per request over the busy throughput.
	mean := time.Duration(fs.Inflight * fs.MeanSize / fs.BusyThroughput * float64(time.Second))
	return randService{mean: mean, tail: fs.P99, size: fs.MeanSize, requests: fs.Requests}, true
}

// A random reader's reference service: what it gets at the device's
// default window, learned while nothing readaheadd does is in force there.

// untouched reports whether nothing readaheadd does is in force on the
// device, and nothing changed there for a Settle (the last measure holds
// no request from before a change).
func (t *Tuner) untouched(d *devState) bool {
	if d == nil {
		return true
	}
	return !t.helping(d) && (d.movedAt == 0 || t.deps.Clock.Now()-d.movedAt >= t.cfg.Settle) && !t.trimmedOn(d)
}

// observeRandom learns the references of the random readers in the Step's
// snapshot (t.mu held).
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
	for k, ref := range t.randRefs {
		if now-ref.seen >= t.cfg.BackoffMax {
			delete(t.randRefs, k)
		}
	}
}

// untouchedEstimate is what a random reader first seen beside windows
// readaheadd raised (a prior given to a fresh open before the first
// interval, say) would get without them, by the same account steps are
// sized by: each KB the raised windows keep queued beyond the device's
// delays its requests by randSlack KB transfers at the device's capacity;
// a trim it already has saves it the transfer of the part of its
// read-around it no longer reads. That account is of its mean.
func (t judgeCtx) untouchedEstimate(fs detector.FileStats, svc randService) randService {
	d := t.devs[fs.Device]
	capBPS := t.capacityOrBusy(fs.Device)
	if d == nil || capBPS <= 0 {
		return svc
	}
	excess := t.raisedExcess(d, fs.Key) - t.trimSaving(fs.Key, svc.size)
	less := time.Duration(excess * randSlack / capBPS * float64(time.Second))
	svc.mean = max(svc.mean-less, svc.mean/4)
	// The p99 is left as measured: it is the spread of the wait behind
	// the queue, which the account above, made for the mean with its
	// slack, does not predict (on the lab at +3 ms a reader measured at
	// p99 2.7 ms untrimmed beside a 240 KB prior read 3.3 ms trimmed
	// beside it; the default window gives it 2.7-4.8 ms from run to run),
	// and an estimate 1.8 ms brought the prior down on the p99 alone. Its
	// verdicts hold it to tailAtDefault as well.
	return svc
}

// raisedExcess is how many bytes the file windows readaheadd holds raised
// on d, other than except's, keep queued beyond the device's window, each
// counted for the share of the measure it was in force: a window raised
// within the measure delayed only the part of the requests after it (a
// prior given a moment ago).
func (t judgeCtx) raisedExcess(d *devState, except probe.FileKey) float64 {
	span, now := t.viewSpan(), t.deps.Clock.Now()
	var excess float64
	for _, fd := range t.files {
		if fd.dev == d && fd.key != except && fd.win.inForce() > fd.win.base {
			share := 1.0
			if moved := now - fd.win.movedAt; fd.win.movedAt != 0 && moved < span {
				share = max(0, float64(moved)/float64(span))
			}
			excess += share * float64(fd.win.inForce()-fd.win.base) * 1024
		}
	}
	return excess
}

// trimSaving is the transfer a random reader's trim spares each of its
// requests, of mean size bytes: the part of its read-around it no longer
// reads. A trim applied within the measure reached some of its requests
// only, which their mean size tells (a prior at start-up: 70 KB per
// request, and the whole 112 KB counted put the estimate of its mean 30%
// over what the default window gives it).
func (t *Tuner) trimSaving(key probe.FileKey, size float64) float64 {
	if td := t.trims[key]; td != nil && td.from > td.kb {
		return max(0, float64(td.from)*1024-size)
	}
	return 0
}

// tailAtDefault is what a random reader's p99 would be at the device's
// window, by the account of what readaheadd does beside it: its p99 now,
// less what each KB the raised file windows keep queued beyond the
// device's window costs it, plus the transfer its trim spares it. A random
// reader's worst requests wait behind the stream's queued transfers, so on
// a device with one transfer channel its p99 grows by a KB's transfer at
// the device's capacity per KB of the stream's window (on the lab, trimmed
// to 16 KB beside a stream slowed +1.5 to +3 ms: 1.2-1.3 ms at 128 KB,
// 1.6-1.7 at 192, 2.0 at 240, 2.3-2.4 at 288; at the default window
// untrimmed 1.8-1.9, or 2.5-2.6 in seconds when two of the stream's
// transfers queue together). Where a KB costs less (many channels), the
// steps judged on the device show it: a KB is taken at twice what it
// cost the readers' mean, at most its transfer. Until a step has shown
// it, the account stands only for a reference whose p99 is not sure (a
// few dozen requests before a prior went in, their largest: 2.07-3.28 ms
// where the default window gives the reader 2.0-2.5), at a KB's transfer:
// without it such a reference counts only 1.6x off, and a saved prior
// held the reader at 1.28x the default window's p99 at +2.5 ms. It needs
// enough recent requests for their p99 (refreshTailRequests) and no
// device-wide window raised (that one enlarges the reader's own requests
// too); ok is false otherwise.
func (t judgeCtx) tailAtDefault(r randObs) (time.Duration, bool) {
	d := t.devs[r.fs.Device]
	capBPS := t.capacityOrBusy(r.fs.Device)
	if !r.ok || r.ref == nil || r.svc.requests < refreshTailRequests || d == nil || d.raisedWide() || capBPS <= 0 ||
		d.randSlope <= 0 && r.ref.tailSure {
		return 0, false
	}
	more := t.raisedExcess(d, r.key)*tailPerByte(d, capBPS) - t.trimSaving(r.key, r.svc.size)/capBPS
	return r.svc.tail - time.Duration(more*float64(time.Second)), true
}

// tailPerByte is what a byte the stream keeps queued costs a random
// reader's p99 on d, in seconds: its transfer at the device's capacity,
// or twice what a byte cost the readers' mean where steps showed less.
func tailPerByte(d *devState, capBPS float64) float64 {
	if d.randSlope > 0 {
		return min(1/capBPS, 2*d.randSlope)
	}
	return 1 / capBPS
}

// tailRef is the p99 a random reader is held to: its reference, or what
// the account of the raised windows says the device's window would give
// it now (tailAtDefault) where that is lower or the reference's p99 is not
// sure, though never below tailEstFloor of its reference (of its p99 now
// where the reference's is not sure: a stray 3.3 ms of a few dozen
// requests put the floor over what the account said). A reference's p99
// is one draw of a bimodal figure: at the default window the benchmark's
// reader reads 1.9 ms in most seconds and 2.5-2.6 ms in some, and a
// reference learned in such seconds held the stream to 1.1x of 2.5-2.6
// ms, where the default window gave the reader 2.03-2.10 ms over the run
// (p99 1.25-1.4x at +2.5 ms). The account errs low where the stream's
// transfers cost the reader less than their transfer time (a device with
// many channels), or where a trim shortens the reader's own p99 more than
// its transfer: the stream is then held nearer the device's window, never
// below it, and by the floor the reader's p99 reads at most 1.33x what its
// reference says, which holds a step back through the verdict's second
// interval and the watch, never at once (far off is 1.6x). It reports
// whether the p99 is sure, and whether it is the account's.
func (t judgeCtx) tailRef(r randObs) (tail time.Duration, sure, estimated bool) {
	tail, sure = r.ref.svc.tail, r.ref.tailSure
	if est, ok := t.tailAtDefault(r); ok {
		floor := tail
		if !sure {
			floor = r.svc.tail
		}
		est = max(est, time.Duration(tailEstFloor*float64(floor)))
		if est < tail || !sure {
			// A reference whose p99 is not sure is replaced by the
			// account either way: a prior's reader referred to 73
			// requests at 1.92 ms read 2.5 ms beside 288 KB, 1.3x, and
			// held only 1.6x off, the window stayed.
			return est, true, true
		}
	}
	return tail, sure, false
}

// referAtTrim gives a random reader about to be trimmed, with no
// reference yet, one from its requests in the tuner's view: read around
// at the device's window, what that window gives it, less the account of
// the windows raised beside it (untouchedEstimate). A reader trimmed between
// Steps (fastTrim) is never measured untrimmed by a Step, and a reference
// estimated from its trimmed requests counts the trim's saving by the same
// account, which on the lab at +3 ms put it at 0.51 ms against the 1.6 ms
// the default window gives it, and held the stream beside it at the
// default window.
func (t judgeCtx) referAtTrim(fs detector.FileStats) {
	if t.randRefs[fs.Key] != nil {
		return
	}
	if svc, ok := serviceOf(fs); ok {
		t.addRandRef(fs, svc, t.untouched(t.devs[fs.Device]), t.deps.Clock.Now(), "tuner: random reader's reference, before its trim")
	}
}

// addRandRef gives a random reader with no reference one from svc: as
// measured where nothing readaheadd does is in force on its device
// (clean), else estimated without the raised windows (untouchedEstimate).
func (t judgeCtx) addRandRef(fs detector.FileStats, svc randService, clean bool, now time.Duration, msg string) {
	if len(t.randRefs) >= maxRandRefs {
		return
	}
	tailSure := clean
	if !clean && t.raisedJustNow(fs.Device, fs.Key) {
		// Its requests came before the windows in force now: what it
		// gets at the device's window, measured. Its p99 too when they
		// are enough: at start-up, with a saved prior given 120 ms after
		// the daemon started, they are 70-80, and their p99 is their
		// largest or so (on the lab at +3 ms: 1.74 and 4.08 ms where the
		// default window gives 2.6; held to 1.1x the first, a 288 KB prior
		// came down to the device's window and the stream read 0.90 of
		// the best static window).
		clean, tailSure = true, svc.requests >= refTailMinRequests
	}
	if !clean {
		svc = t.untouchedEstimate(fs, svc)
	}
	t.randRefs[fs.Key] = &randRef{dev: fs.Device, svc: svc, seen: now, clean: clean, tailSure: tailSure}
	t.log.Debug(msg, "file", fs.Key.String(), "clean", clean, "p99_sure", tailSure, "mean", svc.mean, "p99", svc.tail,
		"requests", svc.requests, "request_kb", int(svc.size/1024))
}

// raisedJustNow reports whether what readaheadd does on dev, though in
// force now, held almost none of the measure a reader's (except's)
// requests are in: nothing but file windows raised in its last
// justNowShare (a prior given to a fresh open as the reader is first seen:
// with saved state the first open after a restart is given its window a
// moment before the reader beside it is referred), no device-wide window,
// no trim, and no window lowered within it. Such a measure is not an
// estimate. On the lab at +3 ms, references taken 2-4 ms after a saved
// prior read p99 2.0-2.7 ms against the default window's 2.1-2.6 in the
// same runs; taken as estimates, their p99 counted only from 1.6x, and the
// stream stepped past the prior to 352 KB with the reader's p99 1.25x.
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

// refreshRandom sets the references of the random readers on dev to what
// they get in the tuner's view (recent requests), while nothing the tuner
// does is in force there, before a first step taken between Steps: the
// reference is what they get at the device's window in the conditions of
// the moment, and a slowdown that just began (a slowed stream leaves them
// more of the device) or a stream that just opened (it takes some) changed
// those since the last Step learned it.
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
		// Sure over refTailMinRequests only: a quarter interval's p99 is
		// one draw of a bimodal figure (1.81 or 2.48 ms at +3 ms, where
		// the default window gives the reader 2.6 over most seconds), and
		// the account of the raised windows stands for it (tailRef).
		r.ref.clean, r.ref.tailSure = true, r.svc.requests >= refTailMinRequests
		t.log.Debug("tuner: random reader's reference in the conditions of the moment", "file", r.key.String(),
			"mean", r.ref.svc.mean, "p99", r.ref.svc.tail, "p99_now", r.svc.tail, "requests", r.svc.requests)
	}
}

// refreshTailWeight is the weight refreshRandom gives the p99 of a random
// reader's n recent requests against its reference from before: all of it
// from refreshTailRequests on, a share below. The reference from before
// was learned in other conditions (a stream at full speed before its
// onset takes more of the device, one just opened took none), so it is no
// prior for the new ones: on the lab, taken half way from it, the p99
// references read 2.10-2.50 ms at +2.5 ms, where the default window gives
// the reader 1.9-2.0 ms second by second, and 2.02-2.22 at +3 ms, where
// it gives 2.5-2.6. A quarter interval holds 130-150 of the benchmark
// reader's requests; its p99 is their second largest.
func refreshTailWeight(n uint64) float64 {
	return min(1, float64(n)/refreshTailRequests)
}

const (
	// randTailAlpha: weight of the latest interval in a smoothed p99
	// (a reference's, and a kept window's watch).
	randTailAlpha = 0.2
	// randSlack: until a step beside random readers has shown how much
	// each KB the stream queues delays them, the delay is taken as this
	// many times a KB's transfer at the device's capacity (one transfer
	// channel: measured on the lab, 1.0-1.15 near saturation; a device
	// with many channels delays them less, which a step then shows).
	randSlack = 1.25
	// randRefAlpha: weight of the latest clean interval in a reference:
	// high, since the reference is what the reader gets in the conditions
	// of the moment (a stream that slows leaves it more of the device).
	randRefAlpha = 0.6
	// justNowShare: windows raised within this last share of a measure
	// delayed too few of a random reader's requests in it for its service
	// there to be an estimate (raisedJustNow).
	justNowShare = 0.1
	// refTailMinRequests: a reference's p99 is sure over this many
	// requests at least (its second largest or further in).
	refTailMinRequests = 200
	// refreshTailRequests: the recent requests whose p99 replaces a random
	// reader's p99 reference outright at a refresh (refreshTailWeight).
	refreshTailRequests = 100
	// tailEstFloor: the account of the raised windows (tailAtDefault)
	// puts what the device's window gives a random reader at this share
	// of its reference at least (of its p99 now, its reference's not sure).
	tailEstFloor = 0.75
	// maxRandRefs bounds the references kept.
	maxRandRefs = 4096
)
