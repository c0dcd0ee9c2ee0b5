package tuner

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// inflightFill: the share of its window a stream keeps in flight to count as
// bound by it (an application- or CPU-bound reader leaves it mostly empty).
const inflightFill = 0.4

// windowBound reports whether a file's stream is bound by its window, and
// why (or why not), from its own reads now (no baseline, no onset). A stream
// at its device's known capacity is not; before that is known, the trial
// tells (a step at bandwidth does not pay and teaches the capacity).
func (t judgeCtx) windowBound(fs detector.FileStats, now time.Duration) (bool, string) {
	if fs.Sequentiality < t.cfg.MinSequentiality {
		return false, fmt.Sprintf("not sequential (%.2f)", fs.Sequentiality)
	}
	if fs.Requests < minBoundRequests || fs.Inflight <= 0 || fs.MeanSize <= 0 {
		return false, "too few requests"
	}
	if now-fs.LastSeen > endedGap {
		return false, "not read now"
	}
	w, _ := t.windowKB(fs.Key)
	if w <= 0 {
		return false, "window unknown (no readahead event)"
	}
	inflight := fs.Inflight * fs.MeanSize
	fill := inflight / float64(w*1024)
	if fill < inflightFill {
		return false, fmt.Sprintf("%.0f KB in flight of a %d KB window", inflight/1024, w)
	}
	why := fmt.Sprintf("%.0f KB in flight of a %d KB window (%.0f%%), %.1f MB/s at p50 %v", inflight/1024, w, 100*fill,
		fs.BusyThroughput/1e6, fs.P50)
	if at, cap := t.atCapacity(fs); at {
		// Its bytes queue: a larger window adds latency, no throughput.
		return false, why + "; but " + cap + ": the device binds it, not its window"
	}
	return true, why
}

// outcomeNeeds adds every window-bound stream under the allow-paths to the
// needs and returns those with no other need: they are judged by their rate.
func (t judgeCtx) outcomeNeeds(snap detector.Snapshot, needs map[probe.FileKey][]detector.RegimeKind, devOf map[probe.FileKey]probe.Dev) map[probe.FileKey]bool {
	out := map[probe.FileKey]bool{}
	if t.scope.Empty() {
		return out
	}
	maps.DeleteFunc(t.capSeen, func(_ probe.FileKey, at time.Duration) bool { return snap.Now-at > capHold })
	for _, f := range snap.Files {
		ok, why := t.windowBound(f, snap.Now)
		if !ok || t.mem.Checking(f.Key) || t.trims[f.Key] != nil {
			continue
		}
		if len(needs[f.Key]) == 0 {
			out[f.Key] = true
			devOf[f.Key] = f.Device
			if fd := t.files[f.Key]; fd == nil || fd.win.trial.to == 0 && fd.win.cur == fd.win.base {
				t.log.Debug("tuner: stream bound by its window", "file", f.Key.String(), "why", why)
			}
		}
		needs[f.Key] = append(needs[f.Key], WindowBound)
	}
	return out
}

// regimeTakesOver turns an outcome decision into a regime one when the
// detector enters a regime on its file: new evidence that an unpaid trial's
// back-off does not hold up (a knee found before it is probed again); not
// during a trial, nor while one undone on the device drains (drainIn).
func (t *Tuner) regimeTakesOver(fd *fileDec) bool {
	if !fd.byRate || fd.win.trial.to != 0 || fd.win.reprobe.until != 0 || fd.pf.trial.to != 0 ||
		t.drainIn(fd.dev, t.deps.Clock.Now(), cmp.Or(t.span, t.cfg.Settle)) {
		return false
	}
	fd.byRate, fd.prior = false, nil
	if !fd.win.back.kneeRandom {
		// A knee the random readers' budget set holds: a regime does not change their cost.
		fd.win.clearBack() // (kneeRandom is false)
	}
	fd.win.regimeBegan()
	fd.pf.clearBack() // (a prefetch's knee is never the random readers')
	return true
}

// outcomeDue: a new outcome decision may start on the device for a file,
// once the device's back-off passed or at once on new evidence.
func (t judgeCtx) outcomeDue(d *devState, k probe.FileKey) bool {
	return t.deps.Clock.Now() >= d.outcomeRetryAt || t.outcomeEvidence(d, k)
}

// outcomeEvidence: file k shows what the last unpaid trial did not: its
// median half again that trial's, a rate drop or a tail needing more.
func (t judgeCtx) outcomeEvidence(d *devState, k probe.FileKey) bool {
	fs, ok := t.fstats[k]
	// rateDropped first: it follows the file's slow intervals one by one.
	return ok && (t.rateDropped(d, k, fs) || d.outcomeFailP50 > 0 && fs.P50 >= d.outcomeFailP50*3/2 || t.tailDue(d, k))
}

// outcomeRateDrop: below this share of the last unpaid trial's stream's
// rate, a stream is slowed since (a mild slowdown moves the rate first).
const outcomeRateDrop = 0.85

// maxOutcomeSlow bounds the files followed by rateDropped per device.
const maxOutcomeSlow = 256

// outcomeP50Rise: a rate drop with the median this many times the failed
// trial's stream's is the device's, and one interval of it is enough.
const outcomeP50Rise = 1.2

// outcomeP50Nudge: a milder drop counts with the median this many times the
// failed trial's stream's (a dip of the host's leaves the median as it was).
const outcomeP50Nudge = 1.05

// rateDropped reports whether file k read below outcomeRateDrop of the
// device's last unpaid trial's stream this interval with its median risen
// outcomeP50Rise, or two intervals running (one dip happens on a healthy
// device); a milder drop (below shortOfCapacity, median nudged up) too. Not
// where a peer's step may have taken the share (peerStepIn).
func (t judgeCtx) rateDropped(d *devState, k probe.FileKey, fs detector.FileStats) bool {
	risen := d.outcomeFailP50 > 0 && float64(fs.P50) >= outcomeP50Rise*float64(d.outcomeFailP50)
	drop, mild := outcomeRateDrop, false
	if fs.BusyThroughput >= drop*d.outcomeFailTput && d.outcomeFailP50 > 0 && float64(fs.P50) >= outcomeP50Nudge*float64(d.outcomeFailP50) {
		drop, mild = t.shortOfCapacity(), true
	}
	if d.outcomeFailTput <= 0 || fs.BusyThroughput <= 0 || fs.BusyThroughput >= drop*d.outcomeFailTput ||
		t.peerStepIn(t.snap.Files, fs, t.deps.Clock.Now(), t.cfg.Settle) {
		delete(d.outcomeSlow, k)
		return false
	}
	if risen && !mild {
		return true
	}
	now := t.snap.Now
	s, seen := d.outcomeSlow[k]
	if !seen || now-s[1] > t.cfg.Settle*3/2 {
		s[0] = now // not the interval after the last slow one: anew
	}
	s[1] = now
	if d.outcomeSlow == nil || len(d.outcomeSlow) >= maxOutcomeSlow && !seen {
		d.outcomeSlow = map[probe.FileKey][2]time.Duration{}
	}
	d.outcomeSlow[k] = s
	return now-s[0] >= t.cfg.Settle
}

// tailDue: a file shows a tail now that the last unpaid outcome trial saw
// none of or needs a larger window than it tried (new evidence).
func (t judgeCtx) tailDue(d *devState, k probe.FileKey) bool {
	fs, ok := t.fstats[k]
	return ok && t.tailNow(k) && (!d.outcomeFailTail || t.tailNeedKB(k, fs.BusyThroughput) > d.outcomeFailKB)
}

// remember updates the memory and the device's outcome back-off after a
// trial: a kept window teaches the directory's prior; an unpaid first step
// backs the device off (every stream there would fail alike) and decays it.
func (t *Tuner) remember(fd *fileDec, hadTrial bool) {
	l := &fd.win
	t.learnFrom(fd)
	now := t.deps.Clock.Now()
	// A climb's step was judged once no step is under trial, or once the
	// step under trial is the next one, taken from the climb's kept value.
	if fd.climbFrom > 0 && hadTrial && (l.trial.to == 0 || l.trial.from != fd.climbFrom) {
		// A climb of the directory's prior was judged: unpaid, the prior
		// holds its window (BackoffBase, then BackoffMax), unless the stream
		// read no better than at the device's window: then it no longer pays.
		paid := l.cur > fd.climbFrom
		t.mem.Climbed(fd.prior, fd.key, paid, now+t.cfg.BackoffBase, now+t.cfg.BackoffMax)
		fd.climbFrom = 0
		if paid || fd.prior == nil || !l.judged.ok || l.judged.tput >= fd.prior.BaseBPS*(1+t.cfg.Margin) {
			return
		}
		if err := t.pinFile(fd, l.base, nil, true); err != nil && !errors.Is(err, errNoReaders) {
			return // the prior's window stays; the Step judges it again
		}
		t.emit(fd.action(now, KindFileWindowUndo, l.cur, l.base, ResultUndone,
			fmt.Sprintf("prior: the stream read %.1f MB/s, no better than the prior's streams at the device's window (%.1f MB/s): the prior is halved", l.judged.tput/1e6, fd.prior.BaseBPS/1e6)))
		l.cur, l.back.knee, l.movedAt = l.base, false, now
		t.mem.Decay(fd.prior, false)
		t.mem.ForgetFile(fd.key)
		fd.prior = nil
		return
	}
	// No step judged, or a young one undone only to be measured whole
	// (youngRetried): no verdict on the device yet.
	if !hadTrial || l.trial.to != 0 || l.youngRetried() {
		return
	}
	if l.back.knee && fd.path != "" {
		// A step above the window its directory's prior holds did not
		// pay: the prior does not climb either while the knee holds.
		if p := t.mem.Dir(fd.key.Dev, fd.path); p != nil && p.Window == l.cur {
			p.KneeUntil = max(p.KneeUntil, l.back.retryAt)
		}
	}
	switch {
	case l.cur > l.base:
		if fd.byRate {
			fd.dev.outcomeFails, fd.dev.outcomeRetryAt = 0, 0
			t.count(EvPaid)
		}
	case fd.byRate:
		fd.dev.outcomeFails++
		fd.dev.outcomeRetryAt = now + t.backoff(fd.dev.outcomeFails)
		if fd.win.trial.before.p50 > 0 {
			fd.dev.outcomeFailP50 = fd.win.trial.before.p50
		}
		fd.dev.outcomeFailKB = fd.win.tried
		fd.dev.outcomeFailTail = fd.win.trial.beforeTail || t.tailNow(fd.key)
		if fd.win.trial.before.ok && fd.win.trial.before.tput > 0 {
			fd.dev.outcomeFailTput = fd.win.trial.before.tput
		}
		fd.dev.outcomeSlow = nil
		t.count(EvNotPaid)
		if fd.prior != nil {
			t.mem.Decay(fd.prior, false)
			t.mem.ForgetFile(fd.key)
			fd.prior = nil
		}
	}
}

// stillPays judges a re-probe of a decision judged by rate: at the end of
// the hold, the stream at the device's window must read slower than at its
// kept window (or the known capacity, if lower) by the margin to come back.
func (t judgeCtx) stillPays(fd *fileDec) (bool, string) {
	l := &fd.win
	if t.deps.Clock.Now() < l.reprobe.until {
		return true, ""
	}
	m := t.measureFor(fd)
	if !m.ok || l.keptM.tput <= 0 {
		return true, "nothing to judge by" // keep the window, probe again later
	}
	margin := t.cfg.Margin
	if t.loneAtCapacity(fd.dev, fd.key, l.keptM) {
		margin = t.halfMargin() // what a step to the capacity pays (marginFor)
	}
	ref, of := l.keptM.tput, "the kept window's"
	if c := t.knownCapacity(fd.dev.dev); c > 0 && c < ref {
		// Against the capacity, the whole margin: within it at the
		// device's window, a stream gains no step's worth.
		ref, of, margin = c, "the device's capacity", t.cfg.Margin
	}
	return m.tput*(1+margin) < ref, fmt.Sprintf("%s at the device's window against %s %.1f MB/s (margin %.0f%%)", m, of, ref/1e6, 100*margin)
}

// contentionAmongStreams: two or more sequential readers take streamShareMin
// of the device's bytes, so a step would only take another's share.
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
		if t.streamOn(snap, f, dev) {
			n++
			streamBytes += float64(f.Bytes)
		}
	}
	if n < 2 || devBytes <= 0 {
		return "", false
	}
	share := streamBytes / devBytes
	return fmt.Sprintf("%d sequential readers take %.0f%% of the device's bytes", n, 100*share), share >= streamShareMin
}

// streamOn: f is a sequential reader on dev, read within the last Settle.
func (t *Tuner) streamOn(snap detector.Snapshot, f detector.FileStats, dev probe.Dev) bool {
	return f.Device == dev && f.Sequentiality >= t.cfg.MinSequentiality && snap.Now-f.LastSeen <= t.cfg.Settle
}

// windowHint is the window (KB) whose bytes in flight hide the file's p95
// at the device's capacity (Little's law), 0 when not measured.
func (t judgeCtx) windowHint(k probe.FileKey) int {
	fs := t.fstats[k] // none: no latency
	lat := cmp.Or(fs.P95, fs.P50)
	if _, ok := t.dstats[fs.Device]; !ok || lat <= 0 {
		return 0
	}
	// Before the capacity is known, what the device reads now is a lower bound.
	capBPS := t.capacityOrBusy(fs.Device)
	return int(lat.Seconds() * capBPS / 1024)
}

// tailHint is the device window (KB) that hides a stall of the device's p99
// at its capacity, when the need is tail inflation and the device is below
// CapacityFrac of its capacity (0 otherwise): smaller steps would each cost
// an interval to learn they are too small.
func (t judgeCtx) tailHint(snap detector.Snapshot, dev probe.Dev) int {
	tail := slices.ContainsFunc(snap.Regimes, func(r detector.Regime) bool {
		return r.Kind == detector.TailInflation && r.Device == dev && r.File.IsZero()
	})
	ds, ok := t.dstats[dev]
	capBPS, _ := t.capacity(dev)
	if !tail || !ok || capBPS <= 0 || ds.P99 <= 0 {
		return 0
	}
	// A device near its capacity has no bandwidth to give back, and its
	// p99 is its queue: steps one at a time, each judged.
	if ds.BusyThroughput >= t.cfg.CapacityFrac*capBPS {
		return 0
	}
	return int(ds.P99.Seconds() * capBPS / 1024)
}

// learnFrom records a file window that paid (above its base) in the memory.
func (t *Tuner) learnFrom(fd *fileDec) {
	if fd.win.cur <= fd.win.base || fd.path == "" || fd.win.cur == fd.learnedKB {
		return
	}
	fd.learnedKB = fd.win.cur
	base := fd.win.baseM.rate
	if fd.prior != nil && base <= 0 {
		base = fd.prior.BaseBPS
	}
	t.mem.Learn(fd.key, fd.dev.name, fd.path, fd.win.cur, fd.win.base, base, fd.win.keptM.rate, t.deps.Clock.Now(), time.Now())
}

// drainIn: a file window on d undone within span before now (not in this
// Step), backing off: the detector's view holds its queue draining and the
// device briefly spare (five streams at capacity, two entered as starved).
func (t *Tuner) drainIn(d *devState, now, span time.Duration) bool {
	for _, fd := range t.files {
		if l := &fd.win; fd.dev == d && l.trial.to == 0 && l.movedAt < now && now-l.movedAt < span && l.back.retryAt > l.movedAt {
			return true
		}
	}
	return false
}

// peerStepIn reports whether another served stream on f's device, reading
// at least peerShareMin of f's bytes, has a step under trial or had its
// window changed within span: a rate that fell then may be that step
// taking its share. A small file beside it (checksums) takes no share.
func (t *Tuner) peerStepIn(files []detector.FileStats, f detector.FileStats, now, span time.Duration) bool {
	// The decisions are few beside the files; a moving one is rarer still.
	for key, fd := range t.files {
		if key == f.Key || fd.dev == nil || fd.dev.dev != f.Device ||
			fd.win.trial.to == 0 && (fd.win.movedAt == 0 || now-fd.win.movedAt >= span) {
			continue
		}
		for _, p := range files {
			if p.Key == key && float64(p.Bytes) >= peerShareMin*float64(f.Bytes) {
				return true
			}
		}
	}
	return false
}

// peerShareMin: a peer reading less than this share of a stream's bytes
// cannot have taken the share its rate lost.
const peerShareMin = 0.25

// needs returns the files needing a larger window and why, the device of
// each, and the devices needing a device-wide window and why.
func (t judgeCtx) needs(snap detector.Snapshot) (fileNeeds map[probe.FileKey][]detector.RegimeKind, fileDev map[probe.FileKey]probe.Dev, devWide map[probe.Dev]string) {
	fileNeeds = map[probe.FileKey][]detector.RegimeKind{}
	fileDev = map[probe.FileKey]probe.Dev{}
	devWide = map[probe.Dev]string{}
	// streamsNeed gives each stream on dev the need kind once.
	streamsNeed := func(dev probe.Dev, kind detector.RegimeKind) {
		for _, f := range snap.Files {
			if t.streamOn(snap, f, dev) && !slices.Contains(fileNeeds[f.Key], kind) {
				fileNeeds[f.Key] = append(fileNeeds[f.Key], kind)
				fileDev[f.Key] = dev
			}
		}
	}
	for _, r := range snap.Regimes {
		switch {
		case !r.File.IsZero() && (r.Kind == detector.FileLatencyShift || r.Kind == detector.StarvedStream || r.Kind == detector.ExtentStart):
			fileNeeds[r.File] = append(fileNeeds[r.File], r.Kind)
			fileDev[r.File] = r.Device
		case r.File.IsZero() && r.Kind == detector.TailInflation:
			devWide[r.Device] = fmt.Sprintf("%s: %s", r.Kind, r.Evidence)
			if _, ok := t.randomOnDevice(r.Device); ok && !t.scope.Empty() {
				// No device-wide window beside a random reader: the device's
				// streams get windows of their own, within its budget.
				streamsNeed(r.Device, detector.TailInflation)
			}
		}
	}
	// Device-wide need from many files (contention's per-file needs below
	// do not count: a device-wide window does not outbid other readers).
	perDev := map[probe.Dev]int{}
	for k := range fileNeeds {
		perDev[fileDev[k]]++
	}
	// Contention: a larger window wins a sequential reader back its share;
	// each such file gets the closed loop (kept only if it gains the margin).
	for _, r := range snap.Regimes {
		if r.Kind != detector.Contention || !r.File.IsZero() {
			continue
		}
		if why, zeroSum := t.contentionAmongStreams(snap, r.Device); zeroSum {
			t.logOnce(r.Device, "contention-zero-sum", "tuner: contention is among the sequential readers themselves; no per-file step (one would only take share from the others)",
				"device", r.Device.String(), "why", why)
			continue
		}
		streamsNeed(r.Device, detector.Contention)
	}
	active := map[probe.Dev]int{}
	for _, f := range snap.Files {
		active[f.Device]++
	}
	for dev, n := range perDev {
		if _, ok := devWide[dev]; !ok && n >= t.cfg.DeviceMinFiles && float64(n) >= t.cfg.DeviceFileFraction*float64(active[dev]) {
			devWide[dev] = fmt.Sprintf("%d of %d files read on the device need a larger window", n, active[dev])
		}
	}
	return fileNeeds, fileDev, devWide
}
