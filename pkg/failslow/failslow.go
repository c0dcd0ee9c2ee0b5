// Package failslow names fail-slow disks and files: disks that read slower
// than the host's other disks (or, on a host with no comparable peer, than
// their own learned healthy latency), and files that read slower than the
// rest of their own disk. It judges the detector's snapshots (per-device
// latency profiles by request size and queue depth, per-file ratios) with
// robust statistics and a hold time, and has no clock or I/O of its own.
// See docs/operations.md, "Fail-slow disks and files".
package failslow

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
	"time"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// Reference says what a disk's ratio compares it with.
type Reference string

const (
	// Peers: the median, per size class and depth bucket, of the other
	// watched disks' medians.
	Peers Reference = "peers"
	// Baseline: the disk's own healthy medians per size class and depth
	// bucket, learned while it was not over the threshold.
	Baseline Reference = "baseline"
	// None: too few comparable requests: no verdict.
	None Reference = "none"
)

// Bases of a ratio.
const (
	BasisModel    = "model"
	BasisCells    = "cells"
	BasisUnqueued = "unqueued"
)

// Config holds the thresholds. The zero value means DefaultConfig.
type Config struct {
	// Threshold: a disk whose ratio is at or above it for Hold consecutive
	// evaluations is named slow; it is cleared after Release consecutive
	// evaluations below Exit.
	Threshold float64
	Exit      float64
	Hold      int
	Release   int
	// MinRequests is how many of a disk's requests in the window must fall
	// in cells that have a reference for it to get a verdict;
	// MinCellRequests is the least a cell (the disk's, or a peer's) must
	// hold to take part.
	MinRequests     int
	MinCellRequests int
	// ModelMinCell is the least a cell must hold to be a point of a
	// disk's cost model (FitModel).
	ModelMinCell int
	// UnqueuedMinCell is the least each of two disks' unqueued cells
	// (UnqueuedRatio) must hold to be compared.
	UnqueuedMinCell int
	// LearnWindows is how many windows a baseline cell is learned from
	// (a plain mean) before it is a reference; LearnAlpha the EWMA weight
	// of a window after that.
	LearnWindows int
	LearnAlpha   float64
	// Forget: a disk with no verdict for this many evaluations loses its
	// named state (it is no longer read).
	Forget int
	// Files: a file whose DiskRatio over at least FileMinRequests
	// requests is at or above FileThreshold for FileHold consecutive
	// evaluations is named; it is cleared as soon as it is below it, or
	// after Forget evaluations without a ratio.
	FileThreshold   float64
	FileMinRequests int
	FileHold        int
}

// DefaultConfig returns the documented defaults (docs/operations.md).
func DefaultConfig() Config {
	return Config{
		Threshold: 1.5, Exit: 1.25, Hold: 10, Release: 10,
		MinRequests: 48, MinCellRequests: 16, ModelMinCell: 8, UnqueuedMinCell: 4,
		LearnWindows: 30, LearnAlpha: 0.01,
		Forget:        60,
		FileThreshold: 1.5, FileMinRequests: 24, FileHold: 3,
	}
}

func (c Config) withDefaults() Config {
	def := DefaultConfig()
	if c == (Config{}) {
		return def
	}
	return c
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Threshold <= 1 || c.Exit < 1 || c.Exit > c.Threshold:
		return fmt.Errorf("failslow: threshold %.2f and exit %.2f: need threshold > 1 and 1 <= exit <= threshold", c.Threshold, c.Exit)
	case c.Hold < 1 || c.Release < 1 || c.FileHold < 1 || c.Forget < 1:
		return fmt.Errorf("failslow: hold, release, file hold and forget must be at least 1 evaluation")
	case c.MinRequests < 1 || c.MinCellRequests < 1 || c.FileMinRequests < 1 || c.ModelMinCell < 1 || c.UnqueuedMinCell < 1:
		return fmt.Errorf("failslow: minimum request counts must be at least 1")
	case c.LearnWindows < 1 || c.LearnAlpha <= 0 || c.LearnAlpha > 1:
		return fmt.Errorf("failslow: learn windows must be >= 1 and alpha in (0, 1]")
	case c.FileThreshold <= 1:
		return fmt.Errorf("failslow: file threshold %.2f must be above 1", c.FileThreshold)
	}
	return nil
}

// Disk is the verdict on one disk.
type Disk struct {
	Device probe.Dev
	// Ratio is the disk's read latency over its reference's, at the same
	// request size and the same or a deeper queue (0 without a verdict).
	Ratio     float64
	Reference Reference
	// Requests is how many of the window's requests the ratio is based on.
	Requests int
	// Basis is how the ratio was computed: BasisUnqueued (the smallest
	// requests issued with nothing ahead, UnqueuedRatio), BasisModel (the
	// disks' cost models at RefSize) or BasisCells (cell by cell, same
	// size class).
	Basis string
	// Over is how many consecutive evaluations the ratio has been at or
	// above the threshold; Held the median ratio of the last Hold
	// verdicts, which names the disk (0 before Hold verdicts).
	Over int
	Held float64
	// Slow: named fail-slow (held over the threshold for Hold
	// evaluations); Since is when it was named.
	Slow  bool
	Since time.Duration
	// SlowFiles are the disk's files named slower than the disk itself,
	// highest ratio first.
	SlowFiles []File
}

// File is a file named slower than its own disk.
type File struct {
	Key      probe.FileKey
	Ratio    float64 // detector.FileStats.DiskRatio
	Requests int
	Since    time.Duration
}

// Judge keeps the hold state between evaluations. Not safe for concurrent
// use: the daemon calls Update from its evaluation loop.
type Judge struct {
	cfg   Config
	disks map[probe.Dev]*diskState
	files map[probe.FileKey]*fileState
}

type cellID struct{ class, depth uint8 }

type learned struct {
	mean    float64 // ns
	depth   float64 // mean depth
	size    float64 // mean request size
	queue   float64 // bytes in flight
	windows int
}

type diskState struct {
	recent     []float64 // the last max(Hold, Release) verdicts' ratios
	over, idle int
	slow       bool
	since      time.Duration
	base       map[cellID]*learned
	// the cost model learned while healthy: EWMAs of its terms
	baseFixed, basePerByte, baseMinSize learned
}

func (st *diskState) baseModel() Model {
	return Model{FixedNS: st.baseFixed.mean, PerByteNS: st.basePerByte.mean, MinSize: st.baseMinSize.mean, Points: 2}
}

func (l *learned) add(v float64, cfg Config) {
	l.windows++
	a := cfg.LearnAlpha
	if l.windows <= cfg.LearnWindows {
		a = 1 / float64(l.windows)
	}
	l.mean += a * (v - l.mean)
}

type fileState struct {
	dev        probe.Dev
	over, idle int
	since      time.Duration
	ratio      float64
	requests   int
	named      bool
	sinceNamed time.Duration
}

// New returns a judge with cfg (zero: defaults).
func New(cfg Config) (*Judge, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Judge{cfg: cfg, disks: map[probe.Dev]*diskState{}, files: map[probe.FileKey]*fileState{}}, nil
}

// Config returns the configuration in use.
func (j *Judge) Config() Config { return j.cfg }

// Forget drops a disk that is no longer watched.
func (j *Judge) Forget(dev probe.Dev) {
	delete(j.disks, dev)
	for k, f := range j.files {
		if f.dev == dev {
			delete(j.files, k)
		}
	}
}

// Update judges one evaluation's snapshot and returns a verdict per
// device in it (sorted by device) and per device known from earlier ones
// within Forget evaluations.
func (j *Judge) Update(snap detector.Snapshot) []Disk {
	cfg := j.cfg
	out := make([]Disk, 0, len(snap.Devices))
	models := make(map[probe.Dev]Model, len(snap.Devices))
	uqModels := make(map[probe.Dev]Model, len(snap.Devices))
	for i := range snap.Devices {
		models[snap.Devices[i].Device] = FitModel(snap.Devices[i].Profile, cfg.ModelMinCell)
		uqModels[snap.Devices[i].Device] = FitModel(snap.Devices[i].Unqueued, cfg.UnqueuedMinCell)
	}
	seen := map[probe.Dev]bool{}
	for i := range snap.Devices {
		ds := &snap.Devices[i]
		seen[ds.Device] = true
		st := j.disks[ds.Device]
		if st == nil {
			st = &diskState{base: map[cellID]*learned{}}
			j.disks[ds.Device] = st
		}
		v := Disk{Device: ds.Device, Reference: None}
		mx := models[ds.Device]
		modelOK := mx.Valid() && mx.Requests >= cfg.MinRequests
		mr, mn := modelRatio(ds.Device, models, cfg.MinRequests)
		base := st.baseModel()
		ur, un := UnqueuedRatio(ds, snap.Devices, cfg.UnqueuedMinCell)
		if un == 0 {
			ur, un = modelRatio(ds.Device, uqModels, cfg.MinRequests)
		}
		switch {
		case un > 0:
			v.Ratio, v.Requests, v.Reference, v.Basis = ur, un, Peers, BasisUnqueued
		case mn > 0:
			v.Ratio, v.Requests, v.Reference, v.Basis = mr, mn, Peers, BasisModel
		default:
			if r, n := PeerRatio(ds, snap.Devices, cfg.MinCellRequests); n >= cfg.MinRequests {
				v.Ratio, v.Requests, v.Reference, v.Basis = r, n, Peers, BasisCells
			} else if modelOK && st.baseFixed.windows >= cfg.LearnWindows && base.Valid() {
				at := CompareAt(mx, base)
				v.Ratio, v.Requests, v.Reference, v.Basis = mx.At(at)/base.At(at), mx.Requests, Baseline, BasisModel
			} else if r, n := st.baselineRatio(ds, cfg); n >= cfg.MinRequests {
				v.Ratio, v.Requests, v.Reference, v.Basis = r, n, Baseline, BasisCells
			}
		}
		j.step(st, &v, snap.Now)
		if v.Reference == None {
			v.Held = st.held(cfg)
		}
		// Learn while nothing says the disk is slow: below the exit
		// ratio, or with no reference yet (a single-disk host's first
		// windows; a disk slow from the start is learned as normal).
		if !st.slow && v.Held < cfg.Threshold && (v.Reference == None || v.Ratio < cfg.Exit) {
			st.learn(ds, cfg)
			if modelOK {
				st.baseFixed.add(mx.FixedNS, cfg)
				st.basePerByte.add(mx.PerByteNS, cfg)
				st.baseMinSize.add(mx.MinSize, cfg)
			}
		}
		v.Over, v.Slow, v.Since = st.over, st.slow, st.since
		out = append(out, v)
	}
	// A device the detector no longer reports was forgotten by it.
	for dev := range j.disks {
		if !seen[dev] {
			j.Forget(dev)
		}
	}
	j.judgeFiles(snap, out)
	slices.SortFunc(out, func(a, b Disk) int { return cmp.Compare(a.Device, b.Device) })
	return out
}

// step moves a disk's hold state by one evaluation: the disk is named
// when the median of its last Hold verdicts is at or above the threshold
// (a robust hold: single windows far off either way do not decide), and
// cleared when the median of its last Release verdicts is below Exit.
func (j *Judge) step(st *diskState, v *Disk, now time.Duration) {
	cfg := j.cfg
	if v.Reference == None {
		// No reads, or none comparable: no verdict, the state holds.
		st.idle++
		if st.idle >= cfg.Forget {
			*st = diskState{base: st.base, baseFixed: st.baseFixed, basePerByte: st.basePerByte, baseMinSize: st.baseMinSize}
		}
		return
	}
	st.idle = 0
	st.recent = append(st.recent, v.Ratio)
	if n := max(cfg.Hold, cfg.Release); len(st.recent) > n {
		st.recent = st.recent[len(st.recent)-n:]
	}
	if v.Ratio >= cfg.Threshold {
		st.over++
	} else {
		st.over = 0
	}
	if !st.slow && len(st.recent) >= cfg.Hold && median(slices.Clone(st.recent[len(st.recent)-cfg.Hold:])) >= cfg.Threshold {
		st.slow, st.since = true, now
	}
	if st.slow && len(st.recent) >= cfg.Release && median(slices.Clone(st.recent[len(st.recent)-cfg.Release:])) < cfg.Exit {
		st.slow, st.since = false, 0
	}
	v.Held = st.held(cfg)
}

// held is the median of the disk's last Hold verdicts (0 before Hold).
func (st *diskState) held(cfg Config) float64 {
	if len(st.recent) < cfg.Hold {
		return 0
	}
	return median(slices.Clone(st.recent[len(st.recent)-cfg.Hold:]))
}

func (j *Judge) judgeFiles(snap detector.Snapshot, disks []Disk) {
	cfg := j.cfg
	seen := map[probe.FileKey]bool{}
	for _, f := range snap.Files {
		if f.DiskRatioRequests < cfg.FileMinRequests {
			continue
		}
		seen[f.Key] = true
		st := j.files[f.Key]
		if st == nil {
			st = &fileState{dev: f.Device}
			j.files[f.Key] = st
		}
		st.idle, st.ratio, st.requests = 0, f.DiskRatio, f.DiskRatioRequests
		if f.DiskRatio >= cfg.FileThreshold {
			st.over++
		} else {
			st.over, st.named = 0, false
		}
		if !st.named && st.over >= cfg.FileHold {
			st.named, st.sinceNamed = true, snap.Now
		}
	}
	idx := map[probe.Dev]int{}
	for i := range disks {
		idx[disks[i].Device] = i
	}
	for k, st := range j.files {
		if !seen[k] {
			st.idle++
			if st.idle >= cfg.Forget {
				delete(j.files, k)
				continue
			}
		}
		if !st.named {
			continue
		}
		if i, ok := idx[st.dev]; ok {
			disks[i].SlowFiles = append(disks[i].SlowFiles, File{Key: k, Ratio: st.ratio, Requests: st.requests, Since: st.sinceNamed})
		}
	}
	for i := range disks {
		slices.SortFunc(disks[i].SlowFiles, func(a, b File) int {
			return cmp.Or(cmp.Compare(b.Ratio, a.Ratio), cmp.Compare(a.Key.Ino, b.Key.Ino))
		})
	}
}

// PeerRatio compares d with the other devices of peers: for each of d's
// cells with at least minCell requests, the reference is the median over
// the other devices of their latency in a matching cell (cellRatio), and
// the ratio is the median of the cells' ratios weighted by d's requests in
// them; n is those requests (0: no comparable cell).
func PeerRatio(d *detector.DeviceStats, peers []detector.DeviceStats, minCell int) (ratio float64, n int) {
	var ws []weighted
	for _, c := range d.Profile {
		if c.Requests < minCell || c.P10 <= 0 {
			continue
		}
		var refs []float64
		for i := range peers {
			p := &peers[i]
			if p.Device == d.Device {
				continue
			}
			if r, ok := cellRatio(c, p.Profile, minCell); ok {
				refs = append(refs, r)
			}
		}
		if len(refs) == 0 {
			continue
		}
		ws = append(ws, weighted{median(refs), c.Requests})
		n += c.Requests
	}
	return weightedMedian(ws), n
}

// modelRatio compares dev's cost model in models with each other
// device's at CompareAt, both fitted on at least minRequests requests, and
// returns the median over the peers (n: dev's model requests; 0 without a
// comparable peer). For the models of unqueued requests (no queueing at
// all), a disk whose small unqueued reads are too few in a window to
// compare is still judged at the smallest size it and a peer read, on the
// line through all its unqueued sizes.
func modelRatio(dev probe.Dev, models map[probe.Dev]Model, minRequests int) (float64, int) {
	mx := models[dev]
	if !mx.Valid() || mx.Requests < minRequests {
		return 0, 0
	}
	var rs []float64
	for d, m := range models {
		if d != dev && m.Valid() && m.Requests >= minRequests {
			at := CompareAt(mx, m)
			rs = append(rs, mx.At(at)/m.At(at))
		}
	}
	if len(rs) == 0 {
		return 0, 0
	}
	return median(rs), mx.Requests
}

// UnqueuedMaxClass is the largest size class UnqueuedRatio compares:
// up to 256 KiB, twice RefSize, a fixed cost of a few ms is not diluted
// in the transfer time.
const UnqueuedMaxClass = 18

// UnqueuedRatio compares d with each other device of peers on their
// smallest requests issued with no other read of the device in flight
// (DeviceStats.Unqueued), in the smallest size class from RefSize's to
// UnqueuedMaxClass in which both hold at least minCell, and returns the
// median over the peers (n: d's requests compared, at most one class per
// peer; 0 when no peer has such a class). A request with nothing ahead of
// it at issue waits for no other transfer: its latency is its fixed cost
// plus its own bytes, whatever windows and queues the disk's other reads
// have. When a tuner grows most reads to several MiB and queues them deep
// (which dilutes and hides a fixed cost in every other cell), each
// stream's first small readahead requests still find the disk idle now
// and then and show it whole. When d's requests in the class are larger
// on average, the peer's latency is scaled up by the size ratio, as if it
// were all per byte: a mismatch can only hide a slow disk, never make a
// healthy one look slow.
func UnqueuedRatio(d *detector.DeviceStats, peers []detector.DeviceStats, minCell int) (ratio float64, n int) {
	var rs []float64
	for i := range peers {
		p := &peers[i]
		if p.Device == d.Device {
			continue
		}
		if r, k, ok := unqueuedPair(d.Unqueued, p.Unqueued, minCell); ok {
			rs = append(rs, r)
			n = max(n, k)
		}
	}
	if len(rs) == 0 {
		return 0, 0
	}
	return median(rs), n
}

func unqueuedPair(a, b []detector.LatencyCell, minCell int) (ratio float64, n int, ok bool) {
	find := func(cells []detector.LatencyCell, class uint8) *detector.LatencyCell {
		for i := range cells {
			if c := &cells[i]; c.Class == class && c.Requests >= minCell && c.P10 > 0 && c.MeanSize > 0 {
				return c
			}
		}
		return nil
	}
	for class := uint8(bits.Len(RefSize - 1)); class <= UnqueuedMaxClass; class++ {
		ca, cb := find(a, class), find(b, class)
		if ca == nil || cb == nil {
			continue
		}
		return float64(ca.P10) / (float64(cb.P10) * max(1, ca.MeanSize/cb.MeanSize)), ca.Requests, true
	}
	return 0, 0, false
}

// cellRatio compares cell c with a reference profile at the same size
// class, never in a way that makes a healthy disk look slower. The
// reference cell is the nearest at c's depth bucket or deeper, else the
// deepest shallower one. A request waits for the bytes in flight ahead of
// it, so when c's requests had more bytes in flight around them
// (QueueBytes) than the reference's, the reference's latency is scaled up
// by the ratio, as if the device's throughput stayed put: a device's
// throughput does not fall when more is in flight. A shallower reference
// counts as unqueued (its 10th percentile is a request that found no
// queue: only its own bytes).
func cellRatio(c detector.LatencyCell, ref []detector.LatencyCell, minCell int) (float64, bool) {
	var pick *detector.LatencyCell
	for i := range ref { // sorted by class, then depth
		p := &ref[i]
		if p.Class != c.Class || p.Requests < minCell || p.P10 <= 0 {
			continue
		}
		pick = p
		if p.Depth >= c.Depth {
			break
		}
	}
	if pick == nil {
		return 0, false
	}
	qc := max(c.QueueBytes, c.MeanSize, 1)
	qp := max(pick.QueueBytes, pick.MeanSize, 1)
	if pick.Depth < c.Depth {
		qp = max(pick.MeanSize, 1)
	}
	scale := max(1, qc/qp)
	return float64(c.P10) / (float64(pick.P10) * scale), true
}

// baselineRatio compares d with the disk's own learned cells, matched as
// with peers (same class, nearest learned depth bucket at or above).
func (st *diskState) baselineRatio(d *detector.DeviceStats, cfg Config) (float64, int) {
	var base []detector.LatencyCell
	for id, l := range st.base {
		if l.windows >= cfg.LearnWindows {
			base = append(base, detector.LatencyCell{Class: id.class, Depth: id.depth, Requests: cfg.MinCellRequests,
				P10: time.Duration(l.mean), MeanDepth: l.depth, MeanSize: l.size, QueueBytes: l.queue})
		}
	}
	if len(base) == 0 {
		return 0, 0
	}
	slices.SortFunc(base, func(a, b detector.LatencyCell) int {
		return cmp.Or(cmp.Compare(a.Class, b.Class), cmp.Compare(a.Depth, b.Depth))
	})
	var ws []weighted
	n := 0
	for _, c := range d.Profile {
		if c.Requests < cfg.MinCellRequests || c.P10 <= 0 {
			continue
		}
		if r, ok := cellRatio(c, base, cfg.MinCellRequests); ok {
			ws = append(ws, weighted{r, c.Requests})
			n += c.Requests
		}
	}
	return weightedMedian(ws), n
}

// learn folds the window's cells into the disk's healthy baseline.
func (st *diskState) learn(d *detector.DeviceStats, cfg Config) {
	for _, c := range d.Profile {
		if c.Requests < cfg.MinCellRequests || c.P10 <= 0 {
			continue
		}
		id := cellID{c.Class, c.Depth}
		l := st.base[id]
		if l == nil {
			l = &learned{}
			st.base[id] = l
		}
		l.windows++
		a := cfg.LearnAlpha
		if l.windows <= cfg.LearnWindows {
			a = 1 / float64(l.windows)
		}
		l.mean += a * (float64(c.P10) - l.mean)
		l.depth += a * (c.MeanDepth - l.depth)
		l.size += a * (c.MeanSize - l.size)
		l.queue += a * (c.QueueBytes - l.queue)
	}
}

type weighted struct {
	v float64
	w int
}

// weightedMedian is the lower weighted median (0 for none).
func weightedMedian(ws []weighted) float64 {
	if len(ws) == 0 {
		return 0
	}
	slices.SortFunc(ws, func(a, b weighted) int { return cmp.Compare(a.v, b.v) })
	total := 0
	for _, x := range ws {
		total += x.w
	}
	acc := 0
	for _, x := range ws {
		acc += x.w
		if 2*acc >= total {
			return x.v
		}
	}
	return ws[len(ws)-1].v
}

// median of xs (the mean of the middle two for an even count); xs is
// reordered.
func median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}
