package tuner

import (
	"fmt"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// Labels of decisions that no detector regime started. They are evidence in
// actions and status, not regimes: the detector reports none for them.
const (
	// WindowBound: a sequential stream whose bytes in flight fill its
	// window (Little's law: its throughput is its window over its
	// latency), whatever its history. A larger window is tried, and kept
	// only if the stream's throughput pays.
	WindowBound detector.RegimeKind = "window_bound"
	// FromPrior: a fresh open given the window that paid for recent
	// streams in its directory (or for the file itself) on its first
	// readahead event.
	FromPrior detector.RegimeKind = "prior"
)

// inflightFill is the share of a stream's window that must be in flight for
// the stream to count as bound by its window. A sequential reader on
// asynchronous readahead keeps between half its window and all of it
// queued; a reader limited by its application or CPU leaves it mostly
// empty between bursts.
const inflightFill = 0.4

// outcomeFirstFactor: an outcome decision's first step is at least this
// many times the device's window.
const outcomeFirstFactor = 4

// minBoundRequests: fewer requests in a window say too little.
const minBoundRequests = 8

// windowKB is the largest window a reader of the file was seen with in the
// last Settle (readahead events carry the open file's ra_pages), 0 if none,
// and whether a reader has been reading it for a whole measurement (a
// stream that started within the detector's window reads at a fraction of
// its rate there: a step judged against that would be kept for nothing).
func (t *Tuner) windowKB(k probe.FileKey) (int, bool) {
	now := t.deps.Clock.Now()
	w, whole := 0, false
	for _, r := range t.readers[k] {
		if now-r.lastSeen <= 2*t.cfg.Settle && r.raKB > w {
			w = r.raKB
		}
		if now-r.firstSeen >= t.cfg.Settle+t.cfg.Settle/2 {
			whole = true
		}
	}
	return w, whole
}

// windowBound reports whether a file's stream is bound by its window, and
// why (or why not). It needs no baseline and no onset: only the stream's
// own reads now. Whether the stream is at the device's bandwidth cannot be
// told from the stream alone (a device slow from the start learns its slow
// rate as its capacity), so that is left to the trial: at bandwidth a
// larger window does not pay, the step is undone and backed off.
func (t *Tuner) windowBound(fs detector.FileStats, now time.Duration) (bool, string) {
	if fs.Sequentiality < t.cfg.MinSequentiality {
		return false, fmt.Sprintf("not sequential (%.2f)", fs.Sequentiality)
	}
	if fs.Requests < minBoundRequests || fs.Inflight <= 0 || fs.MeanSize <= 0 {
		return false, "too few requests"
	}
	if now-fs.LastSeen > t.cfg.Settle {
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
	if t.randomBesideDev(fs.Device, fs.Key) {
		// Beside random readers a full window may be the device's queue,
		// which they wait in too: only a stream slower than them is
		// slowed by its file (random.go).
		slow, peers := t.slowerThanPeers(fs)
		if !slow {
			return false, why + "; but " + peers + ": the device's queue binds it, not its window"
		}
		why += "; " + peers
	}
	return true, why
}

// outcomeNeeds adds to the needs every stream under the allow-paths that is
// bound by its window (no regime required) and returns those whose need is
// only that: their decisions are judged by the stream's rate.
func (t *Tuner) outcomeNeeds(snap detector.Snapshot, needs map[probe.FileKey][]detector.RegimeKind, devOf map[probe.FileKey]probe.Dev) map[probe.FileKey]bool {
	out := map[probe.FileKey]bool{}
	if t.scope.Empty() {
		return out
	}
	for _, f := range snap.Files {
		ok, why := t.windowBound(f, snap.Now)
		if !ok || t.mem.checking(f.Key) || t.trims[f.Key] != nil {
			continue
		}
		if len(needs[f.Key]) == 0 {
			out[f.Key] = true
			devOf[f.Key] = f.Device
			if fd := t.files[f.Key]; fd == nil || fd.win.trial == 0 && fd.win.cur == fd.win.base {
				t.log.Debug("tuner: stream bound by its window", "file", f.Key.String(), "why", why)
			}
		}
		needs[f.Key] = append(needs[f.Key], WindowBound)
	}
	return out
}

// regimeTakesOver turns an outcome decision into a regime decision when the
// detector enters a regime on its file: the regime is new evidence. Backing
// off after a trial that did not pay (a stream that was healthy then) does
// not hold it up, and its Little's-law first step applies; a knee found
// before it (the window at which a healthy stream's next step did not pay,
// or a step the onset fell in) is probed again at once. A step under trial
// is judged first (the next interval). It reports whether it did.
func (t *Tuner) regimeTakesOver(fd *fileDec) bool {
	if !fd.byRate || fd.win.trial != 0 || fd.win.probeUntil != 0 || fd.pf.trial != 0 {
		return false
	}
	fd.byRate, fd.prior = false, nil
	if !fd.win.kneeRandom {
		// A knee the random readers' budget set holds: the regime
		// changes nothing of what a step costs them.
		fd.win.retryAt, fd.win.failures, fd.win.knee = 0, 0, false
	}
	fd.win.rejump = true
	fd.pf.retryAt, fd.pf.failures, fd.pf.knee = 0, 0, false
	return true
}

// outcomeDue reports whether a new outcome-driven decision may start on the
// device now for a file: once the device's back-off has passed, or at once
// when the file's median latency is half again what it was at the trial
// that did not pay, or its requests show a tail that needs a larger window
// than that trial tried (the conditions changed: a slowdown began after a
// healthy spell, which must not wait out a healthy device's back-off).
func (t *Tuner) outcomeDue(d *devState, k probe.FileKey) bool {
	if t.deps.Clock.Now() >= d.outcomeRetryAt {
		return true
	}
	fs, ok := t.fstats[k]
	if ok && d.outcomeFailP50 > 0 && fs.P50 >= d.outcomeFailP50*3/2 {
		return true
	}
	return t.tailDue(d, k)
}

// tailDue reports whether a file's requests show a tail now that needs a
// larger window than the device's last outcome trial that did not pay
// tried (a trial judged between stalls, before the stalls showed): new
// evidence, which neither the device's nor the file's back-off holds up.
func (t *Tuner) tailDue(d *devState, k probe.FileKey) bool {
	fs, ok := t.fstats[k]
	return ok && t.tailNow(k) && t.tailNeedKB(k, fs.BusyThroughput) > d.outcomeFailKB
}

// remember updates the memory and the device's outcome back-off after a
// file window's trial was judged: a kept window teaches the directory's
// prior; a first step that did not pay backs the device's outcome trials
// off (a healthy device at its bandwidth: every stream there would fail
// the same way) and decays the prior it came from.
func (t *Tuner) remember(fd *fileDec, hadTrial bool) {
	l := &fd.win
	if l.cur > l.base {
		t.learnFrom(fd)
	}
	if !hadTrial || l.trial != 0 {
		return
	}
	now := t.deps.Clock.Now()
	switch {
	case l.cur > l.base:
		if fd.byRate {
			fd.dev.outcomeFails, fd.dev.outcomeRetryAt = 0, 0
			t.counts["outcome/paid"]++
		}
	case fd.byRate:
		fd.dev.outcomeFails++
		fd.dev.outcomeRetryAt = now + t.backoff(fd.dev.outcomeFails)
		if fd.win.before.p50 > 0 {
			fd.dev.outcomeFailP50 = fd.win.before.p50
		}
		fd.dev.outcomeFailKB = fd.win.tried
		t.counts["outcome/not_paid"]++
		if fd.prior != nil {
			t.mem.decay(fd.prior, false)
			t.mem.forgetFile(fd.key)
			fd.prior = nil
		}
	}
}

// stillPays judges a re-probe of a decision judged by rate: at the end of
// the hold, the stream at the device's window must read slower than at its
// kept window by the margin for the window to come back.
func (t *Tuner) stillPays(fd *fileDec) bool {
	l := &fd.win
	if t.deps.Clock.Now() < l.probeUntil {
		return true
	}
	m := t.measureFor(fd)
	if !m.ok || l.keptM.tput <= 0 {
		return true // nothing to judge by: keep the window, probe again later
	}
	return m.tput*(1+t.cfg.Margin) < l.keptM.tput
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
	if !ok || lat <= 0 {
		return 0
	}
	capBPS := ds.CapacityBPS
	if capBPS <= 0 {
		// Not learned yet (the daemon just started): what the device
		// reads now, its other readers included, is a lower bound.
		capBPS = ds.BusyThroughput
	}
	return int(lat.Seconds() * capBPS / 1024)
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

// randomOnDevice returns a file read randomly now on the device whose reads
// are read-around sized (an mmap reader: each fault reads the file's window
// around it, so a larger device window makes every fault larger), or one
// trimmed there, if any. A buffered random reader reads what it asks for
// whatever the window and is no reason to keep the device's window down.
func (t *Tuner) randomOnDevice(dev probe.Dev) (probe.FileKey, bool) {
	for k, td := range t.trims {
		if td.dev != nil && td.dev.dev == dev {
			return k, true
		}
	}
	kb := 0
	if d := t.devs[dev]; d != nil {
		kb = d.orig
	}
	for k, fs := range t.fstats {
		if fs.Device == dev && t.readRandomly(fs) && readAroundSized(fs, min(kb, t.cfg.TrimKB)) && t.snap.Now-fs.LastSeen <= t.cfg.Settle {
			return k, true
		}
	}
	return probe.FileKey{}, false
}

// Fresh streams: a stream slow from its first read is judged on the
// detector's recent requests (a fraction of a Settle), not after a whole
// measurement: Little's law needs only its bytes in flight, its window
// (from its readahead events) and its latency, and a whole Settle at the
// default's rate costs a stream slowed 3 ms per request about 5% of an 8 s
// read. The step is the same bounded outcome step, judged one Settle later
// by rate like any other, and held back by the device's outcome back-off.
const (
	// freshMinAge: a reader seen for less than this has not yet ramped its
	// window (the first reads of an open file are synchronous).
	freshMinAgeDiv = 10 // Settle / 10: 100 ms at 1 s
	// freshSpanDiv: the recent requests judged are those of the last
	// Settle / 4 (250 ms at 1 s).
	freshSpanDiv = 4
	// freshMinRequests: fewer requests in the recent span say too little
	// about a stream's bytes in flight.
	freshMinRequests = 32
	// maxFresh bounds the fresh streams waiting for their first judgement.
	maxFresh = 4096
)

// noteFresh records a file with no decision whose reader was first seen at
// firstSeen (called on its readahead events, t.mu held).
func (t *Tuner) noteFresh(k probe.FileKey, firstSeen, now time.Duration) {
	if t.scope.Empty() || now-firstSeen > t.cfg.Settle {
		return
	}
	if at, ok := t.fresh[k]; ok {
		if firstSeen < at {
			t.fresh[k] = firstSeen
		}
		return
	}
	if len(t.fresh) >= maxFresh {
		return
	}
	t.fresh[k] = firstSeen
}

// FreshStreams returns the files first read within the last Settle that
// have no decision and have been read for long enough to judge, and the
// span of recent requests to judge them on: the daemon asks the detector
// for those (detector.Recent) and hands them to FastOutcome. Empty when
// there is nothing to judge (the detector is then not asked).
func (t *Tuner) FreshStreams() ([]probe.FileKey, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.deps.Clock.Now()
	var keys []probe.FileKey
	for k, first := range t.fresh {
		if now-first > t.cfg.Settle || t.ownWindow(k) {
			delete(t.fresh, k)
			continue
		}
		if now-first >= t.cfg.Settle/freshMinAgeDiv {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, compareKeys)
	// A slow stream (a few hundred requests a second, as under
	// contention) has too few requests in the last Settle/4 to judge: it
	// is judged on as much of its life as it has had, up to 3/4 Settle.
	span := t.cfg.Settle / freshSpanDiv
	for _, k := range keys {
		span = max(span, min(now-t.fresh[k], 3*t.cfg.Settle/4))
	}
	return keys, span
}

// RecentSpan is the span of recent requests a step taken between Steps
// is measured on (FastOn's recent snapshot).
func (t *Tuner) RecentSpan() time.Duration { return t.cfg.Settle / freshSpanDiv }

// useView switches the tuner's view to snap, a snapshot of the detector's
// recent requests over span (its measures are then over span), and returns
// what switches it back. A device's capacity missing from snap is the one
// the view had.
func (t *Tuner) useView(snap detector.Snapshot, span time.Duration) (restore func()) {
	savedF, savedD, savedSnap := t.fstats, t.dstats, t.snap
	t.fstats = make(map[probe.FileKey]detector.FileStats, len(snap.Files))
	for _, f := range snap.Files {
		t.fstats[f.Key] = f
	}
	t.dstats = make(map[probe.Dev]detector.DeviceStats, len(snap.Devices))
	for _, d := range snap.Devices {
		if old, ok := savedD[d.Device]; ok && d.CapacityBPS <= 0 {
			d.CapacityBPS = old.CapacityBPS
		}
		t.dstats[d.Device] = d
	}
	t.snap, t.measSpan = snap, span
	return func() { t.fstats, t.dstats, t.snap, t.measSpan = savedF, savedD, savedSnap, 0 }
}

// newOutcomeDec records a decision judged by the stream's rate, for a
// stream bound by its window with no regime, at the device's window.
func (t *Tuner) newOutcomeDec(k probe.FileKey, d *devState, now time.Duration) *fileDec {
	fd := &fileDec{key: k, dev: d, byRate: true, regimes: []detector.RegimeKind{WindowBound}, lastNeeded: now,
		win: ladder{kind: KindFileWindow, base: d.orig, cur: d.orig},
		pf:  ladder{kind: KindPrefetch, first: t.cfg.PrefetchStartKB}}
	t.files[k] = fd
	return fd
}

// FastOutcome takes the first outcome step on fresh streams bound by their
// window, judged on the detector's recent requests (snap, over span; from
// detector.Recent): the same step Step would take a whole Settle later,
// with the same bounds (allow-paths, device back-off, no trim, no prior
// re-check), judged by the next Step one Settle after it.
func (t *Tuner) FastOutcome(snap detector.Snapshot, span time.Duration) []Action {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.out = nil
	if t.scope.Empty() || len(t.fresh) == 0 || span <= 0 {
		return nil
	}
	now := t.deps.Clock.Now()
	// The measures of the first step are over the recent span: the tuner's
	// view is switched to it for the step, and back after.
	defer t.useView(snap, span)()
	t.noteTails(snap.Files, now)
	for _, f := range snap.Files {
		if _, ok := t.fresh[f.Key]; !ok || t.ownWindow(f.Key) || t.trims[f.Key] != nil || t.mem.checking(f.Key) {
			continue
		}
		if f.Requests < freshMinRequests {
			continue
		}
		ok, why := t.windowBound(f, snap.Now)
		if !ok {
			continue
		}
		d := t.device(f.Device)
		if d == nil || !t.outcomeDue(d, f.Key) {
			continue
		}
		delete(t.fresh, f.Key)
		t.refreshRandom(d)
		fd := t.files[f.Key]
		created := fd == nil
		if created {
			fd = t.newOutcomeDec(f.Key, d, now)
		} else {
			// A new stream on a file whose earlier reads' trials did not
			// pay: their back-off and knee were learned in other
			// conditions; the device's outcome back-off (outcomeDue,
			// above) still holds a stream whose latency did not change.
			fd.win.retryAt, fd.win.knee, fd.lastNeeded = 0, false, now
		}
		t.log.Debug("tuner: fresh stream bound by its window", "file", f.Key.String(), "span", span, "why", why, "reopened", !created)
		n := len(t.out)
		t.driveFile(fd, true)
		if len(t.out) == n {
			// No step and nothing to report (no reader's descriptor found
			// yet, the sysfs budget spent): the next Step decides, as it
			// would have without this path.
			if created && !fd.outOfScope {
				delete(t.files, f.Key)
			}
		} else if fd.win.trial != 0 {
			t.counts["outcome/fresh"]++
		}
	}
	return t.out
}
