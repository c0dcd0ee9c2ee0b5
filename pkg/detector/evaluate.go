package detector

import (
	"cmp"
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
	// normalised lower quartile (by class p50): the body of the
	// distribution, which a host's stalls do not move
	n25 float64
	nl  int // set samples in learned classes
	// normalised median of the latest quarter window (extended to
	// FileMinSamples) and its sample count: a shift's exit is judged on it
	recentN50 float64
	recentN   int
	domClass  uint8
	inShort   bool
	shifted   bool // above the shift thresholds on its own (before peers)
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
		others := func() (float64, int) { return d.othersN50(ds, devSet, a.slot) }
		d.stepShift(ds, f, a, peerN50, peerT95, peerN, shiftedFiles, others, dst.BusyThroughput, dst.MeanSize, now)
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
	dc := buildCells(devSet, cellKey)
	dst.Profile = dc.profile(dst.MeanSize)
	if uq := unqueuedAtIssue(devSet); len(uq) > 0 {
		uc := buildCells(uq, classKey)
		dst.Unqueued = uc.profile(dst.MeanSize)
	}
	byClass := buildCells(devSet, classKey)
	d.fillDiskRatios(&byClass, devSet)
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
		a.n25 = percentile(sc.vals, 0.25)
		a.t95 = percentile(sc.vals2, 0.95)
	}
	cfg := &d.cfg
	a.shifted = a.nl >= cfg.FileMinSamples && a.n50 >= cfg.ShiftMult && cfg.shapeShifted(a.n25, a.t95)
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

// othersN50 is the median normalised latency of the device's requests
// other than slot's, shifted files' included, and their count: what a file
// in a shift is compared with when no file is normal (every file slowed at
// once is the device, not the file).
func (d *Detector) othersN50(ds *deviceState, devSet []sample, slot int32) (float64, int) {
	sc := &d.sc
	sc.vals, sc.ws = sc.vals[:0], sc.ws[:0]
	for i := range devSet {
		s := &devSet[i]
		if s.slot == slot {
			continue
		}
		if cb := d.classRef(ds, s.class); cb != nil {
			sc.vals = append(sc.vals, float64(s.lat)/cb.p50)
			sc.ws = append(sc.ws, s.w())
		}
	}
	if len(sc.vals) == 0 {
		return 0, 0
	}
	if ws := weightsOf(sc.ws); ws != nil {
		var q [1]float64
		wquantiles(sc.vals, ws, []float64{0.5}, q[:], &sc.wbuf)
		return q[0], len(sc.vals)
	}
	slices.Sort(sc.vals)
	return percentile(sc.vals, 0.5), len(sc.vals)
}

// shapeShifted reports whether more than a file's median moved: its
// normalised p95 t95 ShiftTailMult above the baseline's, or its lower
// quartile n25 ShiftBodyMult above the baseline median.
func (cfg *Config) shapeShifted(n25, t95 float64) bool {
	return t95 >= cfg.ShiftTailMult || cfg.bodyShifted(n25)
}

// bodyShifted reports whether a file's normalised lower quartile n25 stands
// ShiftBodyMult above the baseline median.
func (cfg *Config) bodyShifted(n25 float64) bool {
	return cfg.ShiftBodyMult > 0 && n25 >= cfg.ShiftBodyMult
}

// bodyApart reports whether a file's normalised lower quartile n25 stands
// PeerMult above its peers' normalised median (ShiftBodyMult 0: never).
func (cfg *Config) bodyApart(n25, peerN50 float64) bool {
	return cfg.ShiftBodyMult > 0 && n25 >= cfg.PeerMult*peerN50
}

// depthCap is the device depth above which a request's latency is
// queueing (ShiftDepthMult times the healthy requests in flight, plus
// one), once those are learned.
func (d *Detector) depthCap(ds *deviceState) (float64, bool) {
	if ds.base.inflightN < d.cfg.BaselineMinWindows {
		return 0, false
	}
	return d.cfg.ShiftDepthMult*ds.base.depth + 1, true
}

// queuedBehind reports whether s was issued into a queue deeper than
// depthCap: its latency is the queue's, not the device's per request.
func (d *Detector) queuedBehind(ds *deviceState, s *sample) bool {
	cap, ok := d.depthCap(ds)
	return ok && float64(s.depth) > cap
}
