// Package detector recognises slowdown regimes of block devices and of
// single files from the stream of completed block reads (probe.Record).
//
// It keeps, per device, a ring of recent requests (the count bound of its
// sliding windows) and, per file, a little sequencing state; every
// Evaluate(now) computes windowed statistics, compares them with a healthy
// baseline learned per device and request-size class, and runs each regime
// through entry/exit hysteresis. The caller drives it: Observe for each
// record, Evaluate once per interval; no goroutines, no wall clock, so it is
// deterministic under test. See docs/detector.md for the model.
package detector

import (
	"math/bits"
	"sync"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// sample flags.
const (
	flagSeq      uint8 = 1 << iota // continues an earlier request of the same file
	flagPostJump                   // among the first requests after a jump or extent crossing
	flagJump                       // the first request after a jump or extent crossing
	flagCross                      // offset contiguous but sector discontiguous: a new extent
)

const noSlot = -1

// maxClass is the largest size class: log2 of a 4 GiB request.
const maxClass = 32

// sample is one request in a device ring; 40 bytes, no pointers (the ring
// is not scanned by the garbage collector).
type sample struct {
	complete int64 // ns
	lat      int64 // ns
	bytes    uint32
	depth    uint32
	slot     int32  // file slot or noSlot
	gen      uint32 // file slot's generation; for noSlot, the unattributed stream
	class    uint8
	flags    uint8
	weight   uint16 // requests this one stands for (probe.Record.Weight); 0 or 1: itself
}

func (s *sample) issue() int64 { return s.complete - s.lat }

// w is the sample's weight in request and byte counts (and in the sums
// behind device-level means and Little's law): above its rate budget the
// probe streams 1 in N of a disk's small requests and of its requests not
// read for a file (direct I/O, metadata), and the record stands for N.
func (s *sample) w() uint64 {
	if s.weight == 0 {
		return 1
	}
	return uint64(s.weight)
}

// sizeClass is ceil(log2(bytes)): requests of 65..128 KiB share class 17.
func sizeClass(b uint32) uint8 {
	if b <= 1 {
		return 0
	}
	return uint8(bits.Len32(b - 1))
}

// recentReq remembers a recent request of a file to recognise sequential
// continuation even when a readahead batch completes out of order.
type recentReq struct {
	offStart, offEnd uint64
	secStart, secEnd uint64
	seq              uint64 // device sample sequence number
	issue            int64
}

const recentReqs = 8

type fileState struct {
	key      probe.FileKey
	dev      probe.Dev
	gen      uint32
	used     bool
	lastSeen int64
	prev     int32 // LRU neighbours, most recent at d.lruHead
	next     int32

	recent     [recentReqs]recentReq
	recentN    int
	recentPos  int
	nextOffset uint64
	lastIssue  int64
	seqEWMA    float64
	postLeft   int
	jumpSeq    uint64 // device sequence number of the last plain jump (not a crossing), +1; 0 if none
	requests   uint64
	bytes      uint64
	crossings  uint64

	shift, extent, starved hyst
}

type deviceState struct {
	dev      probe.Dev
	ring     []sample
	n        uint64 // samples ever added
	lastSeen int64
	errors   uint64

	base baseline

	tail, contention hyst
	// devCheckAt is when tail inflation and contention were last judged
	// (by Evaluate or FastPath): FastPath judges them at most every
	// Window/4.
	devCheckAt int64
	// extentCheckAt is when FastPath last judged extent starts (at most
	// every Window/4; Evaluate judges them every Window).
	extentCheckAt int64

	// Streams of requests the probe could not attribute to a file
	// (O_DIRECT reads, say), told apart by sector continuity: each is one
	// more reader for contention.
	streams    [maxStreams]stream
	nextStream uint32
}

const maxStreams = 16

type stream struct {
	secEnd uint64
	id     uint32
	last   int64
}

// streamOf returns the stream id of an unattributed request: that of the
// stream it continues (it starts where one ended), else a new one
// replacing the least recently seen.
//
// A request of probe.SampleBelow or more that the probe streamed 1 in w
// (w > 1: the requests between it and its stream's last record were
// counted but not streamed) continues the nearest stream it starts at
// most 8w requests of its size beyond, or up to 4 behind (each CPU samples
// its own completions, so a stream's sampled requests are irregularly
// spaced and a little out of order: beyond 8w a stream would split about
// once in 3000 of its samples): sampled, a sequential direct-I/O reader is
// still one reader. Small sampled requests keep to exact continuation
// (random ones, streamed 1 in 128 at 300k IOPS, would chain into streams).
func (ds *deviceState) streamOf(sector uint64, bytes uint32, complete int64, w uint64) uint32 {
	size := uint64(bytes+511) / 512
	end := sector + size
	oldest := 0
	for i := range ds.streams {
		st := &ds.streams[i]
		if st.id != 0 && st.secEnd == sector {
			st.secEnd, st.last = end, complete
			return st.id
		}
		if st.last < ds.streams[oldest].last || st.id == 0 && ds.streams[oldest].id != 0 {
			oldest = i
		}
	}
	if w > 1 && bytes >= probe.SampleBelow {
		near, dist := -1, uint64(0)
		for i := range ds.streams {
			st := &ds.streams[i]
			if st.id == 0 || sector+4*size < st.secEnd || sector > st.secEnd+8*w*size {
				continue
			}
			dd := max(sector, st.secEnd) - min(sector, st.secEnd)
			if near < 0 || dd < dist {
				near, dist = i, dd
			}
		}
		if near >= 0 {
			st := &ds.streams[near]
			st.secEnd, st.last = max(st.secEnd, end), complete
			return st.id
		}
	}
	ds.nextStream++
	if ds.nextStream == 0 {
		ds.nextStream = 1
	}
	ds.streams[oldest] = stream{secEnd: end, id: ds.nextStream, last: complete}
	return ds.nextStream
}

// Detector is the online regime detector. It is safe for concurrent use
// (Observe from the record reader, Evaluate from a ticker), but the
// intended caller drives both from one loop.
type Detector struct {
	mu      sync.Mutex
	cfg     Config
	tiers   []fastTier // the fast path's file checks, from cfg
	devices map[probe.Dev]*deviceState
	fileIdx map[probe.FileKey]int32
	files   []fileState
	free    []int32
	lruHead int32
	lruTail int32
	nFiles  int
	evicted uint64

	sc scratch
}

// New returns a detector. A zero Config means DefaultConfig(); an invalid
// one panics with the reason (configuration is a programming-time choice;
// call cfg.Validate first to handle the error).
func New(cfg Config) *Detector {
	if cfg == (Config{}) {
		cfg = DefaultConfig()
	}
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	return &Detector{
		cfg:     cfg,
		tiers:   fastTiers(&cfg),
		devices: make(map[probe.Dev]*deviceState),
		fileIdx: make(map[probe.FileKey]int32),
		lruHead: noSlot,
		lruTail: noSlot,
	}
}

// Config returns the detector's configuration.
func (d *Detector) Config() Config { return d.cfg }

// Evicted returns how many files were dropped to respect MaxFiles or
// FileIdleTimeout since the detector was created.
func (d *Detector) Evicted() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.evicted
}

func (d *Detector) device(dev probe.Dev) *deviceState {
	ds := d.devices[dev]
	if ds == nil {
		ds = &deviceState{dev: dev, ring: make([]sample, d.cfg.DeviceSamples)}
		ds.base.init()
		d.devices[dev] = ds
	}
	return ds
}

// Observe adds one completed read. All reads feed their device's state;
// only KindFile reads feed per-file state. Failed requests are counted but
// their latency is not used. Amortised O(1); it allocates only when it
// meets a new device or file.
func (d *Detector) Observe(r probe.Record) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ds := d.device(r.Device)
	complete := int64(r.Complete())
	if complete > ds.lastSeen {
		ds.lastSeen = complete
	}
	if r.Error {
		ds.errors++
		return
	}
	seq := ds.n
	s := &ds.ring[seq%uint64(len(ds.ring))]
	*s = sample{
		complete: complete,
		lat:      int64(r.Latency),
		bytes:    r.Bytes,
		depth:    r.Depth,
		slot:     noSlot,
		class:    sizeClass(r.Bytes),
		weight:   uint16(min(r.W(), 1<<16-1)),
	}
	ds.n++
	if r.Kind != probe.KindFile || r.File.IsZero() {
		// gen names the unattributed stream (slot is noSlot).
		s.gen = ds.streamOf(r.Sector, r.Bytes, complete, r.W())
		return
	}
	slot := d.fileSlot(r.File, r.Device, complete)
	f := &d.files[slot]
	s.slot = slot
	s.gen = f.gen
	s.flags = d.sequence(ds, f, &r, seq)
}

// sequence updates f's sequencing state with r and returns r's flags.
func (d *Detector) sequence(ds *deviceState, f *fileState, r *probe.Record, seq uint64) uint8 {
	f.requests += r.W()
	f.bytes += uint64(r.Bytes) * r.W()
	offEnd := r.Offset + uint64(r.Bytes)
	secEnd := r.Sector + uint64(r.Bytes+511)/512
	issue := int64(r.Issue)
	var flags uint8
	cross, follows := false, false
	for i := 0; i < f.recentN; i++ {
		p := &f.recent[i]
		switch {
		case p.offEnd == r.Offset:
			// r continues p.
			follows = true
			if p.secEnd != r.Sector {
				cross = true
			}
		case offEnd == p.offStart:
			// p continues r but completed first (out-of-order completion in a
			// readahead batch): r is sequential, and p may start an extent.
			follows = true
			if ds.n-p.seq <= uint64(len(ds.ring)) {
				ps := &ds.ring[p.seq%uint64(len(ds.ring))]
				ps.flags |= flagSeq
				if f.jumpSeq == p.seq+1 && ps.flags&flagCross == 0 {
					// p looked like a jump only because r, issued before
					// it, completed after it: undo the jump and the
					// post-jump run it started.
					ps.flags &^= flagJump | flagPostJump
					f.postLeft = 0
					f.jumpSeq = 0
				}
				if secEnd != p.secStart && ps.flags&flagCross == 0 {
					ps.flags |= flagCross | flagJump | flagPostJump
					f.crossings++
				}
			}
		}
	}
	if follows {
		flags |= flagSeq
		f.seqEWMA += (1 - f.seqEWMA) / 16
	} else {
		f.seqEWMA -= f.seqEWMA / 16
	}
	switch {
	case cross:
		flags |= flagCross | flagJump | flagPostJump
		f.crossings++
		f.postLeft = d.cfg.ExtentRequests - 1
	case !follows && f.recentN > 0 && f.seqEWMA >= 0.5:
		// A mostly sequential reader jumped elsewhere in the file (or a
		// request completed ahead of its predecessor: undone above when
		// the predecessor arrives).
		flags |= flagJump | flagPostJump
		f.postLeft = d.cfg.ExtentRequests - 1
		f.jumpSeq = seq + 1
	case f.postLeft > 0:
		flags |= flagPostJump
		f.postLeft--
	}
	f.recent[f.recentPos] = recentReq{offStart: r.Offset, offEnd: offEnd, secStart: r.Sector, secEnd: secEnd, seq: seq, issue: issue}
	f.recentPos = (f.recentPos + 1) % recentReqs
	if f.recentN < recentReqs {
		f.recentN++
	}
	if issue >= f.lastIssue {
		f.lastIssue = issue
		f.nextOffset = offEnd
	}
	return flags
}

// fileSlot finds or creates the slot of key and marks it most recently seen.
func (d *Detector) fileSlot(key probe.FileKey, dev probe.Dev, now int64) int32 {
	if i, ok := d.fileIdx[key]; ok {
		f := &d.files[i]
		if now > f.lastSeen {
			f.lastSeen = now
		}
		f.dev = dev
		d.lruTouch(i)
		return i
	}
	if d.nFiles >= d.cfg.MaxFiles {
		d.evict(d.lruTail)
	}
	var i int32
	if n := len(d.free); n > 0 {
		i = d.free[n-1]
		d.free = d.free[:n-1]
	} else {
		d.files = append(d.files, fileState{})
		i = int32(len(d.files) - 1)
	}
	gen := d.files[i].gen + 1
	d.files[i] = fileState{key: key, dev: dev, gen: gen, used: true, lastSeen: now, prev: noSlot, next: noSlot}
	d.fileIdx[key] = i
	d.nFiles++
	d.lruPush(i)
	return i
}

func (d *Detector) lruUnlink(i int32) {
	f := &d.files[i]
	if f.prev != noSlot {
		d.files[f.prev].next = f.next
	} else {
		d.lruHead = f.next
	}
	if f.next != noSlot {
		d.files[f.next].prev = f.prev
	} else {
		d.lruTail = f.prev
	}
	f.prev, f.next = noSlot, noSlot
}

func (d *Detector) lruPush(i int32) {
	f := &d.files[i]
	f.prev = noSlot
	f.next = d.lruHead
	if d.lruHead != noSlot {
		d.files[d.lruHead].prev = i
	}
	d.lruHead = i
	if d.lruTail == noSlot {
		d.lruTail = i
	}
}

func (d *Detector) lruTouch(i int32) {
	if d.lruHead == i {
		return
	}
	d.lruUnlink(i)
	d.lruPush(i)
}

// evict drops a file slot; ring samples that still name it are recognised
// as stale by their generation.
func (d *Detector) evict(i int32) {
	if i == noSlot || !d.files[i].used {
		return
	}
	d.lruUnlink(i)
	f := &d.files[i]
	delete(d.fileIdx, f.key)
	gen := f.gen
	*f = fileState{gen: gen, prev: noSlot, next: noSlot}
	d.free = append(d.free, i)
	d.nFiles--
	d.evicted++
}

// Forget drops a device (it vanished) with its files, samples, regimes and
// baseline. Call SaveBaseline first to keep the baseline.
func (d *Detector) Forget(dev probe.Dev) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.devices, dev)
	for i := range d.files {
		if d.files[i].used && d.files[i].dev == dev {
			d.evict(int32(i))
		}
	}
}

// TrackedFiles returns how many files have state.
func (d *Detector) TrackedFiles() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.nFiles
}

// hyst is one regime instance's entry/exit state.
type hyst struct {
	active     bool
	since      int64
	above      int
	below      int
	confidence float64
	evidence   string
}

type verdict uint8

const (
	unknown verdict = iota // not enough data: hold the current state
	aboveEntry
	between
	belowExit
	idle // nothing read in the window (device-level checks): clear what is active or pending
)

// step applies one evaluation's verdict. Entry needs EnterAfter
// consecutive verdicts above the entry threshold, exit ExitAfter below the
// lower exit threshold; in between the state holds and both counts reset.
func (h *hyst) step(v verdict, now int64, cfg *Config, conf float64, evidence string) {
	switch v {
	case aboveEntry:
		h.above++
		h.below = 0
		h.confidence, h.evidence = conf, evidence
		if !h.active && h.above >= cfg.EnterAfter {
			h.active = true
			h.since = now
		}
	case between:
		h.above, h.below = 0, 0
		h.evidence = evidence
	case belowExit:
		h.above = 0
		h.below++
		h.evidence = evidence
		if h.active && h.below >= cfg.ExitAfter {
			*h = hyst{below: h.below, evidence: evidence}
		}
	}
}

// candidate reports whether the regime is active or on its way in.
func (h *hyst) candidate() bool { return h.active || h.above > 0 }

func durNS(ns float64) time.Duration { return time.Duration(ns) }
