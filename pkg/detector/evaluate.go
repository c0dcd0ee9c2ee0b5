package detector

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// scratch holds buffers reused across evaluations.
type scratch struct {
	win   []sample
	peers []sample
	// contentionCheck's readers and depths, reused: at high request rates
	// they were most of the daemon's garbage.
	readers  map[int64]int
	depths   []float64
	depthSel []float64
	vals     []float64
	vals2    []float64
	vals3    []float64
	// weights of vals (ws) and vals2 (ws2) where device-level samples of
	// unequal weight are gathered (weighted.go), and wquantile's buffer
	ws, ws2 []uint64
	wbuf    []weighted
	// extentRatio is the post-jump to steady ratio judgeExtent last found
	extentRatio     float64
	extentCrossings int
	ivals           [][2]int64
	slotAg          []int32 // slot -> index in aggs + 1 for the current device
	aggs            []fileAgg
}

// fileAgg gathers one file's samples (indices into scratch.win) in a window.
type fileAgg struct {
	slot  int32
	set   []int32 // short window, extended to FileMinSamples
	all   []int32 // long window
	stats FileStats
	// normalised median (by class p50) and p95 (by class p95) over set
	n50, t95 float64
	nl       int // set samples in learned classes
	// normalised median of the latest quarter window (extended to
	// FileMinSamples) and its sample count: a shift's exit is judged on it
	recentN50 float64
	recentN   int
	domClass  uint8
	inShort   bool
	shifted   bool // above the shift thresholds on its own (before peers)
}

// percentile of sorted xs by nearest rank.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(xs)))) - 1
	return xs[max(0, min(i, len(xs)-1))]
}

// trimmedMean is the mean of sorted xs without its lowest and highest
// tenth: stable where a median flips between latency modes, yet blind to
// the few stalls that would swing a plain mean.
func trimmedMean(xs []float64) float64 {
	cut := len(xs) / 10
	xs = xs[cut : len(xs)-cut]
	if len(xs) == 0 {
		return 0
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

// selectPercentile returns what percentile(xs sorted, p) would, without
// sorting: it reorders xs only as far as the one element needs (quickselect,
// O(n) on average). The fast path asks the device's median several times a
// second over thousands of requests at high IOPS: a full sort each time was
// a third of the daemon's CPU there.
func selectPercentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	k := max(0, min(int(math.Ceil(p*float64(len(xs))))-1, len(xs)-1))
	lo, hi := 0, len(xs)-1
	for lo < hi {
		// Median of three as the pivot: sampled latencies arrive in
		// completion order, often nearly sorted in runs.
		mid := lo + (hi-lo)/2
		if xs[mid] < xs[lo] {
			xs[mid], xs[lo] = xs[lo], xs[mid]
		}
		if xs[hi] < xs[lo] {
			xs[hi], xs[lo] = xs[lo], xs[hi]
		}
		if xs[hi] < xs[mid] {
			xs[hi], xs[mid] = xs[mid], xs[hi]
		}
		pivot := xs[mid]
		i, j := lo, hi
		for i <= j {
			for xs[i] < pivot {
				i++
			}
			for xs[j] > pivot {
				j--
			}
			if i <= j {
				xs[i], xs[j] = xs[j], xs[i]
				i++
				j--
			}
		}
		switch {
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default:
			return xs[k]
		}
	}
	return xs[k]
}

// busyNS returns the time covered by the union of the intervals.
func busyNS(iv [][2]int64) int64 {
	if len(iv) == 0 {
		return 0
	}
	slices.SortFunc(iv, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	var total int64
	start, end := iv[0][0], iv[0][1]
	for _, x := range iv[1:] {
		if x[0] > end {
			total += end - start
			start, end = x[0], x[1]
		} else if x[1] > end {
			end = x[1]
		}
	}
	return total + end - start
}

func clamp01(x float64) float64 { return max(0, min(1, x)) }

// confidence grows with the margin over the threshold (margin 1 = at the
// threshold gives 0.5, twice the threshold gives 1) and with the sample
// count relative to the minimum.
func confidence(margin float64, n, minN int) float64 {
	c := clamp01(0.5 + 0.5*(margin-1))
	sf := clamp01(float64(n) / float64(2*minN))
	return c * (0.6 + 0.4*sf)
}

func fmtBytes(b float64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.1fMiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.0fKiB", b/(1<<10))
	default:
		return fmt.Sprintf("%.0fB", b)
	}
}

func fmtRate(bps float64) string { return fmt.Sprintf("%.1fMB/s", bps/1e6) }

func fmtDur(ns float64) string {
	return time.Duration(ns).Round(time.Microsecond).String()
}

func className(c uint8) string {
	if c == 0 {
		return "<=1B"
	}
	return "<=" + fmtBytes(math.Ldexp(1, int(c)))
}

// Evaluate computes the windowed statistics at now, steps every regime's
// hysteresis, learns baselines from healthy windows, evicts idle files and
// returns the snapshot (devices, files and regimes sorted by device, file
// and kind). now must not go backwards; call it once per Window.
func (d *Detector) Evaluate(now time.Duration) Snapshot {
	d.mu.Lock()
	defer d.mu.Unlock()
	nowNS := int64(now)
	idleCut := nowNS - int64(d.cfg.FileIdleTimeout)
	for d.lruTail != noSlot && d.files[d.lruTail].lastSeen < idleCut {
		d.evict(d.lruTail)
	}
	snap := Snapshot{Now: now}
	devs := make([]probe.Dev, 0, len(d.devices))
	for dev := range d.devices {
		devs = append(devs, dev)
	}
	slices.Sort(devs)
	for _, dev := range devs {
		d.evalDevice(d.devices[dev], nowNS, &snap)
	}
	slices.SortFunc(snap.Files, func(a, b FileStats) int {
		return cmp.Or(cmp.Compare(a.Key.Dev, b.Key.Dev), cmp.Compare(a.Key.Ino, b.Key.Ino))
	})
	kindOrder := func(k RegimeKind) int { return slices.Index(Kinds, k) }
	slices.SortFunc(snap.Regimes, func(a, b Regime) int {
		return cmp.Or(cmp.Compare(a.Device, b.Device), cmp.Compare(a.File.Dev, b.File.Dev),
			cmp.Compare(a.File.Ino, b.File.Ino), cmp.Compare(kindOrder(a.Kind), kindOrder(b.Kind)))
	})
	return snap
}

// classRef returns the learned baseline of class c or nil.
func (d *Detector) classRef(ds *deviceState, c uint8) *classBaseline {
	cb := &ds.base.classes[c]
	if cb.learned(d.cfg.BaselineMinWindows) {
		return cb
	}
	return nil
}

// collect gathers ds's samples completed after back, newest first, into
// the scratch window (stale file slots unattributed); the first nShort are
// within the last Window.
func (d *Detector) collect(ds *deviceState, now, back int64) (win []sample, nShort int) {
	sc := &d.sc
	shortCut := now - int64(d.cfg.Window)
	sc.win = sc.win[:0]
	ringN := uint64(len(ds.ring))
	for k := uint64(0); k < min(ds.n, ringN); k++ {
		s := ds.ring[(ds.n-1-k)%ringN]
		if s.complete <= back {
			break
		}
		if s.slot != noSlot {
			f := &d.files[s.slot]
			if !f.used || f.gen != s.gen {
				s.slot = noSlot
			}
		}
		sc.win = append(sc.win, s)
	}
	win = sc.win
	for nShort < len(win) && win[nShort].complete > shortCut {
		nShort++
	}
	return win, nShort
}

// group sorts the window's attributed samples by file into the scratch
// aggregates: all of a file's samples, and its set (the short window,
// extended back to FileMinSamples).
func (d *Detector) group(win []sample, nShort int) {
	sc := &d.sc
	if len(sc.slotAg) < len(d.files) {
		sc.slotAg = make([]int32, len(d.files))
	}
	for i := range sc.aggs {
		sc.slotAg[sc.aggs[i].slot] = 0
	}
	sc.aggs = sc.aggs[:0]
	for i := range win {
		s := &win[i]
		if s.slot == noSlot {
			continue
		}
		ai := sc.slotAg[s.slot]
		if ai == 0 {
			sc.aggs = append(sc.aggs, fileAgg{slot: s.slot})
			ai = int32(len(sc.aggs))
			sc.slotAg[s.slot] = ai
		}
		a := &sc.aggs[ai-1]
		a.all = append(a.all, int32(i))
		if i < nShort || len(a.set) < d.cfg.FileMinSamples {
			a.set = append(a.set, int32(i))
		}
		if i < nShort {
			a.inShort = true
		}
	}
}

func (d *Detector) evalDevice(ds *deviceState, now int64, snap *Snapshot) {
	cfg := &d.cfg
	sc := &d.sc
	longCut := now - int64(cfg.LongWindow)

	win, nShort := d.collect(ds, now, longCut)
	devN := max(nShort, min(len(win), cfg.DeviceMinSamples))
	devSet := win[:devN]
	d.group(win, nShort)
	aggOf := func(slot int32) *fileAgg {
		if slot == noSlot || int(slot) >= len(sc.slotAg) || sc.slotAg[slot] == 0 {
			return nil
		}
		return &sc.aggs[sc.slotAg[slot]-1]
	}

	// Device statistics over devSet.
	dst := DeviceStats{Device: ds.dev, Errors: ds.errors}
	devBusy, _ := d.devSetStats(devSet, &dst)

	// File statistics.
	for ai := range sc.aggs {
		d.fileStats(ds, &sc.aggs[ai], win, now)
	}

	// Peers: requests of files not shifted on their own (and not already in
	// a shift), plus non-file requests.
	peerN50, peerT95, peerN := d.peerStats(ds, devSet, aggOf)
	// Files slow on their own: when more than one is, the slowdown is not
	// one file's (a file is judged "lone" only when no other file is read).
	shiftedFiles := 0
	for ai := range sc.aggs {
		if sc.aggs[ai].shifted && sc.aggs[ai].inShort {
			shiftedFiles++
		}
	}

	// Per-file regimes.
	for ai := range sc.aggs {
		a := &sc.aggs[ai]
		f := &d.files[a.slot]
		if f.dev != ds.dev {
			continue
		}
		d.stepShift(ds, f, a, peerN50, peerT95, peerN, shiftedFiles, dst.BusyThroughput, dst.MeanSize, now)
		d.stepExtent(ds, f, a, win, nShort, now)
		d.stepStarved(ds, f, a, dst.BusyThroughput, now)
	}
	// Files with a regime that were not read in the long window: their
	// regimes end (nothing is being read slowly any more).
	for i := range d.files {
		f := &d.files[i]
		if !f.used || f.dev != ds.dev || aggOf(int32(i)) != nil {
			continue
		}
		for _, h := range []*hyst{&f.shift, &f.extent, &f.starved} {
			if h.candidate() {
				h.step(belowExit, now, cfg, 0, "")
			}
		}
	}

	explained := func(slot int32) bool {
		if slot == noSlot {
			return false
		}
		f := &d.files[slot]
		return f.shift.candidate() || f.starved.active
	}
	v, conf, ev := d.tailCheck(ds, devSet, nShort, devBusy, now, explained)
	d.stepDevice(&ds.tail, now, v, conf, ev)
	v, conf, ev = d.contentionCheck(ds, devSet, devBusy, explained)
	d.stepDevice(&ds.contention, now, v, conf, ev)
	ds.devCheckAt = now

	// Learn from healthy windows only.
	if !ds.tail.candidate() && !ds.contention.candidate() && nShort > 0 {
		d.learn(ds, devSet, devBusy, explained, aggOf)
	}
	if devBusy >= int64(cfg.Window)/4 {
		ds.base.observeCapacity(now, dst.BusyThroughput, cfg.CapacityHalfLife)
	}

	// Report.
	d.fillBaselines(ds, devSet, &dst)
	snap.Devices = append(snap.Devices, dst)
	for ai := range sc.aggs {
		a := &sc.aggs[ai]
		if d.files[a.slot].dev == ds.dev {
			snap.Files = append(snap.Files, a.stats)
		}
	}
	addRegime := func(kind RegimeKind, file probe.FileKey, h *hyst) {
		if h.active {
			snap.Regimes = append(snap.Regimes, Regime{Kind: kind, Device: ds.dev, File: file,
				Since: time.Duration(h.since), Confidence: h.confidence, Evidence: h.evidence})
		}
	}
	addRegime(TailInflation, probe.FileKey{}, &ds.tail)
	addRegime(Contention, probe.FileKey{}, &ds.contention)
	for i := range d.files {
		f := &d.files[i]
		if f.used && f.dev == ds.dev {
			addRegime(FileLatencyShift, f.key, &f.shift)
			addRegime(ExtentStart, f.key, &f.extent)
			addRegime(StarvedStream, f.key, &f.starved)
		}
	}
}

// setStats computes request count, bytes, raw percentiles, mean size and
// depth and busy throughput of the samples (all of set, or win[idx]).
// It returns the busy time and summed latency in ns.
func (d *Detector) setStats(set []sample, idx []int32, reqs, byts *uint64, p50, p95, p99 *time.Duration, meanSize, meanDepth, bt *float64) (int64, float64) {
	sc := &d.sc
	sc.vals = sc.vals[:0]
	sc.ivals = sc.ivals[:0]
	var b, wn uint64
	var depth, sumLat float64
	n := len(set)
	if idx != nil {
		n = len(idx)
	}
	for k := 0; k < n; k++ {
		s := d.at(set, idx, k)
		// Counts and bytes with the sampling weight; latencies and depths
		// are sampled uniformly, so their percentiles and means are not.
		b += uint64(s.bytes) * s.w()
		wn += s.w()
		depth += float64(s.depth)
		sumLat += float64(s.lat)
		sc.vals = append(sc.vals, float64(s.lat))
		sc.ivals = append(sc.ivals, [2]int64{s.issue(), s.complete})
	}
	*reqs, *byts = wn, b
	if n == 0 {
		return 0, 0
	}
	slices.Sort(sc.vals)
	*p50 = durNS(percentile(sc.vals, 0.50))
	*p95 = durNS(percentile(sc.vals, 0.95))
	*p99 = durNS(percentile(sc.vals, 0.99))
	*meanSize = float64(b) / float64(wn)
	*meanDepth = depth / float64(n)
	busy := busyNS(sc.ivals)
	if busy > 0 {
		*bt = float64(b) / (float64(busy) / 1e9)
	}
	return busy, sumLat
}

func (d *Detector) at(set []sample, idx []int32, k int) *sample {
	if idx == nil {
		return &set[k]
	}
	return &set[idx[k]]
}

func (d *Detector) fileStats(ds *deviceState, a *fileAgg, win []sample, now int64) {
	f := &d.files[a.slot]
	st := &a.stats
	st.Key, st.Device, st.NextOffset, st.LastSeen = f.key, f.dev, f.nextOffset, time.Duration(f.lastSeen)
	st.ExtentCrossings = f.crossings
	busy, sumLat := d.setStats(win, a.set, &st.Requests, &st.Bytes, &st.P50, &st.P95, &st.P99, &st.MeanSize, &st.MeanDepth, &st.BusyThroughput)
	if busy > 0 {
		st.Inflight = sumLat / float64(busy)
	}
	var seq int
	var classN [maxClass + 1]int
	sc := &d.sc
	sc.vals, sc.vals2 = sc.vals[:0], sc.vals2[:0]
	for _, i := range a.set {
		s := &win[i]
		if s.flags&flagSeq != 0 {
			seq++
		}
		if s.flags&flagJump != 0 {
			st.Jumps++
		}
		classN[s.class]++
		// Requests right after a jump are extent starts' evidence, not a
		// shift's (as in the fast path).
		if cb := d.classRef(ds, s.class); cb != nil && s.flags&flagPostJump == 0 {
			sc.vals = append(sc.vals, float64(s.lat)/cb.p50)
			sc.vals2 = append(sc.vals2, float64(s.lat)/cb.p95)
		}
	}
	if len(a.set) > 0 {
		st.Sequentiality = float64(seq) / float64(len(a.set))
	}
	for c := range classN {
		if classN[c] > classN[a.domClass] {
			a.domClass = uint8(c)
		}
	}
	// The latest quarter window (extended to FileMinSamples), for the
	// exit: the whole window's median lags an end by half a window.
	sc.vals3 = sc.vals3[:0]
	recentCut := now - int64(d.cfg.Window)/4
	for _, i := range a.set {
		s := &win[i]
		if s.complete <= recentCut && len(sc.vals3) >= d.cfg.FileMinSamples {
			break
		}
		if cb := d.classRef(ds, s.class); cb != nil && s.flags&flagPostJump == 0 {
			sc.vals3 = append(sc.vals3, float64(s.lat)/cb.p50)
		}
	}
	a.recentN = len(sc.vals3)
	if a.recentN > 0 {
		slices.Sort(sc.vals3)
		a.recentN50 = percentile(sc.vals3, 0.5)
	}
	a.nl = len(sc.vals)
	if a.nl > 0 {
		slices.Sort(sc.vals)
		slices.Sort(sc.vals2)
		a.n50 = percentile(sc.vals, 0.5)
		a.t95 = percentile(sc.vals2, 0.95)
	}
	cfg := &d.cfg
	a.shifted = a.nl >= cfg.FileMinSamples && a.n50 >= cfg.ShiftMult && a.t95 >= cfg.ShiftTailMult
}

// peerStats returns the normalised median and p95 of requests not
// belonging to shifted files.
func (d *Detector) peerStats(ds *deviceState, devSet []sample, aggOf func(int32) *fileAgg) (n50, t95 float64, n int) {
	sc := &d.sc
	sc.vals, sc.vals2, sc.ws = sc.vals[:0], sc.vals2[:0], sc.ws[:0]
	for i := range devSet {
		s := &devSet[i]
		if s.slot != noSlot {
			if a := aggOf(s.slot); (a != nil && a.shifted) || d.files[s.slot].shift.candidate() {
				continue
			}
		}
		if cb := d.classRef(ds, s.class); cb != nil {
			sc.vals = append(sc.vals, float64(s.lat)/cb.p50)
			sc.vals2 = append(sc.vals2, float64(s.lat)/cb.p95)
			sc.ws = append(sc.ws, s.w())
		}
	}
	if len(sc.vals) == 0 {
		return 0, 0, 0
	}
	if ws := weightsOf(sc.ws); ws != nil {
		// Peers streamed 1 in N (unattributed requests, small ones) beside
		// files' requests streamed one by one: each counts N times.
		var q [1]float64
		wquantiles(sc.vals, ws, []float64{0.5}, q[:], &sc.wbuf)
		n50 := q[0]
		wquantiles(sc.vals2, ws, []float64{0.95}, q[:], &sc.wbuf)
		return n50, q[0], len(sc.vals)
	}
	slices.Sort(sc.vals)
	slices.Sort(sc.vals2)
	return percentile(sc.vals, 0.5), percentile(sc.vals2, 0.95), len(sc.vals)
}

func (d *Detector) stepShift(ds *deviceState, f *fileState, a *fileAgg, peerN50, peerT95 float64, peerN, shiftedFiles int, devBT, devMeanSize float64, now int64) {
	cfg := &d.cfg
	switch {
	case !a.inShort && f.shift.candidate():
		f.shift.step(belowExit, now, cfg, 0, "")
		return
	case a.nl < cfg.FileMinSamples:
		f.shift.step(unknown, now, cfg, 0, "")
		return
	case a.n50 < cfg.ShiftExitMult:
		ev := ""
		if f.shift.candidate() {
			ev = fmt.Sprintf("file %s: its %d requests take median %.2fx the device's healthy baseline (exit below %.2fx)", f.key, a.nl, a.n50, cfg.ShiftExitMult)
		}
		f.shift.step(belowExit, now, cfg, 0, ev)
		return
	case f.shift.candidate() && a.recentN >= cfg.FileMinSamples && a.recentN50 < cfg.ShiftExitMult:
		// Its latest requests are back to normal: the slowdown ended
		// (ExitAfter such evaluations in a row clear it).
		f.shift.step(belowExit, now, cfg, 0, fmt.Sprintf("file %s: its latest %d requests take median %.2fx the device's healthy baseline (exit below %.2fx)",
			f.key, a.recentN, a.recentN50, cfg.ShiftExitMult))
		return
	}
	ref := &ds.base.classes[a.domClass]
	ev := fmt.Sprintf("file %s: median %s = %.2fx and p95 %s = %.2fx the device's healthy baseline for %s requests (baseline median %s, p95 %s; %d requests)",
		f.key, a.stats.P50, a.n50, a.stats.P95, a.t95, className(a.domClass), fmtDur(ref.p50), fmtDur(ref.p95), a.nl)
	if !a.shifted {
		f.shift.step(between, now, cfg, 0, ev)
		return
	}
	if capBPS := ds.base.capacity; capBPS > 0 && devBT >= cfg.StarvedDeviceSpare*capBPS {
		// The device is bandwidth-saturated: every request waits for the
		// bytes queued ahead of it, so latency says nothing about a
		// per-request shift (it would look the same with or without one).
		// Hold an active shift (a larger window the tuner set keeps the
		// channel busy; backing off is how the tuner finds out) and do not
		// enter one.
		queue := a.stats.MeanDepth * devMeanSize / capBPS
		if a.stats.P50.Seconds() <= cfg.ShiftMult*queue {
			ev += fmt.Sprintf("; device saturated (%s of %s): the median is explained by queueing behind %.1f requests (%s), holding",
				fmtRate(devBT), fmtRate(capBPS), a.stats.MeanDepth, fmtDur(queue*1e9))
			if f.shift.active {
				f.shift.evidence = ev
				f.shift.step(unknown, now, cfg, 0, ev)
			} else {
				f.shift.step(between, now, cfg, 0, ev)
			}
			return
		}
	}
	if depthCap := cfg.ShiftDepthMult*ds.base.depth + 1; !f.shift.active && ds.base.inflightN >= cfg.BaselineMinWindows && a.stats.MeanDepth > depthCap {
		// Its latency rose with the queue: queueing, not the file.
		f.shift.step(between, now, cfg, 0, ev+fmt.Sprintf("; but its requests saw depth %.1f against a healthy %.1f", a.stats.MeanDepth, ds.base.depth))
		return
	}
	margin := min(a.n50/cfg.ShiftMult, a.t95/cfg.ShiftTailMult)
	if peerN >= cfg.PeerMinSamples {
		if peerN50 >= cfg.ShiftMult || a.n50 < cfg.PeerMult*peerN50 || a.t95 < cfg.PeerMult*peerT95 {
			// Others are slow too (device-wide) or the file is not clearly
			// apart from its peers: not a file-level shift; hold.
			f.shift.step(between, now, cfg, 0, ev+fmt.Sprintf("; peers not normal: median %.2fx, p95 %.2fx baseline", peerN50, peerT95))
			return
		}
		margin = min(margin, a.n50/(cfg.PeerMult*max(peerN50, 1e-9)), a.t95/(cfg.PeerMult*max(peerT95, 1e-9)))
		ev += fmt.Sprintf("; other files normal: median %.2fx, p95 %.2fx baseline (%d requests)", peerN50, peerT95, peerN)
		f.shift.step(aboveEntry, now, cfg, confidence(margin, a.nl, cfg.FileMinSamples), ev)
		return
	}
	if shiftedFiles > 1 && !f.shift.active {
		// No normal peer, but other files are as slow: device-wide.
		f.shift.step(between, now, cfg, 0, ev+fmt.Sprintf("; %d files are slow at once: not a file-level shift", shiftedFiles))
		return
	}
	if !cfg.LoneFileShift {
		f.shift.step(between, now, cfg, 0, ev+"; no other file active to compare with")
		return
	}
	f.shift.step(aboveEntry, now, cfg, 0.7*confidence(margin, a.nl, cfg.FileMinSamples), ev+"; no other file active to compare with")
}

func (d *Detector) stepExtent(ds *deviceState, f *fileState, a *fileAgg, win []sample, nShort int, now int64) {
	cfg := &d.cfg
	if !a.inShort {
		if f.extent.candidate() {
			f.extent.step(belowExit, now, cfg, 0, "")
		}
		return
	}
	if a.stats.Sequentiality < cfg.ExtentMinSequential {
		// A random reader (4 KB mmap faults, say) is not one whose reads
		// find new extents: clear what a sequential phase may have entered.
		if f.extent.candidate() {
			f.extent.step(belowExit, now, cfg, 0, fmt.Sprintf("file %s: sequential %.0f%%, below %.0f%%: not judged for extent starts", f.key, 100*a.stats.Sequentiality, 100*cfg.ExtentMinSequential))
		}
		return
	}
	if f.extent.candidate() {
		// The end is judged on the post-jump requests of the latest
		// quarter window: over the whole window, those before the end keep
		// the median up for half a window.
		nRecent := 0
		for nRecent < nShort && win[nRecent].complete > now-int64(cfg.Window)/4 {
			nRecent++
		}
		if v, _, ev := d.judgeExtent(f, a, win, nRecent, now); v == belowExit {
			f.extent.step(belowExit, now, cfg, 0, ev)
			return
		}
	}
	v, conf, ev := d.judgeExtent(f, a, win, nShort, now)
	f.extent.step(v, now, cfg, conf, ev)
}

// judgeExtent compares a sequential file's requests right after jumps
// with its steady ones. Evaluate steps the regime with it; FastPath uses it
// for entry only.
func (d *Detector) judgeExtent(f *fileState, a *fileAgg, win []sample, nShort int, now int64) (verdict, float64, string) {
	cfg := &d.cfg
	sc := &d.sc
	// Post-jump requests: those in the short window, extended back to
	// ExtentMinSamples; steady requests: the rest of the file's window.
	sc.vals, sc.vals2 = sc.vals[:0], sc.vals2[:0]
	var jumps, crossings int
	oldest := now
	for _, i := range a.all {
		s := &win[i]
		if s.flags&flagPostJump == 0 {
			continue
		}
		if int(i) < nShort || len(sc.vals) < cfg.ExtentMinSamples {
			sc.vals = append(sc.vals, float64(s.lat))
			if s.flags&flagJump != 0 {
				jumps++
			}
			if s.flags&flagCross != 0 {
				crossings++
			}
			oldest = min(oldest, s.complete)
		}
	}
	for _, i := range a.set {
		if s := &win[i]; s.flags&flagPostJump == 0 {
			sc.vals2 = append(sc.vals2, float64(s.lat))
		}
	}
	if len(sc.vals) < cfg.ExtentMinSamples || crossings < 2 || len(sc.vals2) < cfg.ExtentMinSamples {
		return unknown, 0, ""
	}
	slices.Sort(sc.vals)
	slices.Sort(sc.vals2)
	post, steady := percentile(sc.vals, 0.5), percentile(sc.vals2, 0.5)
	medRatio := post / max(steady, 1)
	// The slower of two views must both agree: a device whose requests
	// fall in two latency modes (one served at once, one queued behind
	// another) has a median that jumps between the modes when a sample's
	// share of the upper one crosses half. A healthy fragmented file's
	// post-jump median then read 1.65x its steady one while the trimmed
	// means stayed within 1.33x; an extent start lifts both (2.2-2.6x).
	tmRatio := trimmedMean(sc.vals) / max(trimmedMean(sc.vals2), 1)
	ratio := min(medRatio, tmRatio)
	sc.extentRatio, sc.extentCrossings = ratio, crossings
	ev := fmt.Sprintf("file %s: the first %d requests after each of %d jumps (%d of them extent crossings) in the last %s take median %s, %.2fx the file's steady median %s (trimmed means %.2fx); %d extent crossings seen since tracked",
		f.key, cfg.ExtentRequests, jumps, crossings, time.Duration(now-oldest).Round(time.Millisecond), fmtDur(post), medRatio, fmtDur(steady), tmRatio, f.crossings)
	switch {
	case ratio >= cfg.ExtentMult:
		return aboveEntry, confidence(ratio/cfg.ExtentMult, len(sc.vals), cfg.ExtentMinSamples), ev
	case ratio < cfg.ExtentExitMult:
		return belowExit, 0, ev
	default:
		return between, 0, ev
	}
}

func (d *Detector) stepStarved(ds *deviceState, f *fileState, a *fileAgg, devBT float64, now int64) {
	cfg := &d.cfg
	st := &a.stats
	capBPS := ds.base.capacity
	if !a.inShort {
		if f.starved.candidate() {
			f.starved.step(belowExit, now, cfg, 0, "")
		}
		return
	}
	if capBPS <= 0 || st.Requests < uint64(cfg.FileMinSamples) || st.BusyThroughput <= 0 || st.MeanSize <= 0 {
		f.starved.step(unknown, now, cfg, 0, "")
		return
	}
	// The median, not the mean: robust to a window that straddles the onset
	// and to a few slow requests.
	lat := st.P50.Seconds()
	needed := lat * capBPS / st.MeanSize
	bound := st.Inflight * st.MeanSize / lat
	ev := fmt.Sprintf("file %s: sequential %.0f%%, %.1f requests of %s in flight at median latency %s bound it to %s (measured %s while busy); hiding that latency at the device's capacity %s needs %.1f in flight (device busy at %s)",
		f.key, 100*st.Sequentiality, st.Inflight, fmtBytes(st.MeanSize), st.P50.Round(time.Microsecond), fmtRate(bound), fmtRate(st.BusyThroughput), fmtRate(capBPS), needed, fmtRate(devBT))
	switch {
	case st.Sequentiality < cfg.StarvedMinSequential || st.Inflight >= cfg.StarvedExitFrac*needed || st.BusyThroughput >= cfg.StarvedDeviceSpare*capBPS ||
		devBT >= cfg.StarvedDeviceSpare*capBPS:
		// A saturated device has no spare bandwidth for a larger window to
		// use: the stream is not starved (holding here would keep a regime
		// entered in a brief lull alive while the device stays busy).
		f.starved.step(belowExit, now, cfg, 0, ev)
	case st.Inflight < cfg.StarvedInflightFrac*needed && st.BusyThroughput < cfg.StarvedThroughputFrac*capBPS && devBT < cfg.StarvedDeviceSpare*capBPS &&
		busyShare(st, cfg.Window) >= cfg.StarvedMinBusy:
		margin := min(cfg.StarvedInflightFrac*needed/st.Inflight, cfg.StarvedThroughputFrac*capBPS/st.BusyThroughput)
		f.starved.step(aboveEntry, now, cfg, confidence(margin, int(st.Requests), cfg.FileMinSamples), ev)
	default:
		f.starved.step(between, now, cfg, 0, ev)
	}
}

// busyShare is the share of the window the file had a request in flight:
// its throughput over the window against its throughput while busy.
func busyShare(st *FileStats, window time.Duration) float64 {
	if st.BusyThroughput <= 0 {
		return 0
	}
	return float64(st.Bytes) / window.Seconds() / st.BusyThroughput
}

// stepDevice steps a device-level regime with its check's verdict; a device
// with nothing read in the window clears what is active or pending.
func (d *Detector) stepDevice(h *hyst, now int64, v verdict, conf float64, ev string) {
	if v == idle {
		if h.candidate() {
			h.step(belowExit, now, &d.cfg, 0, "")
		}
		return
	}
	h.step(v, now, &d.cfg, conf, ev)
}

// tailCheck judges tail inflation over devSet (the window, extended to
// DeviceMinSamples; its first nShort samples are within Window). Evaluate
// steps the regime with it; FastPath uses it for entry only.
func (d *Detector) tailCheck(ds *deviceState, devSet []sample, nShort int, devBusy, now int64, explained func(int32) bool) (verdict, float64, string) {
	cfg := &d.cfg
	sc := &d.sc
	if nShort == 0 {
		return idle, 0, ""
	}
	sc.vals, sc.ws = sc.vals[:0], sc.ws[:0]
	var wAll, wExcess uint64 // requests the samples stand for
	var quarters [4]bool
	oldest := devSet[len(devSet)-1].complete
	span := max(now-oldest, int64(cfg.Window))
	start := now - span
	srcAll := map[int32]int{}
	srcExcess := map[int32]bool{}
	var sumLat float64
	nExplained := 0
	for i := range devSet {
		s := &devSet[i]
		if explained(s.slot) {
			nExplained++
		}
		if s.flags&flagPostJump != 0 || explained(s.slot) {
			continue
		}
		sumLat += float64(s.lat) * float64(s.w())
		cb := &ds.base.classes[s.class]
		if !cb.learned(cfg.DeviceRegimeMinWindows) || !cb.tailLearned(cfg.DeviceRegimeMinWindows) {
			continue
		}
		sc.vals = append(sc.vals, float64(s.lat)/cb.p50)
		sc.ws = append(sc.ws, s.w())
		wAll += s.w()
		srcAll[s.slot]++
		if float64(s.lat) > cfg.TailMult*cb.p99 {
			wExcess += s.w()
			srcExcess[s.slot] = true
			q := (s.complete - start) * 4 / span
			quarters[max(0, min(q, 3))] = true
		}
	}
	n := len(sc.vals)
	if n < cfg.TailMinSamples {
		return unknown, 0, ""
	}
	// Shares and the median of the requests the samples stand for.
	n50 := wquantile(sc.vals, weightsOf(sc.ws), 0.5, &sc.wbuf)
	share := float64(wExcess) / float64(wAll)
	spread := 0
	for _, q := range quarters {
		if q {
			spread++
		}
	}
	active := 0
	for _, c := range srcAll {
		if c >= 3 {
			active++
		}
	}
	ev := fmt.Sprintf("device %s: %.1f%% of %d requests exceed %.1fx their size class's baseline p99 (entry at %.0f%%, healthy: <1%%), spread over %d of 4 quarters of the last %s, from %d of %d active sources; median %.2fx baseline",
		ds.dev, 100*share, n, cfg.TailMult, 100*cfg.TailShare, spread, time.Duration(span).Round(time.Millisecond), len(srcExcess), active, n50)
	// Requests in flight as contention counts them: a tail that comes with
	// a queue (the first second of a contention, before its median rises:
	// requests waiting behind large transfers) is queueing, not the device
	// stalling; a stall of a few percent of requests barely raises them.
	queued := false
	if base := &ds.base; base.inflightN >= cfg.BaselineMinWindows && base.inflight > 0 && devBusy > 0 {
		if inflight := sumLat / float64(devBusy); inflight >= cfg.ContentionDepthMult*base.inflight && inflight >= base.inflight+1 {
			queued = true
			ev += fmt.Sprintf("; but %.1f requests in flight against a healthy %.1f: queueing", inflight, base.inflight)
		}
	}
	// Beside a file in a file regime (whose window the tuner may have
	// widened), a lone other reader's slow requests are as likely its
	// queueing behind that file's transfers: a device stall needs two
	// sources then.
	lone := nExplained > 0 && len(srcExcess) < 2
	if lone && share >= cfg.TailShare {
		ev += fmt.Sprintf("; but %d requests are a file regime's and the excess comes from one other source", nExplained)
	}
	switch {
	case share < cfg.TailExitShare:
		return belowExit, 0, ev
	case share >= cfg.TailShare && n50 <= cfg.TailMedianMax && spread >= cfg.TailSpread && (active < 2 || len(srcExcess) >= 2) && !queued && !lone:
		return aboveEntry, confidence(share/cfg.TailShare, n, cfg.TailMinSamples), ev
	default:
		return between, 0, ev
	}
}

// contentionCheck judges contention over devSet (busy for devBusy ns), as
// tailCheck does tail inflation.
func (d *Detector) contentionCheck(ds *deviceState, devSet []sample, devBusy int64, explained func(int32) bool) (verdict, float64, string) {
	cfg := &d.cfg
	sc := &d.sc
	base := &ds.base
	if len(devSet) == 0 || devBusy <= 0 {
		return idle, 0, ""
	}
	if base.inflightN < cfg.BaselineMinWindows || base.inflight <= 0 {
		return unknown, 0, ""
	}
	sc.vals, sc.ws = sc.vals[:0], sc.ws[:0]
	var sumLat float64
	// Readers: files, and streams of unattributed requests (O_DIRECT
	// readers are readers too, though the probe cannot name their files).
	if sc.readers == nil {
		sc.readers = map[int64]int{}
	}
	readers := sc.readers
	clear(readers)
	depths := sc.depths[:0]
	for i := range devSet {
		s := &devSet[i]
		if s.flags&flagPostJump != 0 || explained(s.slot) {
			continue
		}
		// Weighted: Little's law over devBusy needs every request's time.
		sumLat += float64(s.lat) * float64(s.w())
		// A reader is a source of at least 3 samples (not requests: one
		// sampled random request stands for N, but is no stream).
		if s.slot == noSlot {
			readers[-1-int64(s.gen)]++
		} else {
			readers[int64(s.slot)]++
		}
		if cb := d.classRef(ds, s.class); cb != nil {
			sc.vals = append(sc.vals, float64(s.lat)/cb.p50)
			sc.ws = append(sc.ws, s.w())
			depths = append(depths, float64(s.depth))
		}
	}
	sc.depths = depths
	if len(sc.vals) < cfg.BaselineMinSamples {
		return unknown, 0, ""
	}
	// Latency against depth: normalised latency of requests issued at
	// above-median depth over that of the others (evidence only).
	sc.depthSel = append(sc.depthSel[:0], depths...)
	medDepth := selectPercentile(sc.depthSel, 0.5)
	var hiSum, loSum float64
	var hiN, loN int
	for i, v := range sc.vals {
		if depths[i] > medDepth {
			hiSum += v
			hiN++
		} else {
			loSum += v
			loN++
		}
	}
	slope := "n/a"
	if hiN > 0 && loN > 0 {
		slope = fmt.Sprintf("%.2fx", (hiSum/float64(hiN))/(loSum/float64(loN)))
	}
	n50 := wquantile(sc.vals, weightsOf(sc.ws), 0.5, &sc.wbuf)
	inflight := sumLat / float64(devBusy)
	nReaders := 0
	for _, c := range readers {
		if c >= 3 {
			nReaders++
		}
	}
	ev := fmt.Sprintf("device %s: median %.2fx baseline with %.1f requests in flight (healthy %.1f) from %d readers not under a per-file regime; latency above the median depth %s that below",
		ds.dev, n50, inflight, base.inflight, nReaders, slope)
	switch {
	case n50 < cfg.ContentionExitMult || inflight < 0.75*cfg.ContentionDepthMult*base.inflight:
		return belowExit, 0, ev
	case n50 >= cfg.ContentionLatencyMult && inflight >= cfg.ContentionDepthMult*base.inflight && inflight >= base.inflight+1 && nReaders >= cfg.ContentionMinReaders:
		margin := min(n50/cfg.ContentionLatencyMult, inflight/(cfg.ContentionDepthMult*base.inflight))
		return aboveEntry, confidence(margin, len(sc.vals), cfg.DeviceMinSamples), ev
	default:
		return between, 0, ev
	}
}

// learn folds a healthy window into the device baseline: per size class,
// requests not explained by a per-file regime and not right after a jump.
// Sequential files whose median stands apart from the rest (ShiftMult
// times the class reference: the learned median, or this window's before
// one is learned) are left out too: a file that is slow from the moment the
// daemon starts is not yet a shift candidate, and learning its latency as
// healthy would hide its shift for good. Random readers stay in: their
// small requests queue behind the streams' and are slower by nature, and
// leaving them out would make them look shifted against the rest.
func (d *Detector) learn(ds *deviceState, devSet []sample, devBusy int64, explained func(int32) bool, aggOf func(int32) *fileAgg) {
	cfg := &d.cfg
	var perClass [maxClass + 1][]float64
	// Each latency's weight, where a class mixes samples streamed one by
	// one with samples standing for N requests (weighted.go).
	var perClassW [maxClass + 1][]uint64
	mixed := !unitWeights(devSet)
	collect := func(skip func(*sample) bool) {
		for c := range perClass {
			perClass[c] = perClass[c][:0]
			perClassW[c] = perClassW[c][:0]
		}
		for i := range devSet {
			s := &devSet[i]
			if s.flags&flagPostJump != 0 || explained(s.slot) || skip(s) {
				continue
			}
			perClass[s.class] = append(perClass[s.class], float64(s.lat))
			if mixed {
				perClassW[s.class] = append(perClassW[s.class], s.w())
			}
		}
	}
	sc := &d.sc
	// classQ returns the p-quantiles of class c's latencies (sorting them).
	var qbuf [3]float64
	classQ := func(c int, ps ...float64) []float64 {
		xs := perClass[c]
		out := qbuf[:len(ps)]
		if ws := weightsOf(perClassW[c]); mixed && ws != nil {
			wquantiles(xs, ws, ps, out, &sc.wbuf)
			return out
		}
		slices.Sort(xs)
		for i, p := range ps {
			out[i] = percentile(xs, p)
		}
		return out
	}
	collect(func(*sample) bool { return false })
	var ref [maxClass + 1]float64
	for c := range perClass {
		if cb := d.classRef(ds, uint8(c)); cb != nil {
			ref[c] = cb.p50
		} else if len(perClass[c]) >= cfg.BaselineMinSamples {
			ref[c] = classQ(c, 0.5)[0]
		}
	}
	apart := func(s *sample) bool {
		a := aggOf(s.slot)
		if a == nil || a.stats.Requests < uint64(cfg.FileMinSamples) || a.stats.Sequentiality < cfg.StarvedMinSequential {
			return false
		}
		r := ref[a.domClass]
		return r > 0 && float64(a.stats.P50) >= cfg.ShiftMult*r
	}
	collect(apart)
	var sumLat, depth float64
	var n int
	var wn uint64
	for i := range devSet {
		s := &devSet[i]
		if s.flags&flagPostJump != 0 || explained(s.slot) || apart(s) {
			continue
		}
		sumLat += float64(s.lat) * float64(s.w())
		depth += float64(s.depth) * float64(s.w())
		wn += s.w()
		n++
	}
	for c := range perClass {
		xs := perClass[c]
		if len(xs) < cfg.BaselineMinSamples {
			continue
		}
		q := classQ(c, 0.5, 0.95, 0.99)
		ds.base.learnClass(uint8(c), q[0], q[1], q[2], len(xs) >= cfg.TailMinSamples, cfg.BaselineAlpha)
	}
	if n >= cfg.BaselineMinSamples && devBusy > 0 {
		ds.base.learnInflight(sumLat/float64(devBusy), depth/float64(wn), cfg.BaselineAlpha)
	}
}

func (d *Detector) fillBaselines(ds *deviceState, devSet []sample, dst *DeviceStats) {
	cfg := &d.cfg
	var classN [maxClass + 1]int
	for i := range devSet {
		classN[devSet[i].class]++
	}
	best, bestScore := -1, -1
	for c := range ds.base.classes {
		cb := &ds.base.classes[c]
		if cb.windows == 0 {
			continue
		}
		learned := cb.learned(cfg.BaselineMinWindows)
		dst.Baselines = append(dst.Baselines, ClassBaseline{Class: uint8(c), P50: durNS(cb.p50), P95: durNS(cb.p95), P99: durNS(cb.p99), Windows: cb.windows, Learned: learned})
		if learned {
			dst.BaselineLearned = true
			score := classN[c]*1_000_000 + cb.windows
			if score > bestScore {
				best, bestScore = c, score
			}
		}
	}
	if best >= 0 {
		cb := &ds.base.classes[best]
		dst.BaselineP50, dst.BaselineP95, dst.BaselineP99 = durNS(cb.p50), durNS(cb.p95), durNS(cb.p99)
	}
	if ds.base.inflightN >= cfg.BaselineMinWindows {
		dst.BaselineInflight = ds.base.inflight
	}
	dst.CapacityBPS = ds.base.capacity
}
