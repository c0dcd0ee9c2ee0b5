package detector

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// FastPath enters regimes between evaluations; call it every
// FastPathInterval(Window) (100 ms at the default 1 s).
//
// It looks for sequential files that are strongly slower than the device's
// baseline and enters their FileLatencyShift at once. The regular
// evaluation needs a full Window of reads; a DataNode opens a new block
// file per read, and a 256 MB block is read in 2-4 s, so waiting a second
// (or more, for a file opened mid-window) costs a large share of the block.
// The fast path judges a file on its last FastMinSamples requests
// (count-based) against FastShiftMult, well above the regular entry
// (ShiftMult), so that it needs no hysteresis. A zero FastShiftMult
// disables this part.
//
// With FastDeviceEntry, at most every Window/4 (counting Evaluate's own
// checks), it also judges tail inflation and contention over the trailing
// Window with Evaluate's entry conditions, and enters a regime that is not
// yet active as soon as they hold (when EnterAfter > 1, only if the
// previous evaluations were above entry too). It never clears anything:
// exits and their hysteresis are Evaluate's.
//
// The returned snapshot holds only the newly entered regimes, the stats of
// their files (for contention, of the files read on the device) and of
// their devices.
func (d *Detector) FastPath(now time.Duration) Snapshot {
	d.mu.Lock()
	defer d.mu.Unlock()
	snap := Snapshot{Now: now}
	cfg := &d.cfg
	devs := make([]probe.Dev, 0, len(d.devices))
	for dev := range d.devices {
		devs = append(devs, dev)
	}
	slices.Sort(devs)
	for _, dev := range devs {
		ds := d.devices[dev]
		entered := false
		if cfg.FastShiftMult > 0 {
			entered = d.fastFiles(ds, int64(now), &snap)
		}
		if cfg.FastDeviceEntry && d.fastDeviceRegimes(ds, int64(now), &snap) {
			entered = true
		}
		if cfg.FastExtentEntry && d.fastExtents(ds, int64(now), &snap) {
			entered = true
		}
		if entered {
			dst := DeviceStats{Device: ds.dev, Errors: ds.errors, CapacityBPS: ds.base.capacity}
			if ds.base.inflightN >= cfg.BaselineMinWindows {
				dst.BaselineInflight = ds.base.inflight
			}
			snap.Devices = append(snap.Devices, dst)
		}
	}
	return snap
}

// fastDeviceRegimes is FastPath's entry check of the device-level regimes.
func (d *Detector) fastDeviceRegimes(ds *deviceState, now int64, snap *Snapshot) bool {
	cfg := &d.cfg
	if ds.tail.active && ds.contention.active {
		return false
	}
	// A little slack for the caller's ticker: checks 100 ms apart must not
	// be skipped every other time because one came a millisecond early.
	every := int64(cfg.Window) / 4
	if now-ds.devCheckAt < every-every/10 {
		return false
	}
	ds.devCheckAt = now
	// The window as Evaluate takes it: the last Window, extended back to
	// DeviceMinSamples but not beyond LongWindow; stale file slots are
	// unattributed.
	sc := &d.sc
	sc.win = sc.win[:0]
	shortCut, longCut := now-int64(cfg.Window), now-int64(cfg.LongWindow)
	ringN := uint64(len(ds.ring))
	nShort := 0
	for k := uint64(0); k < min(ds.n, ringN); k++ {
		s := ds.ring[(ds.n-1-k)%ringN]
		if s.complete <= longCut || (s.complete <= shortCut && len(sc.win) >= cfg.DeviceMinSamples) {
			break
		}
		if s.slot != noSlot {
			f := &d.files[s.slot]
			if !f.used || f.gen != s.gen {
				s.slot = noSlot
			}
		}
		if s.complete > shortCut {
			nShort++
		}
		sc.win = append(sc.win, s)
	}
	devSet := sc.win
	devBusy := d.devBusy(devSet)
	explained := func(slot int32) bool {
		if slot == noSlot {
			return false
		}
		f := &d.files[slot]
		return f.shift.candidate() || f.starved.active
	}
	entered := false
	enter := func(kind RegimeKind, h *hyst, v verdict, conf float64, ev string) {
		if h.active || v != aboveEntry || h.above+1 < cfg.EnterAfter {
			return
		}
		ev = "fast path: " + ev
		h.step(aboveEntry, now, cfg, conf, ev)
		snap.Regimes = append(snap.Regimes, Regime{Kind: kind, Device: ds.dev, Since: time.Duration(now), Confidence: conf, Evidence: ev})
		entered = true
	}
	if !ds.tail.active {
		v, conf, ev := d.tailCheck(ds, devSet, nShort, devBusy, now, explained)
		enter(TailInflation, &ds.tail, v, conf, ev)
	}
	if !ds.contention.active {
		v, conf, ev := d.contentionCheck(ds, devSet, devBusy, explained)
		enter(Contention, &ds.contention, v, conf, ev)
		if ds.contention.active {
			// The tuner answers contention on the device's sequential
			// files: their stats over the trailing window come along.
			win, nShort := d.collect(ds, now, now-int64(cfg.Window))
			d.group(win, nShort)
			for ai := range sc.aggs {
				a := &sc.aggs[ai]
				if d.files[a.slot].dev == ds.dev && a.inShort {
					d.fileStats(ds, a, win, now)
					snap.Files = append(snap.Files, a.stats)
				}
			}
		}
	}
	return entered
}

// fastTier is one of the fast path's file checks: the median of a file's
// latest n requests at least mult times the baseline. Fewer requests need a
// stronger shift (their median is noisier).
type fastTier struct {
	n    int
	mult float64
}

// fastTailCap: the fast path enters no file shift whose normalised p95 is
// more than this many times its normalised median (a healthy stream's 256
// requests during a device's stalls: median 1.53x, p95 6.26x).
const fastTailCap = 2

// ownQueueShare: a file that issued at least this share of the requests
// the window holds that were issued into a deep queue queues behind its own.
const ownQueueShare = 0.8

// fastTiers are the fast path's file checks from FastMinSamples requests
// at FastShiftMult to FastWideSamples at FastWideMult, with the counts
// between doubling and their multiples on a straight line in log(n): the
// noise of a median falls with the count, so a file read at a few hundred
// requests a second shows a 1.6x shift in 128 requests (a third of a
// second) without waiting to fill the widest tier.
func fastTiers(cfg *Config) []fastTier {
	tiers := []fastTier{{cfg.FastMinSamples, cfg.FastShiftMult}}
	if cfg.FastWideMult <= 0 || cfg.FastWideSamples <= cfg.FastMinSamples {
		return tiers
	}
	span := math.Log(float64(cfg.FastWideSamples) / float64(cfg.FastMinSamples))
	for n := 2 * cfg.FastMinSamples; n < cfg.FastWideSamples; n *= 2 {
		frac := math.Log(float64(n)/float64(cfg.FastMinSamples)) / span
		tiers = append(tiers, fastTier{n, cfg.FastShiftMult - frac*(cfg.FastShiftMult-cfg.FastWideMult)})
	}
	return append(tiers, fastTier{cfg.FastWideSamples, cfg.FastWideMult})
}

// fastFiles is FastPath's strong file shift check; it reports whether it
// entered any.
func (d *Detector) fastFiles(ds *deviceState, now int64, snap *Snapshot) bool {
	cfg := &d.cfg
	tiers := d.tiers
	most := 0
	for _, t := range tiers {
		most = max(most, t.n)
	}
	per := map[int32][]sample{}
	win, _ := d.collect(ds, now, now-int64(cfg.Window))
	// Deep requests per file: a file that issued nearly all of those the
	// window holds queues behind its own (ownQueue).
	deep, deepAll := map[int32]int{}, 0
	for i := range win {
		if d.queuedBehind(ds, &win[i]) {
			deepAll++
			if win[i].slot != noSlot {
				deep[win[i].slot]++
			}
		}
	}
	ownQueue := func(slot int32) bool { return float64(deep[slot]) >= ownQueueShare*float64(deepAll) }
	for _, s := range win {
		if s.slot == noSlot || d.files[s.slot].shift.candidate() {
			continue
		}
		// Requests right after a jump or an extent crossing are the
		// evidence of extent starts (slow first reads of each extent of a
		// fragmented file), not of a slower file.
		if s.flags&flagPostJump != 0 {
			continue
		}
		// A file whose request was issued into a queue deeper than
		// depthCap, that queue its own (a window the tuner raised), waited
		// for it, not for the file: it is judged on the
		// requests it issued into a shallow one. A stream widened within a
		// quarter second of its open (a file slowed before it was opened)
		// has its first few dozen requests at the device's window and
		// every later one deep: judged on its latest requests whatever
		// their depth, a +8 ms file was never entered. A file whose deep
		// queue is others' too keeps its deep requests, and the depth
		// check below (the queue may be a contention's).
		if d.queuedBehind(ds, &s) && ownQueue(s.slot) {
			continue
		}
		// Older requests of a file are not its peers (they may predate its
		// slowdown), nor anyone's: the file is judged on its latest only.
		if l := per[s.slot]; len(l) < most {
			per[s.slot] = append(l, s)
		}
	}
	slots := make([]int32, 0, len(per))
	for slot, l := range per {
		if len(l) >= cfg.FastMinSamples {
			slots = append(slots, slot)
		}
	}
	if len(slots) == 0 {
		return false
	}
	slices.Sort(slots)
	// Unattributed requests are the files' peers. Gathered only now: on a
	// device read without files (direct I/O at high rates) the window is
	// all peers and this path runs four times a second.
	peers := d.sc.peers[:0]
	for _, s := range win {
		if s.slot == noSlot {
			peers = append(peers, s)
		}
	}
	d.sc.peers = peers
	norm := func(set []sample, by func(*classBaseline) float64) []float64 {
		var xs []float64
		for i := range set {
			if cb := d.classRef(ds, set[i].class); cb != nil {
				xs = append(xs, float64(set[i].lat)/by(cb))
			}
		}
		slices.Sort(xs)
		return xs
	}
	p50 := func(cb *classBaseline) float64 { return cb.p50 }
	p95 := func(cb *classBaseline) float64 { return cb.p95 }
	// peerQ is the p-quantile of set's normalised latencies and how many
	// there are; peers streamed 1 in N (unattributed requests) beside
	// files' requests streamed one by one count N times each.
	peerQ := func(set []sample, by func(*classBaseline) float64, p float64) (float64, int) {
		if unitWeights(set) {
			xs := norm(set, by)
			return percentile(xs, p), len(xs)
		}
		var xs []float64
		var ws []uint64
		for i := range set {
			if cb := d.classRef(ds, set[i].class); cb != nil {
				xs = append(xs, float64(set[i].lat)/by(cb))
				ws = append(ws, set[i].w())
			}
		}
		return wquantile(xs, ws, p, &d.sc.wbuf), len(xs)
	}
	// judge applies one tier to the file's latest n requests: the evidence
	// if it enters, "" if not.
	judge := func(slot int32, tier fastTier) (string, []sample, float64) {
		all := per[slot]
		if len(all) < tier.n {
			return "", nil, 0
		}
		set := all[:tier.n]
		var seq int
		var depth float64
		for i := range set {
			if set[i].flags&flagSeq != 0 {
				seq++
			}
			depth += float64(set[i].depth)
		}
		seqShare := float64(seq) / float64(len(set))
		depth /= float64(len(set))
		n50s, t95s := norm(set, p50), norm(set, p95)
		if seqShare < cfg.StarvedMinSequential || len(n50s) < tier.n {
			return "", nil, 0
		}
		n25, n50, t95 := percentile(n50s, 0.25), percentile(n50s, 0.5), percentile(t95s, 0.95)
		// Its tail or the body of its distribution moved with its median
		// (as Evaluate). Apart from its peers it must still be by the p95
		// (below): on a few dozen requests, a device stall that caught
		// most of the file's and few of the peers' passed the body rule.
		if n50 < tier.mult || !cfg.shapeShifted(n25, t95) {
			return "", nil, 0
		}
		// A time added to every request lifts the median more than the
		// p95 (t95 < n50); a p95 far above the median's rise is stalls
		// the file's requests queued behind (a device's tail, whose
		// regime is the device's), not a slower file. Evaluate judges it
		// over the window.
		if t95 > fastTailCap*n50 {
			return "", nil, 0
		}
		// Latency that rose with the queue is queueing, not the file.
		if cap, ok := d.depthCap(ds); ok && depth > cap {
			return "", nil, 0
		}
		// Other files (and unattributed requests) not normal: device-wide.
		// Judged over the same span as the file's requests (extended back to
		// PeerMinSamples): a device-wide stall shorter than the window must
		// not leave the file slow against peers mostly read before it.
		var others []sample
		others = append(others, peers...)
		for _, o := range slots {
			if o != slot {
				others = append(others, per[o]...)
			}
		}
		slices.SortFunc(others, func(a, b sample) int { return cmp.Compare(b.complete, a.complete) })
		oldest := set[len(set)-1].complete
		n := 0
		for n < len(others) && others[n].complete >= oldest {
			n++
		}
		// Extended back to PeerMinSamples, but not to requests that
		// waited in a deep queue: those of a stream the tuner widened,
		// read until just before this file started, are slow by their
		// queue, say nothing of the device's per-request latency, and held
		// a slowed file's entry back for a whole window. Requests beside
		// the file's own count whatever their depth (a contention's
		// queue is the device's state the file is judged in).
		for i := n; i < len(others) && n < cfg.PeerMinSamples; i++ {
			if !d.queuedBehind(ds, &others[i]) {
				others[n] = others[i]
				n++
			}
		}
		others = others[:n]
		pm, peerN := peerQ(others, p50, 0.5)
		peerEv := "no other file active to compare with"
		if peerN >= cfg.PeerMinSamples {
			// As Evaluate: the file's median and p95 both PeerMult times
			// its peers'. A device-wide stall leaves the peers' median
			// normal (their unstalled requests even speed up) but not their
			// tail.
			// Without hysteresis, the file must also stand the tier's
			// multiple above its peers when they run slow themselves (a
			// loaded host slows everyone a little; the file a little more
			// now and then).
			pt, _ := peerQ(others, p95, 0.95)
			if pm >= cfg.ShiftMult || n50 < cfg.PeerMult*pm || t95 < cfg.PeerMult*pt || n50 < tier.mult*max(pm, 1) {
				return "", nil, 0
			}
			peerEv = fmt.Sprintf("other requests normal: median %.2fx, p95 %.2fx baseline (%d requests)", pm, pt, peerN)
		}
		f := &d.files[slot]
		p50d, p95d := time.Duration(percentile(sortedLat(set), 0.5)), time.Duration(percentile(sortedLat(set), 0.95))
		ev := fmt.Sprintf("fast path: file %s: its last %d requests (sequential %.0f%%) take median %s = %.2fx and p95 %s = %.2fx the device's healthy baseline for their size (fast entry at %.1fx over %d requests); %s",
			f.key, len(set), 100*seqShare, p50d.Round(time.Microsecond), n50, p95d.Round(time.Microsecond), t95, tier.mult, tier.n, peerEv)
		return ev, set, confidence(n50/tier.mult, len(set), tier.n)
	}
	entered := false
	for _, slot := range slots {
		f := &d.files[slot]
		var ev string
		var set []sample
		var conf float64
		for _, tier := range tiers {
			if ev, set, conf = judge(slot, tier); ev != "" {
				break
			}
		}
		if ev == "" {
			continue
		}
		seq := 0
		for i := range set {
			if set[i].flags&flagSeq != 0 {
				seq++
			}
		}
		st := FileStats{Key: f.key, Device: f.dev, NextOffset: f.nextOffset, LastSeen: time.Duration(f.lastSeen),
			ExtentCrossings: f.crossings, Sequentiality: float64(seq) / float64(len(set))}
		busy, sumLat := d.setStats(set, nil, &st.Requests, &st.Bytes, &st.P50, &st.P95, &st.P99, &st.MeanSize, &st.MeanDepth, &st.BusyThroughput)
		if busy > 0 {
			st.Inflight = sumLat / float64(busy)
		}
		f.shift = hyst{active: true, since: now, above: cfg.EnterAfter, confidence: conf, evidence: ev}
		snap.Files = append(snap.Files, st)
		snap.Regimes = append(snap.Regimes, Regime{Kind: FileLatencyShift, Device: ds.dev, File: f.key,
			Since: time.Duration(now), Confidence: conf, Evidence: ev})
		entered = true
	}
	return entered
}

// sortedLat returns the latencies of set, sorted.
func sortedLat(set []sample) []float64 {
	xs := make([]float64, len(set))
	for i := range set {
		xs[i] = float64(set[i].lat)
	}
	slices.Sort(xs)
	return xs
}

// fastExtentCrossings is the fast path's minimum number of extent crossings
// behind an extent start entry (Evaluate's is 2): a single stall that
// catches the first reads after two crossings must not make one.
const fastExtentCrossings = 4

// fastExtents is FastPath's extent start entry: Evaluate's judgement over
// the trailing Window only, with the post-jump requests of its latest
// quarter (a file crossing extents at streaming speed gives its evidence
// within a fraction of a second), at most every Window/4 per device. It
// reports whether it entered any.
func (d *Detector) fastExtents(ds *deviceState, now int64, snap *Snapshot) bool {
	cfg := &d.cfg
	every := int64(cfg.Window) / 4
	if now-ds.extentCheckAt < every-every/10 {
		return false
	}
	ds.extentCheckAt = now
	// Device-wide stalls or a queue slow any request, the first after a
	// jump among them; over a quarter window that can pass for extent
	// starts. Evaluate's full window still judges them.
	if ds.tail.candidate() || ds.contention.candidate() {
		return false
	}
	win, nShort := d.collect(ds, now, now-int64(cfg.Window))
	if nShort == 0 {
		return false
	}
	d.group(win, nShort)
	// Post-jump requests are taken from the latest quarter window (extended
	// back to ExtentMinSamples): over the whole window, those before an
	// onset would outvote the new ones for half a window.
	nRecent := 0
	for nRecent < len(win) && win[nRecent].complete > now-every {
		nRecent++
	}
	entered := false
	for ai := range d.sc.aggs {
		a := &d.sc.aggs[ai]
		f := &d.files[a.slot]
		if f.dev != ds.dev || f.extent.candidate() || len(a.set) < cfg.FileMinSamples {
			continue
		}
		seq := 0
		for _, i := range a.set {
			if win[i].flags&flagSeq != 0 {
				seq++
			}
		}
		seqShare := float64(seq) / float64(len(a.set))
		if seqShare < cfg.ExtentMinSequential {
			continue
		}
		v, conf, ev := d.judgeExtent(f, a, win, nRecent, now)
		if v != aboveEntry || f.extent.above+1 < cfg.EnterAfter || d.sc.extentRatio < cfg.FastExtentMult || d.sc.extentCrossings < fastExtentCrossings {
			continue
		}
		ev = fmt.Sprintf("fast path (entry at %.1fx): %s", cfg.FastExtentMult, ev)
		f.extent.step(aboveEntry, now, cfg, conf, ev)
		st := FileStats{Key: f.key, Device: f.dev, NextOffset: f.nextOffset, LastSeen: time.Duration(f.lastSeen),
			ExtentCrossings: f.crossings, Sequentiality: seqShare}
		busy, sumLat := d.setStats(win, a.set, &st.Requests, &st.Bytes, &st.P50, &st.P95, &st.P99, &st.MeanSize, &st.MeanDepth, &st.BusyThroughput)
		if busy > 0 {
			st.Inflight = sumLat / float64(busy)
		}
		snap.Files = append(snap.Files, st)
		snap.Regimes = append(snap.Regimes, Regime{Kind: ExtentStart, Device: ds.dev, File: f.key,
			Since: time.Duration(now), Confidence: conf, Evidence: ev})
		entered = true
	}
	return entered
}

// Recent reports the stats of the files read over the trailing span (a
// fraction of Window) on the devices where one of keys is read, and of
// those devices over the same span (their learned capacity included). The
// tuner decides from it whether a stream it has just seen is bound by its
// window (Little's law needs only the bytes in flight, the window and the
// latency): a fresh stream then gets its first step a few hundred
// milliseconds after its first reads, not at the next whole-window
// evaluation. It enters and clears nothing. Bytes are over span: rates are
// Bytes / span.
func (d *Detector) Recent(now, span time.Duration, keys []probe.FileKey) Snapshot {
	d.mu.Lock()
	defer d.mu.Unlock()
	snap := Snapshot{Now: now}
	span = min(span, d.cfg.Window)
	want := make(map[probe.FileKey]bool, len(keys))
	for _, k := range keys {
		want[k] = true
	}
	devs := make([]probe.Dev, 0, len(d.devices))
	for dev := range d.devices {
		devs = append(devs, dev)
	}
	slices.Sort(devs)
	nowNS := int64(now)
	for _, dev := range devs {
		ds := d.devices[dev]
		win, _ := d.collect(ds, nowNS, nowNS-int64(span))
		found := false
		for i := range win {
			if s := win[i].slot; s != noSlot && want[d.files[s].key] {
				found = true
				break
			}
		}
		if !found {
			continue
		}
		dst := DeviceStats{Device: ds.dev, Errors: ds.errors, CapacityBPS: ds.base.capacity}
		d.devSetStats(win, &dst)
		snap.Devices = append(snap.Devices, dst)
		// Every sample is in the span: each file's set is all of its own.
		d.group(win, len(win))
		for ai := range d.sc.aggs {
			a := &d.sc.aggs[ai]
			if d.files[a.slot].dev == ds.dev {
				d.fileStats(ds, a, win, nowNS)
				snap.Files = append(snap.Files, a.stats)
			}
		}
	}
	return snap
}
